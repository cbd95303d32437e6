"""``mx.quantize = mlx_fpqmm.quantize`` and ``mx.dequantize = mlx_fpqmm.dequantize``.

Both take MLX's exact signatures, so the swap routes MLX's callers here. The calls below are
those of MLX's own quantization tests for the fp modes (ml-explore/mlx,
python/tests/test_quantized.py: the mxfp4, mxfp8 and nvfp4 round trips, the global scale, the
dtype argument, the error cases) and its affine round trip, made through ``mx.quantize`` /
``mx.dequantize`` while they are ours; every result is also compared with MLX's own.
"""

import re

import mlx.core as mx
import mlx.nn as nn
import pytest

import mlx_fpqmm

MLX_QUANTIZE, MLX_DEQUANTIZE = mx.quantize, mx.dequantize
MLX_OPS = {"quantize": MLX_QUANTIZE, "dequantize": MLX_DEQUANTIZE}
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


@pytest.fixture(autouse=True)
def swapped(monkeypatch):
    monkeypatch.setattr(mx, "quantize", mlx_fpqmm.quantize)
    monkeypatch.setattr(mx, "dequantize", mlx_fpqmm.dequantize)


def parameters(function) -> list[tuple[str, str | None]]:
    """``(name, default)`` of each parameter in the signature line of ``function``'s
    docstring, with the ``/`` and ``*`` markers as names (the types are spelled
    differently by MLX and by nanobind's stubs, so they are left out)."""
    line = function.__doc__.strip().splitlines()[0]
    inside = line[line.index("(") + 1 : line.rindex(")")]
    tokens, depth, start = [], 0, 0
    for i, char in enumerate(inside):
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        elif char == "," and depth == 0:
            tokens.append(inside[start:i])
            start = i + 1
    tokens.append(inside[start:])
    result = []
    for token in tokens:
        name, _, default = token.partition("=")
        result.append((name.split(":")[0].strip(), default.strip() or None))
    return result


@pytest.mark.parametrize("name", ["quantize", "dequantize"])
def test_signature_is_mlx_s(name):
    ours = getattr(mlx_fpqmm, name)
    assert parameters(ours) == parameters(MLX_OPS[name])
    assert re.match(rf"{name}\(w: mlx.core.array, /,", ours.__doc__.strip())


def lut_matrix(group_size: int) -> mx.array:
    """Exact E2M1 values with a 6 in every group (so that every group's scale is 1), plus a
    small offset that quantization rounds away, in bfloat16 (MLX's test's matrix)."""
    w = mx.array(E2M1)[mx.random.randint(0, 16, shape=(128, 512))].reshape(-1, group_size)
    w[:, 0] = 6
    return (w + 3e-6).astype(mx.bfloat16)


def same_as_mlx(w: mx.array, **kwargs) -> list[mx.array]:
    """``mx.quantize(w, **kwargs)`` (ours), checked to equal MLX's own."""
    ours = mx.quantize(w, **kwargs)
    theirs = MLX_QUANTIZE(w, **kwargs)
    assert len(ours) == len(theirs)
    assert all(mx.array_equal(a, b).item() for a, b in zip(ours, theirs, strict=True))
    return ours


def test_affine_round_trip_is_mlx_s():
    mx.random.seed(0)
    w = mx.random.normal(shape=(128, 512))
    for group_size in (32, 64, 128):
        for bits in (2, 3, 4, 5, 6, 8):
            w_q, scales, biases = same_as_mlx(w, group_size=group_size, bits=bits)
            w_hat = mx.dequantize(w_q, scales, biases, group_size, bits)
            assert mx.array_equal(w_hat, MLX_DEQUANTIZE(w_q, scales, biases, group_size, bits))
            errors = (w - w_hat).abs().reshape(*scales.shape, -1)
            assert (errors <= (scales[..., None] + 1e-6).abs()).all().item()
    zeros = mx.zeros((256, 512))
    w_q, scales, biases = mx.quantize(zeros, 64, 4)
    assert mx.all(mx.dequantize(w_q, scales, biases, 64, 4) == 0).item()


@pytest.mark.parametrize("mode, group_size", [("mxfp4", 32), ("nvfp4", 16)])
def test_fp4_round_trip(mode, group_size):
    mx.random.seed(1)
    w = lut_matrix(group_size)
    w_q, scales = same_as_mlx(w, mode=mode)
    w_hat = mx.dequantize(w_q, scales, mode=mode)
    assert mx.allclose(w, w_hat, rtol=1e-5, atol=1e-5).item()
    assert mx.array_equal(w_hat, MLX_DEQUANTIZE(w_q, scales, mode=mode)).item()
    w_q, scales = mx.quantize(mx.zeros((256, 512)), mode=mode)
    assert mx.all(mx.dequantize(w_q, scales, mode=mode) == 0).item()


def test_mxfp8_round_trip():
    mx.random.seed(2)
    w = (2 * mx.random.uniform(shape=(512, 32)) - 1).astype(mx.bfloat16)
    w_q, scales = same_as_mlx(w, group_size=32, mode="mxfp8")
    w_hat = mx.dequantize(w_q, scales, mode="mxfp8")
    assert mx.allclose(w, w_hat, rtol=1e-1, atol=1e-1).item()
    assert mx.array_equal(w_hat, MLX_DEQUANTIZE(w_q, scales, mode="mxfp8")).item()
    w_q, scales = mx.quantize(mx.zeros((256, 512)), mode="mxfp8")
    assert mx.all(mx.dequantize(w_q, scales, mode="mxfp8") == 0).item()


def test_nvfp4_scale_per_16_values():
    """MLX's check that each 16-value group gets its own scale: alternating tiny and large
    rows round-trip exactly, with the dtype argument."""
    alternating = mx.zeros((64, 16), dtype=mx.bfloat16)
    alternating[::2] = 6 * 2**-9
    alternating[1::2] = 6.0
    w_q, scales = same_as_mlx(alternating, mode="nvfp4")
    w_hat = mx.dequantize(w_q, scales, mode="nvfp4", dtype=mx.bfloat16)
    assert w_hat.dtype == mx.bfloat16
    assert mx.allclose(alternating, w_hat, rtol=1e-5, atol=1e-6).item()


def test_nvfp4_global_scale():
    mx.random.seed(3)
    w = lut_matrix(16)
    global_scale = w.abs().max().astype(mx.float32)
    w_q, scales = same_as_mlx(w, mode="nvfp4", global_scale=global_scale)
    w_hat = mx.dequantize(
        w_q, scales, group_size=16, bits=4, mode="nvfp4", global_scale=global_scale
    )
    assert mx.allclose(w, w_hat, rtol=1e-5, atol=1e-5).item()
    expected = MLX_DEQUANTIZE(w_q, scales, mode="nvfp4", global_scale=global_scale)
    assert mx.array_equal(w_hat, expected).item()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda w: mx.quantize(w, bits=3, mode="mxfp4"), "bits=3"),
        (lambda w: mx.quantize(w, group_size=64, mode="mxfp4"), "group_size=64"),
        (lambda w: mx.quantize(w, bits=3, mode="nvfp4"), "bits=3"),
        (lambda w: mx.quantize(w, group_size=64, mode="nvfp4"), "group_size=64"),
        (lambda w: mx.quantize(w, bits=3, mode="mxfp8"), "bits=3"),
        (lambda w: mx.quantize(w, group_size=32, bits=7, mode="mxfp8"), "bits=7"),
        (lambda w: mx.quantize(w, bits=4, mode="fp8"), "bits=4"),
    ],
    ids=lambda c: c if isinstance(c, str) else "",
)
def test_quantize_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call(mx.ones((32, 64)))


@pytest.mark.parametrize(
    "mode, kwargs, message",
    [
        ("mxfp4", dict(bits=3), "bits=3"),
        ("mxfp4", dict(group_size=64), "group_size=64"),
        ("mxfp4", dict(group_size=32, bits=4, dtype=mx.int32), "int32"),
        ("nvfp4", dict(bits=3), "bits=3"),
        ("nvfp4", dict(group_size=32), "group_size=32"),
        ("mxfp8", dict(group_size=16), "group_size=16"),
        ("mxfp8", dict(bits=4), "bits=4"),
        ("fp4", dict(bits=8), "bits=8"),
    ],
)
def test_dequantize_errors(mode, kwargs, message):
    w_q, scales = mlx_fpqmm.quantize(mx.ones((32, 64)), mode=mode)
    with pytest.raises(ValueError, match=message):
        mx.dequantize(w_q, scales, mode=mode, **kwargs)


@pytest.mark.parametrize("mode", ["mxfp4", "nvfp4", "mxfp8", "fp4", "fp8"])
def test_fp_modes_take_no_biases(mode):
    w_q, scales = mlx_fpqmm.quantize(mx.ones((32, 64)), mode=mode)
    with pytest.raises(ValueError, match=r"biases must be None for quantization mode"):
        mx.dequantize(w_q, scales, scales, mode=mode)


def test_mlx_layers_quantize_through_the_swap():
    """MLX's own nn.quantize calls mx.quantize(w, group_size, bits, mode=mode): ours."""
    mx.random.seed(4)
    model = nn.Sequential(nn.Linear(64, 32), nn.Embedding(16, 64))
    reference = nn.Sequential(nn.Linear(64, 32), nn.Embedding(16, 64))
    reference.update(model.parameters())
    nn.quantize(model, mode="mxfp4")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mx, "quantize", MLX_QUANTIZE)
        patch.setattr(mx, "dequantize", MLX_DEQUANTIZE)
        nn.quantize(reference, mode="mxfp4")
    x = mx.random.normal((3, 64))
    assert mx.array_equal(model.layers[0](x), reference.layers[0](x)).item()
    tokens = mx.array([1, 5, 9])
    assert mx.array_equal(model.layers[1](tokens), reference.layers[1](tokens)).item()
