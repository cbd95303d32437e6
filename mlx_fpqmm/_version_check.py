"""Stops ``import mlx_fpqmm`` when the installed MLX is not the one it was built against.

Imported first by the package, before the extension loads: with another MLX the extension's
types would not match MLX's and every call would fail with nanobind's ``incompatible function
arguments``.
"""

import mlx.core as mx  # loads libmlx and registers its types before _ext

from ._build_info import MLX_VERSION

if mx.__version__ != MLX_VERSION:
    raise ImportError(
        f"mlx_fpqmm was built against mlx {MLX_VERSION} but mlx "
        f"{mx.__version__} is installed; reinstall one of them so they match, "
        f"e.g. `pip install 'mlx=={MLX_VERSION}'` or rebuild mlx_fpqmm with "
        "`pip install --force-reinstall --no-cache-dir mlx-fpqmm`."
    )
