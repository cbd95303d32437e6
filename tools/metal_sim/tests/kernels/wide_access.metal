// Accesses wider than 16 bytes and struct copies: every one must be traced
// (counters, bounds, uninitialised threadgroup memory) at its exact size.
#include <metal_stdlib>
using namespace metal;

struct Record {
  float weight;
  half low;  // 2 bytes of padding follow
  float4 values;
};

// Reverses n elements of each kind through threadgroup memory.
[[kernel]] void reverse_wide(
    const device vec<half, 8>* hin [[buffer(0)]],
    device vec<half, 8>* hout [[buffer(1)]],
    const device vec<float, 8>* fin [[buffer(2)]],
    device vec<float, 8>* fout [[buffer(3)]],
    const device Record* rin [[buffer(4)]],
    device Record* rout [[buffer(5)]],
    uint i [[thread_index_in_threadgroup]],
    uint n [[threads_per_threadgroup]]) {
  threadgroup vec<half, 8> th[64];
  threadgroup vec<float, 8> tf[64];
  threadgroup Record tr[64];
  th[i] = hin[i];
  tf[i] = fin[i];
  tr[i] = rin[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const uint j = n - 1 - i;
  hout[i] = th[j];
  fout[i] = tf[j];
  rout[i] = tr[j];
}

// Writes components of threadgroup vectors one by one (no read of the rest);
// the mutant leaves component 7 unwritten and then reads the whole vector.
[[kernel]] void vector_components(
    const device float* in [[buffer(0)]],
    device vec<float, 8>* out [[buffer(1)]],
    uint i [[thread_index_in_threadgroup]]) {
  threadgroup vec<float, 8> t[32];
  for (int c = 0; c < 7; ++c) t[i][c] = in[8 * i + c];
#ifndef MUTANT_MISSING_COMPONENT
  t[i].s7 = in[8 * i + 7];
#endif
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[i] = t[31 - i];  // BUG when component 7 was never written
}

// Copies records field by field into threadgroup memory (padding never
// written), then as whole structs: copying padding is no error.
[[kernel]] void records_by_field(
    const device Record* in [[buffer(0)]],
    device Record* out [[buffer(1)]],
    uint i [[thread_index_in_threadgroup]]) {
  threadgroup Record t[32];
  t[i].weight = in[i].weight;
  t[i].low = in[i].low;
  t[i].values = in[i].values;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  Record r;
  r = t[31 - i];
  out[i] = r;
}

// Reads one 32-byte vector past the end of its buffer.
[[kernel]] void wide_out_of_bounds(
    const device vec<float, 8>* in [[buffer(0)]],
    device vec<float, 8>* out [[buffer(1)]],
    uint i [[thread_index_in_threadgroup]]) {
  out[i] = in[i + 1];  // BUG: the last thread reads past the end
}
