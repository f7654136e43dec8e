// What the decode step's elementwise kernels (rms_norm.cu, silu_mul.cu) share.
#pragma once
#include "../common.cuh"

namespace lowbit {
namespace step {

// Two fp16 / bf16 values packed in 32 bits, lo first (the inverse of to_float2).
template <typename T>
__device__ __forceinline__ uint32_t pack2(T lo, T hi) {
    return uint32_t(reinterpret_cast<const uint16_t&>(lo)) | (uint32_t(reinterpret_cast<const uint16_t&>(hi)) << 16);
}

// A 1-D launch, with the programmatic-serialization attribute when pdl. The kernels wait for their
// predecessor first and trigger their dependents right after (common.cuh: pdl_wait) -- or, "early", trigger
// at entry: the next kernel then starts while this one's predecessor still runs (a GEMV loads its first
// weights during the previous GEMV's tail instead of during this short kernel only). Safe only when the next
// kernel waits for this one before it touches anything written before (lowbit's GEMVs do: they read only
// constant weights before their wait), since this one completes only after its own wait.
struct Launch1 {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    Launch1(unsigned grid, int threads, void* stream, int pdl) {
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(threads);
        cfg.stream = static_cast<cudaStream_t>(stream);
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = pdl ? 1 : 0;
    }
};

inline bool aligned16(const void* a, const void* b, const void* c) {
    return ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) | reinterpret_cast<uintptr_t>(c)) & 15) == 0;
}

}  // namespace step
}  // namespace lowbit
