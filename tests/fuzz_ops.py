"""Throws random argument combinations at the ops, through hypothesis:
``python fuzz_ops.py N`` tries N examples. test_hardening.py
(test_fuzz_random_arguments_never_crash) runs it in a child process so that a
crash fails the test instead of killing pytest.

The ops: fp4_qmm, fp8_qmm, quantized_matmul, quantize, dequantize and
kernel_path; about half the calls are a valid problem with at most one argument
perturbed, so the kernels are reached too. Every call must either return (an
array, which is evaluated; kernel_path's plan is not) or raise ValueError or
TypeError; any other exception fails the run (exit status 1).
Mode "affine" is skipped (but for kernel_path): the ops hand it to MLX. The last
line printed is a dict of the number of calls per outcome ("ok", "ValueError",
"TypeError").
"""

import collections
import os
import sys

import mlx.core as mx
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mlx_fpqmm

# MLX_FPQMM_FUZZ_DEVICE=gpu runs the same calls on the GPU stream.
mx.set_default_device(getattr(mx, os.environ.get("MLX_FPQMM_FUZZ_DEVICE", "cpu")))
# MLX_FPQMM_FUZZ_TRACE=1 prints each call before it runs (a crash's is the last).
TRACE = os.environ.get("MLX_FPQMM_FUZZ_TRACE") == "1"

DTYPES = [mx.float32, mx.float16, mx.bfloat16, mx.float64, mx.int32, mx.uint8, mx.uint32, mx.bool_]
MODES = ["mxfp4", "nvfp4", "mxfp8", "fp4", "fp8", "affine", "", "MXFP4", "fp16"]
outcomes: collections.Counter = collections.Counter()

shapes = st.lists(st.integers(0, 9), min_size=0, max_size=4).map(tuple)
small_ints = st.one_of(st.integers(-3, 5), st.sampled_from([16, 32, 64, 128, 2**31 - 1]))


def array(draw, shape_strategy=shapes):
    shape = draw(shape_strategy)
    dtype = draw(st.sampled_from(DTYPES))
    fill = draw(st.sampled_from([0.0, 1.0, np.nan, np.inf, -2.5]))
    # Made on the CPU: the GPU has no float64 arrays to hand the ops.
    a = (
        mx.full(shape, fill, stream=mx.cpu).astype(dtype, stream=mx.cpu)
        if dtype != mx.uint32
        else mx.full(shape, 0x12345678, mx.uint32, stream=mx.cpu)
    )
    if draw(st.booleans()) and a.ndim >= 2:
        a = mx.swapaxes(a, -1, -2, stream=mx.cpu)
    return a


@st.composite
def calls(draw):
    op = draw(
        st.sampled_from(
            ["fp4_qmm", "fp8_qmm", "quantized_matmul", "quantize", "dequantize", "kernel_path"]
        )
    )
    mode = draw(st.sampled_from(MODES))
    group_size = draw(st.one_of(st.none(), small_ints))
    x, w, scales = array(draw), array(draw), array(draw)
    if draw(st.booleans()):
        # A valid problem with at most one argument perturbed, so that the
        # checks after the first one and the kernels are reached too.
        mode = draw(st.sampled_from(MODES[:5]))
        format_ = mlx_fpqmm.FORMATS[mode]
        group_size = draw(st.sampled_from(format_["group_sizes"]))
        rows, groups = draw(st.integers(0, 8)), draw(st.integers(0, 3))
        w = mx.zeros((rows, groups * group_size * format_["bits"] // 32), mx.uint32)
        scale_dtype = mx.uint8 if format_["scales"] != "float" else mx.float16
        scales = mx.full((rows, groups), 0.5).astype(scale_dtype)
        x = mx.ones(draw(shapes) + (groups * group_size,), draw(st.sampled_from(DTYPES[:3])))
        if op in ("fp4_qmm", "fp8_qmm"):
            op = mlx_fpqmm.qmm_for_mode(mode).__name__
        perturbed = draw(st.sampled_from(["none", "x", "w", "scales", "group_size"]))
        if perturbed == "x":
            x = array(draw)
        elif perturbed == "w":
            w = array(draw)
        elif perturbed == "scales":
            scales = array(draw)
        elif perturbed == "group_size":
            group_size = draw(small_ints)
    kwargs = {"mode": mode}
    if op in ("fp4_qmm", "fp8_qmm", "quantized_matmul", "kernel_path"):
        kwargs["transpose"] = draw(st.booleans())
    if op == "kernel_path":
        kwargs["device"] = draw(st.sampled_from(["applegpu_g13s", "applegpu_g17s", "bogus"]))
    if op in ("fp4_qmm", "quantize", "dequantize", "kernel_path") and draw(st.booleans()):
        valid = mx.array(draw(st.sampled_from([1.0, 0.0, np.nan, 1e30])))
        kwargs["global_scale"] = draw(st.sampled_from([valid, array(draw)]))
    if op == "dequantize" and draw(st.booleans()):
        kwargs["dtype"] = draw(st.sampled_from(DTYPES))
    if op == "quantize":
        return op, (w if draw(st.booleans()) else x,), {"group_size": group_size, **kwargs}
    if op == "dequantize":
        return op, (w, scales), {"group_size": group_size, **kwargs}
    return op, (x, w, scales), {"group_size": group_size, **kwargs}


@settings(
    max_examples=int(sys.argv[1]),
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(calls())
def fuzz(call):
    name, args, kwargs = call
    if kwargs["mode"] == "affine" and name != "kernel_path":
        return  # MLX's own ops, which crash on some inputs (an empty x)
    if TRACE:
        described = [f"{a.shape}:{a.dtype}" for a in args]
        print(name, described, kwargs, file=sys.stderr, flush=True)
    try:
        result = getattr(mlx_fpqmm, name)(*args, **kwargs)
        if name != "kernel_path":  # a plan, nothing to evaluate
            mx.eval(result)
        outcomes["ok"] += 1
    except (ValueError, TypeError) as e:
        outcomes[type(e).__name__] += 1


if __name__ == "__main__":
    fuzz()
    print(dict(outcomes))
