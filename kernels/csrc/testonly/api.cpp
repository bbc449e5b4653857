// The test-only library's translation unit of kernels: the shipped api.cpp compiled with the
// fault hooks (build.py adds -DKERNELS_TEST_FAULTS and builds this file in api.cpp's place),
// plus the entry that picks the active fault. kernels_tf_fault is static to this unit, so
// the setter must live here, beside the kernels that read it.
#include <string.h>
#include "../api.cpp"

#if defined(KERNELS_PLATFORM_NVIDIA)
#define hipMemcpyToSymbol cudaMemcpyToSymbol
#define HIP_SYMBOL(x) x
#endif

// Indexed by the TF_ codes of faults.h.
static const char* const tf_names[TF_COUNT] = {
    "", "merge_no_max", "softmax_no_max", "empty_skipped", "masked_row_nan", "softcap_after_mask",
    "sink_in_numerator", "alibi_kv_head", "fp8_scale_twice", "decode_rows_at_last_position",
    "custom_mask_transposed", "page_offset_mask", "token_offset_32", "workspace_without_lse",
    "empty_merge_keeps_a", "feature_dims_qk"};

// The host's copy of the active fault, for host code in other units (plan.cpp's scheduler).
static int tf_host_fault = TF_NONE;

extern "C" {
// name "" or "none": the fixed code. Waits for nothing: call it between launches.
int kernels_testonly_set_kernel_fault(const char* name) {
  int code = -1;
  if (!name || !*name || strcmp(name, "none") == 0) code = TF_NONE;
  for (int i = 1; i < TF_COUNT && code < 0; ++i)
    if (strcmp(name, tf_names[i]) == 0) code = i;
  if (code < 0) {
    std::string known;
    for (int i = 1; i < TF_COUNT; ++i) known += std::string(i > 1 ? ", " : "") + tf_names[i];
    return kernels_fail("kernel fault %s: unknown; known: %s", name, known.c_str());
  }
  tf_host_fault = code;
#if defined(KERNELS_PLATFORM_HOST)
  kernels_tf_fault = code;
#else
  if (hipMemcpyToSymbol(HIP_SYMBOL(kernels_tf_fault), &code, sizeof code) != hipSuccess)
    return kernels_fail("kernel fault %s: could not set it on the device", name);
#endif
  return 0;
}

// The known names, comma-separated, in TF_ order.
const char* kernels_testonly_kernel_faults(void) {
  static std::string all;
  if (all.empty())
    for (int i = 1; i < TF_COUNT; ++i) all += std::string(i > 1 ? "," : "") + tf_names[i];
  return all.c_str();
}
}

// plan.cpp's hook (testonly/plan_faults.h): whether the scheduler leaves the LSEs out. Hidden:
// a link inside the library, not part of its C ABI.
extern "C" __attribute__((visibility("hidden"))) int kernels_testonly_ws_without_lse(void) { return tf_host_fault == TF_WS_WITHOUT_LSE; }
