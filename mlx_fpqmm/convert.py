"""``python -m mlx_fpqmm.convert``: quantize a Hugging Face model into an MLX model directory.

``mlx_fpqmm.convert`` is (and stays) the function :func:`mlx_fpqmm.nn.convert`. This file only
makes the ``-m`` command exist. Run as ``__main__`` it is never bound to the package; should
it be imported as ``mlx_fpqmm.convert``, it puts the function in its own ``sys.modules`` slot,
which the import system then binds as the package attribute (a module may replace itself in
``sys.modules``), so the function is not clobbered. The command's code is
``mlx_fpqmm._cli.convert_main``.
"""

import sys

from ._cli import convert_main

if __name__ == "__main__":
    convert_main()
else:
    from .nn import convert as _convert

    sys.modules[__name__] = _convert
