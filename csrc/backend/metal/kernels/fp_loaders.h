// Tile loaders of the prefill kernels: they stage blocks of x and of the
// quantized W (decoded and scaled) in threadgroup memory, every device byte
// once per tile. A kernel picks the tile shape; the loaders work out which
// thread moves what.
#pragma once

#include <metal_stdlib>

#include "backend/metal/kernels/fp_common.h"

namespace fpqmm {

using namespace metal;

// Stages a `rows` x `cols` tile of a quantized matrix (stored row-major,
// grouped along its rows) as decoded, scaled U, laid out as the matrix is,
// `stride` elements per tile row. Thread i of `threads` owns
// `codes_per_thread` adjacent codes of tile row i / threads_per_row, in
// chunks of `chunk` codes (one load of packed words each). Positions past the
// matrix are stored as zeros.
//
// Scales: the first thread of a group within the tile reads its scale; the
// following chunks of that thread copy it, and the row's later threads in
// the same group receive it by simd_shuffle (a row's threads are adjacent
// lanes of one simdgroup).
template <
    typename U,
    int bits,
    int rows,
    int cols,
    int threads,
    int chunk,
    int stride>
struct QuantizedTileLoader {
  static constexpr int codes_per_thread = rows * cols / threads;
  static constexpr int threads_per_row = cols / codes_per_thread;
  static constexpr int chunks = codes_per_thread / chunk;
  static constexpr int words_per_chunk = chunk * bits / 32;
  static_assert(
      codes_per_thread * threads == rows * cols &&
          threads_per_row * codes_per_thread == cols,
      "whole rows per thread group, one pass per tile");
  static_assert(chunks * chunk == codes_per_thread && chunk % 4 == 0, "chunks");
  static_assert(threads_per_row <= 32 && 32 % threads_per_row == 0, "lanes");

  const device uint32_t* w;
  GroupScales group_scales;
  int matrix_rows;
  int row_codes;  // codes per matrix row
  int tile_row;
  int first_code;  // of this thread, within the tile row
  ushort lane;
  float scales[chunks] = {};

  QuantizedTileLoader(
      const device uint32_t* w,
      GroupScales group_scales,
      int matrix_rows,
      int row_codes,
      ushort thread_index,
      ushort lane)
      : w(w),
        group_scales(group_scales),
        matrix_rows(matrix_rows),
        row_codes(row_codes),
        tile_row(thread_index / threads_per_row),
        first_code(thread_index % threads_per_row * codes_per_thread),
        lane(lane) {}

  // The scales of the chunks of the tile at (row0, col0) of the matrix.
  void load_scales(int row0, int col0) {
    const int row = row0 + tile_row;
    const int groups_per_row = row_codes / group_size;
    const int thread_start = col0 + first_code;
    for (int u = 0; u < chunks; ++u) {
      const int code = thread_start + u * chunk;
      const int group_start = max(code / group_size * group_size, col0);
      if (group_start == code) {
        scales[u] =
            row < matrix_rows && code < row_codes
                ? group_scales
                      [int64_t(row) * groups_per_row + code / group_size]
                : 0.0f;
      } else if (group_start >= thread_start) {
        scales[u] = scales[u - 1];
      }
    }
    // Groups no wider than a thread's codes start at thread boundaries.
    if (group_size <= codes_per_thread) {
      return;
    }
    // A group that began in an earlier thread of the row spans that
    // thread's last chunk.
    const int group_start = max(thread_start / group_size * group_size, col0);
    const ushort leader = lane - first_code / codes_per_thread +
                          (group_start - col0) / codes_per_thread;
    const float handed = simd_shuffle(scales[chunks - 1], leader);
    for (int u = 0; u < chunks; ++u) {
      if (group_start < thread_start &&
          thread_start + u * chunk < group_start + group_size) {
        scales[u] = handed;
      }
    }
  }

  // Decodes the tile at (row0, col0) into `tile` with the current scales;
  // chunks at or past `extent` codes into the tile are left alone.
  void load(threadgroup U* tile, int row0, int col0, int extent = cols) {
    const int row = row0 + tile_row;
    const int words_per_row = row_codes * bits / 32;
    for (int u = 0; u < chunks; ++u) {
      const int code = first_code + u * chunk;
      if (code >= extent) {
        break;
      }
      uint32_t packed[words_per_chunk] = {};
      if (row < matrix_rows && col0 + code < row_codes) {
        load_words<words_per_chunk>(
            w + int64_t(row) * words_per_row + (col0 + code) * bits / 32,
            packed);
      }
      U values[chunk];
      decode_scaled<bits, chunk>(packed, scales[u], values);
      threadgroup U* destination = tile + tile_row * stride + code;
      for (int i = 0; i < chunk; i += 4) {
        *(threadgroup vec<U, 4>*)(destination + i) =
            vec<U, 4>(values[i], values[i + 1], values[i + 2], values[i + 3]);
      }
    }
  }
};

// Stages up to `rows` x `cols` of x (M x K, row-major) at (row0, k0) as T,
// `stride` elements per tile row: thread i moves chunk i % (cols / chunk) of
// rows i / (cols / chunk), + rows_per_pass, ... Rows past M (up to
// `rows_used`) and columns past K within a chunk are zeros; chunks wholly
// past K are left alone.
template <typename T, int rows, int cols, int threads, int chunk, int stride>
struct XTileLoader {
  static constexpr int chunks_per_row = cols / chunk;
  static constexpr int rows_per_pass = threads / chunks_per_row;
  static_assert(chunks_per_row * chunk == cols && chunk % 4 == 0, "chunks");
  static_assert(rows_per_pass * chunks_per_row == threads, "whole rows");

  int first_row;
  int column;

  XTileLoader(ushort thread_index)
      : first_row(thread_index / chunks_per_row),
        column(thread_index % chunks_per_row * chunk) {}

  void load(
      threadgroup T* tile,
      const device T* x,
      int M,
      int K,
      int row0,
      int k0,
      int rows_used) {
    const int k = k0 + column;
    if (k >= K) {
      return;
    }
    const bool vector_loads = k + chunk <= K && K % 4 == 0;
    for (int r = first_row; r < rows_used; r += rows_per_pass) {
      const int row = row0 + r;
      const device T* source = x + int64_t(row) * K + k;
      threadgroup T* destination = tile + r * stride + column;
      if (row < M && vector_loads) {
        for (int i = 0; i < chunk; i += 4) {
          *(threadgroup vec<T, 4>*)(destination + i) =
              *(const device vec<T, 4>*)(source + i);
        }
      } else {
        for (int i = 0; i < chunk; ++i) {
          destination[i] = row < M && k + i < K ? source[i] : T(0);
        }
      }
    }
  }
};

}  // namespace fpqmm
