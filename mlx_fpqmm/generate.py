"""``python -m mlx_fpqmm.generate``: ``mlx_lm.generate`` on a model loaded by ``mlx_fpqmm.load``.

Takes ``mlx_lm.generate``'s options (its own parser); prompt caches, draft models, images and
adapters are left to mlx-lm.
"""

from ._cli import generate_main

__all__ = ["generate_main"]

if __name__ == "__main__":
    generate_main()
