// Helpers shared by every lowbit kernel family.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace lowbit {

constexpr unsigned kFullMask = 0xffffffffu;

// E4M4 absmax byte -> float, exact (see lowbit/formats/e4m4.py: bias 15, subnormals at e=0).
// value = mant * 2^(max(e,1) - 19), mant = m + (e ? 16 : 0). Built from bits: no table,
// no branch, 5 integer ops + 1 multiply.
__device__ __forceinline__ float decode_e4m4(uint32_t code) {
    const uint32_t e = code >> 4;
    const uint32_t mant = (code & 15u) | (e ? 16u : 0u);
    const uint32_t exp = (e ? e : 1u) - 19u + 127u;  // biased fp32 exponent of 2^(e' - 19)
    return __uint_as_float(exp << 23) * static_cast<float>(mant);
}

// Output conversion, round-to-nearest-even like torch's .to(dtype).
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace lowbit
