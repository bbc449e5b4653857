// Test-only kernel faults (kernels/testonly.py). KERNELS_TESTONLY_FAULT=<name>, honoured only
// with KERNELS_TESTONLY=1, makes the real kernels take the path a known class of bug takes, so
// the harness's tests can show which generated inputs catch it. Unset: TF_NONE, the fixed code.
#pragma once

enum {
  TF_NONE = 0,
  TF_MERGE_NO_MAX,     // merges weight each state by exp(lse) without subtracting the larger lse
  TF_SOFTMAX_NO_MAX,   // the online softmax sums exp(logit) without a running max
  TF_EMPTY_SKIPPED,    // a kernel returns early for a request with kv_len 0, writing nothing
  TF_MASKED_ROW_NAN,   // a row that attends to nothing is written as 0 / 0
};

// Reads the environment: 0 with *fault set, or a non-zero status (kernels_fail) for an unknown
// name, or a fault named without KERNELS_TESTONLY=1.
int kernels_testonly_kernel_fault(int* fault);
