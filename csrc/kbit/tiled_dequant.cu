// kbit dequantize from the tiled GPU layout (lowbit/formats/kbit/tiled.py): qweight/qabsmax -> dense [n, k_in].
//
// The modules hold only the tiled layout, so the large-M path (prefill, and models that push a whole cache
// through a projection every step, e.g. MLA's kv_b_proj) decodes it here and hands the dense weight to cuBLAS.
// Memory-bound: ~0.5-0.7 B read and 2 B written per element. One warp per (tile, group) unit = 16 rows x
// 256 columns: each lane loads its K 16-byte code chunks and its 16 absmax bytes once (coalesced), then owns
// rows g and g+8 and, per block j, the 8 consecutive columns 32j + 8t .. +7: one 16-byte store per (j, row).
// Arithmetic order = lowbit.formats.kbit_tiled.dequantize: (codebook[code] * (e4m4(absmax) * scale)) in fp32,
// rounded once to T.
#include "tiled/decode.cuh"  // pair_field: the layout's fields

namespace lowbit {

constexpr int kTiledDequantWarps = 4;

template <int BITS, typename T>
__global__ void __launch_bounds__(kTiledDequantWarps * 32)
    kbit_tiled_dequant_kernel(const uint4* __restrict__ qweight, const uint4* __restrict__ qabsmax,
                              const float* __restrict__ codebook, const float* __restrict__ scale_ptr,
                              T* __restrict__ out, int n, int k_in, int groups, int64_t units) {
    static_assert(BITS >= 2 && BITS <= 5, "kbit supports 2..5 bits");
    constexpr uint32_t kCodeMask = (1u << BITS) - 1u;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float cb = lane < (1 << BITS) ? codebook[lane] : 0.0f;  // codebook[code] = shuffle from lane `code`
    const float scale = *scale_ptr;
    const int64_t stride = int64_t(gridDim.x) * kTiledDequantWarps;
    for (int64_t u = int64_t(blockIdx.x) * kTiledDequantWarps + (threadIdx.x >> 5); u < units; u += stride) {
        const int tile = static_cast<int>(u / groups), grp = static_cast<int>(u % groups);
        uint32_t w[4 * BITS];
#pragma unroll
        for (int c = 0; c < BITS; ++c) {
            const uint4 v = ld_stream(qweight + (u * BITS + c) * 32 + lane);
            w[4 * c] = v.x, w[4 * c + 1] = v.y, w[4 * c + 2] = v.z, w[4 * c + 3] = v.w;
        }
        const uint4 a = ld_stream(qabsmax + u * 8 + g);  // 16 bytes at 16 * g: byte 8h + j
        const uint32_t amax[4] = {a.x, a.y, a.z, a.w};
        const int col_base = grp * 256 + 8 * t;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = tile * 16 + 8 * h + g;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int byte = 8 * h + j;
                const float block_scale = decode_e4m4((amax[byte >> 2] >> (8 * (byte & 3))) & 255u) * scale;
                union {
                    uint4 u;
                    T v[8];
                } pack;
#pragma unroll
                for (int mq = 0; mq < 4; ++mq) {  // (m, q): pair p = 4m + 2q + h holds columns 4m + 2q + {0, 1}
                    const uint32_t field = gemv::pair_field<BITS>(w, 8 * j + 2 * mq + h);  // 4m + 2q = 2 * mq
                    const float c0 = __shfl_sync(kFullMask, cb, field & kCodeMask);
                    const float c1 = __shfl_sync(kFullMask, cb, field >> BITS);
                    pack.v[2 * mq] = from_float<T>(c0 * block_scale);
                    pack.v[2 * mq + 1] = from_float<T>(c1 * block_scale);
                }
                const int col = col_base + 32 * j;
                if (row < n && col < k_in)  // k_in % 32 == 0: the 8 columns are all in or all out
                    __stcs(reinterpret_cast<uint4*>(out + int64_t(row) * k_in + col), pack.u);
            }
        }
    }
}

template <int BITS, typename T>
int launch_kbit_tiled_dequant(const void* qweight, const void* qabsmax, const float* codebook, const float* scale,
                              void* out, int n, int k_in, void* stream) {
    if (n <= 0 || k_in <= 0) return 0;
    const int tiles = (n + 15) / 16, groups = (k_in + 255) / 256;
    const int64_t units = int64_t(tiles) * groups;
    const unsigned grid = one_wave_grid(kbit_tiled_dequant_kernel<BITS, T>, kTiledDequantWarps * 32,
                                        (units + kTiledDequantWarps - 1) / kTiledDequantWarps);
    kbit_tiled_dequant_kernel<BITS, T><<<grid, kTiledDequantWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const uint4*>(qweight), static_cast<const uint4*>(qabsmax), codebook, scale, static_cast<T*>(out),
        n, k_in, groups, units);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace lowbit

#define LOWBIT_DEFINE_KBIT_TILED_DEQUANT(BITS, NAME, TYPE)                                                         \
    extern "C" int lowbit_kbit_tiled_dequant_b##BITS##_##NAME(const void* qweight, const void* qabsmax,            \
                                                              const float* codebook, const float* scale, void* out, \
                                                              int n, int k_in, void* stream) {                    \
        return lowbit::launch_kbit_tiled_dequant<BITS, TYPE>(qweight, qabsmax, codebook, scale, out, n, k_in,      \
                                                             stream);                                             \
    }
#define LOWBIT_DEFINE_KBIT_TILED_DEQUANT_BITS(BITS)            \
    LOWBIT_DEFINE_KBIT_TILED_DEQUANT(BITS, fp16, __half)       \
    LOWBIT_DEFINE_KBIT_TILED_DEQUANT(BITS, bf16, __nv_bfloat16)
LOWBIT_DEFINE_KBIT_TILED_DEQUANT_BITS(2)
LOWBIT_DEFINE_KBIT_TILED_DEQUANT_BITS(3)
LOWBIT_DEFINE_KBIT_TILED_DEQUANT_BITS(4)
LOWBIT_DEFINE_KBIT_TILED_DEQUANT_BITS(5)
