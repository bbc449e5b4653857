// Injected crashes for the harness's own tests (kernels/testonly.py, refused there unless
// KERNELS_TESTONLY=1): each one is what a broken kernel does to the process. Nothing here
// runs unless called, so the shipped library keeps them; kernel faults (wrong answers) live
// only in the test-only library (csrc/testonly/).
#include <stdlib.h>
#if defined(KERNELS_PLATFORM_HOST)
#include <unistd.h>
#endif
#include "errors.h"
#include "platform.h"

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
