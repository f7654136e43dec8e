// RMSNorm of a decode step's rows, as transformers' LlamaRMSNorm computes it:
//   y[r, :] = w * T(x[r, :] * rsqrt(mean(x[r, :]^2) + eps))     (fp32 inside; T rounds, then w * it rounds)
// Why lowbit has it: under programmatic dependent launch (PDL) each kernel of the step lets the next one
// start once it has waited for its own predecessor. Inductor's Triton kernels trigger only after their
// last load, so the GEMV after a Triton norm starts late; this kernel triggers right after its wait, and
// the next projection's GEMV loads its first weights while the norm runs
// (benchmarks/journal/2026-11-25_decode_layer_in_lowbit_kernels.md).
// One CTA per row: a decode step has 1-8 rows of a few thousand elements, a few microseconds of
// latency-bound work in any layout.
#include "step.cuh"

namespace lowbit {
namespace step {

constexpr int kNormThreads = 256;

// Sum of v over the CTA (every thread gets it).
__device__ __forceinline__ float cta_sum(float v) {
    __shared__ float part[kNormThreads / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kNormThreads / 32; ++i) s += part[i];
    return s;
}

// VEC: rows of a multiple of 8 elements at 16-byte aligned addresses, read 8 at a time.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                                T* __restrict__ y, int n, float eps, bool early) {
    if (early) pdl_launch_dependents();  // step.cuh: only where the next kernel waits for this one
    pdl_wait();  // x is the previous kernel's output
    if (!early) pdl_launch_dependents();
    const T* xr = x + int64_t(blockIdx.x) * n;
    T* yr = y + int64_t(blockIdx.x) * n;
    float ss = 0.f;
    if constexpr (VEC) {
        for (int i = threadIdx.x * 8; i < n; i += kNormThreads * 8) {
            const uint4 v = ld_x(reinterpret_cast<const uint4*>(xr + i));
            const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float2 f = to_float2<T>(u[j]);
                ss += f.x * f.x + f.y * f.y;
            }
        }
    } else {
        for (int i = threadIdx.x; i < n; i += kNormThreads) {
            const float f = to_float(xr[i]);
            ss += f * f;
        }
    }
    const float r = rsqrtf(cta_sum(ss) / n + eps);
    // second pass: the row is in L1 now
    if constexpr (VEC) {
        for (int i = threadIdx.x * 8; i < n; i += kNormThreads * 8) {
            const uint4 v = ld_x(reinterpret_cast<const uint4*>(xr + i));
            const uint4 wv = *reinterpret_cast<const uint4*>(w + i);
            const uint32_t u[4] = {v.x, v.y, v.z, v.w}, wu[4] = {wv.x, wv.y, wv.z, wv.w};
            uint32_t o[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float2 f = to_float2<T>(u[j]), g = to_float2<T>(wu[j]);
                o[j] = pack2<T>(from_float<T>(g.x * to_float(from_float<T>(f.x * r))),
                                from_float<T>(g.y * to_float(from_float<T>(f.y * r))));
            }
            *reinterpret_cast<uint4*>(yr + i) = make_uint4(o[0], o[1], o[2], o[3]);
        }
    } else {
        for (int i = threadIdx.x; i < n; i += kNormThreads)
            yr[i] = from_float<T>(to_float(w[i]) * to_float(from_float<T>(to_float(xr[i]) * r)));
    }
}

template <typename T>
int launch_rms_norm(const void* x, const void* w, void* y, int rows, int n, float eps, int flags, void* stream) {
    if (rows < 1 || n < 1) return static_cast<int>(cudaErrorInvalidValue);
    const bool vec = n % 8 == 0 && aligned16(x, w, y);
    Launch1 l(rows, kNormThreads, stream, flags & 1);
    const cudaError_t err = vec ? cudaLaunchKernelEx(&l.cfg, rms_norm_kernel<T, true>, static_cast<const T*>(x),
                                                     static_cast<const T*>(w), static_cast<T*>(y), n, eps, (flags & 2) != 0)
                                : cudaLaunchKernelEx(&l.cfg, rms_norm_kernel<T, false>, static_cast<const T*>(x),
                                                     static_cast<const T*>(w), static_cast<T*>(y), n, eps, (flags & 2) != 0);
    if (err != cudaSuccess) return static_cast<int>(err);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace step
}  // namespace lowbit

// x, w, y: [rows, n] rows back to back (w: [n]), fp16/bf16; flags bit 0: launch with PDL, bit 1: trigger the
// next kernel at entry (step.cuh).
#define LOWBIT_DEFINE_RMS_NORM(NAME, TYPE)                                                                       \
    extern "C" int lowbit_rms_norm_##NAME(const void* x, const void* w, void* y, int rows, int n, float eps,      \
                                          int flags, void* stream) {                                             \
        return lowbit::step::launch_rms_norm<TYPE>(x, w, y, rows, n, eps, flags, stream);                        \
    }
LOWBIT_DEFINE_RMS_NORM(fp16, __half)
LOWBIT_DEFINE_RMS_NORM(bf16, __nv_bfloat16)
