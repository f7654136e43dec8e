// kbit dequantize: bit-plane blocks -> fp32 / fp16 / bf16 rows.
//
// Memory-bound (~0.6 B read and 2-4 B written per element), so the layout of the accesses is
// what matters. One warp handles 32 consecutive blocks per step: it reads their plane words
// and absmax bytes with coalesced loads (lane l reads word l, l+32, ...) into shared memory,
// then each lane assembles whole 16-byte output vectors so that the warp's stores are
// consecutive 16-byte chunks: lane l writes chunk l, l + 32, ... of the warp's 32 x 32 outputs.
// The codebook is held one entry per lane (2^BITS <= 32): the lookup is a register shuffle.
// The arithmetic order matches lowbit.formats.kbit.dequantize_reference exactly:
//   block_scale = e4m4(absmax) * scale;  value = codebook[code] * block_scale  (fp32, RN).
#include "common.cuh"
#include "lowbit.h"

namespace lowbit {

constexpr int kDequantWarps = 8;

template <int BITS, typename T>
__global__ void __launch_bounds__(kDequantWarps * 32) kbit_dequant_kernel(const uint32_t* __restrict__ planes,
                                                                         const uint8_t* __restrict__ absmax,
                                                                         const float* __restrict__ codebook,
                                                                         const float* __restrict__ scale_ptr,
                                                                         T* __restrict__ out, int64_t n_blocks) {
    static_assert(BITS >= 2 && BITS <= 5, "kbit supports 2..5 bits");
    constexpr int kPerVec = 16 / sizeof(T);       // elements per 16-byte store
    constexpr int kVecPerBlock = 32 / kPerVec;    // 16-byte chunks per 32-element block
    constexpr int kSteps = kVecPerBlock;          // a lane's chunks per 32-block step (32 * kVecPerBlock / 32)
    __shared__ uint32_t s_words[kDequantWarps][32 * BITS];
    __shared__ float s_scale[kDequantWarps][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float cb = lane < (1 << BITS) ? codebook[lane] : 0.0f;
    const float scale = *scale_ptr;

    const int64_t n_steps = (n_blocks + 31) / 32;
    const int64_t warp_stride = int64_t(gridDim.x) * kDequantWarps;
    for (int64_t step = int64_t(blockIdx.x) * kDequantWarps + warp; step < n_steps; step += warp_stride) {
        const int64_t blk0 = step * 32;
        const int nb = n_blocks - blk0 < 32 ? static_cast<int>(n_blocks - blk0) : 32;  // blocks in this step
        const uint32_t* src = planes + blk0 * BITS;
#pragma unroll
        for (int p = 0; p < BITS; ++p) {
            const int i = lane + 32 * p;
            s_words[warp][i] = i < nb * BITS ? __ldcs(src + i) : 0u;  // read once: streaming
        }
        s_scale[warp][lane] = lane < nb ? decode_e4m4(absmax[blk0 + lane]) * scale : 0.0f;
        __syncwarp();
        uint4* dst = reinterpret_cast<uint4*>(out + blk0 * 32);
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
            const int chunk = lane + 32 * s;            // chunk of the warp's output
            const int b = chunk / kVecPerBlock;         // its block, and first element in the block
            const int e0 = (chunk % kVecPerBlock) * kPerVec;
            uint32_t w[BITS];
#pragma unroll
            for (int p = 0; p < BITS; ++p) w[p] = s_words[warp][b * BITS + p] >> e0;
            const float block_scale = s_scale[warp][b];
            union {
                uint4 u;
                T t[kPerVec];
            } pack;
#pragma unroll
            for (int i = 0; i < kPerVec; ++i) {
                uint32_t code = 0;
#pragma unroll
                for (int p = 0; p < BITS; ++p) code |= ((w[p] >> i) & 1u) << p;
                pack.t[i] = from_float<T>(__shfl_sync(kFullMask, cb, code) * block_scale);
            }
            if (b < nb) __stcs(dst + chunk, pack.u);  // written once: streaming
        }
        __syncwarp();  // s_words / s_scale are rewritten by the next step
    }
}

template <int BITS, typename T>
int launch_kbit_dequant(const uint32_t* planes, const uint8_t* absmax, const float* codebook,
                        const float* scale, void* out, int64_t n_blocks, void* stream) {
    if (n_blocks <= 0) return 0;
    // One wave of resident warps, each looping over 32-block steps.
    const int64_t steps = (n_blocks + 31) / 32;
    const int64_t want = (steps + kDequantWarps - 1) / kDequantWarps;
    const unsigned grid = one_wave_grid(kbit_dequant_kernel<BITS, T>, kDequantWarps * 32, want);
    kbit_dequant_kernel<BITS, T><<<grid, kDequantWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(
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
