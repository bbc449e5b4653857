// Merging attention states (o, natural-log lse). A state with lse -inf carries no weight;
// two of them merge to o = 0, lse = -inf.
#pragma once
#include <math.h>
#include "dtype.h"

// out-of-place over rows*heads, one thread per (row, head); all tensors packed.
__global__ void merge_state_kernel(const void* va, const float* sa, const void* vb, const float* sb,
                                   void* vo, float* so, int64_t rows, int heads, int dim, int dt) {
  const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= rows * heads) return;
  const float a = sa[idx], b = sb[idx];
  const float m = a > b ? a : b;
  const int64_t base = idx * dim;
  if (m == -INFINITY) {
    for (int d = 0; d < dim; ++d) st_dt(vo, base + d, dt, 0.f);
    so[idx] = -INFINITY;
    return;
  }
  const float wa = expf(a - m), wb = expf(b - m), inv = 1.f / (wa + wb);
  for (int d = 0; d < dim; ++d)
    st_dt(vo, base + d, dt, (ld_dt(va, base + d, dt) * wa + ld_dt(vb, base + d, dt) * wb) * inv);
  so[idx] = m + logf(wa + wb);
}

// In place over num_rows rows (MergeStateInPlace). live_rows, when given, is a device-side
// row count past which a block returns: a graph-sized grid over a smaller batch.
__global__ void merge_state_in_place_kernel(void* v, float* s, const void* vo, const float* so,
                                            int64_t num_rows, const int32_t* live_rows, int heads,
                                            int dim, int dt) {
  const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= num_rows * heads) return;
  if (live_rows && idx / heads >= *live_rows) return;
  const float a = s[idx], b = so[idx];
  const float m = a > b ? a : b;
  const int64_t base = idx * dim;
  if (m == -INFINITY) {
    for (int d = 0; d < dim; ++d) st_dt(v, base + d, dt, 0.f);
    s[idx] = -INFINITY;
    return;
  }
  const float wa = expf(a - m), wb = expf(b - m), inv = 1.f / (wa + wb);
  for (int d = 0; d < dim; ++d)
    st_dt(v, base + d, dt, (ld_dt(v, base + d, dt) * wa + ld_dt(vo, base + d, dt) * wb) * inv);
  s[idx] = m + logf(wa + wb);
}
