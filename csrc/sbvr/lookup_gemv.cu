// SBVR's weight-only decode GEMV: each weight group's 2^num_sums subset sums expanded into a small
// table, weights looked up from 4-bit codes and multiplied on the fp16/bf16 tensor cores (exact x, no
// activation rounding). lowbit/formats/sbvr/tiled.py (`code_tile`) holds the layout.
//
// Unlike kbit, whose one codebook is a replicated pair table (one conflict-free 32-bit lookup per two
// weights), every SBVR group has its own points: a warp rebuilds a 16-row x 16-point table per chunk
// (each lane 8 points) and looks weights up one 16-bit value at a time. Rows g and g + 4 share banks,
// so a lookup costs up to two wavefronts: shared-memory bound near 60% of HBM bandwidth, for every
// M <= 8 alike (the MMA takes 8 tokens for the price of one). The popcount GEMV (gemv.cu) is faster up to
// M = 4 and slower above; the dispatcher keeps the faster one per M.
//
// k permutation: lane (g, t) holds word t (inputs 32t .. 32t + 31) of its rows' chunk, so MMA i takes
// from lane t the inputs 32t + 4i .. 32t + 4i + 3 (A registers 0/1: +0, +1; 2/3: +2, +3) -- and its B
// registers hold x at exactly those inputs, loaded per lane. Any k order is the same product.
#include <cstdint>

#include "../tiled/decode.cuh"  // mask_shift_add: a lookup address in two instructions

namespace lowbit {
namespace sbvr_lookup {

constexpr int kChunk = 128;
constexpr int kMaxWarps = 16;

template <typename T> __device__ __forceinline__ uint16_t bits16(float v);
template <> __device__ __forceinline__ uint16_t bits16<__half>(float v) { return __half_as_ushort(__float2half_rn(v)); }
template <> __device__ __forceinline__ uint16_t bits16<__nv_bfloat16>(float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__device__ __forceinline__ uint32_t lds_u16(uint32_t addr) {
    uint16_t v;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr));
    return v;
}

// The shared address of nibble E of `word` in a row table at `row` (16 entries of 2 bytes): masked,
// then shifted into place and added in one LEA.
template <int E>
__device__ __forceinline__ uint32_t entry(uint32_t word, uint32_t row) {
    return gemv::mask_shift_add<0xFu << (4 * E), 1 - 4 * E>(word, row);
}

// One CTA per 16-row tile, warps split the chunks (warp w: chunks w, w + W, ...), fixed-order reduction.
template <int M, typename T>
__global__ void __launch_bounds__(kMaxWarps * 32, 1) lookup_gemv_kernel(
    const uint32_t* __restrict__ qcodes, const uint32_t* __restrict__ qidx, const uint4* __restrict__ cache8,
    const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y, int n, int k, int group) {
    __shared__ float red[kMaxWarps][M][16];
    __shared__ __align__(16) uint16_t table[kMaxWarps][16][16];  // [warp][row in tile][code]
    const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4, tile = blockIdx.x;
    const int chunks = (k + kChunk - 1) / kChunk, lg = __ffs(group) - 1, n_groups = k >> lg;
    const uint32_t tbl = static_cast<uint32_t>(__cvta_generic_to_shared(&table[warp][0][0]));
    const uint32_t row_lo = tbl + g * 32, row_hi = tbl + (g + 8) * 32;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const uint4* qc = reinterpret_cast<const uint4*>(qcodes + (int64_t(tile) * chunks * 32 + lane) * 8);  // + c * 64
    uint4 w0, w1, n0, n1;  // this chunk's codes and the next one's (row g: words 0..3, row g + 8: 4..7)
    if (warp < chunks) w0 = ld_stream(qc + int64_t(warp) * 64), w1 = ld_stream(qc + int64_t(warp) * 64 + 1);
    for (int c = warp; c < chunks; c += warps) {
        if (c + warps < chunks) n0 = ld_stream(qc + int64_t(c + warps) * 64), n1 = ld_stream(qc + int64_t(c + warps) * 64 + 1);
        const uint32_t wlo[4] = {w0.x, w0.y, w0.z, w0.w}, whi[4] = {w1.x, w1.y, w1.z, w1.w};
        // x of token g at inputs 128c + 32t .. + 31 (zero past K and for g >= M)
        uint32_t xr[16];
        const int64_t first = int64_t(c) * kChunk + 32 * t;
        if (g < M && first < k) {
            const uint4* xp = reinterpret_cast<const uint4*>(x + int64_t(g) * k + first);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const uint4 v = __ldg(xp + i);
                xr[4 * i] = v.x, xr[4 * i + 1] = v.y, xr[4 * i + 2] = v.z, xr[4 * i + 3] = v.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 16; ++i) xr[i] = 0u;
        }
        // this lane's 4 points (codes 4t .. 4t + 3) of rows g and g + 8, as the reference sums them
        const int gi = (c * kChunk + 32 * t) >> lg;  // the lane's word's group (group: a power of two)
        const uint32_t lines = first < k ? __ldg(qidx + (int64_t(tile) * n_groups + gi) * 8 + g) : 0u;
        __syncwarp();  // the previous chunk's lookups are done
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint4 raw = __ldg(cache8 + (h ? lines >> 16 : lines & 0xFFFFu));
            const __half* cf = reinterpret_cast<const __half*>(&raw);
            const float c0 = __half2float(cf[0]), c1 = __half2float(cf[1]), c2 = __half2float(cf[2]),
                        c3 = __half2float(cf[3]);
            const float base = ((t & 1) ? c2 : 0.f) + ((t & 2) ? c3 : 0.f);
            uint2 pts;
            pts.x = uint32_t(bits16<T>(base)) | uint32_t(bits16<T>(base + c0)) << 16;
            pts.y = uint32_t(bits16<T>(base + c1)) | uint32_t(bits16<T>(base + c0 + c1)) << 16;
            *reinterpret_cast<uint2*>(&table[warp][g + 8 * h][4 * t]) = pts;
        }
        __syncwarp();
        // groups smaller than 128 inputs: each lane's word has its own group, and the lane's table
        // quarter holds that group's points -- but the lookups read whole rows. So the 4 lanes of a
        // row must agree on the group: the tiled layout requires group >= 128 here (checked on the host).
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const uint32_t lo = wlo[i / 2], hi = whi[i / 2];
            uint32_t a[4];
            if (i % 2 == 0) {
                a[0] = lds_u16(entry<0>(lo, row_lo)) | lds_u16(entry<1>(lo, row_lo)) << 16;
                a[1] = lds_u16(entry<0>(hi, row_hi)) | lds_u16(entry<1>(hi, row_hi)) << 16;
                a[2] = lds_u16(entry<2>(lo, row_lo)) | lds_u16(entry<3>(lo, row_lo)) << 16;
                a[3] = lds_u16(entry<2>(hi, row_hi)) | lds_u16(entry<3>(hi, row_hi)) << 16;
            } else {
                a[0] = lds_u16(entry<4>(lo, row_lo)) | lds_u16(entry<5>(lo, row_lo)) << 16;
                a[1] = lds_u16(entry<4>(hi, row_hi)) | lds_u16(entry<5>(hi, row_hi)) << 16;
                a[2] = lds_u16(entry<6>(lo, row_lo)) | lds_u16(entry<7>(lo, row_lo)) << 16;
                a[3] = lds_u16(entry<6>(hi, row_hi)) | lds_u16(entry<7>(hi, row_hi)) << 16;
            }
            mma16816<T>(acc, a, xr[2 * i], xr[2 * i + 1]);
        }
        w0 = n0, w1 = n1;
    }
    // D: acc[0..1] = row g, tokens 2t, 2t + 1; acc[2..3] = row g + 8
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int token = 2 * t + (j & 1), r = g + 8 * (j >> 1);
        if (token < M) red[warp][token][r] = acc[j];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < M * 16; i += blockDim.x) {
        const int mt = i / 16, r = i % 16, row = tile * 16 + r;
        float v = 0.f;
        for (int w = 0; w < warps; ++w) v += red[w][mt][r];
        if (row < n) {
            if (bias != nullptr) v += to_float(bias[row]);
            y[int64_t(mt) * n + row] = from_float<T>(v);
        }
    }
}

template <int M, typename T>
int launch(const uint32_t* qcodes, const uint32_t* qidx, const void* cache8, const void* x, const void* bias, void* y,
           int n, int k, int group, int warps, void* stream) {
    if (group % kChunk) return static_cast<int>(cudaErrorInvalidValue);
    const int tiles = (n + 15) / 16, chunks = (k + kChunk - 1) / kChunk;
    int sms = 132, device = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (warps > kMaxWarps) return static_cast<int>(cudaErrorInvalidValue);
    if (warps <= 0) {  // as the popcount GEMV's rule (gemv.cu, pick_warps)
        warps = 4;
        while (warps < kMaxWarps && int64_t(tiles) * warps < int64_t(sms) * 15 && 2 * warps <= chunks) warps *= 2;
    }
    lookup_gemv_kernel<M, T><<<tiles, warps * 32, 0, static_cast<cudaStream_t>(stream)>>>(
        qcodes, qidx, static_cast<const uint4*>(cache8), static_cast<const T*>(x), static_cast<const T*>(bias),
        static_cast<T*>(y), n, k, group);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace sbvr_lookup
}  // namespace lowbit

#define LOWBIT_SBVR_LOOKUP(NAME, TYPE, M)                                                                         \
    extern "C" int lowbit_sbvr_lookup_gemv_##NAME##_m##M(const uint32_t* qcodes, const uint32_t* qidx,            \
                                                         const void* cache8, const void* x, const void* bias,      \
                                                         void* y, int n, int k, int group, int warps,              \
                                                         void* stream) {                                           \
        return lowbit::sbvr_lookup::launch<M, TYPE>(qcodes, qidx, cache8, x, bias, y, n, k, group, warps, stream); \
    }
#define LOWBIT_SBVR_LOOKUP_DTYPE(NAME, TYPE) \
    LOWBIT_SBVR_LOOKUP(NAME, TYPE, 1)        \
    LOWBIT_SBVR_LOOKUP(NAME, TYPE, 2)        \
    LOWBIT_SBVR_LOOKUP(NAME, TYPE, 3)        \
    LOWBIT_SBVR_LOOKUP(NAME, TYPE, 4)        \
    LOWBIT_SBVR_LOOKUP(NAME, TYPE, 5)        \
    LOWBIT_SBVR_LOOKUP(NAME, TYPE, 6)        \
    LOWBIT_SBVR_LOOKUP(NAME, TYPE, 7)        \
    LOWBIT_SBVR_LOOKUP(NAME, TYPE, 8)
LOWBIT_SBVR_LOOKUP_DTYPE(fp16, __half)
LOWBIT_SBVR_LOOKUP_DTYPE(bf16, __nv_bfloat16)
