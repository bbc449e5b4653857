// The split-KV scheduler, run on the host at plan() time (like FlashInfer's PrefillPlan).
//
// A request of kv_len tokens becomes ceil(kv_len / chunk) work items (at least one). When any
// request has more than one, or the caller forces it (CUDA-graph mode), every item writes fp32
// partial rows into the float workspace and a merge combines them; the partial slot of
// (request r, row i, chunk j) is base_r + i * chunks_r + j, so a row's slots are contiguous.
//
// The schedule is int32, laid out for capacities Wc (work items) and Rc (rows):
//   work_req[Wc] work_kv_lo[Wc] work_kv_hi[Wc] work_slot[Wc] work_nchunks[Wc]
//   merge_indptr[Rc + 1] live[2]
#include <stdint.h>
#include <vector>
#include "errors.h"
#include "params.h"

// The scheduler's hook (host code; the kernels' hooks are in hooks.h): the floats a partial
// row takes in the float workspace, its output and its LSE. The test-only build may drop one.
#if defined(KERNELS_TEST_FAULTS)
#include "testonly/plan_faults.h"
#else
#define HOOK_WS_ROW_FLOATS(dvo) ((int64_t)(dvo) + 1)
#endif

enum { INFO_NUM_WORK, INFO_SPLIT, INFO_NUM_SLOTS, INFO_WS_BYTES, INFO_CHUNK, INFO_TOTAL_ROWS, INFO_LEN };

extern "C" int64_t kernels_schedule_len(int64_t work_capacity, int64_t row_capacity) {
  return 5 * work_capacity + row_capacity + 3;
}

// sched null: only fill info (sizes), so the caller can allocate.
// work_limit > 0: grow the chunk until the item count fits (a fixed graph grid).
extern "C" int kernels_plan(const int32_t* qo_indptr, const int32_t* kv_lens, int batch,
                            int num_qo_heads, int head_dim_vo, int max_kv_chunk, int work_limit,
                            int force_split, int64_t float_workspace_bytes, int32_t* sched,
                            int64_t work_capacity, int64_t row_capacity, int64_t* info) {
  // _plan.py passes len(kv_lens) (never negative) and a chunk guards.max_kv_chunk_positive
  // has checked (or its default): both arms are for other C callers and --disable-guards.
  if (batch < 0) return kernels_fail("plan(): batch size is %d", batch);
  if (max_kv_chunk <= 0) return kernels_fail("plan(): max_kv_chunk is %d, must be positive", max_kv_chunk);
  int64_t chunk = max_kv_chunk;
  auto chunks_of = [&](int r) -> int64_t {
    const int64_t n = (kv_lens[r] + chunk - 1) / chunk;
    return n < 1 ? 1 : n;
  };
  int64_t num_work = 0;
  for (;;) {
    num_work = 0;
    for (int r = 0; r < batch; ++r) num_work += chunks_of(r);
    if (work_limit <= 0 || num_work <= work_limit) break;  // past it: graph_replan kv_outgrows_work
    // The refusal is unreachable from Python: guards.graph_capacity keeps a re-plan's batch at
    // the first plan's, whose work_limit is at least GRAPH_WORK_PER_REQUEST (4) items a request
    // (_plan.py), so num_work > work_limit always means more than one item a request.
    if (num_work <= batch) return kernels_fail("plan(): batch of %d requests exceeds the %d work items fixed by the first plan()", batch, work_limit);
    chunk *= 2;
  }
  bool split = force_split != 0;
  for (int r = 0; r < batch && !split; ++r) split = chunks_of(r) > 1;
  // batch 0: a plan of no requests, which no case describes (model/problem.py: non-empty lens).
  const int64_t total_rows = batch > 0 ? qo_indptr[batch] - qo_indptr[0] : 0;
  int64_t slots = 0;
  if (split)
    for (int r = 0; r < batch; ++r) slots += (int64_t)(qo_indptr[r + 1] - qo_indptr[r]) * chunks_of(r);
  const int64_t ws = split ? slots * num_qo_heads * HOOK_WS_ROW_FLOATS(head_dim_vo) * 4 : 0;
  info[INFO_NUM_WORK] = num_work;
  info[INFO_SPLIT] = split;
  info[INFO_NUM_SLOTS] = slots;
  info[INFO_WS_BYTES] = ws;
  info[INFO_CHUNK] = chunk;
  info[INFO_TOTAL_ROWS] = total_rows;
  if (!sched) return 0;
  if (ws > float_workspace_bytes)
    return kernels_fail("plan(): float_workspace_buffer is %lld bytes but the schedule needs %lld "
                        "(%lld partial rows at max_kv_chunk %lld)",
                        (long long)float_workspace_bytes, (long long)ws, (long long)slots, (long long)chunk);
  // Never from Python: _plan.py sizes the buffers from this plan's own info, or (graph mode)
  // passes work_limit = work_capacity and guards.graph_capacity refuses rows past row_capacity.
  if (num_work > work_capacity || total_rows > row_capacity)
    return kernels_fail("plan(): schedule of %lld work items and %lld rows exceeds its buffer (%lld, %lld)",
                        (long long)num_work, (long long)total_rows, (long long)work_capacity, (long long)row_capacity);
  const int64_t W = work_capacity;
  int32_t *req = sched, *lo = sched + W, *hi = sched + 2 * W, *slot = sched + 3 * W, *nch = sched + 4 * W;
  int32_t* merge = sched + 5 * W;
  int32_t* live = merge + row_capacity + 1;
  int64_t w = 0, base = 0;
  for (int r = 0; r < batch; ++r) {
    const int64_t c = chunks_of(r), qlen = qo_indptr[r + 1] - qo_indptr[r];
    for (int64_t j = 0; j < c; ++j, ++w) {
      req[w] = r;
      lo[w] = (int32_t)(j * chunk);
      hi[w] = (int32_t)((j + 1) * chunk < kv_lens[r] ? (j + 1) * chunk : kv_lens[r]);
      slot[w] = split ? (int32_t)(base + j) : -1;
      nch[w] = (int32_t)c;
    }
    if (split) {
      for (int64_t i = 0; i < qlen; ++i) merge[qo_indptr[r] - qo_indptr[0] + i] = (int32_t)(base + i * c);
      base += qlen * c;
    }
  }
  merge[total_rows] = (int32_t)base;
  live[0] = (int32_t)num_work;
  live[1] = (int32_t)total_rows;
  return 0;
}
