"""mlx_fpqmm's development tools: what only the project's own development uses.

- :mod:`fpqmm_dev.mlx_metal`: MLX's own fp-quantized Metal kernels, planned as MLX plans
  them, in the Metal simulator; ``python -m fpqmm_dev.mlx_metal fetch`` downloads MLX's
  macOS headers (the ``mlx-metal`` wheel) once.
- :mod:`fpqmm_dev.bench_metal`: device-memory traffic of the Metal kernels, ours and MLX's,
  from the simulator's counters (``python -m fpqmm_dev.bench_metal``).
- :mod:`fpqmm_dev.ggml_glue`: ggml's CPU backend, the baseline of
  ``python -m mlx_fpqmm.bench --vs-ggml``.

They need mlx_fpqmm and the simulator (``tools/metal_sim``) installed; ``tools/setup``
installs all three in editable mode.
"""
