// The contract between the Metal kernels and the host plan
// (backend/metal/plan.cpp): buffer and function-constant indices and tile
// geometry. Compiled both as MSL and as C++.
#pragma once

#include "common/scale_encoding.h"

namespace fpqmm {

// [[buffer(n)]] slots, the same for every kernel, and [[function_constant(n)]]
// indices (fixed per pipeline, so the compiler specialises the scale decode
// and the group arithmetic). Macros: they appear inside attributes.
#define FPQMM_BUFFER_W 0
#define FPQMM_BUFFER_SCALES 1
#define FPQMM_BUFFER_GLOBAL_SCALE 2  // bound only with has_global_scale
#define FPQMM_BUFFER_X 3
#define FPQMM_BUFFER_Y 4
#define FPQMM_BUFFER_M 5
#define FPQMM_BUFFER_N 6
#define FPQMM_BUFFER_K 7
#define FPQMM_BUFFER_BATCH_NDIMS 8  // 0: one matrix product
#define FPQMM_BUFFER_BATCH_SHAPE 9
#define FPQMM_BUFFER_X_BATCH_STRIDES 10       // in elements
#define FPQMM_BUFFER_W_BATCH_STRIDES 11       // in uint32 words
#define FPQMM_BUFFER_SCALES_BATCH_STRIDES 12  // in scale elements
// Gather kernels (mixture of experts): pair z multiplies x matrix
// lhs_indices[z] (z / lhs_divisor where the divisor is not 0) with W matrix
// rhs_indices[z]; the counts bound the indices.
#define FPQMM_BUFFER_LHS_INDICES 13
#define FPQMM_BUFFER_RHS_INDICES 14
#define FPQMM_BUFFER_X_MATRICES 15
#define FPQMM_BUFFER_W_MATRICES 16
// Split K: float partial sums (split x M x N), K per split, number of splits.
#define FPQMM_BUFFER_PARTIALS 17
#define FPQMM_BUFFER_SPLIT_K_STEP 18
#define FPQMM_BUFFER_SPLITS 19
#define FPQMM_BUFFER_LHS_DIVISOR 20
#define FPQMM_CONSTANT_GROUP_SIZE 100
#define FPQMM_CONSTANT_SCALE_ENCODING 101
#define FPQMM_CONSTANT_HAS_GLOBAL_SCALE 102

FPQMM_CONST int kSimdSize = 32;

// MMA kernels: a BM x 32 output tile per threadgroup of 2 x 2 simdgroups,
// K in blocks of 32. BM is 32 or 64 (a template parameter).
FPQMM_CONST int kMmaBlockN = 32;
FPQMM_CONST int kMmaBlockK = 32;
FPQMM_CONST int kMmaThreads = 4 * kSimdSize;
// Threadgroup tiles are padded by 16 bytes per row against bank conflicts.
constexpr int padded_row(int elements, int itemsize) {
  return elements + 16 / itemsize;
}

// Split K: a split covers at least this much of K, so each threadgroup still
// runs several K blocks per tile load of its partial sums. fp_split_k_sum
// runs kSplitKSumThreads threads per threadgroup, one output each.
FPQMM_CONST int kSplitKMinStep = 128;
FPQMM_CONST int kSplitKSumThreads = 256;

// NAX kernels (nax/): a BM x 64 output tile per threadgroup of 2 x 2
// simdgroups, each running (16, 32, 16) matmul2d steps on a (BM / 2) x 32
// corner; K in blocks of 64 (any multiple of 16: the group sizes are). BM is
// 32 or 64. x is staged as T, W dequantized to bfloat (exact for MLX's
// modes), so each is read from device memory once per tile.
FPQMM_CONST int kNaxBlockN = 64;
FPQMM_CONST int kNaxBlockK = 64;
FPQMM_CONST int kNaxThreads = 4 * kSimdSize;
FPQMM_CONST int kNaxWeightItemsize = 2;  // bfloat

// Decode kernel for transpose=True (qmv): each simdgroup owns kQmvOutputs
// rows of W (x is read N / 4 times, as by MLX's qmv_fast) for one block of
// up to kQmvRows x rows; each lane takes whole groups of K, in chunks of
// kQmvChunk codes (one 8- or 16-byte load). More rows of x take more blocks,
// side by side in the grid (x), so on a GPU the blocks after the first find
// their rows of W in cache.
FPQMM_CONST int kQmvSimdgroups = 2;
FPQMM_CONST int kQmvChunk = 16;
FPQMM_CONST int kQmvRows = 8;
FPQMM_CONST int kQmvOutputs = 4;

// Decode kernel for transpose=False (qvm): each lane owns 8 adjacent output
// columns, the simdgroups of a threadgroup split K, and x rows come in
// blocks of kQvmRows.
FPQMM_CONST int kQvmSimdgroups = 4;
FPQMM_CONST int kQvmColumnsPerLane = 8;
FPQMM_CONST int kQvmRows = 4;

}  // namespace fpqmm
