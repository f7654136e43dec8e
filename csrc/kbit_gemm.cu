// kbit GEMM on tensor cores for batched decode and short prefills: y[M, N] = x[M, K_in] @ W^T,
// M from 9 to a few hundred, reading the same tiled layout as the GEMV (kbit_decode.cuh).
//
// A CTA owns 8 consecutive 16-row tiles (one per warp) and MT = 8 * NT tokens, over a range of
// K groups (split-K across CTAs when the row blocks alone cannot fill the GPU). Per group:
//   * the CTA stages x[MT tokens, 256 columns] in shared memory with cp.async (3 stages, one barrier
//     per group, zero-filled past M and K_in), so the 8 warps share one copy of x instead of each
//     reading it from L1/L2 (at M = 64 a warp would read 16x as many x bytes as weight bytes);
//   * each warp decodes its tile's group once (the GEMV's lookups, 2 groups of weights in flight),
//     scales the A fragments by the block absmax (8 packed multiplies per block: fp16/bf16 weights,
//     as dequantize + cuBLAS rounds them) and reuses them for NT x 2 MMAs accumulating in fp32 --
//     per 8 tokens a block costs one 16-byte shared load and 2 MMAs.
// Split-K partials (fp32) go to a workspace; the last CTA of a (row block, token chunk), found by
// an atomic counter, sums them in split order (deterministic) and writes y.
#include <type_traits>

#include "common.cuh"
#include "kbit_decode.cuh"
#include "lowbit.h"

namespace lowbit {
namespace gemm {

using namespace gemv;

constexpr int kWarps = 8;                 // warps (tiles) per CTA
constexpr int kRows = kWarps * 16;        // output rows per CTA
constexpr int kXStride = 256 + 32;        // x row stride in shared memory (elements): +64 B, so the
                                          // 8 row groups of a quarter-warp hit different banks
constexpr int kStages = 3;                // x stages in shared memory = weight groups in registers

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
    // src_bytes = 0 fills the 16 bytes with zeros (rows past M, columns past K_in)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ uint4 lds_u128(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

template <int BITS> using GemmLut = Lut<BITS, false, true>;  // compact: leaves room for x

template <int BITS, int NT>
__host__ __device__ constexpr size_t gemm_smem() {
    return GemmLut<BITS>::kBytes + size_t(kStages) * 8 * NT * kXStride * 2;
}

// 2 CTAs per SM (registers capped at 128) where the shared memory allows it.
template <int BITS, int NT>
__host__ __device__ constexpr int gemm_ctas_per_sm() { return 2 * gemm_smem<BITS, NT>() <= 220 * 1024 ? 2 : 1; }

// Block J's absmax of rows g (low half) and g + 8 (high) as a pair of T, to scale A fragments.
// fp16: an E4M4 byte shifted left by 6 *is* the fp16 of its value (same exponent bias, subnormals
// included); bf16: through fp32 (exact: E4M4 values have 5 significant bits).
template <typename T, int J>
__device__ __forceinline__ void scale_pairs(const uint32_t (&a)[4], uint32_t& lo, uint32_t& hi) {
    constexpr uint32_t kSel = (J % 4) | 0x40u | ((J % 4) << 8) | 0x4000u;  // byte J%4 to bytes 0 and 2
    if constexpr (std::is_same_v<T, __half>) {
        lo = __byte_perm(a[J / 4], 0u, kSel) << 6;
        hi = __byte_perm(a[2 + J / 4], 0u, kSel) << 6;
    } else {
        float s_lo, s_hi;
        block_scales<J>(a, s_lo, s_hi);
        lo = Pack2<T>::pack(s_lo * kScaleFix, s_lo * kScaleFix);
        hi = Pack2<T>::pack(s_hi * kScaleFix, s_hi * kScaleFix);
    }
}

template <typename T>
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
    uint32_t d;
    if constexpr (std::is_same_v<T, __half>) asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    else asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));  // + (-0): exact a*b; sm_80 has no mul.bf16x2
    return d;
}

// Stage x[tok0 .. tok0 + MT, grp * 256 .. + 256] into stage buffer xs (MT * 32 chunks of 16 bytes).
template <int NT, typename T>
__device__ __forceinline__ void stage_x(uint32_t xs, const T* __restrict__ x, int m, int k_in, int tok0, int grp) {
    constexpr int kChunks = 8 * NT * 32;
#pragma unroll
    for (int i = 0; i < (kChunks + kWarps * 32 - 1) / (kWarps * 32); ++i) {
        const int c = i * kWarps * 32 + threadIdx.x;
        if (kChunks % (kWarps * 32) == 0 || c < kChunks) {
            const int r = c >> 5, col = (c & 31) * 8;
            const int tok = tok0 + r, k = grp * 256 + col;
            const bool ok = tok < m && k < k_in;
            cp_async16(xs + uint32_t(r * kXStride + col) * 2, ok ? x + int64_t(tok) * k_in + k : x, ok ? 16 : 0);
        }
    }
}

// One block of the warp's tile against NT token tiles of the staged x: 8 lookups give two A
// fragments, scaled by the rows' block absmax, reused by NT x 2 MMAs.
template <int BITS, typename T, int NT, int J>
__device__ __forceinline__ void gemm_block(float (&acc)[NT][4], const uint32_t (&w)[4 * BITS], const uint32_t (&a)[4],
                                           uint32_t lane_op, uint32_t table, uint32_t xs_lane) {
    uint32_t frag[2][4];
    lookup_block<BITS, false, J, true>(frag, w, lane_op, table);
    uint32_t lo, hi;
    scale_pairs<T, J>(a, lo, hi);
#pragma unroll
    for (int mm = 0; mm < 2; ++mm) {  // registers 0, 2: row g; 1, 3: row g + 8
        frag[mm][0] = hmul2<T>(frag[mm][0], lo);
        frag[mm][1] = hmul2<T>(frag[mm][1], hi);
        frag[mm][2] = hmul2<T>(frag[mm][2], lo);
        frag[mm][3] = hmul2<T>(frag[mm][3], hi);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        // token 8 * nt + g, columns 32 J + 8 t .. + 8: exactly the B fragments of the block's 2 MMAs
        const uint4 xv = lds_u128(xs_lane + uint32_t((8 * nt * kXStride + 32 * J) * 2));
        mma16816<T>(acc[nt], frag[0], xv.x, xv.y);
        mma16816<T>(acc[nt], frag[1], xv.z, xv.w);
    }
}

template <int BITS, typename T, int NT, int... J>
__device__ __forceinline__ void gemm_group(float (&acc)[NT][4], const GroupData<BITS>& d, uint32_t lane_op,
                                           uint32_t table, uint32_t xs_lane, std::integer_sequence<int, J...>) {
    uint32_t w[4 * BITS];
#pragma unroll
    for (int c = 0; c < BITS; ++c) {
        w[4 * c] = d.w[c].x; w[4 * c + 1] = d.w[c].y; w[4 * c + 2] = d.w[c].z; w[4 * c + 3] = d.w[c].w;
    }
    const uint32_t a[4] = {d.a.x, d.a.y, d.a.z, d.a.w};
    (gemm_block<BITS, T, NT, J>(acc, w, a, lane_op, table, xs_lane), ...);
}

// grid: (row blocks, splits, token chunks). Padded rows (past N) and columns (past K_in) have zero
// codes and absmax; their x is staged as zeros, so they add exactly 0.
template <int BITS, typename T, int NT>
__global__ void __launch_bounds__(kWarps * 32, gemm_ctas_per_sm<BITS, NT>()) kbit_gemm_kernel(
    const T* __restrict__ x, const uint4* __restrict__ qweight, const uint4* __restrict__ qabsmax,
    const float* __restrict__ codebook, const float* __restrict__ scale_ptr, T* __restrict__ y,
    const T* __restrict__ bias, float* __restrict__ workspace, int* __restrict__ counters, int m, int n, int k_in,
    int n_tiles, int n_groups) {
    using L = GemmLut<BITS>;
    constexpr int MT = 8 * NT;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int splits = gridDim.y, split = blockIdx.y;
    const int tile = blockIdx.x * kWarps + warp;
    const bool has_tile = tile < n_tiles;  // warp-uniform; idle warps still stage x and sync
    const int tok0 = blockIdx.z * MT;
    const int g0 = int(int64_t(split) * n_groups / splits), g1 = int(int64_t(split + 1) * n_groups / splits);
    const uint32_t table = static_cast<uint32_t>(__cvta_generic_to_shared(g_table));
    const uint32_t xs0 = table + uint32_t(L::kBytes);
    constexpr uint32_t kStageBytes = uint32_t(MT * kXStride * 2);
    const uint32_t lane_op = L::lane_operand(table, lane);
    const uint32_t xs_lane = xs0 + uint32_t((g * kXStride + 8 * t) * 2);  // + stage, + token tile, + block
    const uint4* qw_lane = qweight + lane;
    const uint4* qa_lane = qabsmax + g;
    const int64_t u0 = int64_t(tile) * n_groups;

    // Prologue: groups g0 and g0 + 1 in flight (weights in registers, x in stages 0 and 1) while
    // the table is built.
    GroupData<BITS> buf[kStages];
    if (has_tile) {
        load_group<BITS>(buf[0], qw_lane, qa_lane, u0 + g0);
        if (g0 + 1 < g1) load_group<BITS>(buf[1], qw_lane, qa_lane, u0 + g0 + 1);
    }
    stage_x<NT>(xs0, x, m, k_in, tok0, g0);
    cp_async_commit();
    if (g0 + 1 < g1) stage_x<NT>(xs0 + kStageBytes, x, m, k_in, tok0, g0 + 1);
    cp_async_commit();
    const float scale = *scale_ptr;
    L::template build<kWarps * 32, T>(codebook);

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
        for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;
    for (int grp = g0; grp < g1;) {
#pragma unroll
        for (int s = 0; s < kStages; ++s) {  // unrolled: buf[] and the stage are compile-time; s = (grp - g0) % 3
            if (grp < g1) {
                cp_async_wait<1>();  // this thread's copies of group grp landed (grp + 1 may be in flight)
                __syncthreads();     // ... everyone's (and the table); every warp is done with group grp - 1
                if (grp + 2 < g1) stage_x<NT>(xs0 + ((s + 2) % kStages) * kStageBytes, x, m, k_in, tok0, grp + 2);
                cp_async_commit();   // (possibly empty: keeps the group count uniform)
                if (has_tile) {
                    if (grp + 2 < g1) load_group<BITS>(buf[(s + 2) % kStages], qw_lane, qa_lane, u0 + grp + 2);
                    gemm_group<BITS, T, NT>(acc, buf[s], lane_op, table, xs_lane + s * kStageBytes,
                                            std::make_integer_sequence<int, kGroupBlocks>{});
                }
                ++grp;
            }
        }
    }
    cp_async_wait<0>();

    // Epilogue. acc[nt][i]: row tile * 16 + g + 8 (i >> 1), token tok0 + 8 nt + 2 t + (i & 1).
    auto store = [&](int row, int tok, float v) {
        if (row < n && tok < m) y[int64_t(tok) * n + row] = from_float<T>(v * scale + bias_of(bias, row));
    };
    if (splits == 1) {
        if (!has_tile) return;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) store(tile * 16 + g + 8 * (i >> 1), tok0 + 8 * nt + 2 * t + (i & 1), acc[nt][i]);
        return;
    }
    // workspace: [token chunk][split][row block][kRows][MT] fp32
    const int rb = blockIdx.x, n_rb = gridDim.x;
    auto ws_at = [&](int sp) {
        return workspace + ((int64_t(blockIdx.z) * splits + sp) * n_rb + rb) * (kRows * MT);
    };
    float* ws = ws_at(split);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) ws[(warp * 16 + g + 8 * (i >> 1)) * MT + 8 * nt + 2 * t + (i & 1)] = acc[nt][i];
    __threadfence();
    __syncthreads();
    __shared__ int last;
    int* counter = counters + int64_t(blockIdx.z) * n_rb + rb;
    if (threadIdx.x == 0) last = atomicAdd(counter, 1) == splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int e = threadIdx.x; e < kRows * MT; e += kWarps * 32) {  // fixed split order: deterministic
        float sum = 0.f;
        for (int sp = 0; sp < splits; ++sp) sum += __ldcg(ws_at(sp) + e);
        store(rb * kRows + e / MT, tok0 + e % MT, sum);
    }
    if (threadIdx.x == 0) *counter = 0;  // ready for the next launch (graph replays too)
}

template <int BITS, typename T, int NT>
int launch(const void* x, const void* qweight, const void* qabsmax, const float* codebook, const float* scale, void* y,
           const void* bias, float* workspace, int* counters, int m, int n, int k_in, int splits, void* stream) {
    const int n_tiles = (n + 15) / 16, n_groups = (k_in + 255) / 256;
    constexpr size_t smem = gemm_smem<BITS, NT>();
    auto kernel = kbit_gemm_kernel<BITS, T, NT>;
    if (int err = configure(kernel, smem)) return err;
    if (m < 1 || splits < 1 || splits > n_groups || (splits > 1 && (workspace == nullptr || counters == nullptr)))
        return static_cast<int>(cudaErrorInvalidValue);
    const dim3 grid((n_tiles + kWarps - 1) / kWarps, splits, (m + 8 * NT - 1) / (8 * NT));
    if (grid.z > 65535) return static_cast<int>(cudaErrorInvalidValue);
    kernel<<<grid, kWarps * 32, smem, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), static_cast<const uint4*>(qweight), static_cast<const uint4*>(qabsmax), codebook,
        scale, static_cast<T*>(y), static_cast<const T*>(bias), workspace, counters, m, n, k_in, n_tiles, n_groups);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace gemm
}  // namespace lowbit

// lowbit_kbit_gemm_b<BITS>_<dtype>_t<NT>: NT token tiles of 8 per CTA (M rows in chunks of 8 NT).
#define LOWBIT_DEFINE_GEMM(BITS, NAME, TYPE, NT)                                                              \
    extern "C" int lowbit_kbit_gemm_b##BITS##_##NAME##_t##NT(                                                  \
        const void* x, const void* qweight, const void* qabsmax, const float* codebook, const float* scale,   \
        void* y, const void* bias, float* workspace, int* counters, int m, int n, int k_in, int splits,       \
        void* stream) {                                                                                       \
        return lowbit::gemm::launch<BITS, TYPE, NT>(x, qweight, qabsmax, codebook, scale, y, bias, workspace, \
                                                    counters, m, n, k_in, splits, stream);                    \
    }                                                                                                         \
    extern "C" int lowbit_kbit_gemm_occupancy_b##BITS##_##NAME##_t##NT(void) {                                \
        return lowbit::gemv::occupancy(lowbit::gemm::kbit_gemm_kernel<BITS, TYPE, NT>,                        \
                                       lowbit::gemm::gemm_smem<BITS, NT>(), lowbit::gemm::kWarps);            \
    }
#define LOWBIT_DEFINE_GEMM_DTYPE(BITS, NAME, TYPE) \
    LOWBIT_DEFINE_GEMM(BITS, NAME, TYPE, 2)        \
    LOWBIT_DEFINE_GEMM(BITS, NAME, TYPE, 4)        \
    LOWBIT_DEFINE_GEMM(BITS, NAME, TYPE, 8)
#define LOWBIT_DEFINE_GEMM_BITS(BITS)                  \
    LOWBIT_DEFINE_GEMM_DTYPE(BITS, fp16, __half)       \
    LOWBIT_DEFINE_GEMM_DTYPE(BITS, bf16, __nv_bfloat16)
LOWBIT_DEFINE_GEMM_BITS(2)
LOWBIT_DEFINE_GEMM_BITS(3)
LOWBIT_DEFINE_GEMM_BITS(4)
LOWBIT_DEFINE_GEMM_BITS(5)
