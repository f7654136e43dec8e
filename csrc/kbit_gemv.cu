// kbit decode GEMV / grouped (MoE) GEMV on tensor cores: y[M, N] = x[M, K_in] @ W^T, M <= 8.
//
// Why tensor cores for M = 1..4: the arithmetic budget per weight on H100 is ~5 issued
// instructions (3.1 TB/s of 4.25-bit weights = ~22 weights per SM-clock against 128 issue
// slots). Scalar fp32 FMAs alone would cost M instructions per weight. Instead weights are the
// A operand of mma.m16n8k16 ("swap AB": rows of W are the MMA's M, tokens its N), so one MMA
// per thread covers 8 weights for any M <= 8, accumulating in fp32.
//
// Per 16 weights a lane does: 8 pair lookups (shift + and/or + one 4-byte shared load each,
// giving two fp16/bf16 codebook values), 2 MMAs, 2 absmax decodes and 4 FMAs that apply the
// two rows' block scales to the block's partial sums: ~2.5 instructions per weight.
// Layout: see lowbit/formats/kbit_tiled.py (the reference repack that defines it).
//
// Determinism: warps that share a tile write fp32 partials; the last one to finish it (atomic
// counter) sums them in warp order, so the result never depends on arrival order.
#include <type_traits>
#include <utility>

#include "common.cuh"
#include "lowbit.h"

namespace lowbit {
namespace gemv {

constexpr int kWarps = 8;         // warps per CTA

// The pair-lookup table (dynamic shared memory). Referenced by symbol, not through a pointer,
// so each lookup compiles to one LDS [offset + table] with the table base as an immediate.
extern __shared__ __align__(16) char g_table[];
constexpr int kGroupBlocks = 8;   // 32-element blocks per group (one load round)
__host__ __device__ constexpr int kLoBits(int bits) { return bits >= 4 ? 4 : 2; }
__host__ __device__ constexpr int kTableEntries(int bits) { return 1 << (2 * bits); }

template <typename T> struct Pack2;
template <> struct Pack2<__half> {
    static __device__ uint32_t pack(float a, float b) {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t*>(&h);
    }
};
template <> struct Pack2<__nv_bfloat16> {
    static __device__ uint32_t pack(float a, float b) {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t*>(&h);
    }
};

template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (std::is_same_v<T, __half>) {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;  // weights are read once: don't keep them in L1
    asm("ld.global.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// E4M4 byte (in bits 19..26 of `shifted`) -> float: the byte placed in an fp32's exponent and
// top mantissa bits is e4m4 * 2^-112 (exact, subnormals included), so one multiply finishes it.
__device__ __forceinline__ float e4m4_from_shifted(uint32_t shifted) {
    return __uint_as_float(shifted & 0x07F80000u) * 5.192296858534828e33f;  // 2^112
}

// Pair-lookup table: entry i, replica `lane` at word i*32 + lane, so every lane of a warp
// reads its own bank (conflict-free for any indices).
template <int BITS, typename T>
__device__ void build_table(const float* __restrict__ codebook) {
    constexpr int KLO = kLoBits(BITS);
    constexpr int kEntries = kTableEntries(BITS);
    __shared__ float cb[1 << BITS];  // one global read per entry, then shared-memory reads
    if (threadIdx.x < (1 << BITS)) cb[threadIdx.x] = codebook[threadIdx.x];
    __syncthreads();
    uint32_t* table = reinterpret_cast<uint32_t*>(g_table);
    for (int i = threadIdx.x; i < kEntries * 32; i += blockDim.x) {
        const int e = i >> 5;
        const int lo0 = e & ((1 << KLO) - 1), lo1 = (e >> KLO) & ((1 << KLO) - 1);
        const int hi0 = (e >> (2 * KLO)) & 1, hi1 = (e >> (2 * KLO + 1)) & 1;
        table[i] = Pack2<T>::pack(cb[lo0 | (hi0 << KLO)], cb[lo1 | (hi1 << KLO)]);
    }
}

// Byte offset of pair p's table word: (field << 7) | lane*4, field = the pair's 2K-bit index.
template <int BITS, int J, int P>
__device__ __forceinline__ uint32_t pair_offset(const uint32_t (&w)[4 * BITS], uint32_t lane4) {
    constexpr int KLO = kLoBits(BITS);
    uint32_t off;
    if constexpr (KLO == 4) {
        constexpr int s = 8 * (P % 4);
        const uint32_t word = w[2 * J + P / 4];
        off = (s <= 7 ? (word << (7 - s)) : (word >> (s - 7))) & 0x7F80u;
    } else {
        constexpr int s = 4 * P;
        const uint32_t word = w[J];
        off = (s <= 7 ? (word << (7 - s)) : (word >> (s - 7))) & 0x780u;
    }
    if constexpr (BITS % 2) {  // top bits of both codes go above the low fields
        constexpr int s = 16 * (J % 2) + 2 * P;   // source bit position
        constexpr int d = 2 * KLO + 7;            // destination bit position
        const uint32_t word = w[4 * KLO + J / 2];
        off |= (s <= d ? (word << (d - s)) : (word >> (s - d))) & (3u << d);
    }
    return off | lane4;
}

// Block J of a group: decode 16 codes into two A fragments, 2 MMAs, apply the rows' block scales.
template <int BITS, typename T, int J>
__device__ __forceinline__ void process_block(float (&acc)[4], const uint32_t (&w)[4 * BITS], const uint32_t (&a)[4],
                                              const uint4& xv, uint32_t lane4) {
    const char* table = g_table;
    uint32_t frag[2][4];  // register R of MMA m holds pair p = 4m + R
    frag[0][0] = *reinterpret_cast<const uint32_t*>(table + pair_offset<BITS, J, 0>(w, lane4));
    frag[1][0] = *reinterpret_cast<const uint32_t*>(table + pair_offset<BITS, J, 4>(w, lane4));
    frag[0][1] = *reinterpret_cast<const uint32_t*>(table + pair_offset<BITS, J, 1>(w, lane4));
    frag[0][2] = *reinterpret_cast<const uint32_t*>(table + pair_offset<BITS, J, 2>(w, lane4));
    frag[0][3] = *reinterpret_cast<const uint32_t*>(table + pair_offset<BITS, J, 3>(w, lane4));
    frag[1][1] = *reinterpret_cast<const uint32_t*>(table + pair_offset<BITS, J, 5>(w, lane4));
    frag[1][2] = *reinterpret_cast<const uint32_t*>(table + pair_offset<BITS, J, 6>(w, lane4));
    frag[1][3] = *reinterpret_cast<const uint32_t*>(table + pair_offset<BITS, J, 7>(w, lane4));
    float part[4] = {0.f, 0.f, 0.f, 0.f};
    mma16816<T>(part, frag[0], xv.x, xv.y);
    mma16816<T>(part, frag[1], xv.z, xv.w);
    // absmax bytes: row g at byte J, row g+8 at byte 8 + J of this lane's 16 bytes
    constexpr int q = 8 * (J % 4);
    const uint32_t lo_word = a[J / 4], hi_word = a[2 + J / 4];
    const float s_lo = e4m4_from_shifted(q <= 19 ? lo_word << (19 - q) : lo_word >> (q - 19));
    const float s_hi = e4m4_from_shifted(q <= 19 ? hi_word << (19 - q) : hi_word >> (q - 19));
    acc[0] = fmaf(s_lo, part[0], acc[0]);
    acc[1] = fmaf(s_lo, part[1], acc[1]);
    acc[2] = fmaf(s_hi, part[2], acc[2]);
    acc[3] = fmaf(s_hi, part[3], acc[3]);
}

template <int BITS, typename T, int... J>
__device__ __forceinline__ void process_blocks(float (&acc)[4], const uint32_t (&w)[4 * BITS], const uint32_t (&a)[4],
                                               const uint4 (&xv)[kGroupBlocks], uint32_t lane4,
                                               std::integer_sequence<int, J...>) {
    (process_block<BITS, T, J>(acc, w, a, xv[J], lane4), ...);
}

// One tile (16 rows) over groups [g0, g1): acc[4] = this lane's (row g / g+8, token 2t / 2t+1)
// partial sums (before the tensor scale). x points at token 0 of the tile's input rows.
template <int BITS, typename T, int MAXM>
__device__ __forceinline__ void tile_loop(float (&acc)[4], const uint4* __restrict__ qw, const uint4* __restrict__ qa,
                                          const T* __restrict__ x, int64_t x_stride, int m, int k_in, int g0, int g1) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t lane4 = lane * 4u;
    const bool has_token = g < m && g < MAXM;
    const T* xrow = x + (has_token ? g : 0) * x_stride + 8 * t;
    // qw: [groups][BITS chunks][32 lanes] uint4;  qa: [groups][8 row groups] uint4
    uint4 wbuf[BITS], abuf;
#pragma unroll
    for (int c = 0; c < BITS; ++c) wbuf[c] = ld_stream(qw + (int64_t(g0) * BITS + c) * 32 + lane);
    abuf = ld_stream(qa + int64_t(g0) * 8 + g);
    for (int grp = g0; grp < g1; ++grp) {
        uint32_t w[4 * BITS];
#pragma unroll
        for (int c = 0; c < BITS; ++c) {
            w[4 * c] = wbuf[c].x; w[4 * c + 1] = wbuf[c].y; w[4 * c + 2] = wbuf[c].z; w[4 * c + 3] = wbuf[c].w;
        }
        const uint32_t a[4] = {abuf.x, abuf.y, abuf.z, abuf.w};
        if (grp + 1 < g1) {  // prefetch the next group while this one computes
#pragma unroll
            for (int c = 0; c < BITS; ++c) wbuf[c] = ld_stream(qw + (int64_t(grp + 1) * BITS + c) * 32 + lane);
            abuf = ld_stream(qa + int64_t(grp + 1) * 8 + g);
        }
        uint4 xv[kGroupBlocks];
#pragma unroll
        for (int j = 0; j < kGroupBlocks; ++j) {
            const int k0 = (grp * kGroupBlocks + j) * 32;
            xv[j] = (has_token && k0 < k_in) ? *reinterpret_cast<const uint4*>(xrow + k0) : make_uint4(0, 0, 0, 0);
        }
        process_blocks<BITS, T>(acc, w, a, xv, lane4, std::make_integer_sequence<int, kGroupBlocks>{});
    }
}

template <int BITS>
constexpr size_t table_bytes() { return size_t(kTableEntries(BITS)) * 32 * 4; }

// Dense GEMV, "stream-K": the n_tiles x n_groups units (16 rows x 256 columns each) are cut
// into n_warps equal contiguous ranges, one per warp, on a grid that fits the GPU in one wave.
// A warp's range covers whole tiles (written directly) and at most a partial head and tail
// tile, whose fp32 partials go to workspace slot 0 (the warp's first tile) or 1 (its last).
__device__ __forceinline__ int warp_of_unit(int64_t u, int64_t units, int64_t warps) {
    return static_cast<int>(((u + 1) * warps - 1) / units);
}

template <int BITS, typename T, int MAXM>
__global__ void __launch_bounds__(kWarps * 32) kbit_gemv_kernel(
    const T* __restrict__ x, const uint4* __restrict__ qweight, const uint4* __restrict__ qabsmax,
    const float* __restrict__ codebook, const float* __restrict__ scale_ptr, T* __restrict__ y,
    float* __restrict__ workspace, int* __restrict__ counters, int m, int n, int k_in, int n_tiles, int n_groups,
    int n_warps) {
    build_table<BITS, T>(codebook);
    __syncthreads();
    const int w = blockIdx.x * kWarps + (threadIdx.x >> 5);
    if (w >= n_warps) return;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const float scale = *scale_ptr;
    const int64_t units = int64_t(n_tiles) * n_groups;
    const int64_t u_begin = w * units / n_warps, u_end = (w + 1) * units / n_warps;
    const int first_tile = static_cast<int>(u_begin / n_groups);
    for (int64_t u = u_begin; u < u_end;) {
        const int tile = static_cast<int>(u / n_groups);
        const int g0 = static_cast<int>(u % n_groups);
        const int g1 = static_cast<int>(g0 + (u_end - u) < n_groups ? g0 + (u_end - u) : n_groups);
        u += g1 - g0;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        tile_loop<BITS, T, MAXM>(acc, qweight + int64_t(tile) * n_groups * BITS * 32,
                                 qabsmax + int64_t(tile) * n_groups * 8, x, k_in, m, k_in, g0, g1);
        const int row0 = tile * 16 + g;
        if (g0 == 0 && g1 == n_groups) {  // whole tile: write the output
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = row0 + (i >> 1) * 8, tok = 2 * t + (i & 1);
                if (tok < m && tok < MAXM && row < n) y[int64_t(tok) * n + row] = from_float<T>(acc[i] * scale);
            }
            continue;
        }
        // partial tile: [warp][slot][16 rows][8 tokens] fp32; the last contributor reduces
        float* ws = workspace + (int64_t(w) * 2 + (tile == first_tile ? 0 : 1)) * 128;
#pragma unroll
        for (int i = 0; i < 4; ++i) ws[(g + (i >> 1) * 8) * 8 + 2 * t + (i & 1)] = acc[i];
        __threadfence();
        const int w_first = warp_of_unit(int64_t(tile) * n_groups, units, n_warps);
        const int w_last = warp_of_unit(int64_t(tile + 1) * n_groups - 1, units, n_warps);
        int last = 0;
        if (lane == 0) last = atomicAdd(&counters[tile], 1) == w_last - w_first;
        last = __shfl_sync(kFullMask, last, 0);
        if (!last) continue;
        __threadfence();
        float sum[4] = {0.f, 0.f, 0.f, 0.f};
        for (int v = w_first; v <= w_last; ++v) {  // fixed order: deterministic
            const int v_first_tile = static_cast<int>((v * units / n_warps) / n_groups);
            const float* p = workspace + (int64_t(v) * 2 + (tile == v_first_tile ? 0 : 1)) * 128;
#pragma unroll
            for (int i = 0; i < 4; ++i) sum[i] += __ldcg(p + (g + (i >> 1) * 8) * 8 + 2 * t + (i & 1));
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int row = row0 + (i >> 1) * 8, tok = 2 * t + (i & 1);
            if (tok < m && tok < MAXM && row < n) y[int64_t(tok) * n + row] = from_float<T>(sum[i] * scale);
        }
        if (lane == 0) counters[tile] = 0;  // ready for the next launch (graph replays too)
    }
}

// Grouped GEMV for MoE: tokens sorted by expert; item = expert * n_tiles + tile; experts with
// no tokens are skipped; more than 8 tokens on one expert are processed 8 at a time.
template <int BITS, typename T>
__global__ void __launch_bounds__(kWarps * 32) kbit_grouped_gemv_kernel(
    const T* __restrict__ x, const int64_t* __restrict__ expert_offsets, const uint4* __restrict__ qweight,
    const uint4* __restrict__ qabsmax, const float* __restrict__ codebook, const float* __restrict__ scales,
    T* __restrict__ y, int n_experts, int n, int k_in, int n_tiles, int n_groups) {
    build_table<BITS, T>(codebook);
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int items = n_experts * n_tiles;
    const int warp_global = blockIdx.x * kWarps + (threadIdx.x >> 5);
    for (int item = warp_global; item < items; item += gridDim.x * kWarps) {
        const int e = item / n_tiles, tile = item % n_tiles;
        const int64_t lo = expert_offsets[e], hi = expert_offsets[e + 1];
        if (hi <= lo) continue;
        const float scale = scales[e];
        const int64_t wbase = (int64_t(e) * n_tiles + tile) * n_groups;
        for (int64_t tok0 = lo; tok0 < hi; tok0 += 8) {
            const int m = static_cast<int>(hi - tok0 < 8 ? hi - tok0 : 8);
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            tile_loop<BITS, T, 8>(acc, qweight + wbase * BITS * 32, qabsmax + wbase * 8, x + tok0 * k_in, k_in, m,
                                  k_in, 0, n_groups);
            const int row0 = tile * 16 + g;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = row0 + (i >> 1) * 8, tok = 2 * t + (i & 1);
                if (tok < m && row < n) y[(tok0 + tok) * n + row] = from_float<T>(acc[i] * scale);
            }
        }
    }
}

template <typename K>
int configure(K kernel, size_t smem) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    return static_cast<int>(err);
}

template <int BITS, typename T, int MAXM>
int launch_gemv(const void* x, const void* qweight, const void* qabsmax, const float* codebook, const float* scale,
                void* y, float* workspace, int* counters, int m, int n, int k_in, int n_warps, void* stream) {
    const int n_tiles = (n + 15) / 16, n_groups = (k_in + 255) / 256;
    constexpr size_t smem = table_bytes<BITS>();
    auto kernel = kbit_gemv_kernel<BITS, T, MAXM>;
    if (int err = configure(kernel, smem)) return err;
    const int grid = (n_warps + kWarps - 1) / kWarps;
    kernel<<<grid, kWarps * 32, smem, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), static_cast<const uint4*>(qweight), static_cast<const uint4*>(qabsmax), codebook,
        scale, static_cast<T*>(y), workspace, counters, m, n, k_in, n_tiles, n_groups, n_warps);
    return static_cast<int>(cudaGetLastError());
}

// CTAs of this kernel that fit on one SM (registers, shared memory): sizes the one-wave grid.
template <typename K>
int occupancy(K kernel, size_t smem) {
    if (configure(kernel, smem)) return 0;
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kWarps * 32, smem) != cudaSuccess) return 0;
    return blocks;
}

template <int BITS, typename T>
int launch_grouped(const void* x, const int64_t* offsets, const void* qweight, const void* qabsmax,
                   const float* codebook, const float* scales, void* y, int n_experts, int n, int k_in, int grid,
                   void* stream) {
    const int n_tiles = (n + 15) / 16, n_groups = (k_in + 255) / 256;
    constexpr size_t smem = table_bytes<BITS>();
    auto kernel = kbit_grouped_gemv_kernel<BITS, T>;
    if (int err = configure(kernel, smem)) return err;
    kernel<<<grid, kWarps * 32, smem, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), offsets, static_cast<const uint4*>(qweight), static_cast<const uint4*>(qabsmax),
        codebook, scales, static_cast<T*>(y), n_experts, n, k_in, n_tiles, n_groups);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace gemv
}  // namespace lowbit

#define LOWBIT_DEFINE_GEMV(BITS, NAME, TYPE, M)                                                               \
    extern "C" int lowbit_kbit_gemv_b##BITS##_##NAME##_m##M(                                                  \
        const void* x, const void* qweight, const void* qabsmax, const float* codebook, const float* scale,   \
        void* y, float* workspace, int* counters, int m, int n, int k_in, int n_warps, void* stream) {        \
        return lowbit::gemv::launch_gemv<BITS, TYPE, M>(x, qweight, qabsmax, codebook, scale, y, workspace,   \
                                                        counters, m, n, k_in, n_warps, stream);               \
    }                                                                                                         \
    extern "C" int lowbit_kbit_gemv_occupancy_b##BITS##_##NAME##_m##M(void) {                                 \
        return lowbit::gemv::occupancy(lowbit::gemv::kbit_gemv_kernel<BITS, TYPE, M>,                        \
                                       lowbit::gemv::table_bytes<BITS>());                                    \
    }
#define LOWBIT_DEFINE_GROUPED(BITS, NAME, TYPE)                                                                \
    extern "C" int lowbit_kbit_grouped_gemv_b##BITS##_##NAME(                                                  \
        const void* x, const int64_t* offsets, const void* qweight, const void* qabsmax, const float* codebook, \
        const float* scales, void* y, int n_experts, int n, int k_in, int grid, void* stream) {                \
        return lowbit::gemv::launch_grouped<BITS, TYPE>(x, offsets, qweight, qabsmax, codebook, scales, y,     \
                                                        n_experts, n, k_in, grid, stream);                    \
    }
#define LOWBIT_DEFINE_GEMV_DTYPE(BITS, NAME, TYPE) \
    LOWBIT_DEFINE_GEMV(BITS, NAME, TYPE, 1)        \
    LOWBIT_DEFINE_GEMV(BITS, NAME, TYPE, 2)        \
    LOWBIT_DEFINE_GEMV(BITS, NAME, TYPE, 3)        \
    LOWBIT_DEFINE_GEMV(BITS, NAME, TYPE, 4)        \
    LOWBIT_DEFINE_GROUPED(BITS, NAME, TYPE)
#define LOWBIT_DEFINE_GEMV_BITS(BITS)                  \
    LOWBIT_DEFINE_GEMV_DTYPE(BITS, fp16, __half)       \
    LOWBIT_DEFINE_GEMV_DTYPE(BITS, bf16, __nv_bfloat16)
LOWBIT_DEFINE_GEMV_BITS(2)
LOWBIT_DEFINE_GEMV_BITS(3)
LOWBIT_DEFINE_GEMV_BITS(4)
LOWBIT_DEFINE_GEMV_BITS(5)
