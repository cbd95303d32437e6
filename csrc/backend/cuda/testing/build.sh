#!/bin/sh
# Builds the standalone harness: build.sh OUT_DIR MLX_INCLUDE_DIR [ARCH...]
# (ARCH: nvcc -gencode values; default sm_90a). Every translation unit
# compiles in parallel. nvcc from $NVCC or PATH.
set -e
out=$1
mlx_include=$2
shift 2
[ $# -gt 0 ] || set -- arch=compute_90a,code=sm_90a
root=$(cd "$(dirname "$0")/../../../.." && pwd)
nvcc=${NVCC:-nvcc}
gencode=""
for arch in "$@"; do
  gencode="$gencode -gencode $arch"
done
flags="-O3 -std=c++20 -I$root/csrc -I$mlx_include -diag-suppress 997 --expt-relaxed-constexpr"
mkdir -p "$out"
pids=""
for source in "$root"/csrc/backend/cuda/instantiations/*.cu \
    "$root"/csrc/backend/cuda/table.cu \
    "$root"/csrc/backend/cuda/testing/harness.cu; do
  object="$out/$(basename "$source" .cu).o"
  $nvcc $flags $gencode -c "$source" -o "$object" &
  pids="$pids $!"
done
g++ -O2 -std=c++20 -I"$root/csrc" -I"$mlx_include" \
  -c "$root/csrc/backend/cuda/plan.cpp" -o "$out/plan.o" &
pids="$pids $!"
for pid in $pids; do
  wait "$pid"
done
$nvcc $gencode "$out"/*.o -o "$out/harness"
