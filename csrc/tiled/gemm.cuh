#pragma once
// kbit GEMM on tensor cores for batched decode, short prefills and MoE experts:
// y[M, N] = x[M, K_in] @ W^T, M from 9 to a few hundred, reading the same tiled layout as the GEMV
// (tiled/decode.cuh).
//
// A CTA owns 8 warps x R consecutive 16-row tiles and MT = 8 * NT tokens, over a range of K groups
// (split-K across CTAs when the row blocks alone cannot fill the GPU). Per group:
//   * the CTA stages x[MT tokens, 256 columns] in shared memory with cp.async (3 stages, one barrier
//     per group, zero-filled past the token range and K_in), so the 8 warps share one copy of x
//     instead of each reading it from L1/L2 (at M = 64 a warp would read 16x as many x bytes as
//     weight bytes);
//   * each warp decodes its tiles' group once (the GEMV's lookups, 2 groups of weights in flight),
//     scales the A fragments by the block absmax (8 packed multiplies per block: fp16/bf16 weights,
//     as dequantize + cuBLAS rounds them) and reuses them for NT x 2 MMAs accumulating in fp32 --
//     per 8 tokens a block costs one 16-byte shared load and 2 MMAs per tile. With R = 2 each x
//     load feeds both tiles (half the shared-memory x traffic per weight, which ncu showed as the
//     limit at M >= 32; it costs registers: one CTA per SM).
// Split-K partials (fp32) go to a workspace; the last CTA of a (row block, token chunk), found by
// an atomic counter, sums them in split order (deterministic) and writes y.
// NVFP4 (FP4 = true, K = 4 code layout, lowbit/formats/nvfp4/tiled.py): the codebook is the 16 E2M1
// values and each lane scales its fragments by an E4M3 byte per row and block (its 8 columns lie in
// one 16-column NVFP4 block); E2M1 x E4M3 is exact in fp16/bf16, so only the MMA sums round. The
// grouped kernel takes NVFP4 expert stacks the same way (scales[e] = each expert's scale_2).
// Grouped (MoE): tokens sorted by expert; every CTA scans the expert offsets into chunks of MT
// tokens and walks (chunk, row block) items, so empty experts cost nothing and one launch serves
// any distribution; the table is built once per CTA (a persistent grid).
#include <type_traits>

#include "common.cuh"
#include "tiled/decode.cuh"
#include "lowbit.h"

namespace lowbit {
namespace gemm {

using namespace gemv;

constexpr int kWarps = 8;                 // warps per CTA
template <int R> __host__ __device__ constexpr int rows_per_cta() { return kWarps * 16 * R; }
constexpr int kXStride = 256 + 32;        // x row stride in shared memory (elements): +64 B, so the
                                          // 8 row groups of a quarter-warp hit different banks
constexpr int kStages = 3;                // x stages in shared memory = weight groups in registers

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

// 2 CTAs per SM (registers capped at 128) where the shared memory allows it; R = 2 needs up to 255.
template <int BITS, int NT, int R>
__host__ __device__ constexpr int gemm_ctas_per_sm() { return R == 1 && 2 * gemm_smem<BITS, NT>() <= 220 * 1024 ? 2 : 1; }

// Stage x[tok0 .. tok0 + MT, grp * 256 .. + 256] into stage buffer xs (MT * 32 chunks of 16 bytes);
// rows from tok_end on are zeros.
template <int NT, typename T>
__device__ __forceinline__ void stage_x(uint32_t xs, const T* __restrict__ x, int tok_end, int k_in, int tok0, int grp) {
    constexpr int kChunks = 8 * NT * 32;
#pragma unroll
    for (int i = 0; i < (kChunks + kWarps * 32 - 1) / (kWarps * 32); ++i) {
        const int c = i * kWarps * 32 + threadIdx.x;
        if (kChunks % (kWarps * 32) == 0 || c < kChunks) {
            const int r = c >> 5, col = (c & 31) * 8;
            const int tok = tok0 + r, k = grp * 256 + col;
            const bool ok = tok < tok_end && k < k_in;
            cp_async16(xs + uint32_t(r * kXStride + col) * 2, ok ? x + int64_t(tok) * k_in + k : x, ok ? 16 : 0);
        }
    }
}

// Block J of the warp's R tiles against NT token tiles of the staged x: per tile 8 lookups give two
// A fragments, scaled by the rows' block absmax; each x fragment (one 16-byte shared load per 8
// tokens) then feeds the R tiles' 2 MMAs, so x's shared-memory traffic per weight falls as 1 / R.
// Branch-free (a branch would end ptxas's scheduling region and serialize the blocks' latency
// chains): a warp with fewer than R real tiles computes a copy of its first one (gemm_item).
template <int BITS, typename T, int NT, int R, bool FP4, int J>
__device__ __forceinline__ void gemm_block(float (&acc)[R][NT][4], const uint32_t (&w)[R][4 * BITS],
                                           const uint32_t (&a)[R][4], uint32_t lane_op, uint32_t table,
                                           uint32_t xs_lane) {
    uint32_t frag[R][2][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        lookup_block<BITS, false, J, true>(frag[r], w[r], lane_op, table);
        uint32_t lo, hi;
        scale_pairs<T, J, FP4>(a[r], lo, hi);
#pragma unroll
        for (int mm = 0; mm < 2; ++mm) {  // registers 0, 2: row g; 1, 3: row g + 8
            frag[r][mm][0] = hmul2<T>(frag[r][mm][0], lo);
            frag[r][mm][1] = hmul2<T>(frag[r][mm][1], hi);
            frag[r][mm][2] = hmul2<T>(frag[r][mm][2], lo);
            frag[r][mm][3] = hmul2<T>(frag[r][mm][3], hi);
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        // token 8 * nt + g, columns 32 J + 8 t .. + 8: exactly the B fragments of the block's 2 MMAs
        const uint4 xv = lds_u128(xs_lane + uint32_t((8 * nt * kXStride + 32 * J) * 2));
#pragma unroll
        for (int r = 0; r < R; ++r) {
            mma16816<T>(acc[r][nt], frag[r][0], xv.x, xv.y);
            mma16816<T>(acc[r][nt], frag[r][1], xv.z, xv.w);
        }
    }
}

template <int BITS, typename T, int NT, int R, bool FP4, int... J>
__device__ __forceinline__ void gemm_group(float (&acc)[R][NT][4], const GroupData<BITS> (&d)[R],
                                           uint32_t lane_op, uint32_t table, uint32_t xs_lane,
                                           std::integer_sequence<int, J...>) {
    uint32_t w[R][4 * BITS], a[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int c = 0; c < BITS; ++c) {
            w[r][4 * c] = d[r].w[c].x; w[r][4 * c + 1] = d[r].w[c].y;
            w[r][4 * c + 2] = d[r].w[c].z; w[r][4 * c + 3] = d[r].w[c].w;
        }
        a[r][0] = d[r].a.x; a[r][1] = d[r].a.y; a[r][2] = d[r].a.z; a[r][3] = d[r].a.w;
    }
    (gemm_block<BITS, T, NT, R, FP4, J>(acc, w, a, lane_op, table, xs_lane), ...);
}

// 16-byte scale chunks per unit: kbit absmax 128 bytes, NVFP4 scales 256.
template <bool FP4>
constexpr int kAStride = FP4 ? 16 : 8;

// The shared-memory addresses and per-lane operands of one CTA (fixed for its lifetime).
struct Ctx {
    uint32_t table, xs0, lane_op, xs_lane;
    const uint4* qw_lane;
    const uint4* qa_lane;
};

template <int BITS, int NT, bool FP4 = false>
__device__ __forceinline__ Ctx make_ctx(const uint4* __restrict__ qweight, const uint4* __restrict__ qabsmax) {
    using L = GemmLut<BITS>;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    Ctx c;
    c.table = static_cast<uint32_t>(__cvta_generic_to_shared(g_table));
    c.xs0 = c.table + uint32_t(L::kBytes);
    c.lane_op = L::lane_operand(c.table, lane);
    c.xs_lane = c.xs0 + uint32_t((g * kXStride + 8 * t) * 2);  // + stage, + token tile, + block
    c.qw_lane = qweight + lane;
    c.qa_lane = FP4 ? qabsmax + 2 * g + (t >> 1) : qabsmax + g;  // NVFP4: 32 bytes per row group, a half per t pair
    return c;
}

// One CTA work item: acc[r] += (the warp's tile r) x (tokens tok0 .. tok_end, at most MT) over
// groups [g0, g1). unit0 = unit index of tile r = 0, group 0 (units of consecutive tiles are
// n_groups apart); has_r = how many of the warp's R tiles exist (warp-uniform; idle warps still stage
// x and take part in the barriers). `pre()` runs while the first groups load (the table build).
// Starts and ends with every stage free of pending copies; the caller syncs before reusing stages.
template <int BITS, typename T, int NT, int R, bool FP4, typename Pre>
__device__ __forceinline__ void gemm_item(float (&acc)[R][NT][4], const Ctx& c, const T* __restrict__ x, int tok0,
                                          int tok_end, int k_in, int64_t unit0, int has_r, int n_groups, int g0,
                                          int g1, Pre&& pre) {
    constexpr uint32_t kStageBytes = uint32_t(8 * NT * kXStride * 2);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[r][nt][i] = 0.f;
    // Prologue: groups g0 and g0 + 1 in flight (weights in registers, x in stages 0 and 1).
    // Tile r's units; a tile past the last one (r >= has_r) re-reads tile 0 and is never stored.
    int64_t unit[R];
#pragma unroll
    for (int r = 0; r < R; ++r) unit[r] = unit0 + int64_t(r < has_r ? r : 0) * n_groups;
    GroupData<BITS> buf[kStages][R];
    if (has_r > 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            load_group<BITS, kAStride<FP4>>(buf[0][r], c.qw_lane, c.qa_lane, unit[r] + g0);
            if (g0 + 1 < g1) load_group<BITS, kAStride<FP4>>(buf[1][r], c.qw_lane, c.qa_lane, unit[r] + g0 + 1);
        }
    }
    stage_x<NT>(c.xs0, x, tok_end, k_in, tok0, g0);
    cp_async_commit();
    if (g0 + 1 < g1) stage_x<NT>(c.xs0 + kStageBytes, x, tok_end, k_in, tok0, g0 + 1);
    cp_async_commit();
    pre();
    for (int grp = g0; grp < g1;) {
#pragma unroll
        for (int s = 0; s < kStages; ++s) {  // unrolled: buf[] and the stage are compile-time; s = (grp - g0) % 3
            if (grp < g1) {
                cp_async_wait<1>();  // this thread's copies of group grp landed (grp + 1 may be in flight)
                __syncthreads();     // ... everyone's (and the table); every warp is done with group grp - 1
                if (grp + 2 < g1) stage_x<NT>(c.xs0 + ((s + 2) % kStages) * kStageBytes, x, tok_end, k_in, tok0, grp + 2);
                cp_async_commit();   // (possibly empty: keeps the group count uniform)
                if (has_r > 0) {  // warp-uniform
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        if (grp + 2 < g1)
                            load_group<BITS, kAStride<FP4>>(buf[(s + 2) % kStages][r], c.qw_lane, c.qa_lane, unit[r] + grp + 2);
                    gemm_group<BITS, T, NT, R, FP4>(acc, buf[s], c.lane_op, c.table, c.xs_lane + s * kStageBytes,
                                               std::make_integer_sequence<int, kGroupBlocks>{});
                }
                ++grp;
            }
        }
    }
    cp_async_wait<0>();
}

// Visit the warp's accumulators: acc[r][nt][i] is row (tile0 + r) * 16 + g + 8 (i >> 1), token
// 8 nt + 2 t + (i & 1) of the CTA's chunk; f(row, token in chunk, value) for the tiles that exist.
template <int NT, int R, typename F>
__device__ __forceinline__ void each_acc(const float (&acc)[R][NT][4], int tile0, int has_r, F&& f) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int r = 0; r < R; ++r)
        if (r < has_r)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    f((tile0 + r) * 16 + g + 8 * (i >> 1), 8 * nt + 2 * t + (i & 1), acc[r][nt][i]);
}

// y[tok, row] = acc * scale (+ bias[row]) for rows < n, tokens tok0 + ... < tok_end.
template <typename T, int NT, int R>
__device__ __forceinline__ void store_acc(const float (&acc)[R][NT][4], T* __restrict__ y, const T* __restrict__ bias,
                                          float scale, int tile0, int has_r, int tok0, int tok_end, int n) {
    each_acc<NT, R>(acc, tile0, has_r, [&](int row, int j, float v) {
        const int tok = tok0 + j;
        if (row < n && tok < tok_end) y[int64_t(tok) * n + row] = from_float<T>(v * scale + bias_of(bias, row));
    });
}

// Dense. grid: (row blocks, splits, token chunks). Padded rows (past N) and columns (past K_in)
// have zero codes and absmax; their x is staged as zeros, so they add exactly 0.
template <int BITS, typename T, int NT, int R, bool FP4 = false>
__global__ void __launch_bounds__(kWarps * 32, gemm_ctas_per_sm<BITS, NT, R>()) kbit_gemm_kernel(
    const T* __restrict__ x, const uint4* __restrict__ qweight, const uint4* __restrict__ qabsmax,
    const float* __restrict__ codebook, const float* __restrict__ scale_ptr, T* __restrict__ y,
    const T* __restrict__ bias, float* __restrict__ workspace, int* __restrict__ counters, int m, int n, int k_in,
    int n_tiles, int n_groups) {
    constexpr int MT = 8 * NT, kRows = rows_per_cta<R>();
    const int warp = threadIdx.x >> 5;
    const int splits = gridDim.y, split = blockIdx.y;
    const int tile0 = (blockIdx.x * kWarps + warp) * R;  // this warp's tiles: tile0 .. tile0 + R - 1
    const int has_r = max(0, min(R, n_tiles - tile0));
    const int tok0 = blockIdx.z * MT;
    const int g0 = int(int64_t(split) * n_groups / splits), g1 = int(int64_t(split + 1) * n_groups / splits);
    const Ctx c = make_ctx<BITS, NT, FP4>(qweight, qabsmax);
    float acc[R][NT][4];
    gemm_item<BITS, T, NT, R, FP4>(acc, c, x, tok0, m, k_in, int64_t(tile0) * n_groups, has_r, n_groups, g0, g1,
                                   [&] { GemmLut<BITS>::template build<kWarps * 32, T>(codebook); });
    const float scale = *scale_ptr * kOutFix<FP4>;  // the A fragments carry the block scales
    if (splits == 1) {
        store_acc<T, NT, R>(acc, y, bias, scale, tile0, has_r, tok0, m, n);
        return;
    }
    // workspace: [token chunk][split][tile row (n_tiles * 16)][MT] fp32
    const int rb = blockIdx.x, n_rb = gridDim.x;
    const int64_t tile_rows = int64_t(n_tiles) * 16;
    auto ws_at = [&](int sp) { return workspace + (int64_t(blockIdx.z) * splits + sp) * tile_rows * MT; };
    float* ws = ws_at(split);
    each_acc<NT, R>(acc, tile0, has_r, [&](int row, int j, float v) { ws[row * int64_t(MT) + j] = v; });
    __threadfence();
    __syncthreads();
    __shared__ int last;
    int* counter = counters + int64_t(blockIdx.z) * n_rb + rb;
    if (threadIdx.x == 0) last = atomicAdd(counter, 1) == splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Sum the splits (fixed order: deterministic) 4 tokens per float4, kBatch float4s per thread at a
    // time with all their loads issued together: one L2 round trip per split and batch instead of one
    // per element (a serial loop cost ~25 us at 256 rows x 64 tokens).
    constexpr int kVecs = kRows * MT / 4, kPer = kVecs / (kWarps * 32), kBatch = kPer < 4 ? kPer : 4;
    static_assert(kVecs % (kWarps * 32 * kBatch) == 0, "whole batches");
    for (int v0 = threadIdx.x; v0 < kVecs; v0 += kWarps * 32 * kBatch) {
        float4 sum[kBatch];
        int64_t off[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int v = v0 + b * kWarps * 32;
            const int64_t row = int64_t(rb) * kRows + v / (MT / 4);
            off[b] = row < tile_rows ? row * MT + (v % (MT / 4)) * 4 : 0;  // rows past the last tile: unused
            sum[b] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
        for (int sp = 0; sp < splits; ++sp) {
            float4 part[kBatch];
#pragma unroll
            for (int b = 0; b < kBatch; ++b) part[b] = __ldcg(reinterpret_cast<const float4*>(ws_at(sp) + off[b]));
#pragma unroll
            for (int b = 0; b < kBatch; ++b) {
                sum[b].x += part[b].x; sum[b].y += part[b].y; sum[b].z += part[b].z; sum[b].w += part[b].w;
            }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int v = v0 + b * kWarps * 32;
            const int row = rb * kRows + v / (MT / 4), tok = tok0 + (v % (MT / 4)) * 4;
            const float vals[4] = {sum[b].x, sum[b].y, sum[b].z, sum[b].w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
                if (row < n && tok + i < m) y[int64_t(tok + i) * n + row] = from_float<T>(vals[i] * scale + bias_of(bias, row));
        }
    }
    if (threadIdx.x == 0) *counter = 0;  // ready for the next launch (graph replays too)
}

// Grouped: chunk_begin[e] = index of expert e's first chunk of MT tokens (chunk_begin[E] = total),
// from the offsets, by every CTA (a block-wide scan; E of a few hundred costs ~1 us, once per CTA).
template <int MT>
__device__ int scan_chunks(int* chunk_begin, const int64_t* __restrict__ offsets, int n_experts) {
    __shared__ int warp_sum[kWarps];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) chunk_begin[0] = 0;
    int total = 0;
    for (int e0 = 0; e0 < n_experts; e0 += kWarps * 32) {
        const int e = e0 + threadIdx.x;
        int v = e < n_experts ? (static_cast<int>(offsets[e + 1] - offsets[e]) + MT - 1) / MT : 0;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {  // inclusive scan over the warp
            const int u = __shfl_up_sync(kFullMask, v, d);
            if (lane >= d) v += u;
        }
        if (lane == 31) warp_sum[warp] = v;
        __syncthreads();
        int before = total, all = 0;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
            before += w < warp ? warp_sum[w] : 0;
            all += warp_sum[w];
        }
        if (e < n_experts) chunk_begin[e + 1] = before + v;
        total += all;
        __syncthreads();  // warp_sum is rewritten by the next round; chunk_begin is complete after the last
    }
    return total;
}

template <int BITS, int NT>
__host__ __device__ constexpr size_t grouped_smem(int n_experts) {
    return gemm_smem<BITS, NT>() + size_t(n_experts + 1) * sizeof(int);
}

// grid: any number of CTAs (the host launches one full wave); item = chunk * row blocks + row block,
// so the CTAs working on one chunk of tokens at a time cover an expert's rows together (x from L2).
template <int BITS, typename T, int NT, bool FP4 = false>
__global__ void __launch_bounds__(kWarps * 32, gemm_ctas_per_sm<BITS, NT, 1>()) kbit_grouped_gemm_kernel(
    const T* __restrict__ x, const int64_t* __restrict__ offsets, const uint4* __restrict__ qweight,
    const uint4* __restrict__ qabsmax, const float* __restrict__ codebook, const float* __restrict__ scales,
    T* __restrict__ y, const T* __restrict__ bias, int n_experts, int n, int k_in, int n_tiles, int n_groups) {
    constexpr int MT = 8 * NT;
    int* chunk_begin = reinterpret_cast<int*>(g_table + gemm_smem<BITS, NT>());
    const int warp = threadIdx.x >> 5;
    const Ctx c = make_ctx<BITS, NT, FP4>(qweight, qabsmax);
    GemmLut<BITS>::template build<kWarps * 32, T>(codebook);
    const int total = scan_chunks<MT>(chunk_begin, offsets, n_experts);
    const int n_rb = (n_tiles + kWarps - 1) / kWarps;
    const int64_t items = int64_t(total) * n_rb;
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {  // block-uniform
        const int chunk = static_cast<int>(item / n_rb), rb = static_cast<int>(item % n_rb);
        int lo = 0, hi = n_experts;  // chunk_begin[lo] <= chunk < chunk_begin[hi]: the expert is lo
        while (hi - lo > 1) {
            const int mid = (lo + hi) >> 1;
            if (chunk_begin[mid] <= chunk) lo = mid; else hi = mid;
        }
        const int e = lo;
        const int tok0 = static_cast<int>(offsets[e]) + (chunk - chunk_begin[e]) * MT;
        const int tok_end = static_cast<int>(offsets[e + 1]);
        const int tile0 = rb * kWarps + warp;
        const int has_r = tile0 < n_tiles ? 1 : 0;
        __syncthreads();  // every warp is done with the previous item's x stages
        float acc[1][NT][4];
        gemm_item<BITS, T, NT, 1, FP4>(acc, c, x, tok0, tok_end, k_in, (int64_t(e) * n_tiles + tile0) * n_groups, has_r,
                                       n_groups, 0, n_groups, [] {});
        store_acc<T, NT, 1>(acc, y, bias == nullptr ? nullptr : bias + int64_t(e) * n, scales[e] * kOutFix<FP4>, tile0,
                            has_r, tok0, tok_end, n);
    }
}

template <int BITS, typename T, int NT, int R, bool FP4 = false>
int launch(const void* x, const void* qweight, const void* qabsmax, const float* codebook, const float* scale, void* y,
           const void* bias, float* workspace, int* counters, int m, int n, int k_in, int splits, void* stream) {
    const int n_tiles = (n + 15) / 16, n_groups = (k_in + 255) / 256;
    constexpr size_t smem = gemm_smem<BITS, NT>();
    auto kernel = kbit_gemm_kernel<BITS, T, NT, R, FP4>;
    if (int err = configure(kernel, smem)) return err;
    if (m < 1 || splits < 1 || splits > n_groups || (splits > 1 && (workspace == nullptr || counters == nullptr)))
        return static_cast<int>(cudaErrorInvalidValue);
    constexpr int kRows = rows_per_cta<R>();
    const dim3 grid((n_tiles * 16 + kRows - 1) / kRows, splits, (m + 8 * NT - 1) / (8 * NT));
    if (grid.z > 65535) return static_cast<int>(cudaErrorInvalidValue);
    kernel<<<grid, kWarps * 32, smem, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), static_cast<const uint4*>(qweight), static_cast<const uint4*>(qabsmax), codebook,
        scale, static_cast<T*>(y), static_cast<const T*>(bias), workspace, counters, m, n, k_in, n_tiles, n_groups);
    return static_cast<int>(cudaGetLastError());
}

template <int BITS, typename T, int NT, bool FP4 = false>
int launch_grouped(const void* x, const int64_t* offsets, const void* qweight, const void* qabsmax,
                   const float* codebook, const float* scales, void* y, const void* bias, int n_experts, int n,
                   int k_in, int ctas, void* stream) {
    const int n_tiles = (n + 15) / 16, n_groups = (k_in + 255) / 256;
    if (n_experts < 1 || ctas < 1 || grouped_smem<BITS, NT>(n_experts) > size_t(dynamic_smem_limit()))
        return static_cast<int>(cudaErrorInvalidValue);
    const size_t smem = grouped_smem<BITS, NT>(n_experts);
    auto kernel = kbit_grouped_gemm_kernel<BITS, T, NT, FP4>;
    if (int err = configure(kernel, smem)) return err;
    kernel<<<ctas, kWarps * 32, smem, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), offsets, static_cast<const uint4*>(qweight), static_cast<const uint4*>(qabsmax),
        codebook, scales, static_cast<T*>(y), static_cast<const T*>(bias), n_experts, n, k_in, n_tiles, n_groups);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace gemm
}  // namespace lowbit
