// fa2-style attention kernels: one thread owns one (query row, qo head) and runs an fp32 online
// softmax over its kv range. No shared memory, no __syncthreads (see platform.h).
#pragma once
#include <math.h>
#include "dtype.h"
#include "params.h"
#include "hooks.h"

#define NEG_INF (-INFINITY)

// Offset of kv token j of request req, before the head offset. 64-bit: page ids past 65,535
// times a page stride overflow 32 bits.
__device__ __forceinline__ int64_t kv_token_offset(const AttnParams& p, int req, int j,
                                                   int64_t stride_page, int64_t stride_n) {
  if (p.page_size > 0) {
    const int64_t page = p.kv_indices[(int64_t)p.kv_indptr[req] + j / p.page_size];
    return page * stride_page + (int64_t)HOOK_IN_PAGE(j, p.page_size) * stride_n;
  }
  if (p.kv_indptr) return HOOK_TOKEN_OFFSET(((int64_t)p.kv_indptr[req] + j) * stride_n);
  return HOOK_TOKEN_OFFSET((int64_t)j * stride_n);
}

struct WorkItem {
  int req, lo, hi, slot, nchunks, qo_start, qo_len, kv_len;
};

// false when the item is past the live count of a fixed-size (graph) grid.
__device__ __forceinline__ bool load_work(const AttnParams& p, int w, WorkItem& it) {
  if (p.live && w >= p.live[0]) return false;
  if (p.work_req) {
    it.req = p.work_req[w];
    it.lo = p.work_kv_lo[w];
    it.hi = p.work_kv_hi[w];
    it.slot = p.split ? p.work_slot[w] : -1;
    it.nchunks = p.split ? p.work_nchunks[w] : 1;
  } else {
    it.req = w;
    it.lo = 0;
    it.hi = -1;
    it.slot = -1;
    it.nchunks = 1;
  }
  if (p.qo_indptr) {
    it.qo_start = p.qo_indptr[it.req];
    it.qo_len = p.qo_indptr[it.req + 1] - it.qo_start;
    it.kv_len = p.kv_lens[it.req];
  } else {
    it.qo_start = 0;
    it.qo_len = p.qo_len;
    it.kv_len = p.kv_len;
  }
  if (it.hi < 0) it.hi = it.kv_len;
  return true;
}

// A key's logit for a query at position qpos (bottom-right aligned): s = q.k * sm_scale (the
// dot comes scaled), then the soft cap, then ALiBi. Masking comes after both.
__device__ __forceinline__ float logit(const AttnParams& p, float s, int h, int kvh, int j, int qpos) {
  if (p.logits_soft_cap > 0.f) s = p.logits_soft_cap * tanhf(s / p.logits_soft_cap);
  if (p.alibi_slopes) s += p.alibi_slopes[HOOK_ALIBI_HEAD(h, kvh)] * (float)(j - qpos);
  return s;
}

// The sink joins the softmax denominator of (m, l, acc) and nothing else: a row that attended
// to nothing gets o = 0 and lse = the sink.
__device__ __forceinline__ void add_sink(const AttnParams& p, float sk, int dvo, float* acc, float& m, float& l) {
  const float m2 = sk > m ? sk : m;
  const float r = expf(m - m2), e = expf(sk - m2);
  l = l * r + e;
  for (int d = 0; d < HOOK_FEATURE_DIMS(dvo); ++d) acc[d] *= r;
  HOOK_SINK_VALUE(acc, dvo, e);
  m = m2;
}

// Row i of the request over kv [lo, hi); diag is the row's key position (causal alignment is
// bottom-right: i + kv_len - qo_len). acc holds the unnormalised output; m and l the running
// max and sum. The sink is counted by the item that starts the request's kv (lo 0), so a
// split row's partials carry it once.
template <int KDT>
__device__ void attend_row(const AttnParams& p, const WorkItem& it, int i, int diag, int h, int kvh,
                           bool honour_window, float* acc, float& m_out, float& l_out) {
  float qv[KERNELS_MAX_HEAD_DIM];
  const int dqk = p.head_dim_qk, dvo = p.head_dim_vo;
  const int64_t qoff = (int64_t)(it.qo_start + i) * p.q_stride_n + (int64_t)h * p.q_stride_h;
  // k's dequantization scale folds into q: one multiply per dim instead of per key.
  const float qscale = p.sm_scale * HOOK_KV_SCALE(p.k_scale);
  for (int d = 0; d < dqk; ++d) qv[d] = ld_dt(p.q, qoff + d, p.q_dtype) * qscale;
  for (int d = 0; d < dvo; ++d) acc[d] = 0.f;
  float m = HOOK_MAX_START(NEG_INF), l = 0.f;
  int jlo = it.lo, jhi = it.hi;
  if (p.causal && diag + 1 < jhi) jhi = diag + 1;
  // honour_window is true at both call sites (prefill_kernel, decode_kernel): its false arm is
  // dead, kept for a caller that must ignore the window.
  if (honour_window && p.window_left >= 0 && diag - p.window_left > jlo) jlo = diag - p.window_left;
  const uint8_t* mask = p.custom_mask;
  if (mask && p.mask_indptr) mask += p.mask_indptr[it.req];
  HOOK_MASK_BOUNDS(jlo, jhi);
  for (int j = jlo; j < jhi; ++j) {
    const bool keep = !mask || mask[HOOK_MASK_INDEX((int64_t)i * it.kv_len + j, i, j)] != 0;
    if (HOOK_SKIP_MASKED(!keep)) continue;
    const int64_t ko = kv_token_offset(p, it.req, j, p.k_stride_page, p.k_stride_n) + (int64_t)kvh * p.k_stride_h;
    const int64_t vo = kv_token_offset(p, it.req, j, p.v_stride_page, p.v_stride_n) + (int64_t)kvh * p.v_stride_h;
    float s = 0.f;
    for (int d = 0; d < dqk; ++d) s += qv[d] * ld<KDT>(p.k, ko + d);
    s = HOOK_MASKED_LOGIT(logit(p, s, h, kvh, j, diag), keep, j);
    if (HOOK_RAISE_MAX(s > m)) {
      const float r = expf(m - s);
      l *= r;
      for (int d = 0; d < dvo; ++d) acc[d] *= r;
      m = s;
    }
    const float e = expf(s - m);
    l += e;
    for (int d = 0; d < dvo; ++d) acc[d] += e * ld<KDT>(p.v, vo + d);
  }
  const float vscale = HOOK_KV_SCALE(p.v_scale);
  if (vscale != 1.f)
    for (int d = 0; d < HOOK_FEATURE_DIMS(dvo); ++d) acc[d] *= vscale;
  if (p.sinks && it.lo == 0) add_sink(p, p.sinks[h], dvo, acc, m, l);
  m_out = m;
  l_out = l;
}

// Final rows go to o/lse in the caller's dtype; split items to fp32 partial slots.
__device__ inline void write_row(const AttnParams& p, const WorkItem& it, int i, int h,
                                 const float* acc, float m, float l) {
  const int dvo = p.head_dim_vo;
  // Nothing attended (a NaN must stay visible). A split row's empty partials meet the merge's
  // own test.
  const bool empty = HOOK_EMPTY_ROW(!(l > 0.f) && !(l != l), it.slot < 0);
  const float inv = empty ? 0.f : 1.f / l;
  const float lse = empty ? NEG_INF : m + logf(l);
  if (it.slot >= 0) {
    const int64_t s = (int64_t)it.slot + (int64_t)i * it.nchunks;
    float* po = p.partial_o + (s * p.num_qo_heads + h) * dvo;
    for (int d = 0; d < dvo; ++d) po[d] = acc[d] * inv;
    p.partial_lse[s * p.num_qo_heads + h] = lse;
  } else {
    const int64_t row = (int64_t)(it.qo_start + i);
    const int64_t base = (row * p.num_qo_heads + h) * dvo;
    for (int d = 0; d < dvo; ++d) st_dt(p.o, base + d, p.o_dtype, acc[d] * inv);
    if (p.lse) p.lse[row * p.num_qo_heads + h] = lse;
  }
}

// grid (work items, Hq, row tiles); the threads of the item's row-tile blocks stride over the
// request's query rows together, so every row is covered whatever the number of tiles.
template <int KDT>
__global__ void prefill_kernel(AttnParams p) {
  WorkItem it;
  if (!load_work(p, (int)blockIdx.x, it)) return;
  HOOK_ITEM_START(it);
  const int h = (int)blockIdx.y;
  // The GQA mapping: a group that does not divide, or is zero, is not checked here.
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int kvh = h / group;
  float acc[KERNELS_MAX_HEAD_DIM];
  const int first = (int)(blockIdx.z * blockDim.x + threadIdx.x), step = (int)(gridDim.z * blockDim.x);
  for (int i = first; i < it.qo_len; i += step) {
    float m, l;
    attend_row<KDT>(p, it, i, i + it.kv_len - it.qo_len, h, kvh, true, acc, m, l);
    write_row(p, it, i, h, acc, m, l);
  }
}

// grid (work items, ceil(Hq / block)), one thread per qo head; a request's few query rows (one,
// or q_len_per_req of a multi-token decode, causal within the request) in turn.
template <int KDT>
__global__ void decode_kernel(AttnParams p) {
  WorkItem it;
  if (!load_work(p, (int)blockIdx.x, it)) return;
  HOOK_ITEM_START(it);
  const int h = (int)(blockIdx.y * blockDim.x + threadIdx.x);
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int kvh = h / group;
  if (h >= p.num_qo_heads) return;
  float acc[KERNELS_MAX_HEAD_DIM];
  for (int i = 0; i < it.qo_len; ++i) {
    float m, l;
    attend_row<KDT>(p, it, i, HOOK_DECODE_DIAG(i + it.kv_len - it.qo_len, it.kv_len - 1), h, kvh, true, acc, m, l);
    write_row(p, it, i, h, acc, m, l);
  }
}

// Combines a row's partial slots (VariableLengthMergeStates). grid (ceil(rows/block), Hq).
__global__ void merge_partials_kernel(AttnParams p) {
  const int row = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  const int h = (int)blockIdx.y;
  if (row >= p.num_rows || (p.live && row >= p.live[1])) return;
  const int dvo = p.head_dim_vo;
  const int s0 = p.merge_indptr[row], s1 = p.merge_indptr[row + 1];
  float m = NEG_INF;
  for (int s = s0; s < s1; ++s) {
    const float x = p.partial_lse[(int64_t)s * p.num_qo_heads + h];
    // A NaN partial (a NaN logit in its chunk) makes the row NaN: `x > m` alone skipped it,
    // and a row whose other partials were empty came out 0 / -inf (values.nan_k_graph).
    if (x > m || x != x) m = x;
    if (m != m) break;
  }
  const int64_t obase = ((int64_t)row * p.num_qo_heads + h) * dvo;
  if (m == NEG_INF) {
    for (int d = 0; d < dvo; ++d) st_dt(p.o, obase + d, p.o_dtype, 0.f);
    if (p.lse) p.lse[(int64_t)row * p.num_qo_heads + h] = NEG_INF;
    return;
  }
  HOOK_MERGE_MAX(m);
  float wsum = 0.f;
  for (int s = s0; s < s1; ++s) wsum += expf(p.partial_lse[(int64_t)s * p.num_qo_heads + h] - m);
  for (int d = 0; d < dvo; ++d) {
    float a = 0.f;
    for (int s = s0; s < s1; ++s) {
      const int64_t si = (int64_t)s * p.num_qo_heads + h;
      a += expf(p.partial_lse[si] - m) * p.partial_o[si * dvo + d];
    }
    st_dt(p.o, obase + d, p.o_dtype, a / wsum);
  }
  if (p.lse) p.lse[(int64_t)row * p.num_qo_heads + h] = m + logf(wsum);
}

// ll4mi-style paged decode (seed 000's shape). grid (requests, Hq), block NWARPS warps. Each
// warp computes the softmax weights itself, then walks VHELOOP = HEAD_SIZE / 16 / NWARPS
// slices of 16 value dims at (vhe * NWARPS + warp) * 16. A head size that is not a multiple
// of 16 * NWARPS leaves dims unwritten; below 64 the loop never runs. No sliding window and
// no LSE: this kernel has neither.
#define LL4MI_NWARPS 4
template <int KDT>
__global__ void ll4mi_decode_kernel(AttnParams p) {
  WorkItem it;
  // decode.py launches ll4mi unsplit with no live count (one item a request, p.live null),
  // and a decode request has exactly one q row: neither early return below has an input.
  if (!load_work(p, (int)blockIdx.x, it)) return;
  HOOK_ITEM_START(it);
  const int h = (int)blockIdx.y;
  const int warp = (int)threadIdx.x / KERNELS_WARP_SIZE;
  const int lane = (int)threadIdx.x % KERNELS_WARP_SIZE;
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int kvh = h / group;
  if (lane >= 16 || it.qo_len < 1) return;
  const int HEAD_SIZE = p.head_dim_vo;
  const int VHELOOP = HEAD_SIZE / 16 / LL4MI_NWARPS;
  const int64_t qoff = (int64_t)it.qo_start * p.q_stride_n + (int64_t)h * p.q_stride_h;
  const int qpos = it.kv_len - 1;
  const float qscale = p.sm_scale * HOOK_KV_SCALE(p.k_scale), vscale = HOOK_KV_SCALE(p.v_scale);
  float m = HOOK_MAX_START(NEG_INF);
  for (int j = 0; j < it.kv_len; ++j) {
    const int64_t ko = kv_token_offset(p, it.req, j, p.k_stride_page, p.k_stride_n) + (int64_t)kvh * p.k_stride_h;
    float s = 0.f;
    for (int d = 0; d < p.head_dim_qk; ++d) s += ld_dt(p.q, qoff + d, p.q_dtype) * ld<KDT>(p.k, ko + d);
    s = logit(p, s * qscale, h, kvh, j, qpos);
    if (HOOK_RAISE_MAX(s > m)) m = s;
  }
  for (int vhe = 0; vhe < VHELOOP; ++vhe) {
    const int dim = (vhe * LL4MI_NWARPS + warp) * 16 + lane;
    float l = 0.f, a = 0.f, mm = m;
    for (int j = 0; j < it.kv_len; ++j) {
      const int64_t ko = kv_token_offset(p, it.req, j, p.k_stride_page, p.k_stride_n) + (int64_t)kvh * p.k_stride_h;
      const int64_t vo = kv_token_offset(p, it.req, j, p.v_stride_page, p.v_stride_n) + (int64_t)kvh * p.v_stride_h;
      float s = 0.f;
      for (int d = 0; d < p.head_dim_qk; ++d) s += ld_dt(p.q, qoff + d, p.q_dtype) * ld<KDT>(p.k, ko + d);
      const float e = expf(logit(p, s * qscale, h, kvh, j, qpos) - mm);
      l += e;
      a += e * ld<KDT>(p.v, vo + dim);
    }
    a *= vscale;
    if (p.sinks) add_sink(p, p.sinks[h], 1, &a, mm, l);
    const int64_t o = ((int64_t)it.qo_start * p.num_qo_heads + h) * HEAD_SIZE + dim;
    // A NaN sum (a NaN logit) stays NaN: `l > 0` alone wrote 0 (values.nan_k, ll4mi).
    st_dt(p.o, o, p.o_dtype, l > 0.f || l != l ? a / l : 0.f);
  }
}
