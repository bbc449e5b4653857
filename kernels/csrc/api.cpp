// The C ABI. Every entry point returns 0 or a non-zero status whose message
// kernels_last_error() returns. The shims launch; every input check lives in kernels/guards.py.
#include <stdarg.h>
#include <stdio.h>
#include <string>
#include "attention.h"
#include "errors.h"
#include "merge.h"

static thread_local std::string g_error;

int kernels_fail(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  g_error = buf;
  return 1;
}

// On the host kernels_launch_error() is always null (platform.h): the failure arm is a GPU
// build's only, no host input reaches it.
static int launched(const char* what) {
  const char* e = kernels_launch_error();
  return e ? kernels_fail("%s: launch failed: %s", what, e) : 0;
}

static bool dtype_ok(int dt) { return dt == DT_F32 || dt == DT_F16 || dt == DT_BF16; }
static bool kv_dtype_ok(int dt) { return dtype_ok(dt) || dt == DT_E4M3 || dt == DT_E5M2; }

static int check_params(const AttnParams* p, const char* what) {
  // Never null from Python: _launch.py passes its AttnParams by reference. Other C callers only.
  if (!p) return kernels_fail("%s: null params", what);
  // Unknown codes: guards.dtype_supported (q, out) and fp8_kv_route (the cache) refuse every
  // other dtype first; only --disable-guards (or another C caller) reaches the failure arm.
  if (!dtype_ok(p->q_dtype) || !kv_dtype_ok(p->kv_dtype) || !dtype_ok(p->o_dtype))
    return kernels_fail("%s: unknown dtype code (q %d, kv %d, o %d)", what, p->q_dtype, p->kv_dtype, p->o_dtype);
  return 0;
}

static inline unsigned cdiv(int64_t a, int64_t b) { return (unsigned)((a + b - 1) / b); }

#define DISPATCH_KV(dt, ...)                                            \
  switch (dt) {                                                         \
    case DT_F32: { constexpr int KDT = DT_F32; __VA_ARGS__; } break;   \
    case DT_F16: { constexpr int KDT = DT_F16; __VA_ARGS__; } break;   \
    case DT_E4M3: { constexpr int KDT = DT_E4M3; __VA_ARGS__; } break; \
    case DT_E5M2: { constexpr int KDT = DT_E5M2; __VA_ARGS__; } break; \
    default: { constexpr int KDT = DT_BF16; __VA_ARGS__; } break;      \
  }

// num_rows 0: a split batch of no query rows (edge_rows no_rows_split). num_qo_heads 0: a q
// with no heads, which has no reference (harness/model/reference.py NoReference), so no case
// sends it; the test keeps an empty grid dimension from the launch.
static void launch_merge(const AttnParams& a, void* stream) {
  if (a.split && a.num_rows > 0 && a.num_qo_heads > 0)
    LAUNCH(merge_partials_kernel, dim3(cdiv(a.num_rows, 64), a.num_qo_heads), dim3(64), stream, a);
}

extern "C" {

const char* kernels_last_error(void) { return g_error.c_str(); }
const char* kernels_platform(void) { return KERNELS_PLATFORM_NAME; }
int kernels_warp_size(void) { return KERNELS_WARP_SIZE; }
int kernels_params_size(void) { return (int)sizeof(AttnParams); }

// fa2 prefill (single, paged, ragged; tensor-core decode): grid (work items, Hq, row tiles).
// One tile of 64 rows per block: a long request's rows spread over the device instead of
// queueing behind 64 threads (4096 rows x 64k kv took 26 s on an H200 with one tile).
// The tile count is clamped at 4096 (grid z) past 262,144 query rows in one request: 2^18
// rows x the kv they see is beyond what the host's ci (or full) profile runs, so no case
// reaches the clamp. num_work is 0 only for a batch of no requests, and num_qo_heads 0 only
// for a q without heads: no case describes either (model/problem.py: qo_lens is a non-empty
// list, num_qo_heads >= 1), here or in the decode shims below.
int kernels_prefill(const AttnParams* p, void* stream) {
  if (int e = check_params(p, "prefill")) return e;
  const AttnParams a = *p;
  const int tiles = a.max_qo_len > 64 ? (int)(cdiv(a.max_qo_len, 64) < 4096 ? cdiv(a.max_qo_len, 64) : 4096) : 1;
  if (a.num_work > 0 && a.num_qo_heads > 0)
    DISPATCH_KV(a.kv_dtype, LAUNCH(prefill_kernel<KDT>, dim3(a.num_work, a.num_qo_heads, tiles), dim3(64), stream, a));
  launch_merge(a, stream);
  return launched("prefill");
}

// fa2 decode (single, batch, the aiter route): a request's few query rows, threads over heads.
int kernels_decode(const AttnParams* p, void* stream) {
  if (int e = check_params(p, "decode")) return e;
  const AttnParams a = *p;
  if (a.num_work > 0 && a.num_qo_heads > 0)
    DISPATCH_KV(a.kv_dtype, LAUNCH(decode_kernel<KDT>, dim3(a.num_work, cdiv(a.num_qo_heads, 32)), dim3(32), stream, a));
  launch_merge(a, stream);
  return launched("decode");
}

// ll4mi-style paged decode: unsplit, no LSE, no window.
int kernels_ll4mi_decode(const AttnParams* p, void* stream) {
  if (int e = check_params(p, "ll4mi_decode")) return e;
  const AttnParams a = *p;
  if (a.num_work > 0 && a.num_qo_heads > 0)
    DISPATCH_KV(a.kv_dtype, LAUNCH(ll4mi_decode_kernel<KDT>, dim3(a.num_work, a.num_qo_heads),
                                   dim3(LL4MI_NWARPS * KERNELS_WARP_SIZE), stream, a));
  return launched("ll4mi_decode");
}

// Unknown dtype: guards.dtype_supported refuses it in merge.py first (--disable-guards only).
// n 0: a merge over no rows (edge_rows no_rows_*).
int kernels_merge_state(const void* va, const float* sa, const void* vb, const float* sb, void* vo,
                        float* so, int64_t rows, int heads, int dim, int dtype, void* stream) {
  if (!dtype_ok(dtype)) return kernels_fail("merge_state: unknown dtype code %d", dtype);
  const int64_t n = rows * heads;
  if (n > 0)
    LAUNCH(merge_state_kernel, dim3(cdiv(n, 128)), dim3(128), stream, va, sa, vb, sb, vo, so, rows, heads, dim, dtype);
  return launched("merge_state");
}

int kernels_merge_state_in_place(void* v, float* s, const void* vo, const float* so, int64_t num_rows,
                                 const int32_t* live_rows, int heads, int dim, int dtype, void* stream) {
  if (!dtype_ok(dtype)) return kernels_fail("merge_state_in_place: unknown dtype code %d", dtype);
  const int64_t n = num_rows * heads;
  if (n > 0)
    LAUNCH(merge_state_in_place_kernel, dim3(cdiv(n, 128)), dim3(128), stream, v, s, vo, so, num_rows, live_rows, heads,
           dim, dtype);
  return launched("merge_state_in_place");
}

}  // extern "C"

extern "C" {
// Element conversion on host memory with the kernels' own fp16/bf16 routines (tests check
// them against torch bit for bit).
// No wrapper calls it, so a check never does: tests/test_kernels_build.py is its only caller.
int kernels_convert_host(const void* in, int in_dtype, void* out, int out_dtype, int64_t n) {
  if (!dtype_ok(in_dtype) || !dtype_ok(out_dtype)) return kernels_fail("convert: unknown dtype code");
  for (int64_t i = 0; i < n; ++i) st_dt(out, i, out_dtype, ld_dt(in, i, in_dtype));
  return 0;
}
}
