// Memory-bandwidth probe: stream a buffer once with 16-byte loads, as a decode GEMV streams
// its weights. The benchmark harness uses it to measure the GPU's achievable read bandwidth,
// the denominator of every "% of bandwidth" figure.
#include "common.cuh"
#include "lowbit.h"

namespace lowbit {

// Mode bit 0 picks the load: evict-first streaming (__ldcs), or the GEMV's load (L1 bypass + L2
// fetches the surrounding 256 bytes). Bit 1 picks the walk: grid-stride (every CTA touches the
// whole buffer), or one contiguous slice per CTA (as a GEMV's CTA walks its rows). The harness
// takes the best: a probe slower than the kernels it is the denominator for would flatter them.
template <bool PF>
__device__ __forceinline__ uint4 probe_load(const uint4* p) {
    if constexpr (PF) return ld_stream<true>(p);  // common.cuh, as the dense GEMV loads weights
    return __ldcs(p);
}

template <bool PF, bool SLICE>
__global__ void __launch_bounds__(512) read_bw_kernel(const uint4* __restrict__ src, int64_t n_vec,
                                                     uint32_t* __restrict__ sink) {
    constexpr int kUnroll = 4;  // independent 16-byte loads in flight per thread
    uint32_t acc = 0;
    int64_t begin = 0, end = n_vec, i, stride;
    if constexpr (SLICE) {
        const int64_t per = (n_vec + gridDim.x - 1) / gridDim.x;
        begin = min(n_vec, per * blockIdx.x);
        end = min(n_vec, begin + per);
        i = begin + threadIdx.x;
        stride = blockDim.x;
    } else {
        i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
        stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    }
    for (; i + (kUnroll - 1) * stride < end; i += kUnroll * stride) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = probe_load<PF>(src + i + u * stride);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < end; i += stride) {
        const uint4 v = probe_load<PF>(src + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    // A store the compiler can't rule out keeps the loads alive; it (almost) never happens. (An
    // atomic per warp did: with tens of thousands of CTAs they serialized on one L2 address.)
    if (acc == 0x9e3779b9u) *sink = acc;
}

// Copy probe: the read+write counterpart (dequantize reads little and writes a lot).
__global__ void __launch_bounds__(512) copy_bw_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                     int64_t n_vec) {
    constexpr int kUnroll = 4;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; i + (kUnroll - 1) * stride < n_vec; i += kUnroll * stride) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(src + i + u * stride);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) __stcs(dst + i + u * stride, v[u]);
    }
    for (; i < n_vec; i += stride) __stcs(dst + i, __ldcs(src + i));
}

}  // namespace lowbit

extern "C" int lowbit_read_bw(const void* src, int64_t n_bytes, void* sink, int grid, int mode, void* stream) {
    const int64_t n_vec = n_bytes / 16;
    auto* s = static_cast<cudaStream_t>(stream);
    auto* in = static_cast<const uint4*>(src);
    auto* out = static_cast<uint32_t*>(sink);
    switch (mode) {
        case 0: lowbit::read_bw_kernel<false, false><<<grid, 512, 0, s>>>(in, n_vec, out); break;
        case 1: lowbit::read_bw_kernel<true, false><<<grid, 512, 0, s>>>(in, n_vec, out); break;
        case 2: lowbit::read_bw_kernel<false, true><<<grid, 512, 0, s>>>(in, n_vec, out); break;
        case 3: lowbit::read_bw_kernel<true, true><<<grid, 512, 0, s>>>(in, n_vec, out); break;
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
    return static_cast<int>(cudaGetLastError());
}

extern "C" int lowbit_copy_bw(const void* src, void* dst, int64_t n_bytes, int grid, void* stream) {
    lowbit::copy_bw_kernel<<<grid, 512, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const uint4*>(src), static_cast<uint4*>(dst), n_bytes / 16);
    return static_cast<int>(cudaGetLastError());
}
