// Merging attention states (o, natural-log lse). A state with lse -inf carries no weight;
// two of them merge to o = 0, lse = -inf.
#pragma once
#include <math.h>
#include "dtype.h"
#include "hooks.h"

// One (row, head): merges state (vb, b) into (va, a), writes o to vo at base and returns
// the merged lse. vo may be va: each element is read before it is written.
__device__ inline float merge_one(const void* va, float a, const void* vb, float b, void* vo,
                                  int64_t base, int dim, int dt) {
  // A NaN state makes the merge NaN (`a > b` alone dropped a NaN a beside an empty b).
  float m = a > b || a != a ? a : b;
  if (m == -INFINITY) {
    for (int d = 0; d < dim; ++d) st_dt(vo, base + d, dt, HOOK_EMPTY_MERGE_VALUE(0.f, va, base + d, dt));
    return -INFINITY;
  }
  HOOK_MERGE_MAX(m);
  const float wa = expf(a - m), wb = expf(b - m), inv = 1.f / (wa + wb);
  for (int d = 0; d < dim; ++d)
    st_dt(vo, base + d, dt, (ld_dt(va, base + d, dt) * wa + ld_dt(vb, base + d, dt) * wb) * inv);
  return m + logf(wa + wb);
}

// out-of-place over rows*heads, one thread per (row, head); all tensors packed.
__global__ void merge_state_kernel(const void* va, const float* sa, const void* vb, const float* sb,
                                   void* vo, float* so, int64_t rows, int heads, int dim, int dt) {
  const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= rows * heads) return;
  so[idx] = merge_one(va, sa[idx], vb, sb[idx], vo, idx * dim, dim, dt);
}

// In place over num_rows rows (MergeStateInPlace). live_rows, when given, is a device-side
// row count past which a block returns: a graph-sized grid over a smaller batch.
__global__ void merge_state_in_place_kernel(void* v, float* s, const void* vo, const float* so,
                                            int64_t num_rows, const int32_t* live_rows, int heads,
                                            int dim, int dt) {
  const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= num_rows * heads) return;
  if (live_rows && idx / heads >= *live_rows) return;
  s[idx] = merge_one(v, s[idx], vo, so[idx], v, idx * dim, dim, dt);
}
