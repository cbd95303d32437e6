"""Every argument check of the ops: exception type and a message that names
the argument, what was expected and what was received."""

import subprocess
import sys

import mlx.core as mx
import pytest

import mlx_fpqmm

W4, S4 = mlx_fpqmm.quantize(mx.zeros((16, 64)), mode="mxfp4")
WN, SN = mlx_fpqmm.quantize(mx.zeros((16, 64)), mode="nvfp4")
WF, SF = mlx_fpqmm.quantize(mx.zeros((16, 64)), mode="fp4")
W8, S8 = mlx_fpqmm.quantize(mx.zeros((16, 64)), mode="mxfp8")
X = mx.zeros((2, 64))
G = mx.array(1.0)

fp4, fp8 = mlx_fpqmm.fp4_qmm, mlx_fpqmm.fp8_qmm

CASES = {
    "int x": (lambda: fp4(X.astype(mx.int32), W4, S4), "x must be float32.*int32"),
    "uint8 x": (lambda: fp4(X.astype(mx.uint8), W4, S4), "x must be.*uint8"),
    "0-d x": (lambda: fp4(mx.array(1.0), W4, S4), "x must have at least 1 dim"),
    "float w": (lambda: fp4(X, W4.astype(mx.float32), S4), "w must be uint32.*float32"),
    "1-d w": (lambda: fp4(X, W4[0], S4[0]), r"w must have at least 2.*\(8\)"),
    "x inner dim": (lambda: fp4(mx.zeros((2, 32)), W4, S4), r"last dimension of x \(32\).*K=64"),
    "x inner dim, no transpose": (
        lambda: fp4(X, W4, S4, transpose=False),
        r"last dimension of x \(64\).*K=16",
    ),
    "float scales for mxfp4": (
        lambda: fp4(X, W4, S4.astype(mx.float32)),
        "scales for mode 'mxfp4' must be uint8",
    ),
    "uint8 scales for fp4": (
        lambda: fp4(X, WF, S4, mode="fp4"),
        "scales for mode 'fp4' must be float32",
    ),
    "scales shape": (lambda: fp4(X, W4, S4[:, :1]), r"scales must have shape \(16,2\)"),
    "transposed scales": (lambda: fp4(X, W4, S4.T), r"received \(2,16\)"),
    "nvfp4 data read as mxfp4": (lambda: fp4(X, WN, SN), r"scales must have shape \(16,2\)"),
    "group size for mxfp4": (
        lambda: fp4(X, W4, S4, group_size=64),
        "group_size=64 is not supported for mode 'mxfp4'",
    ),
    "group size for fp4": (
        lambda: fp4(X, WF, SF, group_size=8, mode="fp4"),
        "group_size=8.*16, 32, 64, 128",
    ),
    "K not a multiple of the group size": (
        lambda: fp4(mx.zeros((1, 40)), WF[:, :5], SF[:, :1], mode="fp4", group_size=16),
        "40 elements, which is not a multiple of group_size=16",
    ),
    "fp8 mode in fp4_qmm": (lambda: fp4(X, W8, S8, mode="mxfp8"), "Invalid mode 'mxfp8'"),
    "fp4 mode in fp8_qmm": (lambda: fp8(X, W4, S4, mode="mxfp4"), "Invalid mode 'mxfp4'"),
    "unknown mode": (lambda: fp4(X, W4, S4, mode="int4"), "Invalid mode 'int4'.*mxfp4, nvfp4, fp4"),
    "global scale on mxfp4": (
        lambda: fp4(X, W4, S4, global_scale=G),
        "global_scale is only supported for mode 'nvfp4'",
    ),
    "float16 global scale": (
        lambda: fp4(X, WN, SN, mode="nvfp4", global_scale=G.astype(mx.float16)),
        "global_scale must be float32 but received float16",
    ),
    "global scale shape": (
        lambda: fp4(X, WN, SN, mode="nvfp4", global_scale=mx.ones((2,))),
        r"global_scale must hold one value.*\(2\)",
    ),
    "batch mismatch": (
        lambda: fp4(
            mx.zeros((3, 2, 64)), mx.broadcast_to(W4, (4, 16, 8)), mx.broadcast_to(S4, (4, 16, 2))
        ),
        r"batch dimensions of x \(3\) and w \(4\) cannot be broadcast",
    ),
    "biases with fp mode": (
        lambda: mlx_fpqmm.quantized_matmul(X, W4, S4, S4, mode="mxfp4"),
        "biases must be None for quantization mode 'mxfp4'",
    ),
    "bits for mode": (
        lambda: mlx_fpqmm.quantized_matmul(X, W4, S4, bits=8, mode="mxfp4"),
        "bits=8 is not supported for mode 'mxfp4'; expected 4",
    ),
    "quantize integer w": (
        lambda: mlx_fpqmm.quantize(mx.zeros((4, 64), dtype=mx.int32), mode="fp4"),
        "w must be float32.*int32",
    ),
    "quantize 1-d w": (
        lambda: mlx_fpqmm.quantize(mx.zeros((64,)), mode="fp8"),
        r"at least 2 dim.*\(64\)",
    ),
    "quantize K": (
        lambda: mlx_fpqmm.quantize(mx.zeros((4, 48)), mode="fp8"),
        r"last dimension of w \(48\) must be a multiple of group_size=32",
    ),
    # The drop-in ops take MLX's modes (affine passed to MLX) and their own.
    **{
        f"{name} mode": (call, "Invalid mode 'nope'; expected one of: affine, mxfp4, nvfp4, mxfp8")
        for name, call in {
            "quantize": lambda: mlx_fpqmm.quantize(X, mode="nope"),
            "dequantize": lambda: mlx_fpqmm.dequantize(W4, S4, mode="nope"),
            "quantized_matmul": lambda: mlx_fpqmm.quantized_matmul(X, W4, S4, mode="nope"),
            "gather_qmm": lambda: mlx_fpqmm.gather_qmm(X, W4, S4, mode="nope"),
        }.items()
    },
    "dequantize dtype": (
        lambda: mlx_fpqmm.dequantize(WF, SF, mode="fp4", dtype=mx.int32),
        "dtype must be float32.*int32",
    ),
    "dequantize scales": (
        lambda: mlx_fpqmm.dequantize(WF, SF[:, :1], mode="fp4"),
        "scales must have shape",
    ),
}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_argument(case):
    call, message = CASES[case]
    with pytest.raises(ValueError, match=message):
        call()


def test_argument_of_wrong_python_type():
    with pytest.raises(TypeError):
        fp4(X, W4, S4, group_size="32")
    with pytest.raises(TypeError):
        fp4(X.tolist(), W4, S4)


def test_no_gradient_for_quantized_weights():
    with pytest.raises(ValueError, match="only x is differentiable"):
        mx.vjp(lambda w: fp4(X, w, S4), [W4], [mx.zeros((2, 16))])


def test_version_mismatch_is_an_import_error():
    code = (
        "import mlx.core as mx; mx.__version__ = '0.0.1'\n"
        "try:\n    import mlx_fpqmm\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "built against mlx 0.32.4 but mlx 0.0.1 is installed" in out.stdout
    assert "pip install" in out.stdout


def layer_cases():
    import mlx.nn as nn

    from mlx_fpqmm import nn as fnn

    return {
        "layer mode": (lambda: fnn.QuantizedLinear(64, 16, mode="int4"), "Invalid .*mode 'int4'"),
        "layer bits": (
            lambda: fnn.QuantizedLinear(64, 16, bits=8, mode="mxfp4"),
            "'mxfp4' stores 4-bit codes but bits=8",
        ),
        "layer input dims": (
            lambda: fnn.QuantizedLinear(40, 16, mode="fp4"),
            r"last dimension of w \(40\) must be a multiple of group_size=32",
        ),
        "layer group size": (
            lambda: fnn.QuantizedLinear(64, 16, group_size=64, mode="mxfp4"),
            "group_size=64 is not supported for mode 'mxfp4'",
        ),
        "layer input": (
            lambda: fnn.QuantizedLinear(64, 16, mode="fp8")(mx.zeros((2, 32))),
            r"last dimension of x \(32\) must equal K=64",
        ),
        "layer global scale on fp4": (
            lambda: fnn.QuantizedLinear.from_linear(
                nn.Linear(64, 8), mode="fp4", global_scale=True
            ),
            "global_scale is only supported for mode 'nvfp4'",
        ),
        "model quantize mode": (
            lambda: fnn.quantize(nn.Linear(64, 8), mode="nope"),
            "Invalid .*mode 'nope'",
        ),
        "model predicate": (
            lambda: fnn.quantize(
                nn.Sequential(nn.Linear(64, 8)), mode="fp4", class_predicate=lambda p, m: 3
            ),
            "class_predicate.* must return a bool or a dict",
        ),
    }


@pytest.mark.parametrize("case", list(layer_cases()), ids=str)
def test_bad_layer_argument(case):
    call, message = layer_cases()[case]
    with pytest.raises(ValueError, match=message):
        call()


def test_convert_needs_a_module():
    with pytest.raises(TypeError, match="mlx.nn.Module but received int"):
        mlx_fpqmm.convert(3)
