// The one argument block every attention launch takes. kernels/_lib.py mirrors it field for
// field (ctypes.Structure): change both together.
#pragma once
#include "platform.h"

#define KERNELS_MAX_HEAD_DIM 256

typedef struct {
  // q [rows, Hq, Dqk]: token and head strides honoured, head_dim read packed.
  const void* q;
  int64_t q_stride_n, q_stride_h;
  // k/v: paged [pages, ...] (stride_page), ragged/dense [tokens, ...]; head_dim read packed.
  const void* k;
  int64_t k_stride_page, k_stride_n, k_stride_h;
  const void* v;
  int64_t v_stride_page, v_stride_n, v_stride_h;
  void* o;             // written packed: [rows, Hq, Dvo]
  float* lse;          // written packed: [rows, Hq]; null: not written
  float* partial_o;    // float workspace: [slots, Hq, Dvo]
  float* partial_lse;  // float workspace: [slots, Hq]
  // The batch (device int32). qo_indptr null: one request of qo_len/kv_len below.
  const int32_t* qo_indptr;   // [B+1]
  const int32_t* kv_indptr;   // paged: into kv_indices; ragged: into k/v rows; null: dense
  const int32_t* kv_indices;  // paged only
  const int32_t* kv_lens;     // [B]
  // The schedule (device int32) from kernels_plan; work_req null: one unsplit item per request.
  const int32_t* work_req;
  const int32_t* work_kv_lo;
  const int32_t* work_kv_hi;
  const int32_t* work_slot;     // first partial slot of the item's row 0
  const int32_t* work_nchunks;  // slots stride between rows of one request
  const int32_t* merge_indptr;  // [rows+1] slots per output row
  const int32_t* live;          // device [live work items, live rows]; null: num_work, num_rows
  int32_t num_work;   // grid size in work items
  int32_t num_rows;   // merge grid size in rows
  int32_t qo_len, kv_len;  // when qo_indptr is null
  int32_t num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo;
  int32_t page_size;  // 0: not paged
  int32_t causal, window_left;
  float sm_scale;
  int32_t q_dtype, kv_dtype, o_dtype;
  int32_t split;  // work items write partial slots, then the merge writes o/lse
  // The longest request's query rows (0: unknown). Only the prefill grid's size: its blocks
  // split each item's rows into tiles, and rows past the tiles are still strided over, so a
  // smaller value (a captured graph replayed with longer requests) costs speed, never rows.
  int32_t max_qo_len;
  // Features; zero / null is off (kernels/README.md, "Features").
  float logits_soft_cap;       // c > 0: a logit s = q.k * sm_scale becomes c * tanh(s / c)
  float k_scale, v_scale;      // dequantized k/v = stored * scale (1 when not given)
  const float* sinks;          // [Hq] fp32: one extra logit per q head, in the denominator only
  const float* alibi_slopes;   // [Hq] fp32: + slope * (key_pos - query_pos), after the soft cap
  const uint8_t* custom_mask;  // bool (non-zero: attend), each request's [qo_len, kv_len] row-major
  const int32_t* mask_indptr;  // [B+1] element offset of each request's mask; null: offset 0
} AttnParams;
