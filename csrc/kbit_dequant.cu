// kbit dequantize: bit-plane blocks -> fp32 / fp16 / bf16 rows.
//
// One thread owns one 32-element block: it reads the block's BITS plane words and absmax
// byte, rebuilds each element's code bit by bit, and looks the code up in a codebook held
// one entry per lane (2^BITS <= 32), so the lookup is a register shuffle, not a memory load.
// The arithmetic order matches lowbit.formats.kbit.dequantize_reference exactly:
//   block_scale = e4m4(absmax) * scale;  value = codebook[code] * block_scale  (fp32, RN).
#include "common.cuh"
#include "lowbit.h"

namespace lowbit {

template <int BITS, typename T>
__global__ void __launch_bounds__(256) kbit_dequant_kernel(const uint32_t* __restrict__ planes,
                                                          const uint8_t* __restrict__ absmax,
                                                          const float* __restrict__ codebook,
                                                          const float* __restrict__ scale_ptr,
                                                          T* __restrict__ out, int64_t n_blocks) {
    static_assert(BITS >= 2 && BITS <= 5, "kbit supports 2..5 bits");
    const int lane = threadIdx.x & 31;
    const float cb = lane < (1 << BITS) ? codebook[lane] : 0.0f;
    const float scale = *scale_ptr;
    constexpr int kPerVec = 16 / sizeof(T);  // elements per 16-byte store

    // Grid-stride over blocks; `base` is warp-uniform so every lane reaches each shuffle.
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x; base < n_blocks; base += stride) {
        const int64_t blk = base + threadIdx.x;
        const bool active = blk < n_blocks;
        uint32_t w[BITS];
        float block_scale = 0.0f;
        if (active) {
#pragma unroll
            for (int b = 0; b < BITS; ++b) w[b] = planes[blk * BITS + b];
            block_scale = decode_e4m4(absmax[blk]) * scale;
        } else {
#pragma unroll
            for (int b = 0; b < BITS; ++b) w[b] = 0;
        }
        uint4* dst = reinterpret_cast<uint4*>(out + blk * 32);
#pragma unroll
        for (int v = 0; v < 32 / kPerVec; ++v) {
            union {
                uint4 u;
                T t[kPerVec];
            } pack;
#pragma unroll
            for (int i = 0; i < kPerVec; ++i) {
                const int j = v * kPerVec + i;
                uint32_t code = 0;
#pragma unroll
                for (int b = 0; b < BITS; ++b) code |= ((w[b] >> j) & 1u) << b;
                pack.t[i] = from_float<T>(__shfl_sync(kFullMask, cb, code) * block_scale);
            }
            if (active) dst[v] = pack.u;
        }
    }
}

template <int BITS, typename T>
int launch_kbit_dequant(const uint32_t* planes, const uint8_t* absmax, const float* codebook,
                        const float* scale, void* out, int64_t n_blocks, void* stream) {
    if (n_blocks <= 0) return 0;
    constexpr int kThreads = 256;
    const int64_t want = (n_blocks + kThreads - 1) / kThreads;
    const unsigned grid = static_cast<unsigned>(want < 65535 * 32 ? want : 65535 * 32);
    kbit_dequant_kernel<BITS, T><<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        planes, absmax, codebook, scale, static_cast<T*>(out), n_blocks);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace lowbit

#define LOWBIT_DEFINE_KBIT_DEQUANT(BITS, NAME, TYPE)                                          \
    extern "C" int lowbit_kbit_dequant_b##BITS##_##NAME(const uint32_t* planes,               \
                                                        const uint8_t* absmax,                \
                                                        const float* codebook,                \
                                                        const float* scale, void* out,        \
                                                        int64_t n_blocks, void* stream) {     \
        return lowbit::launch_kbit_dequant<BITS, TYPE>(planes, absmax, codebook, scale, out,  \
                                                       n_blocks, stream);                     \
    }
#define LOWBIT_DEFINE_KBIT_DEQUANT_ALL_DTYPES(BITS)      \
    LOWBIT_DEFINE_KBIT_DEQUANT(BITS, fp32, float)        \
    LOWBIT_DEFINE_KBIT_DEQUANT(BITS, fp16, __half)       \
    LOWBIT_DEFINE_KBIT_DEQUANT(BITS, bf16, __nv_bfloat16)
LOWBIT_DEFINE_KBIT_DEQUANT_ALL_DTYPES(2)
LOWBIT_DEFINE_KBIT_DEQUANT_ALL_DTYPES(3)
LOWBIT_DEFINE_KBIT_DEQUANT_ALL_DTYPES(4)
LOWBIT_DEFINE_KBIT_DEQUANT_ALL_DTYPES(5)
