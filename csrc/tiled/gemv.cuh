#pragma once
// kbit decode GEMV / grouped (MoE) GEMV on tensor cores: y[M, N] = x[M, K_in] @ W^T, M <= 8.
//
// Why tensor cores for M = 1..4: the arithmetic budget per weight on H100 is ~5 issued
// instructions (3.1 TB/s of 4.25-bit weights = ~22 weights per SM-clock against 128 issue
// slots). Scalar fp32 FMAs alone would cost M instructions per weight. Instead weights are the
// A operand of mma.m16n8k16 ("swap AB": rows of W are the MMA's M, tokens its N), so one MMA
// per thread covers 8 weights for any M <= 8, accumulating in fp32.
//
// Per 16 weights a lane does: 8 pair lookups (one 4-byte shared load each, giving two fp16/bf16
// codebook values; its address is one byte permute for K=4, mask + LEA for K=3/5 plus a funnel
// shift for the few fields that straddle two words) or, for K=2 in stream-K, 4 quad lookups
// (one 8-byte load each; two or three blocks of a group's 8 decode in registers instead,
// kK2RegBlocks); 2 MMAs, 2 absmax decodes and 4 FMAs that apply the two rows' block scales to the
// block's partial sums: ~2 instructions per weight at K=4 (ncu: ~300 per group of
// 4,096). At 16 warps per SM the large shapes are bound by load latency and the access pattern,
// not by issue (benchmarks/journal/2026-11-23_round_3_large_shapes_what_limits.md).
// Layout: see lowbit/formats/kbit/tiled.py (the reference repack that defines it).
// NVFP4 (FP4 = true; lowbit/formats/nvfp4/tiled.py): the K=4 instances with the 16 E2M1 values as
// codebook and E4M3 scales applied to the A fragments before the MMAs (scale_pairs, tiled/decode.cuh).
// This header holds the templates; each format's exported instances live in its own folder
// (kbit/gemv.cu, nvfp4/tiled_gemv.cu).
//
// Two kernels share the decode: stream-K (dense; warps that share a tile sum their fp32 partials
// in warp order, through global memory and an atomic counter, or -- "CTA-local" -- through shared
// memory when every CTA owns whole tiles) and split-in-CTA (grouped MoE and small dense shapes;
// the warps of a tile reduce through shared memory in slice order). All are deterministic: the
// summation order never depends on which warp arrives first.
#include <type_traits>
#include <utility>

#include "common.cuh"
#include "tiled/decode.cuh"
#include "lowbit.h"

namespace lowbit {
namespace gemv {

constexpr int kWarps = 8;         // warps per CTA (split kernel)
constexpr int kStreamWarps = 16;  // warps per CTA (stream-K kernel: one CTA per SM, see below)

// Per-lane constants of the unit loop.
template <typename T>
struct LaneCtx {
    const T* x;        // this lane's token row (rows >= m read token m-1: their outputs are dropped), + 8t
    uint32_t lane_op;  // Lut::lane_operand
    uint32_t table;    // the table's shared-window address (uniform)
    int k_blocks;      // k_in / 32
    uint32_t rot;      // ROT: this lane's Hadamard A-fragment value (rotate_x)
    CbRegs cb2;        // K=2 / K=3 register decode (kK2RegBlocks, kK3RegBlocks): the codebook's bytes
};

// ---- rotation = 32 (lowbit/formats/kbit/rotation.py): the weight holds W H per 32-column block
// (H: the orthonormal Sylvester Walsh-Hadamard matrix), so the kernel multiplies by x H instead of
// x. x H is computed on the tensor cores from the lane's x registers, exactly in fp32 and rounded
// once: the block's 32 x 8 (columns x tokens) x is the B operand of two m16n8k16 MMAs per 16
// rotated columns, with a constant A of +-1/8 (exact in fp16/bf16; the output is scaled by
// sqrt(2) = 8 / sqrt(32) once, kRotOutFix). The MMA leaves x H transposed (rows: columns); one
// movmatrix per register turns it back into the B layout of the main MMAs. Cost per block: 4 MMAs,
// 4 converts, 4 movmatrix, 2 negations; shared by the 16 rows of the unit.
//
// Lane (g, t) holds block columns c = 8t + 2q + e in x register q (q = 0..3, e = half), so a B
// fragment's k (2t + e, or 2t + 8 + e) is column 8t + 4kc + 2h + e for MMA kc in {0, 1} and half
// h. Rotated column r of D row 8h' + 2t' + e' of m-tile mt is assigned 8t' + 4mt + 2h' + e', so that
// after the transpose lane t holds rotated columns 8t + 2q + e in register q = 2mt + h' -- the
// layout the main MMAs read. With these orders the sign (-1)^popc(r & c) of A splits into
// t-bits x e-bits (the lane's value P), h x h' (register 3 only) and mt x kc (B negated for mt = 1
// on kc = 1): the A fragment is {P, P, P, -P} for both m-tiles.
constexpr float kRotOutFix = 1.4142135623730951f;  // sqrt(2): the +-1/8 of A times sqrt(32) / 8

template <typename T>
__device__ __forceinline__ uint32_t rot_fragment(int lane) {
    const int g = lane >> 2, t = lane & 3;
    const bool flip_t = __popc((g >> 1) & t) & 1;  // (-1)^popc(t_r & t_c): the columns' lane bits
    const float lo = flip_t ? -0.125f : 0.125f;    // e_c = 0
    const float hi = (g & 1) ? -lo : lo;           // e_c = 1: (-1)^(e_r & e_c)
    return Pack2<T>::pack(lo, hi);
}

template <typename T>
__device__ __forceinline__ uint4 rotate_x(const uint4& xv, uint32_t p) {
    const uint32_t a[4] = {p, p, p, p ^ 0x80008000u};
    float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
    mma16816<T>(d0, a, xv.x, xv.y);  // m-tile 0: columns of kc 0 + kc 1
    mma16816<T>(d0, a, xv.z, xv.w);
    mma16816<T>(d1, a, xv.x, xv.y);  // m-tile 1: kc 0 - kc 1
    mma16816<T>(d1, a, xv.z ^ 0x80008000u, xv.w ^ 0x80008000u);
    uint4 r;
    r.x = movmatrix_trans(Pack2<T>::pack(d0[0], d0[1]));
    r.y = movmatrix_trans(Pack2<T>::pack(d0[2], d0[3]));
    r.z = movmatrix_trans(Pack2<T>::pack(d1[0], d1[1]));
    r.w = movmatrix_trans(Pack2<T>::pack(d1[2], d1[3]));
    return r;
}

template <bool ROT>
constexpr float kRotFix = ROT ? kRotOutFix : 1.f;

// K=2 in the stream-K kernel: which of a group's 8 blocks decode in registers (bit J: cb2_block) instead of
// through the table, by the instance's token count. The table path is bound by the shared-memory data path,
// the register path costs ~3x its ALU instructions; two or three blocks of eight balance them. H100,
// 8192x29568, us:
//   M = 1: none 33.9, blocks 0 4 31.2, 0 2 4 30.7, 0 3 6 33.9, 0 1 4 5 32.6, every other 35.4, all 43.4
//   M = 2: none 36.9, blocks 0 4 37.6, 0 2 4 38.8 (4096x28672: 20.7, 19.2, 18.6)
//   M = 4: none 38.0, blocks 0 4 36.2, 0 2 4 38.2, every other 39.8, all 47.1
// The rotated instances keep the table: their x is permuted after the rotation, in registers, and at M = 4 that
// spilled (8192x29568 47.9 -> 51.4 us). (benchmarks/journal/2026-11-26_k2_register_decode.md.)
__host__ __device__ constexpr unsigned kK2RegBlocks(int maxm, bool rot) { return rot ? 0u : maxm == 1 ? 0x15u : 0x11u; }

// K=3, the same trade (cb3_block): blocks 0 2 4 in registers in the one-token stream-K instance and in the split
// kernel. H100, M = 1, CTA-local stream-K alone, us, table -> 0 2 4: 4096x6144 8.14 -> 7.65, 14336x4096 13.51 ->
// 13.03, 8192x29568 39.20 -> 38.69 (0 4: 39.18, every other 38.89, all 41.46; y bit-equal). Llama-3-8B kbit3 step
// at batch 1: 489.1 -> 496.5 tok/s with both kernels, 491.0 with the stream-K one alone. The bulk-copy kernel keeps
// the table: every mask was slower there (8192x29568 40.5 -> 41.0 us at 0 4, 48.3 at all). It keeps x in registers,
// so its table lookups share the shared-memory data path with less (not profiled).
// (benchmarks/journal/2026-11-28_k3_register_decode.md.)
__host__ __device__ constexpr unsigned kK3RegBlocks(int maxm, bool rot) { return rot || maxm != 1 ? 0u : 0x15u; }
constexpr unsigned kK3SplitRegBlocks = 0x15u;

// Block J of a group: decode 16 codes into two A fragments, 2 MMAs, apply the rows' block scales.
// NVFP4 (FP4): the lane's 8 columns lie in one 16-column block, so its fragments are scaled before
// the MMAs (exact in fp16/bf16, as in the GEMM) and the MMAs accumulate straight into acc.
template <int BITS, bool QUAD, typename T, bool FP4, bool ROT, unsigned K2REG, bool XPERM, int J>
__device__ __forceinline__ void process_block(float (&acc)[4], const uint32_t (&w)[4 * BITS], const uint32_t (&a)[4],
                                              const uint4& x_in, uint32_t lane_op, uint32_t table, uint32_t rot,
                                              const CbRegs& cb2) {
    constexpr bool REG = QUAD && BITS == 2 && ((K2REG >> J) & 1);
    constexpr bool REG3 = BITS == 3 && !FP4 && ((K2REG >> J) & 1);  // K=3: the table's fragments, x as it is
    uint4 xv = ROT ? rotate_x<T>(x_in, rot) : x_in;  // just in time: 4 live registers, not 32
    uint32_t frag[2][4];
    if constexpr (REG) {
        cb2_block(frag, w[J], cb2);
        if constexpr (!XPERM) xv = cb2_x(xv);  // XPERM: stage_x stored this block's x in that order
    } else if constexpr (REG3) {
        cb3_block<J>(frag, w, cb2);
    } else {
        lookup_block<BITS, QUAD, J>(frag, w, lane_op, table);
    }
    if constexpr (FP4) {
        uint32_t lo, hi;
        scale_pairs<T, J, true>(a, lo, hi);
#pragma unroll
        for (int mm = 0; mm < 2; ++mm) {  // registers 0, 2: row g; 1, 3: row g + 8
            frag[mm][0] = hmul2<T>(frag[mm][0], lo);
            frag[mm][1] = hmul2<T>(frag[mm][1], hi);
            frag[mm][2] = hmul2<T>(frag[mm][2], lo);
            frag[mm][3] = hmul2<T>(frag[mm][3], hi);
        }
        mma16816<T>(acc, frag[0], xv.x, xv.y);
        mma16816<T>(acc, frag[1], xv.z, xv.w);
        return;
    }
    float part[4] = {0.f, 0.f, 0.f, 0.f};
    mma16816<T>(part, frag[0], xv.x, xv.y);
    mma16816<T>(part, frag[1], xv.z, xv.w);
    float s_lo, s_hi;
    block_scales<J>(a, s_lo, s_hi);
    acc[0] = fmaf(s_lo, part[0], acc[0]);
    acc[1] = fmaf(s_lo, part[1], acc[1]);
    acc[2] = fmaf(s_hi, part[2], acc[2]);
    acc[3] = fmaf(s_hi, part[3], acc[3]);
}

template <int BITS, bool QUAD, typename T, bool FP4, bool ROT, unsigned K2REG, bool XPERM, int... J>
__device__ __forceinline__ void process_blocks(float (&acc)[4], const uint32_t (&w)[4 * BITS], const uint32_t (&a)[4],
                                               const uint4 (&xv)[kGroupBlocks], uint32_t lane_op, uint32_t table,
                                               uint32_t rot, const CbRegs& cb2, std::integer_sequence<int, J...>) {
    (process_block<BITS, QUAD, T, FP4, ROT, K2REG, XPERM, J>(acc, w, a, xv[J], lane_op, table, rot, cb2), ...);
}

// The output factor besides the tensor scale: kbit partial sums carry the block scales times
// 2^-112 (kScaleFix undoes it), NVFP4 fragments the E4M3 scales / 256.
template <bool FP4>
constexpr float kGemvOutFix = FP4 ? 256.f : kScaleFix;

// This lane's 16-byte scale chunk of a unit (kbit absmax: one per row group; NVFP4: one per row
// group and lane pair) and the chunks per unit.
template <bool FP4>
__device__ __forceinline__ const uint4* scale_lane(const uint4* qabsmax, int g, int t) {
    return FP4 ? qabsmax + 2 * g + (t >> 1) : qabsmax + g;
}
template <bool FP4>
constexpr int kScaleStride = FP4 ? 16 : 8;

// Where a kernel reads x from (the XSRC template argument; 0 / 1 are also "PDL: false / true"):
// global memory; global through the coherent path after pdl_wait, under PDL (common.cuh: ld_x); or a
// copy in shared memory (stage_x), zero-padded to whole groups.
constexpr int kXGlobal = 0, kXCoherent = 1, kXShared = 2;
// x staged in shared memory (and not rotated, which needs the natural order) is stored in the register
// decode's order by stage_x, instead of 4 byte permutes per block here.
template <int BITS, bool QUAD, int XSRC, bool ROT> constexpr bool kXPerm = QUAD && BITS == 2 && XSRC == kXShared && !ROT;

// x[k..k+7] of one block.
template <int XSRC, typename T>
__device__ __forceinline__ uint4 x_chunk(const T* p) {
    if constexpr (XSRC == kXShared) {
        uint4 v;  // not volatile: the copy is published by a barrier before any read
        asm("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
        return v;
    } else if constexpr (XSRC == kXCoherent) {
        return ld_x(reinterpret_cast<const uint4*>(p));
    } else {
        return *reinterpret_cast<const uint4*>(p);
    }
}

// silu(g) * u in fp32: the one formula of the SwiGLU epilogue and the routed down GEMV's staged activation.
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.f + __expf(-g)) * u; }

// silu(gate) * up of 8 columns, in fp32, rounded once (as the SwiGLU epilogue and ops.swiglu_reference): gate at p,
// up at p + off; coherent loads (under PDL gate|up is the kernel before).
template <typename T>
__device__ __forceinline__ uint4 act_chunk(const T* p, int off) {
    const uint4 gv = ld_x(reinterpret_cast<const uint4*>(p)), uv = ld_x(reinterpret_cast<const uint4*>(p + off));
    const uint32_t gs[4] = {gv.x, gv.y, gv.z, gv.w}, us[4] = {uv.x, uv.y, uv.z, uv.w};
    uint32_t out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 g = to_float2<T>(gs[i]), u = to_float2<T>(us[i]);
        out[i] = Pack2<T>::pack(silu_mul(g.x, u.x), silu_mul(g.y, u.y));
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}

// Load x for the 8 blocks of group grp (zero past k_in in a partial last group; the shared copy
// holds those zeros).
template <int XSRC, typename T>
__device__ __forceinline__ void load_x(uint4 (&xv)[kGroupBlocks], const LaneCtx<T>& ctx, int grp) {
    const int valid_blocks = ctx.k_blocks - grp * kGroupBlocks;
    const T* xg = ctx.x + grp * 256;
    if (XSRC == kXShared || valid_blocks >= kGroupBlocks) {
#pragma unroll
        for (int j = 0; j < kGroupBlocks; ++j) xv[j] = x_chunk<XSRC>(xg + 32 * j);
    } else {
#pragma unroll
        for (int j = 0; j < kGroupBlocks; ++j) xv[j] = j < valid_blocks ? x_chunk<XSRC>(xg + 32 * j) : make_uint4(0, 0, 0, 0);
    }
}

// The shared copy of x: rows of whole groups (zero-padded) plus 16 bytes, so that the 8 rows a warp
// reads at one column fall in different banks.
__host__ __device__ constexpr size_t x_row_bytes(int k_in) { return size_t((k_in + 255) / 256) * 512 + 16; }

// The staging loop of stage_x and stage_act: m shared rows of x_row_bytes(k_in), chunk(row, col) the 16 bytes of
// column chunk col (col < k_in / 8; k_in % 32 == 0: whole chunks), zeros past it; PERM as stage_x's.
template <unsigned PERM = 0, typename Chunk>
__device__ __forceinline__ void stage_rows(uint4* xs, int m, int k_in, Chunk&& chunk) {
    const int row_chunks = int(x_row_bytes(k_in) / 16);  // 16-byte chunks per shared row (the last: padding)
    const int chunks = m * row_chunks, valid = k_in / 8;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        const int row = c / row_chunks, col = c - row * row_chunks;
        uint4 v = col < valid ? chunk(row, col) : make_uint4(0, 0, 0, 0);
        if (PERM != 0 && ((PERM >> ((col >> 2) & 7)) & 1)) v = cb2_x(v);
        xs[c] = v;
    }
}

// Copy x's m rows into shared memory at xs (all threads of the CTA; the caller publishes it with a
// barrier). Read through the coherent path: under PDL x may come from the kernel before.
// PERM: bit j set: the chunks of block j of every group are stored in cb2_x's order (the register decode's).
template <unsigned PERM, typename T>
__device__ __forceinline__ void stage_x(T* xs, const T* __restrict__ x, int m, int k_in) {
    stage_rows<PERM>(reinterpret_cast<uint4*>(xs), m, k_in, [&](int row, int col) {
        return ld_x(reinterpret_cast<const uint4*>(x + int64_t(row) * k_in) + col);
    });
}

// ACT (the routed down GEMV on gate|up's output): silu(gate) * up of the m routes at positions tok0.. of rowmap,
// rows [gate | up] of 2 k_in columns in x, into xs as stage_x lays x out (whole groups, zero-padded), once per CTA
// and chunk of routes -- the units then read it from shared memory instead of recomputing it per tile.
template <typename T>
__device__ __forceinline__ void stage_act(T* xs, const T* __restrict__ x, const int* rowmap, int tok0, int m, int k_in) {
    stage_rows(reinterpret_cast<uint4*>(xs), m, k_in, [&](int row, int col) {
        return act_chunk<T>(x + int64_t(rowmap[tok0 + row]) * 2 * k_in + 8 * col, k_in);
    });
}

// One group: decode + MMAs. Padded columns past k_in have zero absmax; their x is zero too, so
// they add exactly 0 (never 0 * Inf).
template <int BITS, bool QUAD, typename T, bool FP4 = false, bool ROT = false, unsigned K2REG = 0, bool XPERM = false>
__device__ __forceinline__ void decode_group(float (&acc)[4], const GroupData<BITS>& d, const uint4 (&xv)[kGroupBlocks],
                                             const LaneCtx<T>& ctx) {

    uint32_t w[4 * BITS];
#pragma unroll
    for (int c = 0; c < BITS; ++c) {
        w[4 * c] = d.w[c].x; w[4 * c + 1] = d.w[c].y; w[4 * c + 2] = d.w[c].z; w[4 * c + 3] = d.w[c].w;
    }
    const uint32_t a[4] = {d.a.x, d.a.y, d.a.z, d.a.w};
    process_blocks<BITS, QUAD, T, FP4, ROT, K2REG, XPERM>(acc, w, a, xv, ctx.lane_op, ctx.table, ctx.rot, ctx.cb2,
                                            std::make_integer_sequence<int, kGroupBlocks>{});
}

template <int BITS, bool QUAD, typename T, int XSRC, bool FP4 = false, bool ROT = false, unsigned K2REG = 0>
__device__ __forceinline__ void compute_group(float (&acc)[4], const GroupData<BITS>& d, const LaneCtx<T>& ctx,
                                              int grp) {
    uint4 xv[kGroupBlocks];
    load_x<XSRC>(xv, ctx, grp);
    decode_group<BITS, QUAD, T, FP4, ROT, K2REG, kXPerm<BITS, QUAD, XSRC, ROT>>(acc, d, xv, ctx);
}

template <int BITS, bool QUAD, typename T>
__device__ __forceinline__ LaneCtx<T> lane_ctx(const T* x, int64_t x_stride, int m, int k_in) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int row = g < m ? g : m - 1;
    LaneCtx<T> c;
    c.x = x + row * x_stride + 8 * t;
    c.table = static_cast<uint32_t>(__cvta_generic_to_shared(g_table));
    c.lane_op = Lut<BITS, QUAD>::lane_operand(c.table, lane);
    c.k_blocks = k_in / 32;
    c.rot = rot_fragment<T>(lane);
    c.cb2 = CbRegs{};
    return c;
}

// ---- The decode step's glue, fused into the output (lowbit_epilogue, lowbit.h): a residual add and the
// next RMSNorm's weight where the residual stream is written (o_proj, down_proj), the norm's per-token
// factor where its output is read (the next GEMV). Only the kernels' EPI instances (kbit and NVFP4, unrotated) have it:
// its branches at every store site of the plain kernels doubled their code and cost 2-9% with no epilogue
// (benchmarks/journal/2026-11-26_decode_layer_glue_in_gemvs.md).
template <typename T>
struct Epilogue {
    const T* rms_x;     // [m, k_in]: y *= rsqrt(mean(rms_x[tok]^2) + eps) before the bias
    const T* residual;  // [m, n]: y += residual before the one rounding
    const T* norm_w;    // [n] with yw [m, n]: yw = round(y * norm_w)
    T* yw;
    float eps;
};

template <typename T>
__host__ Epilogue<T> epilogue_of(const lowbit_epilogue* e) {
    if (e == nullptr) return Epilogue<T>{nullptr, nullptr, nullptr, nullptr, 0.f};
    return Epilogue<T>{static_cast<const T*>(e->rms_x), static_cast<const T*>(e->residual),
                       static_cast<const T*>(e->norm_weight), static_cast<T*>(e->yw), e->eps};
}

constexpr int kRmsRows = 8;  // token rows a GEMV launch normalizes (it takes <= 8)

// Per-warp sums of squares of rms_x's m rows into part[warp][row], by every thread of the CTA after
// pdl_wait (rms_x is the previous kernel's output); a barrier publishes them. Fixed order: deterministic.
// Every row's loads are issued before any is summed: one L2 round trip for the m rows, not m.
template <typename T>
__device__ __forceinline__ void rms_load(uint4 (&v)[kRmsRows], const T* rms_x, int m, int k_in, int c) {
#pragma unroll
    for (int r = 0; r < kRmsRows; ++r)
        if (r < m) v[r] = ld_x(reinterpret_cast<const uint4*>(rms_x + int64_t(r) * k_in) + c);
}
template <typename T>
__device__ __forceinline__ void rms_add(float (&s)[kRmsRows], const uint4 (&v)[kRmsRows], int m) {
#pragma unroll
    for (int r = 0; r < kRmsRows; ++r) {
        if (r >= m) continue;
        const uint32_t w[4] = {v[r].x, v[r].y, v[r].z, v[r].w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const float2 f = to_float2<T>(w[q]);
            s[r] = fmaf(f.x, f.x, s[r]);
            s[r] = fmaf(f.y, f.y, s[r]);
        }
    }
}
__device__ __forceinline__ void rms_publish(float (*part)[kRmsRows], float (&s)[kRmsRows], int m) {
#pragma unroll
    for (int r = 0; r < kRmsRows; ++r) {
        if (r >= m) continue;
#pragma unroll
        for (int o = 16; o; o >>= 1) s[r] += __shfl_xor_sync(kFullMask, s[r], o);
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5][r] = s[r];
    }
}
template <int WARPS, typename T>
__device__ __forceinline__ void rms_partials(float (*part)[kRmsRows], const T* rms_x, int m, int k_in) {
    float s[kRmsRows];
#pragma unroll
    for (int r = 0; r < kRmsRows; ++r) s[r] = 0.f;
    for (int c = threadIdx.x; c < k_in / 8; c += WARPS * 32) {
        uint4 v[kRmsRows];
        rms_load(v, rms_x, m, k_in, c);
        rms_add<T>(s, v, m);
    }
    rms_publish(part, s, m);
}

// The same (the same sums, in the same order) with `between()` run once in every thread after its first loads are
// issued and before they are summed: a copy of x there (stage_x) waits on the same L2 round trip instead of one of its
// own. rms_x null: between() only.
template <int WARPS, typename T, typename F>
__device__ __forceinline__ void rms_partials(float (*part)[kRmsRows], const T* rms_x, int m, int k_in, F&& between) {
    const int chunks = rms_x == nullptr ? 0 : k_in / 8;
    float s[kRmsRows];
#pragma unroll
    for (int r = 0; r < kRmsRows; ++r) s[r] = 0.f;
    uint4 v[kRmsRows];
    if (int(threadIdx.x) < chunks) rms_load(v, rms_x, m, k_in, threadIdx.x);
    between();
    for (int c = threadIdx.x; c < chunks; c += WARPS * 32) {
        if (c != int(threadIdx.x)) rms_load(v, rms_x, m, k_in, c);
        rms_add<T>(s, v, m);
    }
    if (rms_x != nullptr) rms_publish(part, s, m);
}

// The norm's factor of each token from the published partials (warp order), into this warp's own row of
// `factor` (lanes < m; no CTA barrier: each warp sums the same partials in the same order). The stores then
// read one value: the summation is not repeated at every store site (code size matters in these kernels).
template <int WARPS>
__device__ __forceinline__ void rms_factors(float* factor, const float (*part)[kRmsRows], int m, int k_in, float eps) {
    const int lane = threadIdx.x & 31;
    if (lane < m) {
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) s += part[w][lane];
        factor[lane] = rsqrtf(s / float(k_in) + eps);
    }
    __syncwarp();
}

// y[idx] = v (+ res), rounded once; and yw[idx] = round(y[idx] * nw): the epilogue's one output, with the residual
// value and the norm weight at hand (the split kernel stages them in shared memory: epi_stage).
template <typename T>
__device__ __forceinline__ void write_out_staged(T* __restrict__ y, const Epilogue<T>& epi, int64_t idx, float v,
                                                 const T& res, const T& nw) {
    if (epi.residual != nullptr) v += to_float(res);
    const T out = from_float<T>(v);
    y[idx] = out;
    if (epi.yw != nullptr) epi.yw[idx] = from_float<T>(to_float(out) * to_float(nw));
}

// The same, reading residual[idx] and norm_w[row] from global memory. Out of line: the stores are inlined into
// every pipeline stage's tile flush.
template <typename T>
__device__ __noinline__ void write_out(T* __restrict__ y, const Epilogue<T>& epi, int64_t idx, int row, float v) {
    const T none = from_float<T>(0.f);
    write_out_staged(y, epi, idx, v, epi.residual != nullptr ? epi.residual[idx] : none,
                     epi.yw != nullptr ? epi.norm_w[row] : none);
}

// The split kernel's EPI tail: the slice-0 warp of a tile sums the partials, then writes each output with its
// residual and norm weight. Loaded there, those are L2 round trips one after another at the very end (write_out is
// out of line); instead the warp copies its tile's rows of both into shared memory (cp.async, no registers) right
// after the PDL wait, while its units decode. Rows in 16-byte pieces: n % 8 == 0 and aligned rows (else write_out).
constexpr int kEpiStageElems = kRmsRows * 16 + 16;  // per warp: [token][16 residual rows], then 16 norm weights
template <typename T>
__device__ __forceinline__ bool epi_stageable(const Epilogue<T>& epi, int n) {
    auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
    return (epi.residual != nullptr || epi.yw != nullptr) && n % 8 == 0 && aligned(epi.residual) && aligned(epi.norm_w);
}
// Lanes 0 .. 2m - 1 copy token lane / 2's half lane % 2 of the tile's residual rows, lanes 16 and 17 the norm
// weights' halves; every lane then commits its (possibly empty) group.
template <typename T>
__device__ __forceinline__ void epi_stage(T* st, const Epilogue<T>& epi, int lane, int tile, int tok0, int m, int n) {
    const int row0 = tile * 16;
    if (epi.residual != nullptr && lane < 2 * m) {
        const int tok = lane >> 1, h = lane & 1, ok = row0 + 8 * h < n;
        cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(st + tok * 16 + 8 * h)),
                   ok ? epi.residual + int64_t(tok0 + tok) * n + row0 + 8 * h : epi.residual, ok ? 16 : 0);
    }
    if (epi.yw != nullptr && (lane == 16 || lane == 17)) {
        const int h = lane - 16, ok = row0 + 8 * h < n;
        cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(st + kRmsRows * 16 + 8 * h)),
                   ok ? epi.norm_w + row0 + 8 * h : epi.norm_w, ok ? 16 : 0);
    }
    cp_async_commit();
}

// ---- The unit loop: an S-deep register pipeline (the split kernel: 2, its warps' slices are a
// few groups, often one; the stream-K kernel: kStreamStages).
constexpr int kSplitStages = 2;

// Issue the loads of units [u0, u0 + S - 1) (the pipeline prologue) into buf[0..].
template <int BITS, int S, bool FP4 = false>
__device__ __forceinline__ void prologue(GroupData<BITS> (&buf)[S], const uint4* qw_lane,
                                         const uint4* qa_lane, int64_t u0, int64_t u_end) {
#pragma unroll
    for (int s = 0; s + 1 < S; ++s)
        if (u0 + s < u_end) load_group<BITS, kScaleStride<FP4>>(buf[s], qw_lane, qa_lane, u0 + s);
}

// A range of at most S units, every one loaded now (the pipeline's buffers hold them all): the split kernel's
// warps of a mid-size dense GEMV (4096 -> 4096: 2 groups each) then have their whole slice in flight before the
// PDL wait, not half of it. Returns whether it did (run_units' FULL).
template <int BITS, int S, bool FP4 = false>
__device__ __forceinline__ bool preload_all(GroupData<BITS> (&buf)[S], const uint4* qw_lane, const uint4* qa_lane,
                                            int64_t u0, int64_t u_end) {
    if (u_end - u0 > S) return false;
#pragma unroll
    for (int s = 0; s < S; ++s)
        if (u0 + s < u_end) load_group<BITS, kScaleStride<FP4>>(buf[s], qw_lane, qa_lane, u0 + s);
    return true;
}

// Stream units [u_begin, u_end) (prologue already issued) through an S-deep register pipeline,
// accumulating into acc; at the end of every tile (or of the range) call
// flush(acc, tile, first_group, end_group) and restart from zero. Tile boundaries don't drain
// the pipeline: loads run ahead across them. The caller gives u_begin's tile and group (it knows
// them; dividing here put a 64-bit division on every warp's critical path). FULL: the caller loaded
// the whole range (u_end - u_begin <= S: preload_all), so the loop issues no loads. wait(grp) runs
// before a unit reads x's group grp (the library passes none; benchmarks/tools/gemv_chain_probe.cu's
// per-group flags do).
struct NoWait {
    __device__ __forceinline__ void operator()(int) const {}
};
template <int BITS, bool QUAD, typename T, int S, int XSRC, bool FP4, bool ROT, unsigned K2REG, typename Flush,
          typename Wait = NoWait>
__device__ __forceinline__ void run_units(GroupData<BITS> (&buf)[S], const uint4* qw_lane,
                                          const uint4* qa_lane, const LaneCtx<T>& ctx, int64_t u_begin,
                                          int64_t u_end, int tile, int grp, int n_groups, Flush&& flush,
                                          bool full = false, Wait&& wait = {}) {
    int g0 = grp;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int64_t u = u_begin; u < u_end;) {
#pragma unroll
        for (int i = 0; i < S; ++i) {  // unrolled: buf[] indices are compile-time (registers)
            if (u < u_end) {
                if (u + S - 1 < u_end && !full)
                    load_group<BITS, kScaleStride<FP4>>(buf[(i + S - 1) % S], qw_lane, qa_lane, u + S - 1);
                wait(grp);
                compute_group<BITS, QUAD, T, XSRC, FP4, ROT, K2REG>(acc, buf[i], ctx, grp);
                LOWBIT_TRACE(3 + (u - u_begin < 16 ? int(u - u_begin) : 15));  // unit decoded
                ++u;
                if (++grp == n_groups || u == u_end) {
                    flush(acc, tile, g0, grp);
#pragma unroll
                    for (int r = 0; r < 4; ++r) acc[r] = 0.f;
                    ++tile;
                    grp = g0 = 0;
                }
            }
        }
    }
}

// The stream-K kernel's pipeline depth (groups in flight per warp: one being decoded, S - 1
// loading). K = 2 up to 3 tokens moves the fewest bytes per group and keeps one more stage. K = 3 had it
// too, until a two-stage K = 3 measured 3-18% faster on every shape, most on mid shapes (4096x6144 9.71 ->
// 8.11 us). Two stages at K = 2 measured 1-9% faster with 4 and 8 tokens, but 7-8% slower on 4096x28672
// with 1 and 2 (benchmarks/journal/2026-11-26_gemv_startup.md). Deeper measured slower at K = 4 (8192x28672: 3 stages,
// still 128 registers, 49.3 vs 48.2 us; 4 stages, 8 warps per SM, 63.1; again this session on H100 and
// H200), and so did a shared-memory ring filled by cp.async (8/6/4/3 stages, one 16-warp CTA per SM sharing
// one table): the kernel is not short of bytes in flight
// (benchmarks/journal/2026-11-23_round_3_large_shapes_what_limits.md, ..._round_4_the_large_shape_ceiling.md).
__host__ __device__ constexpr int kStreamStages(int bits, int maxm) { return bits <= 2 && maxm <= 3 ? 3 : 2; }
template <int BITS> __host__ __device__ constexpr bool kStreamQuad() { return BITS == 2; }
// Shared memory: the table, then (CTA-local mode) fp32 partial tiles [warp][slot][acc register][lane].
template <int BITS> __host__ __device__ constexpr size_t stream_table_bytes() { return Lut<BITS, kStreamQuad<BITS>()>::kBytes; }
template <int BITS> __host__ __device__ constexpr size_t stream_smem() {
    return stream_table_bytes<BITS>() + size_t(kStreamWarps) * 2 * 128 * sizeof(float);
}
// The SwiGLU epilogue's outputs of a CTA's tile pairs: [gate | up][pair][16 rows][8 tokens] fp32, up to
// kSwiMaxPairs pairs (a CTA-local grid leaves ~7 pairs per CTA on Llama-3-8B's 28672-row gate|up).
constexpr int kSwiMaxPairs = 32;
__host__ __device__ constexpr size_t swi_smem(int pairs) { return size_t(pairs) * 2 * 16 * 8 * sizeof(float); }
// Which instances stage x in shared memory (XS), up to how many bytes of it. K=2/3 move few bytes per
// unit, so an L2 round trip for x on every unit shows: 8192x29568 K=2 35.9 -> 34.2 us, K=3 44.5 -> 41.6,
// 4096x28672 K=3 25.4 -> 23.9 (H100, M = 1; benchmarks/journal/2026-11-25_gemv_x_staging.md). At K=4 the register pipeline already hides it and the copy
// only adds its own round trip (8192x29568 49.7 -> 50.2, 14336x4096 14.9 -> 15.6; M = 4 18.6 vs 15.8).
template <int BITS, bool FP4> constexpr bool kStageX = !FP4 && BITS <= 3;
constexpr size_t kStageXMaxBytes = 32 * 1024;

// Tile pairs a CTA of the SwiGLU epilogue may hold on this device (<= kSwiMaxPairs): the room left by the table, the
// partial sums and (xs) x's copy, in swi_smem(1) steps. An H100 or H200 keeps 32 either way; a 99 KB part (sm_86 /
// sm_89) has 18 without the copy and no room for it.
template <int BITS>
int swi_max_pairs(bool xs) {
    const int64_t room = int64_t(dynamic_smem_limit()) - int64_t(stream_smem<BITS>() + (xs ? kStageXMaxBytes : 0));
    const int64_t pairs = room > 0 ? room / int64_t(swi_smem(1)) : 0;
    return int(pairs < kSwiMaxPairs ? pairs : kSwiMaxPairs);
}

// Dense GEMV, "stream-K": the n_tiles x n_groups units (16 rows x 256 columns each) are cut
// into n_warps contiguous ranges, one per warp, on a grid that fits the GPU in one wave: warp w
// gets q + (w < r) units (q, r = units / n_warps, units % n_warps). A warp's range covers whole
// tiles (written directly) and at most a partial head and tail tile, whose fp32 partials go to
// slot 0 (the warp's first tile) or 1 (its last). 32-bit math: units < 2^31.
//
// Global mode: one range per warp over all units; partial tiles are summed through `workspace`
// by the last warp to finish them (atomic counter, __threadfence: a chain of L2 round trips).
// CTA-local mode (kFlagLocal; mid-size shapes): CTA c owns whole tiles (tiles are cut into
// gridDim.x contiguous ranges, `tiles` below), its 16 warps cut the CTA's units into 16 ranges, and
// partial tiles are summed from shared memory after one barrier. The grid is one CTA per SM, so the
// whole GEMV is one wave (every CTA, not just the first wave, loads weights before the PDL wait),
// balanced to a tile per CTA and a unit per warp, with no global atomics.
struct StreamK {
    int q, r;
    __device__ __forceinline__ int begin(int w) const { return w * q + (w < r ? w : r); }
    __device__ __forceinline__ int warp_of(int u) const {  // the warp whose range holds unit u
        const int big = r * (q + 1);
        return u < big ? u / (q + 1) : r + (u - big) / q;
    }
};

// PDL: weights, scale and table (constants) are read before griddepcontrol.wait; x, y, workspace and
// counters (stream-ordered data) only after it, and the next kernel is triggered right after it
// (common.cuh). One instance serves both launches: without the programmatic-serialization attribute
// both instructions are no-ops (a plain-launch instance doubled the file's compile time for nothing).
// XS: x is first copied to shared memory (stage_x, after the PDL wait), so that no unit waits on an L2
// round trip for its x (the launcher picks it where it pays: kStageX).
// SWI (an EPI instance, CTA-local mode only): y = silu(round(gate)) * round(up) where the weight's rows are
// [gate; up], each n / 2 (n % 32 == 0: launch_gemv checks). The tiles pair up -- gate tile j with up tile j + n_tiles / 2 -- and
// `tiles` cuts the pairs among the CTAs; warps 0-7 stream a CTA's gate units, 8-15 its up units (both halves
// the same size). Tiles are not written as they finish: their rounded-to-be fp32 values wait in shared
// memory (swi_smem), and after the CTA's last barrier each thread writes one y value from its pair. The
// activation's own kernel goes away, and the down projection can start under PDL behind this one.
template <int BITS, typename T, int MAXM, bool FP4 = false, bool ROT = false, bool XS = false, bool EPI = false,
          bool SWI = false>
__global__ void __launch_bounds__(kStreamWarps * 32, 1) kbit_gemv_kernel(
    const T* __restrict__ x, const uint4* __restrict__ qweight, const uint4* __restrict__ qabsmax,
    const float* __restrict__ codebook, const float* __restrict__ scale_ptr, T* __restrict__ y,
    const T* __restrict__ bias, float* __restrict__ workspace, int* __restrict__ counters, int m, int n, int k_in, int n_tiles, int n_groups,
    int n_warps, StreamK sk, bool local, StreamK tiles, const Epilogue<T> epi) {
    constexpr bool QUAD = kStreamQuad<BITS>();
    static_assert(!SWI || (EPI && !ROT), "SwiGLU is an epilogue of unrotated weights");
    __shared__ float rms_part[EPI ? kStreamWarps : 1][kRmsRows], rms_f[EPI ? kStreamWarps : 1][kRmsRows];  // EPI: the norm
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    // Global mode: warp w of all n_warps, ranges over all units. Local: warp `warp` of this CTA's
    // units, which start at unit_base (its first tile's first unit); sk then describes the CTA.
    int w = blockIdx.x * kStreamWarps + warp, unit_base = 0, cta_tiles = 0;
    constexpr int kHalfWarps = kStreamWarps / 2;  // SWI: warps per half (gate | up)
    [[maybe_unused]] int t0 = 0;                  // SWI: the CTA's first pair
    if (local) {
        if constexpr (SWI) {  // `tiles` and cta_tiles count pairs; each half's units cut among its 8 warps
            t0 = tiles.begin(blockIdx.x);
            cta_tiles = tiles.begin(blockIdx.x + 1) - t0;
            const int units = cta_tiles * n_groups, half = warp / kHalfWarps;
            sk = StreamK{units / kHalfWarps, units % kHalfWarps};
            unit_base = (t0 + half * (n_tiles / 2)) * n_groups;
            w = warp - half * kHalfWarps;
            n_warps = kHalfWarps;
        } else {
            const int first = tiles.begin(blockIdx.x);
            cta_tiles = tiles.begin(blockIdx.x + 1) - first;
            const int units = cta_tiles * n_groups;
            sk = StreamK{units / kStreamWarps, units % kStreamWarps};
            unit_base = first * n_groups;
            w = warp;
            n_warps = kStreamWarps;
        }
    }
    const int u_begin = unit_base + sk.begin(w), u_end = unit_base + sk.begin(w + 1);
    LOWBIT_TRACE(0);  // entry
    const uint4* qw_lane = qweight + lane;
    const uint4* qa_lane = scale_lane<FP4>(qabsmax, g, t);
    // The codebook's load first (Lut::fetch), then the first groups', whose latency hides the table build.
    const float cb = Lut<BITS, QUAD>::fetch(codebook);
    constexpr int S = kStreamStages(BITS, MAXM);
    // K=2, K=3: blocks decoded in registers
    constexpr unsigned K2REG = QUAD ? kK2RegBlocks(MAXM, ROT) : BITS == 3 && !FP4 ? kK3RegBlocks(MAXM, ROT) : 0u;
    GroupData<BITS> buf[S];
    if (w < n_warps) prologue<BITS, S, FP4>(buf, qw_lane, qa_lane, u_begin, u_end);
    const float scale = *scale_ptr * kRotFix<ROT>;  // issued early: its latency overlaps the table build
    Lut<BITS, QUAD>::template store<kStreamWarps * 32, T>(cb);
    // every lane, before any warp leaves
    const CbRegs cb2 = !K2REG ? CbRegs{} : QUAD ? cb2_regs<T>(cb) : cb3_regs<T>(cb);
    m = m < MAXM ? m : MAXM;
    // SWI: [half][pair][16 rows][8 tokens] fp32 outputs after the table and the partials, then x's copy
    float* swi = reinterpret_cast<float*>(g_table + stream_smem<BITS>());
    T* xs = reinterpret_cast<T*>(g_table + stream_smem<BITS>() + (SWI ? swi_smem(tiles.q + (tiles.r > 0)) : 0));
    const bool rms = EPI && epi.rms_x != nullptr;  // the norm's statistics, before the barrier like x's copy
    if (XS || rms) {
        pdl_wait();  // x, y, workspace, counters and the epilogue's tensors belong to the stream order
        pdl_launch_dependents();
    }
    // x's copy between the norm's loads and its sums: one L2 round trip for both
    if (XS || rms)
        rms_partials<kStreamWarps>(rms_part, rms ? epi.rms_x : nullptr, m, k_in, [&] {
            if constexpr (XS) stage_x<kXPerm<BITS, QUAD, kXShared, ROT> ? K2REG : 0u>(xs, x, m, k_in);
        });
    __syncthreads();
    LOWBIT_TRACE(1);  // table built
    if (w >= n_warps) return;  // global mode only (local: n_warps = kStreamWarps, SWI: kHalfWarps)
    if (rms) rms_factors<kStreamWarps>(rms_f[warp], rms_part, m, k_in, epi.eps);
    if (!XS && !rms) {
        pdl_wait();
        pdl_launch_dependents();
    }
    LOWBIT_TRACE(2);  // past the PDL wait
    LaneCtx<T> ctx = XS ? lane_ctx<BITS, QUAD, T>(xs, x_row_bytes(k_in) / sizeof(T), m, k_in)
                        : lane_ctx<BITS, QUAD, T>(x, k_in, m, k_in);
    if constexpr (K2REG != 0) ctx.cb2 = cb2;
    constexpr int XSRC = XS ? kXShared : kXCoherent;
    const int first_tile = u_begin / n_groups;
    float* red = reinterpret_cast<float*>(g_table + stream_table_bytes<BITS>());  // local: [warp][slot][4][32]
    auto store = [&](const float (&v)[4], int tile) {
        const int row0 = tile * 16 + g;
        if constexpr (SWI) {  // into the pair's shared slot (every row exists: n % 32 == 0)
            const int th = tile >= n_tiles / 2, pair = tile - th * (n_tiles / 2) - t0;
            float* o = swi + ((th * cta_tiles + pair) * 16 + g) * 8 + 2 * t;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = row0 + (i >> 1) * 8, tok = 2 * t + (i & 1);
                if (tok < m) o[(i >> 1) * 64 + (i & 1)] = v[i] * kGemvOutFix<FP4> * (rms ? rms_f[warp][tok] * scale : scale) + bias_of(bias, row);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = row0 + (i >> 1) * 8, tok = 2 * t + (i & 1);
                if (tok < m && row < n) {
                    if constexpr (EPI) {
                        const float f = rms ? rms_f[warp][tok] * scale : scale;
                        write_out(y, epi, int64_t(tok) * n + row, row, v[i] * kGemvOutFix<FP4> * f + bias_of(bias, row));
                    } else {
                        y[int64_t(tok) * n + row] = from_float<T>(v[i] * kGemvOutFix<FP4> * scale + bias_of(bias, row));
                    }
                }
            }
        }
    };
    auto flush = [&](const float (&acc)[4], int tile, int g0, int g1) {
        if (g0 == 0 && g1 == n_groups) {  // whole tile: write the output
            store(acc, tile);
            return;
        }
        if (local) {  // partial tile: summed from shared memory after the loop
            float* p = red + (warp * 2 + (tile == first_tile ? 0 : 1)) * 128 + lane;
#pragma unroll
            for (int i = 0; i < 4; ++i) p[32 * i] = acc[i];
            return;
        }
        // partial tile: [warp][slot][16 rows][8 tokens] fp32; the last contributor reduces
        float* ws = workspace + (int64_t(w) * 2 + (tile == first_tile ? 0 : 1)) * 128;
#pragma unroll
        for (int i = 0; i < 4; ++i) ws[(g + (i >> 1) * 8) * 8 + 2 * t + (i & 1)] = acc[i];
        __threadfence();
        const int w_first = sk.warp_of(tile * n_groups);
        const int w_last = sk.warp_of((tile + 1) * n_groups - 1);
        int last = 0;
        if (lane == 0) last = atomicAdd(&counters[tile], 1) == w_last - w_first;
        last = __shfl_sync(kFullMask, last, 0);
        if (!last) return;
        __threadfence();
        float sum[4] = {0.f, 0.f, 0.f, 0.f};
        for (int v = w_first; v <= w_last; ++v) {  // fixed order: deterministic
            const int v_first_tile = sk.begin(v) / n_groups;
            const float* p = workspace + (int64_t(v) * 2 + (tile == v_first_tile ? 0 : 1)) * 128;
#pragma unroll
            for (int i = 0; i < 4; ++i) sum[i] += __ldcg(p + (g + (i >> 1) * 8) * 8 + 2 * t + (i & 1));
        }
        store(sum, tile);
        if (lane == 0) counters[tile] = 0;  // ready for the next launch (graph replays too)
    };
    run_units<BITS, QUAD, T, S, XSRC, FP4, ROT, K2REG>(buf, qw_lane, qa_lane, ctx, u_begin, u_end, first_tile,
                                                u_begin - first_tile * n_groups, n_groups, flush);
    LOWBIT_TRACE(19);  // units done
    if (!local) return;
    // CTA-local: each tile shared by warps w_first..w_last is summed in warp order by one warp.
    __syncthreads();
    LOWBIT_TRACE(20);  // partials published
    if constexpr (!SWI) {
        for (int j = warp; j < cta_tiles; j += kStreamWarps) {
            const int w_first = sk.warp_of(j * n_groups), w_last = sk.warp_of((j + 1) * n_groups - 1);
            if (w_first == w_last) continue;  // one warp's whole tile: already written
            float sum[4] = {0.f, 0.f, 0.f, 0.f};
            for (int v = w_first; v <= w_last; ++v) {
                const float* p = red + (v * 2 + (j == sk.begin(v) / n_groups ? 0 : 1)) * 128 + lane;
#pragma unroll
                for (int i = 0; i < 4; ++i) sum[i] += p[32 * i];
            }
            store(sum, unit_base / n_groups + j);
        }
    } else {
        // the gate half's shared tiles, then the up half's (jj over both; half h's warps are h * 8 + v)
        for (int jj = warp; jj < 2 * cta_tiles; jj += kStreamWarps) {
            const int h = jj >= cta_tiles, j = jj - h * cta_tiles;
            const int w_first = sk.warp_of(j * n_groups), w_last = sk.warp_of((j + 1) * n_groups - 1);
            if (w_first == w_last) continue;  // one warp's whole tile: already in shared memory
            float sum[4] = {0.f, 0.f, 0.f, 0.f};
            for (int v = w_first; v <= w_last; ++v) {
                const float* p = red + ((h * kHalfWarps + v) * 2 + (j == sk.begin(v) / n_groups ? 0 : 1)) * 128 + lane;
#pragma unroll
                for (int i = 0; i < 4; ++i) sum[i] += p[32 * i];
            }
            store(sum, t0 + h * (n_tiles / 2) + j);
        }
        // every pair's gate and up are in shared memory: y = silu(gate) * up, each rounded first
        __syncthreads();
        const int rows = cta_tiles * 16, half_n = n / 2;
        for (int e = threadIdx.x; e < m * rows; e += kStreamWarps * 32) {
            const int tok = e / rows, r = e - tok * rows;
            const float* o = swi + r * 8 + tok;  // [pair][row] is r
            const float gv = to_float(from_float<T>(o[0])), uv = to_float(from_float<T>(o[cta_tiles * 128]));
            y[int64_t(tok) * half_n + t0 * 16 + r] = from_float<T>(silu_mul(gv, uv));
        }
    }
    LOWBIT_TRACE(21);  // done
}

// Split-K inside one CTA, for grouped (MoE) GEMV and for dense shapes too small to fill the GPU
// with whole tiles: a CTA item is (expert, 8/S consecutive tiles); the S warps of a tile each take
// a contiguous slice of its groups, leave their fp32 partials in shared memory, and the slice-0
// warp sums them in slice order (deterministic) and writes the output. No global atomics, no
// workspace, no second pass: the fixed latency of a small GEMV is one weight load plus two
// barriers. Experts are given by expert_offsets (tokens sorted by expert; empty experts are
// compacted away first, so CTAs only see items with work), or, when it is null, one expert with
// m_dense tokens. More than 8 tokens on an expert are processed 8 at a time.
struct ActiveExpert {
    int e, lo, hi;  // expert id and its token range [lo, hi)
    float scale;    // its global scale
};

// Where each warp of a split-kernel CTA works, computed once on the host: ncu showed the integer
// divisions that derived it (warp / split, warp % split, slice * n_groups / split, ...) at ~40% of
// the instructions of a small GEMV, ahead of its first weight load.
// Per-warp fields are packed in 64-bit words (8-bit fields for 8 warps, 16-bit fields in two
// words) and picked with shifts: indexing a parameter array by warp would copy it to local memory.
struct SplitPlan {
    int items_per_expert;  // CTA items per expert: ceil(n_tiles / tiles_per_item)
    int tiles_per_item;    // kWarps / split
    uint64_t tile;         // byte w: warp w's tile within the item; 0xff: idle (split does not divide kWarps)
    uint64_t slice;        // byte w: warp w's slice of the tile's groups
    uint64_t g_begin[2];   // 16-bit field w: warp w's groups [g_begin, g_end) of every tile
    uint64_t g_end[2];
    __host__ void set(int w, int tile_, int slice_, int g0, int g1) {
        tile |= uint64_t(tile_ & 0xff) << (8 * w);
        slice |= uint64_t(slice_) << (8 * w);
        g_begin[w / 4] |= uint64_t(g0) << (16 * (w % 4));
        g_end[w / 4] |= uint64_t(g1) << (16 * (w % 4));
    }
    __device__ __forceinline__ int tile_of(int w) const { return static_cast<signed char>(tile >> (8 * w)); }
    __device__ __forceinline__ int slice_of(int w) const { return static_cast<int>((slice >> (8 * w)) & 0xff); }
    __device__ __forceinline__ int field16(const uint64_t (&v)[2], int w) const {
        return static_cast<int>(((w < 4 ? v[0] : v[1]) >> (16 * (w & 3))) & 0xffff);
    }
};

// Routed rows (decode MoE without sorting on the host): route r multiplies x row r / x_div by expert
// ids[r] into y row r (gate|up: x_div = top-k, every token's row read once per route; down: 1).
// ids == nullptr: not routed.
struct Routes {
    const int64_t* ids;
    int count;  // <= kMaxRoutes
    int x_div;
};
constexpr int kMaxRoutes = kWarps * 32;  // one route per thread while the CTA orders them

// The split kernel's dynamic shared memory: the table, the active experts, then for routes their raw and sorted ids
// (ints); ACT: min(8, routes) staged rows of K_in after that (a chunk's routes), 16-byte aligned.
template <int BITS> __host__ __device__ constexpr size_t split_lists_end(int n_experts, int routes) {
    return Lut<BITS, false>::kBytes + size_t(n_experts) * sizeof(ActiveExpert) + size_t(routes) * 2 * sizeof(int);
}
template <int BITS> __host__ __device__ constexpr size_t split_act_offset(int n_experts, int routes) {
    return (split_lists_end<BITS>(n_experts, routes) + 15) & ~size_t(15);
}
template <int BITS> __host__ __device__ constexpr size_t split_smem(int n_experts, int routes = 0, int act_k_in = 0) {
    return act_k_in ? split_act_offset<BITS>(n_experts, routes) + size_t(routes < 8 ? routes : 8) * x_row_bytes(act_k_in)
                    : split_lists_end<BITS>(n_experts, routes);
}

// Write the active experts (in expert order) to `list`; returns their count (block-uniform).
inline __device__ int compact_experts(ActiveExpert* list, const int64_t* __restrict__ offsets,
                               const float* __restrict__ scales, int n_experts) {
    __shared__ int warp_count[kWarps];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int total = 0;
    for (int e0 = 0; e0 < n_experts; e0 += kWarps * 32) {
        const int e = e0 + threadIdx.x;
        int lo = 0, hi = 0;
        if (e < n_experts) { lo = static_cast<int>(offsets[e]); hi = static_cast<int>(offsets[e + 1]); }
        const bool active = hi > lo;
        const unsigned ballot = __ballot_sync(kFullMask, active);
        if (lane == 0) warp_count[warp] = __popc(ballot);
        __syncthreads();
        int before = total, chunk = 0;
#pragma unroll
        for (int v = 0; v < kWarps; ++v) {
            before += v < warp ? warp_count[v] : 0;
            chunk += warp_count[v];
        }
        if (active) list[before + __popc(ballot & ((1u << lane) - 1u))] = ActiveExpert{e, lo, hi, scales[e]};
        total += chunk;
        __syncthreads();  // warp_count is rewritten by the next chunk
    }
    return total;
}

// Routed: the CTA orders the routes by (expert, route) -- each route's rank is the number of routes
// before it, O(count) per thread, cheaper than a sort kernel at decode sizes -- so that the routes of
// one expert share its weight pass, as sorted rows do. rowmap[p]: the route at position p; list: the
// experts' position ranges. Ids outside [0, n_experts) (expert-parallel sentinels) are left out and
// stay -1 in s_id (the caller zeroes their rows). Returns the active experts (block-uniform).
inline __device__ int compact_routes(ActiveExpert* list, int* rowmap, int* s_id, int* s_sorted, const Routes routes,
                                     const float* __restrict__ scales, int n_experts) {
    __shared__ int warp_count[kWarps];
    const int r = threadIdx.x, warp = r >> 5, lane = r & 31, count = routes.count;
    int id = -1;
    if (r < count) {
        const int64_t v = routes.ids[r];
        id = v >= 0 && v < n_experts ? static_cast<int>(v) : -1;
        s_id[r] = id;
    }
    const int valid = __syncthreads_count(id >= 0);
    if (id >= 0) {
        int rank = 0;
        for (int j = 0; j < count; ++j) {
            const int o = s_id[j];
            rank += o >= 0 && (o < id || (o == id && j < r));
        }
        rowmap[rank] = r;
        s_sorted[rank] = id;
    }
    __syncthreads();
    const bool start = r < valid && (r == 0 || s_sorted[r] != s_sorted[r - 1]);
    const unsigned ballot = __ballot_sync(kFullMask, start);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) {
        before += v < warp ? warp_count[v] : 0;
        total += warp_count[v];
    }
    if (start) {
        const int e = s_sorted[r];
        int hi = r + 1;
        while (hi < valid && s_sorted[hi] == e) ++hi;
        list[before + __popc(ballot & ((1u << lane) - 1u))] = ActiveExpert{e, r, hi, scales[e]};
    }
    return total;
}

// ONE: the small dense GEMV (host-checked: no experts, every warp's slice is one group, one item per
// CTA, <= 8 tokens, no PDL): the weights *and x* are loaded before the table build and decoded right
// after the barrier -- no unit loop, no item loop (x's L2 latency no longer follows the barrier;
// 2048x512 K=4 3.50 -> 3.16 us). A separate instance, so the general kernel keeps its registers.
// ROUTED: rows given by Routes (compact_routes) -- its own instance, so that the others keep their registers
// (they sit at 128).
template <int BITS, typename T, bool PDL, bool ONE = false, bool FP4 = false, bool ROT = false, bool ROUTED = false,
          bool EPI = false, bool ACT = false>
__global__ void __launch_bounds__(kWarps * 32) kbit_split_gemv_kernel(
    const T* __restrict__ x, const int64_t* __restrict__ expert_offsets, int m_dense,
    const uint4* __restrict__ qweight, const uint4* __restrict__ qabsmax, const float* __restrict__ codebook,
    const float* __restrict__ scales, T* __restrict__ y, const T* __restrict__ bias, int n_experts, int n, int k_in,
    int n_tiles, int n_groups, int split, const SplitPlan plan, const Routes routes, const Epilogue<T> epi) {
    constexpr int S_ = kSplitStages;
    __shared__ float partial[kWarps][4][32];  // [warp][acc register][lane]: conflict-free
    __shared__ float rms_part[EPI ? kWarps : 1][kRmsRows], rms_f[EPI ? kWarps : 1][kRmsRows];  // EPI: the norm
    ActiveExpert* list = reinterpret_cast<ActiveExpert*>(g_table + Lut<BITS, false>::kBytes);
    __shared__ int rowmap[ROUTED ? kMaxRoutes : 1];  // ROUTED: the route at each position
    __shared__ alignas(16) T epi_st[EPI ? kWarps : 1][EPI ? kEpiStageElems : 8];  // EPI: epi_stage's rows per warp
    const bool staged = EPI && epi_stageable(epi, n);  // dense only (EPI is): token rows are y rows
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int items_per_expert = plan.items_per_expert, tiles_per_item = plan.tiles_per_item;
    const int tile_in_item = plan.tile_of(warp);
    const bool warp_used = tile_in_item >= 0;  // split not dividing kWarps leaves kWarps % split warps idle
    const int slice = plan.slice_of(warp);
    const int g_begin = plan.field16(plan.g_begin, warp), g_end = plan.field16(plan.g_end, warp);  // >= 1 group
    const uint4* qw_lane = qweight + lane;
    const uint4* qa_lane = scale_lane<FP4>(qabsmax, g, t);
    auto first_unit = [&](int e, int tile) { return (int64_t(e) * n_tiles + tile) * n_groups + g_begin; };
    // The slice-0 warp of a tile sums its slices' partials in slice order (deterministic) and writes y.
    auto store_tile = [&](int tile, int e, int tok0, int m, float scale) {
        float sum[4] = {0.f, 0.f, 0.f, 0.f};
        for (int s = 0; s < split; ++s) {
#pragma unroll
            for (int i = 0; i < 4; ++i) sum[i] += partial[warp + s][i][lane];
        }
        const int row0 = tile * 16 + g;
        const T* ebias = bias == nullptr ? nullptr : bias + int64_t(e) * n;  // [n_experts, n]
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int row = row0 + (i >> 1) * 8, tok = 2 * t + (i & 1);
            if (tok < m && row < n) {
                const int y_row = ROUTED ? rowmap[tok0 + tok] : tok0 + tok;
                const float v = sum[i] * (kGemvOutFix<FP4> * kRotFix<ROT>);
                if constexpr (EPI) {  // dense only (host-checked): y_row is the token row of rms_x and residual
                    const float f = epi.rms_x != nullptr ? rms_f[warp][y_row] * scale : scale;
                    // one fused multiply-add, written out: with the two calls below the compiler kept v * f apart
                    // in some instances, and a zero residual then missed the plain GEMV's bits by an ulp
                    const float val = fmaf(v, f, bias_of(ebias, row));
                    if (staged)
                        write_out_staged(y, epi, int64_t(y_row) * n + row, val, epi_st[warp][tok * 16 + (row - tile * 16)],
                                         epi_st[warp][kRmsRows * 16 + (row - tile * 16)]);
                    else
                        write_out(y, epi, int64_t(y_row) * n + row, row, val);
                } else {
                    y[int64_t(y_row) * n + row] = from_float<T>(fmaf(v, scale, bias_of(ebias, row)));
                }
            }
        }
    };

    if constexpr (ONE) {
        static_assert(!PDL, "the one-group path reads x before any wait");
        const int tile = blockIdx.x * tiles_per_item + tile_in_item;
        const bool has_tile = warp_used && tile < n_tiles;
        const LaneCtx<T> ctx = lane_ctx<BITS, false, T>(x, k_in, m_dense, k_in);
        const float cb = Lut<BITS, false>::fetch(codebook);  // before the weights (Lut::fetch)
        GroupData<BITS> d;
        uint4 xv[kGroupBlocks];
        if (has_tile) {
            load_group<BITS, kScaleStride<FP4>>(d, qw_lane, qa_lane, first_unit(0, tile));
            load_x<false>(xv, ctx, g_begin);
        }
        const float scale = *scales;
        Lut<BITS, false>::template store<kWarps * 32, T>(cb);
        static_assert(!EPI, "the epilogue runs in the general instance (launch_split)");
        __syncthreads();
        if (has_tile) {
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            decode_group<BITS, false, T, FP4, ROT>(acc, d, xv, ctx);
#pragma unroll
            for (int i = 0; i < 4; ++i) partial[warp][i][lane] = acc[i];
        }
        __syncthreads();
        if (has_tile && slice == 0) store_tile(tile, 0, 0, m_dense, scale);
        return;
    }

    const float cb = Lut<BITS, false>::fetch(codebook);  // before the weights (Lut::fetch)
    GroupData<BITS> buf[S_];
    bool prefetched = false, full = false;  // full: the first item's whole slice loaded (preload_all)
    if (expert_offsets == nullptr && !ROUTED) {
        // Dense: the first item is known before anything is read, so its loads overlap the table build.
        const int tile = blockIdx.x * tiles_per_item + tile_in_item;
        if (warp_used && blockIdx.x < items_per_expert && tile < n_tiles) {
            const int64_t u0 = first_unit(0, tile), u1 = u0 + (g_end - g_begin);
            full = preload_all<BITS, S_, FP4>(buf, qw_lane, qa_lane, u0, u1);
            if (!full) prologue<BITS, S_, FP4>(buf, qw_lane, qa_lane, u0, u1);
            prefetched = true;
        }
        if (threadIdx.x == 0) list[0] = ActiveExpert{0, 0, m_dense, *scales};
    }
    Lut<BITS, false>::template store<kWarps * 32, T>(cb);
    constexpr unsigned K3REG = BITS == 3 && !FP4 && !ROT ? kK3SplitRegBlocks : 0u;  // K=3: blocks in registers
    const CbRegs cb3 = K3REG ? cb3_regs<T>(cb) : CbRegs{};                          // every lane
    if constexpr (PDL) {
        pdl_wait();  // expert_offsets and x come from earlier kernels; y is written below
        pdl_launch_dependents();
    }
    int n_active = 1;
    if constexpr (ROUTED) {
        int* s_id = reinterpret_cast<int*>(list + n_experts);
        n_active = compact_routes(list, rowmap, s_id, s_id + routes.count, routes, scales, n_experts);
        if (blockIdx.x == 0) {  // rows of routes to no expert: zeros (they contribute nothing)
            for (int r = 0; r < routes.count; ++r) {
                if (s_id[r] >= 0) continue;
                for (int c = threadIdx.x; c < n; c += kWarps * 32) y[int64_t(r) * n + c] = from_float<T>(0.f);
            }
        }
    } else if (expert_offsets != nullptr) {
        n_active = compact_experts(list, expert_offsets, scales, n_experts);
    } else if (EPI && epi.rms_x != nullptr) {
        rms_partials<kWarps>(rms_part, epi.rms_x, m_dense, k_in);
    }
    __syncthreads();
    if (EPI && epi.rms_x != nullptr) rms_factors<kWarps>(rms_f[warp], rms_part, m_dense, k_in, epi.eps);

    const int items = n_active * items_per_expert;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {  // block-uniform loop
        const int ei = expert_offsets == nullptr && !ROUTED ? 0 : item / items_per_expert;  // dense: no division
        const ActiveExpert ae = list[ei];
        const int tile = (item - ei * items_per_expert) * tiles_per_item + tile_in_item;
        const bool has_tile = warp_used && tile < n_tiles;  // warp-uniform
        const float scale = ae.scale;
        const int64_t u0 = first_unit(ae.e, tile), u1 = u0 + (g_end - g_begin);
        for (int tok0 = ae.lo; tok0 < ae.hi; tok0 += 8) {
            const int m = ae.hi - tok0 < 8 ? ae.hi - tok0 : 8;
            [[maybe_unused]] T* xs = nullptr;
            if constexpr (ACT) {  // this chunk's weights first, then its routes' activation, shared by the CTA
                if (has_tile && !prefetched) prologue<BITS, S_, FP4>(buf, qw_lane, qa_lane, u0, u1);
                prefetched = has_tile;
                xs = reinterpret_cast<T*>(g_table + split_act_offset<BITS>(n_experts, routes.count));
                stage_act<T>(xs, x, rowmap, tok0, m, k_in);
                __syncthreads();
            }
            if (has_tile) {
                if (!prefetched) prologue<BITS, S_, FP4>(buf, qw_lane, qa_lane, u0, u1);
                prefetched = false;
                // routed: each lane's token row through the route order (lane_ctx with one row); ACT: the staged rows
                LaneCtx<T> ctx =
                    ACT ? lane_ctx<BITS, false, T>(xs, x_row_bytes(k_in) / sizeof(T), m, k_in)
                    : !ROUTED ? lane_ctx<BITS, false, T>(x + int64_t(tok0) * k_in, k_in, m, k_in)
                              : lane_ctx<BITS, false, T>(x + int64_t(rowmap[tok0 + (g < m ? g : m - 1)] / routes.x_div) * k_in,
                                                         k_in, 1, k_in);
                if constexpr (K3REG != 0) ctx.cb2 = cb3;
                auto flush = [&](const float (&acc)[4], int, int, int) {
#pragma unroll
                    for (int i = 0; i < 4; ++i) partial[warp][i][lane] = acc[i];
                };
                if (staged && slice == 0) epi_stage(epi_st[warp], epi, lane, tile, tok0, m, n);
                run_units<BITS, false, T, S_, ACT ? kXShared : PDL, FP4, ROT, K3REG>(
                    buf, qw_lane, qa_lane, ctx, u0, u1, tile, g_begin, n_groups, flush, full);
                full = false;
            }
            if (staged) cp_async_wait<0>();  // this thread's epi_stage copies landed (the barrier shares them)
            __syncthreads();
            if (has_tile && slice == 0) store_tile(tile, ae.e, tok0, m, scale);
            __syncthreads();  // partial[] is rewritten by the next chunk / item
        }
    }
}

// The launchers' `flags`: bit 0 launches with PDL, bit 1 multiplies by x H (rotation = 32; kbit only),
// bit 2 runs the stream-K kernel CTA-local (n_warps = 16 x CTAs, at most one CTA per tile), bit 3
// keeps the stream-K kernel's x in global memory (no shared copy; for comparisons), bit 4 keeps the routed
// split kernel's warps per tile at split_for's (for comparisons).
// Bit 5 (routed only): x is the gate|up output [gate | up] and the operand silu(gate) * up (stage_act).
constexpr int kFlagPdl = 1, kFlagRot32 = 2, kFlagLocal = 4, kFlagGlobalX = 8, kFlagSplitAll = 16, kFlagAct = 32;

// Pick the ROT instance of a kernel template (only where the format has it).
template <bool FP4, typename Pick>
__host__ auto pick_instance(int flags, Pick&& pick) {
    if constexpr (!FP4) {
        if (flags & kFlagRot32) return pick(std::true_type{});
    }
    return pick(std::false_type{});
}

template <int BITS, typename T, int MAXM, bool FP4 = false>
int launch_gemv(const void* x, const void* qweight, const void* qabsmax, const float* codebook, const float* scale,
                void* y, const void* bias, float* workspace, int* counters, int m, int n, int k_in, int n_warps,
                int flags, const lowbit_epilogue* epi, void* stream) {
    const int n_tiles = (n + 15) / 16, n_groups = (k_in + 255) / 256;
    const bool with_epi = epi != nullptr;  // unrotated only (their own instances: EPI)
    if (with_epi && ((flags & kFlagRot32) || (epi->rms_x != nullptr && m > kRmsRows)))
        return static_cast<int>(cudaErrorInvalidValue);
    if (FP4 && (flags & kFlagRot32)) return static_cast<int>(cudaErrorInvalidValue);
    if (m < 1 || k_in < 32 || k_in % 32 || n_warps < 1) return static_cast<int>(cudaErrorInvalidValue);
    const bool local = flags & kFlagLocal;
    // SWI: CTA-local over tile pairs (kbit_gemv_kernel), y [m, n / 2], nothing else written
    const bool swi = with_epi && epi->swiglu;
    if (swi && (!local || n % 32 || epi->residual != nullptr || epi->yw != nullptr || epi->norm_weight != nullptr))
        return static_cast<int>(cudaErrorInvalidValue);
    const int owned = swi ? n_tiles / 2 : n_tiles;  // what CTA-local mode cuts among the CTAs: tiles (pairs)
    const int grid = (n_warps + kStreamWarps - 1) / kStreamWarps;
    const StreamK tiles{owned / grid, owned % grid};  // local: CTA c's tiles (pairs)
    const int max_pairs = tiles.q + (tiles.r > 0);
    if (swi && max_pairs > swi_max_pairs<BITS>(false)) return static_cast<int>(cudaErrorInvalidValue);
    const size_t x_bytes = size_t(m < MAXM ? m : MAXM) * x_row_bytes(k_in);
    // the shared copy of x only where the instance's largest request fits the device; where the 64 KB table and the
    // copy (and the SwiGLU outputs) pass its limit (99 KB on sm_86 / sm_89 parts), x is read from global memory
    const bool xs_fits = swi ? max_pairs <= swi_max_pairs<BITS>(true)
                             : stream_smem<BITS>() + kStageXMaxBytes <= size_t(dynamic_smem_limit());
    const bool xs = kStageX<BITS, FP4> && !(flags & kFlagGlobalX) && x_bytes <= kStageXMaxBytes && xs_fits;
    const size_t smem = stream_smem<BITS>() + (swi ? swi_smem(max_pairs) : 0) + (xs ? x_bytes : 0);
    const int pdl = flags & kFlagPdl;
    auto kernel = pick_instance<FP4>(flags, [xs, with_epi, swi](auto rot_) {
        constexpr bool R = decltype(rot_)::value;
        if constexpr (!R) {
            if (swi) {
                if constexpr (kStageX<BITS, FP4>) {
                    if (xs) return kbit_gemv_kernel<BITS, T, MAXM, FP4, R, true, true, true>;
                }
                return kbit_gemv_kernel<BITS, T, MAXM, FP4, R, false, true, true>;
            }
            if (with_epi) {
                if constexpr (kStageX<BITS, FP4>) {
                    if (xs) return kbit_gemv_kernel<BITS, T, MAXM, FP4, R, true, true>;
                }
                return kbit_gemv_kernel<BITS, T, MAXM, FP4, R, false, true>;
            }
        }
        if constexpr (kStageX<BITS, FP4>) {
            if (xs) return kbit_gemv_kernel<BITS, T, MAXM, FP4, R, true>;
        }
        return kbit_gemv_kernel<BITS, T, MAXM, FP4, R, false>;
    });
    // one attribute per instance, whatever the call: the most any call of it takes on this device
    if (int err = configure(kernel, xs || swi ? stream_smem<BITS>() + (xs ? kStageXMaxBytes : 0) +
                                                    (swi ? swi_smem(swi_max_pairs<BITS>(xs)) : 0)
                                              : smem))
        return err;
    const int64_t units = int64_t(n_tiles) * n_groups;
    if (units >= (int64_t(1) << 31) || (!local && n_warps > units)) return static_cast<int>(cudaErrorInvalidValue);
    if (local && (n_warps % kStreamWarps || grid > owned)) return static_cast<int>(cudaErrorInvalidValue);
    const StreamK sk{static_cast<int>(units / n_warps), static_cast<int>(units % n_warps)};
    Launch l(grid, kStreamWarps * 32, smem, stream, pdl);
    const cudaError_t err = cudaLaunchKernelEx(
        &l.cfg, kernel, static_cast<const T*>(x), static_cast<const uint4*>(qweight), static_cast<const uint4*>(qabsmax),
        codebook, scale, static_cast<T*>(y), static_cast<const T*>(bias), workspace, counters, m, n, k_in, n_tiles,
        n_groups, n_warps, sk, local, tiles, epilogue_of<T>(epi));
    if (err != cudaSuccess) return static_cast<int>(err);
    return static_cast<int>(cudaGetLastError());
}

// Resident warps per SM of the stream-K kernel (one-wave grids; CTA-local mode: / kStreamWarps CTAs).
template <int BITS, typename T, int MAXM, bool FP4 = false>
int gemv_occupancy() {
    return kStreamWarps * occupancy(kbit_gemv_kernel<BITS, T, MAXM, FP4>, stream_smem<BITS>(), kStreamWarps);
}

// Warps that share a tile in the split kernel: min(n_groups, kWarps), so that no warp decodes more
// groups than it must -- a warp's groups are decoded one after another, and each extra one costs
// ~0.6-0.9 us on a small GEMV (576x576 K=4: 4.59 -> 3.68 us with 3 warps per tile instead of 2).
// When split does not divide kWarps, the CTA's last kWarps % split warps idle. (16-warp CTAs with up
// to 16 warps per tile, for rows of more than 8 groups, measured slower: 4096x4096 7.63 -> 9.29 us.)
// Mirrored by lowbit.kernels.tiled.split_items.
inline int split_for(int n_groups) { return n_groups < kWarps ? n_groups : kWarps; }

// Whether the routed down GEMV that computes silu(gate) * up itself (kFlagAct) fits this device's shared memory for
// `routes` routes of n_experts experts and a K_in of k_in: its staged rows grow with K_in (Mixtral-sized
// experts, K_in = 14336, need 28 KB a row), so where they do not fit, the activation runs as its own step.
template <int BITS>
int routed_act_fits(int n_experts, int routes, int k_in) {
    if (n_experts < 1 || routes < 1 || k_in < 32) return 0;
    return split_smem<BITS>(n_experts, routes, k_in) <= size_t(dynamic_smem_limit()) ? 1 : 0;
}

template <int BITS, typename T, bool FP4 = false>
int launch_split(const void* x, const int64_t* offsets, int m_dense, const void* qweight, const void* qabsmax,
                 const float* codebook, const float* scales, void* y, const void* bias, int n_experts, int n, int k_in,
                 int max_ctas, int flags, const lowbit_epilogue* epi, void* stream, Routes routes = Routes{nullptr, 0, 1}) {
    const int n_tiles = (n + 15) / 16, n_groups = (k_in + 255) / 256;
    // the epilogue is for dense calls (token rows = y rows), and normalizes at most kRmsRows of them
    const bool with_epi = epi != nullptr;  // unrotated only (their own instance: EPI)
    if (with_epi && ((flags & kFlagRot32) || offsets != nullptr || routes.ids != nullptr || epi->swiglu ||
                     (epi->rms_x != nullptr && m_dense > kRmsRows)))
        return static_cast<int>(cudaErrorInvalidValue);
    if (FP4 && (flags & kFlagRot32)) return static_cast<int>(cudaErrorInvalidValue);
    const int pdl = flags & kFlagPdl;
    const bool routed = routes.ids != nullptr;
    if (routed && ((flags & kFlagRot32) || offsets != nullptr || routes.count < 1 || routes.count > kMaxRoutes ||
                   routes.x_div < 1 || routes.count % routes.x_div))
        return static_cast<int>(cudaErrorInvalidValue);
    const bool act = flags & kFlagAct;  // routed, unrotated, one route per x row
    if (act && (!routed || (flags & kFlagRot32) || routes.x_div != 1)) return static_cast<int>(cudaErrorInvalidValue);
    // items of the experts that can be active (routed: at most one per route)
    const int max_active = routed && routes.count < n_experts ? routes.count : n_experts;
    auto items_of = [&](int s) { return int64_t(max_active) * ((n_tiles + kWarps / s - 1) / (kWarps / s)); };
    int split = split_for(n_groups);
    // Routed (few experts active, known here): fewer warps per tile until the items fit one wave of CTAs. A
    // CTA's next item loads its weights only when it starts, so each extra wave costs a DRAM round trip;
    // a warp's groups of one item stream through its pipeline instead. (kFlagSplitAll keeps split_for's.)
    if (routed && !(flags & kFlagSplitAll))
        while (split > 1 && items_of(split) > max_ctas) --split;
    const int tiles_per_item = kWarps / split;
    const int64_t items = items_of(split);
    if (max_ctas < 1 || items >= (int64_t(1) << 31) || n_experts < 1 || n_groups > 32767)
        return static_cast<int>(cudaErrorInvalidValue);
    SplitPlan plan = {};
    plan.tiles_per_item = tiles_per_item;
    plan.items_per_expert = (n_tiles + tiles_per_item - 1) / tiles_per_item;
    for (int w = 0; w < kWarps; ++w) {
        const int slice = w % split;
        plan.set(w, w < split * tiles_per_item ? w / split : -1, slice, slice * n_groups / split,
                 (slice + 1) * n_groups / split);
    }
    const size_t smem = split_smem<BITS>(n_experts, routed ? routes.count : 0, act ? k_in : 0);
    // one group per warp (split == n_groups), one item per CTA, one pass of <= 8 tokens: the ONE instance
    const bool one = !pdl && !with_epi && offsets == nullptr && !routed && split == n_groups && items <= max_ctas && m_dense <= 8;
    // the general instance (PDL-aware; its waits are no-ops in a plain launch), ONE (plain only) and ROUTED
    auto kernel = pick_instance<FP4>(flags, [one, routed, with_epi, act](auto rot_) {
        constexpr bool R = decltype(rot_)::value;
        if constexpr (!R) {  // kbit and NVFP4 alike: the routes and the activation are the rows', not the format's
            if (with_epi) return kbit_split_gemv_kernel<BITS, T, true, false, FP4, false, false, true>;
            if (act) return kbit_split_gemv_kernel<BITS, T, true, false, FP4, false, true, false, true>;
            if (routed) return kbit_split_gemv_kernel<BITS, T, true, false, FP4, false, true>;
        }
        return one ? kbit_split_gemv_kernel<BITS, T, false, true, FP4, R> : kbit_split_gemv_kernel<BITS, T, true, false, FP4, R>;
    });
    if (int err = configure(kernel, smem)) return err;
    const int grid = static_cast<int>(items < max_ctas ? items : max_ctas);
    Launch l(grid, kWarps * 32, smem, stream, pdl);
    const cudaError_t err = cudaLaunchKernelEx(
        &l.cfg, kernel, static_cast<const T*>(x), offsets, m_dense, static_cast<const uint4*>(qweight),
        static_cast<const uint4*>(qabsmax), codebook, scales, static_cast<T*>(y), static_cast<const T*>(bias),
        n_experts, n, k_in, n_tiles, n_groups, split, plan, routes, epilogue_of<T>(epi));
    if (err != cudaSuccess) return static_cast<int>(err);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace gemv
}  // namespace lowbit
