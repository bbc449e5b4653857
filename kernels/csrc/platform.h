// One HIP source, three platforms. KERNELS_PLATFORM_{HOST,NVIDIA,AMD} is set by kernels/build.py.
//
// host:   g++ -fopenmp. Kernels are plain functions; LAUNCH runs OpenMP over blocks and a plain
//         loop over the threads of a block. That only works because no kernel uses
//         __syncthreads or shared memory: keep it that way.
// nvidia: nvcc -x cu. hip* host calls map to cuda*.
// amd:    hipcc -x hip, or clang++-19/22 -x hip (build.py picks per arch). Wavefronts are 64
//         lanes on every gfx9 data-centre part (gfx90a, gfx940, gfx942, gfx950); code that
//         cares reads KERNELS_WARP_SIZE, never a literal 32 or 64.
#pragma once
#include <stdint.h>

#if defined(KERNELS_PLATFORM_HOST)
#include <omp.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
inline thread_local dim3 blockIdx, threadIdx, blockDim, gridDim;

typedef void* kernels_stream_t;
#define KERNELS_WARP_SIZE 64  // the host emulates AMD's wave64 so the ll4mi loop runs its real shape

// Blocks in parallel, threads of a block one after another. Arguments are re-evaluated per
// thread, so pass plain values.
#define LAUNCH(kernel, grid, block, stream, ...)                                              \
  do {                                                                                         \
    const dim3 g_ = (grid), b_ = (block);                                                      \
    const long long nblocks_ = (long long)g_.x * g_.y * g_.z;                                  \
    (void)(stream);                                                                            \
    _Pragma("omp parallel for schedule(dynamic, 1)")                                           \
    for (long long blk_ = 0; blk_ < nblocks_; ++blk_) {                                        \
      gridDim = g_; blockDim = b_;                                                             \
      blockIdx = dim3((unsigned)(blk_ % g_.x), (unsigned)((blk_ / g_.x) % g_.y),               \
                      (unsigned)(blk_ / ((long long)g_.x * g_.y)));                            \
      for (unsigned tz_ = 0; tz_ < b_.z; ++tz_)                                                \
        for (unsigned ty_ = 0; ty_ < b_.y; ++ty_)                                              \
          for (unsigned tx_ = 0; tx_ < b_.x; ++tx_) {                                          \
            threadIdx = dim3(tx_, ty_, tz_);                                                   \
            kernel(__VA_ARGS__);                                                               \
          }                                                                                    \
    }                                                                                          \
  } while (0)

static inline const char* kernels_launch_error() { return nullptr; }
#define KERNELS_PLATFORM_NAME "host"

#elif defined(KERNELS_PLATFORM_NVIDIA)
#include <cuda_runtime.h>
typedef cudaStream_t hipStream_t;
#define hipSuccess cudaSuccess
#define hipError_t cudaError_t
#define hipGetLastError cudaGetLastError
#define hipGetErrorString cudaGetErrorString
typedef cudaStream_t kernels_stream_t;
#define KERNELS_WARP_SIZE 32
#define LAUNCH(kernel, grid, block, stream, ...) \
  kernel<<<(grid), (block), 0, (cudaStream_t)(stream)>>>(__VA_ARGS__)
#define KERNELS_PLATFORM_NAME "nvidia"

#elif defined(KERNELS_PLATFORM_AMD)
// clang 22 no longer predefines __AMDGCN_WAVEFRONT_SIZE; older HIP headers (Debian's 5.2 among
// them) still read it for warpSize. Give them what clang 19 gives: 32 on RDNA (gfx10-12) device
// passes, 64 on gfx9 device passes and on the host pass.
#if !defined(__AMDGCN_WAVEFRONT_SIZE)
#if defined(__HIP_DEVICE_COMPILE__) && (defined(__GFX10__) || defined(__GFX11__) || defined(__GFX12__))
#define __AMDGCN_WAVEFRONT_SIZE 32
#else
#define __AMDGCN_WAVEFRONT_SIZE 64
#endif
#endif
#include <hip/hip_runtime.h>
typedef hipStream_t kernels_stream_t;
// A logical warp, the same number in the host pass (launch shapes) and every device pass, so
// not the hardware wave size: gfx9 (gfx90a/gfx940/gfx942/gfx950) runs wave64 and RDNA wave32.
// No kernel uses cross-lane operations (__shfl, ballots, wave reductions), so a logical warp of
// 64 is correct on wave32 parts too, as two hardware waves.
#define KERNELS_WARP_SIZE 64
#define LAUNCH(kernel, grid, block, stream, ...) \
  hipLaunchKernelGGL(kernel, (grid), (block), 0, (hipStream_t)(stream), __VA_ARGS__)
#define KERNELS_PLATFORM_NAME "amd"

#else
#error "build with -DKERNELS_PLATFORM_HOST, -DKERNELS_PLATFORM_NVIDIA or -DKERNELS_PLATFORM_AMD"
#endif

#if !defined(KERNELS_PLATFORM_HOST)
// Launches are asynchronous; only configuration errors are caught here (no sync in the library).
static inline const char* kernels_launch_error() {
  hipError_t e = hipGetLastError();
  return e == hipSuccess ? nullptr : hipGetErrorString(e);
}
#endif
