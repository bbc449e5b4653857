// Injected failures for the harness's own tests (kernels/testonly.py, KERNELS_TESTONLY=1):
// each one is what a broken kernel does to the process.
#include <stdlib.h>
#include <string.h>
#if defined(KERNELS_PLATFORM_HOST)
#include <unistd.h>
#endif
#include "errors.h"
#include "platform.h"
#include "testonly.h"

__global__ void testonly_divide_kernel(volatile int* out, int divisor) { out[threadIdx.x] = 1000 / divisor; }
__global__ void testonly_spin_kernel(volatile int* flag) {
  while (*flag == 0) {
#if defined(KERNELS_PLATFORM_HOST)
    // Never returns all the same; on the host it yields its core meanwhile, so a test of the
    // harness's hang handling does not spin one of two cores until its timeout fires.
    usleep(1000);
#endif
  }
}

enum { FAULT_SIGFPE = 1, FAULT_SIGSEGV = 2, FAULT_ABORT = 3, FAULT_HANG = 4 };

extern "C" int kernels_testonly_fault(int kind, int divisor, void* flag, void* stream) {
  static volatile int sink[64];
  volatile int d = divisor;
  switch (kind) {
    case FAULT_SIGFPE:
#if defined(KERNELS_PLATFORM_HOST)
      LAUNCH(testonly_divide_kernel, dim3(1), dim3(1), stream, sink, d);
#else
      sink[0] = 1000 / d;  // the host side of a GPU build: a device divide does not trap
#endif
      return 0;
    case FAULT_SIGSEGV: {
      volatile int* p = (volatile int*)(intptr_t)divisor;
      *p = 1;
      return 0;
    }
    case FAULT_ABORT:
      abort();
    case FAULT_HANG:
      LAUNCH(testonly_spin_kernel, dim3(1), dim3(1), stream, (volatile int*)flag);
      return 0;
  }
  return kernels_fail("testonly: unknown fault %d", kind);
}

int kernels_testonly_kernel_fault(int* fault) {
  // Indexed by the TF_ codes of testonly.h.
  static const char* const names[] = {"", "merge_no_max", "softmax_no_max", "empty_skipped",
                                      "masked_row_nan"};
  *fault = TF_NONE;
  const char* want = getenv("KERNELS_TESTONLY_FAULT");
  if (!want || !*want) return 0;
  const char* allowed = getenv("KERNELS_TESTONLY");
  if (!allowed || strcmp(allowed, "1") != 0)
    return kernels_fail("KERNELS_TESTONLY_FAULT=%s: set KERNELS_TESTONLY=1 to reach injected faults", want);
  for (int i = 1; i < (int)(sizeof names / sizeof names[0]); ++i)
    if (strcmp(want, names[i]) == 0) {
      *fault = i;
      return 0;
    }
  return kernels_fail("KERNELS_TESTONLY_FAULT=%s: unknown; known: merge_no_max, softmax_no_max, "
                      "empty_skipped, masked_row_nan", want);
}
