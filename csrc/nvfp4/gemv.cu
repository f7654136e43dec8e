// NVFP4 GEMV on the layout NVFP4 checkpoints store (lowbit/formats/nvfp4.py): W [rows, K/2] packed
// E2M1 (element 2i in the low nibble), E4M3 block scales [rows, K/16], K contiguous. No repack.
//   W4A16: y[m, row] = scale_2 * sum_k W[row, k] x[m, k], x fp16/bf16, M = 1..8 tokens in one pass.
//   W4A4 (GPU MODE nvfp4_gemv): c[row, l] = sum_k A_l[row, k] b_l[k], b_l NVFP4 too, a batch of L
//   independent matrix-vector products, fp16 out.
//
// Why a second NVFP4 GEMV beside the tiled one (tiled/gemv.cuh, FP4): that one streams 16-row x 256-
// column units per warp from two arrays (codes, scales) and measured 71-73% of read bandwidth on the
// Llama-3-70B MLP, 84-86% even with its decode removed (benchmarks/journal/2026-11-23_nvfp4_kernels_w4a16_on_the_checkpoint.md). Here a CTA sweeps
// consecutive rows and its warps read whole rows, 512 contiguous bytes per warp and row at M = 1:
// with the decode removed this access pattern streams 8192x28672 at 98% of the read bandwidth.
//
// Work split: the CTA's warps own K slices (steps of 128 * S values), walk the CTA's row groups and
// leave fp32 partials in shared memory, summed per (row, token) in (warp, segment) order at the end:
// deterministic, no atomics, no workspace. A step's activation slice is loaded (W4A4: decoded) once
// into registers and reused for every row group.
//
// MMA (mma.m16n8k16, fp32 accumulate) with "segments", as dense_gemv_mma_kernel: P = tokens per
// segment (M rounded up to 1, 2, 4, 8), S = 8 / P segments of 128 K values side by side. A row i is W
// row i / S of the group (rows 8..15: the next 8 / S rows) over segment i % S; B column j is token
// j % P over segment j / P; C[i][j] is a useful partial dot product when the segments match. A row
// group is 2P W rows; a lane (g, t) loads 32 K values (16 bytes) at offset 32t of its segment for
// its two rows, and the activation's 32 values at the same offset of its column's segment: the MMA's
// k order is free as long as A and B agree on it. Runs per row and warp: 512 bytes at P = 1, 64 at P = 8.
//
// Decode: no table. An E2M1 nibble s|e1 e0|m placed with its magnitude bits at the fp16 (bf16)
// exponent's two low bits and the mantissa's top bit, and its sign at bit 15, *is* the fp16 (bf16)
// of e2m1 * 2^-14 (2^-126), subnormals included. A register takes elements i and i+4 of an 8-element
// word (16 bits apart), so one shift + mask places both magnitudes, another both signs: 4 integer
// ops per 2 weights. The block scale then multiplies the register (hmul2), so the MMA sees
// e2m1 * scale / 256 exactly (at most 6 significant bits; fp16 keeps them down to 2^-24). (A
// 256-entry shared-memory table, kbit's decode, measured slower here: 66.6 vs 61.0 us on 8192x28672,
// and 2x on small CTAs that each build it.)
//
// Occupancy is what this kernel is short of (the decode + scale is ~5 instructions per 2 weights):
// 8-warp CTAs, 2 row groups in flight per warp, registers capped for 3 CTAs per SM -- the best of
// the depth / CTA-size / register-cap variants measured (benchmarks/journal/2026-11-23_nvfp4_kernels_w4a16_on_the_checkpoint.md).
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "common.cuh"
#include "tiled/decode.cuh"

namespace lowbit {
namespace nvfp4 {

using gemv::hmul2;
using gemv::shift;

constexpr int kWarps = 8;   // at most, per CTA (fewer when K has fewer steps)
constexpr int kDepth = 2;   // row groups in flight per warp (register pipeline)
constexpr int kMinCtas = 3; // CTAs per SM the register cap is set for

// Elements i and i+4 of the 8 E2M1 codes in q (element j = nibble j) as a pair of T holding
// e2m1 * 2^-14 (fp16) or e2m1 * 2^-126 (bf16).
template <typename T, int I>
__device__ __forceinline__ uint32_t decode_pair(uint32_t q) {
    constexpr int kMag = std::is_same_v<T, __half> ? 9 : 6;  // bit of the mantissa's top bit
    const uint32_t mag = shift<kMag - 4 * I>(q) & (0x00070007u << kMag);
    const uint32_t sign = shift<12 - 4 * I>(q) & 0x80008000u;
    return mag | sign;
}

template <typename T>
__device__ __forceinline__ void decode_word(uint32_t q, uint32_t (&r)[4]) {
    r[0] = decode_pair<T, 0>(q);
    r[1] = decode_pair<T, 1>(q);
    r[2] = decode_pair<T, 2>(q);
    r[3] = decode_pair<T, 3>(q);
}

// E4M3 byte -> the pair (s', s') that takes a decode_pair value to e2m1 * s / 256 (exact):
// fp16 s' = s * 2^6, bf16 s' = s * 2^118. The byte shifted to fp32's exponent and mantissa is
// s * 2^-120 (subnormal scales included).
template <typename T>
__device__ __forceinline__ uint32_t scale_pair(uint32_t byte) {
    const float s = __uint_as_float(byte << 20);
    const float v = std::is_same_v<T, __half> ? s * 0x1p126f : (s * 0x1p119f) * 0x1p119f;
    return Pack2<T>::pack(v, v);
}

// x's 8 values (one uint4) as B registers in decode_pair's element order.
__device__ __forceinline__ void act_word(const uint4& v, uint32_t* b) {
    b[0] = __byte_perm(v.x, v.z, 0x5410);  // (x0,x1) (x2,x3) (x4,x5) (x6,x7) -> (x0,x4) (x1,x5) (x2,x6) (x3,x7)
    b[1] = __byte_perm(v.x, v.z, 0x7632);
    b[2] = __byte_perm(v.y, v.w, 0x5410);
    b[3] = __byte_perm(v.y, v.w, 0x7632);
}

// Output factor besides scale_2: W4A16 fragments carry 1/256, W4A4 both operands do.
template <bool ACT_FP4>
constexpr float kOutFix = ACT_FP4 ? 65536.f : 256.f;

struct Params {
    const uint8_t* w;       // codes: [batch][rows][K/2], row stride w_row bytes
    const uint8_t* ws;      // scales: [batch][rows][K/16], row stride ws_row bytes
    int64_t w_row, w_batch, ws_row, ws_batch;
    const void* act;        // W4A16: T [batch][tokens][K]; W4A4: codes [batch][K/2]
    const uint8_t* act_s;   // W4A4: scales [batch][K/16]
    int64_t act_batch, act_s_batch;  // elements (W4A16) / bytes (W4A4)
    void* out;              // OutT [batch][tokens][rows]: strides out_row, out_tok, out_batch (elements)
    int64_t out_row, out_tok, out_batch;
    const float* scale_2;   // device scalar or null (1)
    int rows, k, tokens, batches, ctas_per_batch;
};

// This lane's 32 activation values (K positions kpos..kpos+31 of token tok) as B registers.
template <typename T, bool ACT_FP4>
__device__ __forceinline__ void load_act(uint32_t (&b)[16], const Params& p, int batch, int tok, int kpos) {
    if constexpr (ACT_FP4) {
        const uint8_t* codes = static_cast<const uint8_t*>(p.act) + batch * p.act_batch;
        const uint4 q = *reinterpret_cast<const uint4*>(codes + kpos / 2);
        const uint32_t sc = *reinterpret_cast<const uint16_t*>(p.act_s + batch * p.act_s_batch + kpos / 16);
        const uint32_t words[4] = {q.x, q.y, q.z, q.w};
        const uint32_t s_lo = scale_pair<__half>(sc & 0xffu), s_hi = scale_pair<__half>(sc >> 8);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            uint32_t r[4];
            decode_word<__half>(words[w], r);
#pragma unroll
            for (int i = 0; i < 4; ++i) b[4 * w + i] = hmul2<__half>(r[i], w < 2 ? s_lo : s_hi);
        }
    } else {
        const uint4* xv = reinterpret_cast<const uint4*>(static_cast<const T*>(p.act) + batch * p.act_batch +
                                                         int64_t(tok) * p.k + kpos);
#pragma unroll
        for (int w = 0; w < 4; ++w) act_word(__ldg(xv + w), b + 4 * w);
    }
}

struct RowPair {
    uint4 c0, c1;        // 32 codes of the lane's two rows
    uint32_t s0, s1;     // their two scale bytes each
};

template <typename T, bool ACT_FP4, int P>
__global__ void __launch_bounds__(kWarps * 32, kMinCtas) nvfp4_gemv_kernel(const Params p) {
    using MmaT = std::conditional_t<ACT_FP4, __half, T>;
    using OutT = std::conditional_t<ACT_FP4, __half, T>;
    constexpr int S = 8 / P, kRows = 2 * P, kStep = 128 * S;
    float* part = reinterpret_cast<float*>(gemv::g_table);  // [group][row][token][warp][segment]
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int batch = blockIdx.x / p.ctas_per_batch, cta = blockIdx.x % p.ctas_per_batch;
    const int groups = (p.rows + kRows - 1) / kRows;
    const int grp0 = int(int64_t(cta) * groups / p.ctas_per_batch);
    const int n_groups = int(int64_t(cta + 1) * groups / p.ctas_per_batch) - grp0;
    const int steps = (p.k + kStep - 1) / kStep;
    const int s_begin = warp * steps / warps, s_end = (warp + 1) * steps / warps;
    const int seg_a = g % S, row_a0 = g / S, row_a1 = 8 / S + g / S;  // this lane's A segment and rows
    const int seg_b = g / P, tok_b = g % P;                              // its B column's segment, token
    const bool tok_ok = tok_b < p.tokens;
    const int slot = warps * S;  // floats per (row, token) in the partials

    for (int s = s_begin; s < s_end; ++s) {
        const int kpos_a = s * kStep + 128 * seg_a + 32 * t, kpos_b = s * kStep + 128 * seg_b + 32 * t;
        const bool valid = kpos_a < p.k;  // K % 32 == 0: a lane's 32 values are all in or all out
        // running pointers to the next row group's codes and scales
        const int64_t row0 = int64_t(grp0) * kRows;
        const uint8_t* wp = p.w + batch * p.w_batch + row0 * p.w_row + kpos_a / 2;
        const uint8_t* sp = p.ws + batch * p.ws_batch + row0 * p.ws_row + kpos_a / 16;
        int next_row = int(row0);
        auto issue = [&](RowPair& rp) {
            // rows past the end re-read the last row; their results are dropped
            const int r0 = min(next_row + row_a0, p.rows - 1) - next_row, r1 = min(next_row + row_a1, p.rows - 1) - next_row;
            if (valid) {
                rp.c0 = ld_stream(reinterpret_cast<const uint4*>(wp + r0 * p.w_row));
                rp.c1 = ld_stream(reinterpret_cast<const uint4*>(wp + r1 * p.w_row));
                rp.s0 = *reinterpret_cast<const uint16_t*>(sp + r0 * p.ws_row);
                rp.s1 = *reinterpret_cast<const uint16_t*>(sp + r1 * p.ws_row);
            } else {
                rp.c0 = rp.c1 = make_uint4(0u, 0u, 0u, 0u);
                rp.s0 = rp.s1 = 0u;
            }
            wp += kRows * p.w_row;
            sp += kRows * p.ws_row;
            next_row += kRows;
        };
        RowPair buf[kDepth];
#pragma unroll
        for (int d = 0; d + 1 < kDepth; ++d)
            if (d < n_groups) issue(buf[d]);
        uint32_t b[16];
        if (kpos_b < p.k && tok_ok) {
            load_act<T, ACT_FP4>(b, p, batch, tok_b, kpos_b);
        } else {
#pragma unroll
            for (int i = 0; i < 16; ++i) b[i] = 0u;
        }
        auto compute = [&](const RowPair& rp, int gi) {
            const uint32_t c0[4] = {rp.c0.x, rp.c0.y, rp.c0.z, rp.c0.w};
            const uint32_t c1[4] = {rp.c1.x, rp.c1.y, rp.c1.z, rp.c1.w};
            const uint32_t sc[2][2] = {{scale_pair<MmaT>(rp.s0 & 0xffu), scale_pair<MmaT>(rp.s0 >> 8)},
                                       {scale_pair<MmaT>(rp.s1 & 0xffu), scale_pair<MmaT>(rp.s1 >> 8)}};
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int w = 0; w < 4; ++w) {  // words 0, 1: the first 16-block; 2, 3: the second
                uint32_t a0[4], a1[4];
                decode_word<MmaT>(c0[w], a0);
                decode_word<MmaT>(c1[w], a1);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    a0[i] = hmul2<MmaT>(a0[i], sc[0][w >> 1]);
                    a1[i] = hmul2<MmaT>(a1[i], sc[1][w >> 1]);
                }
                const uint32_t f0[4] = {a0[0], a1[0], a0[1], a1[1]};
                const uint32_t f1[4] = {a0[2], a1[2], a0[3], a1[3]};
                mma16816<MmaT>(acc, f0, b[4 * w + 0], b[4 * w + 1]);
                mma16816<MmaT>(acc, f1, b[4 * w + 2], b[4 * w + 3]);
            }
            // acc[e], acc[2 + e] = C[g][2t + e], C[g + 8][2t + e]: useful when column 2t + e's segment
            // is this lane's A segment; it is then token (2t + e) % P's partial for rows row_a0 / row_a1
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int col = 2 * t + e;
                if (col / P == seg_a && col % P < p.tokens) {
                    float* dst = part + ((int64_t(gi) * kRows + row_a0) * P + col % P) * slot + warp * S + seg_a;
                    float* dst1 = dst + int64_t(row_a1 - row_a0) * P * slot;
                    if (s == s_begin) {
                        *dst = acc[e];
                        *dst1 = acc[2 + e];
                    } else {
                        *dst += acc[e];
                        *dst1 += acc[2 + e];
                    }
                }
            }
        };
        for (int gi = 0; gi < n_groups; gi += kDepth) {
#pragma unroll
            for (int d = 0; d < kDepth; ++d) {  // unrolled: buf[] indices are compile-time
                if (gi + d < n_groups) {
                    if (gi + d + kDepth - 1 < n_groups) issue(buf[(d + kDepth - 1) % kDepth]);
                    compute(buf[d], gi + d);
                }
            }
        }
    }
    __syncthreads();
    const float fix = kOutFix<ACT_FP4> * (p.scale_2 != nullptr ? *p.scale_2 : 1.f);
    OutT* out = static_cast<OutT*>(p.out) + batch * p.out_batch;
    const int outputs = n_groups * kRows * P;
    for (int o = threadIdx.x; o < outputs; o += blockDim.x) {
        const int r = o / P, tok = o % P, row = grp0 * kRows + r;
        if (row >= p.rows || tok >= p.tokens) continue;
        const float* src = part + int64_t(o) * slot;
        float sum = 0.f;
        for (int i = 0; i < slot; ++i) sum += src[i];  // (warp, segment) order: deterministic
        out[tok * p.out_tok + row * p.out_row] = from_float<OutT>(sum * fix);
    }
}

// Warps per CTA for K: one per step, at most kWarps.
template <int P>
int warps_for(int k) {
    const int steps = (k + 128 * (8 / P) - 1) / (128 * (8 / P));
    return steps < kWarps ? steps : kWarps;
}

template <typename T, bool ACT_FP4, int P>
int launch(Params p, void* stream) {
    if (p.rows < 1 || p.k < 32 || p.k % 32 || p.batches < 1 || p.tokens < 1 || p.tokens > P)
        return static_cast<int>(cudaErrorInvalidValue);
    auto kernel = nvfp4_gemv_kernel<T, ACT_FP4, P>;
    const int warps = warps_for<P>(p.k), threads = warps * 32;
    const int groups = (p.rows + 2 * P - 1) / (2 * P);
    const size_t group_bytes = size_t(2 * P) * P * warps * (8 / P) * sizeof(float);
    int device = 0;
    cudaGetDevice(&device);
    // The plan (CTAs per batch, shared memory) per device and shape, computed once: the occupancy
    // queries cost microseconds of host time, too much for an eager decode step.
    using Key = std::tuple<int, int, int, int>;  // per template instance (a static of each)
    static std::map<Key, std::pair<int, size_t>> plans;
    static std::mutex mu;
    const Key key{device, groups, warps, p.batches};
    int cpb = 0;
    size_t smem = 0;
    {
        std::lock_guard<std::mutex> lock(mu);
        auto it = plans.find(key);
        if (it != plans.end()) std::tie(cpb, smem) = it->second;
    }
    if (cpb == 0) {
        // One wave of CTAs, split evenly over the batch (at most 96 KB of partials per CTA: more
        // CTAs if needed). Occupancy is first taken without the partials, then at what the plan needs.
        int sms = 0;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        auto smem_for = [&](int c) { return size_t((groups + c - 1) / c) * group_bytes; };
        constexpr size_t kMaxSmem = 96 * 1024;
        // The attribute is per function and device, shared by every plan of this instance: set it to
        // the largest any plan uses, never to a plan's own size (a smaller plan made later would lower
        // it under an earlier, larger one, whose launches then fail with "invalid argument").
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmem)) != cudaSuccess)
            return static_cast<int>(cudaGetLastError());
        int per_sm = 0;
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0);
        for (int it = 0; it < 2; ++it) {
            const int wave = sms * (per_sm > 0 ? per_sm : 1);
            cpb = wave / p.batches > 1 ? wave / p.batches : 1;
            cpb = cpb < groups ? cpb : groups;
            const int min_cpb = int((int64_t(groups) * group_bytes + kMaxSmem - 1) / kMaxSmem);
            cpb = cpb > min_cpb ? cpb : min_cpb;
            smem = smem_for(cpb);
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
        }
        std::lock_guard<std::mutex> lock(mu);
        plans[key] = {cpb, smem};
    }
    p.ctas_per_batch = cpb;
    kernel<<<unsigned(int64_t(cpb) * p.batches), threads, smem, static_cast<cudaStream_t>(stream)>>>(p);
    return static_cast<int>(cudaGetLastError());
}

template <typename T>
int launch_w4a16(Params p, void* stream) {
    const int m = p.tokens;
    if (m <= 1) return launch<T, false, 1>(p, stream);
    if (m <= 2) return launch<T, false, 2>(p, stream);
    if (m <= 4) return launch<T, false, 4>(p, stream);
    return launch<T, false, 8>(p, stream);
}

}  // namespace nvfp4
}  // namespace lowbit

// W4A16 on the checkpoint layout: y[i, n] = scale_2 * W[n, :] . x[i, :] for m = 1..8 tokens in one
// pass over W. Strides of W's rows and scale rows in bytes (K contiguous; 16- and 2-byte aligned);
// x [m, k] and y [m, n] contiguous, x 16-byte aligned; k % 32 == 0.
#define LOWBIT_DEFINE_NVFP4_PLAIN_GEMV(NAME, TYPE)                                                            \
    extern "C" int lowbit_nvfp4_plain_gemv_##NAME(const void* x, const void* w, const void* ws, int64_t w_row, \
                                                   int64_t ws_row, const float* scale_2, void* y, int m, int n, \
                                                   int k, void* stream) {                                      \
        lowbit::nvfp4::Params p = {};                                                                          \
        p.w = static_cast<const uint8_t*>(w);                                                                  \
        p.ws = static_cast<const uint8_t*>(ws);                                                                \
        p.w_row = w_row;                                                                                       \
        p.ws_row = ws_row;                                                                                     \
        p.act = x;                                                                                             \
        p.out = y;                                                                                             \
        p.out_row = 1;                                                                                         \
        p.out_tok = n;                                                                                         \
        p.scale_2 = scale_2;                                                                                   \
        p.rows = n;                                                                                            \
        p.k = k;                                                                                               \
        p.tokens = m;                                                                                          \
        p.batches = 1;                                                                                         \
        return lowbit::nvfp4::launch_w4a16<TYPE>(p, stream);                                                   \
    }
LOWBIT_DEFINE_NVFP4_PLAIN_GEMV(fp16, __half)
LOWBIT_DEFINE_NVFP4_PLAIN_GEMV(bf16, __nv_bfloat16)

// W4A4 batched GEMV (GPU MODE nvfp4_gemv): c[m, 0, l] = sum_k A[m, k, l] B[0, k, l]. Strides of the
// m and l dimensions in bytes for a / sfa / b / sfb and in elements for c (K contiguous); k % 32 == 0.
extern "C" int lowbit_nvfp4_w4a4_gemv(const void* a, const void* sfa, const void* b, const void* sfb, void* c,
                                      int m, int k, int l, int64_t a_m, int64_t a_l, int64_t sfa_m, int64_t sfa_l,
                                      int64_t b_l, int64_t sfb_l, int64_t c_m, int64_t c_l, void* stream) {
    lowbit::nvfp4::Params p = {};
    p.w = static_cast<const uint8_t*>(a);
    p.ws = static_cast<const uint8_t*>(sfa);
    p.w_row = a_m;
    p.w_batch = a_l;
    p.ws_row = sfa_m;
    p.ws_batch = sfa_l;
    p.act = b;
    p.act_s = static_cast<const uint8_t*>(sfb);
    p.act_batch = b_l;
    p.act_s_batch = sfb_l;
    p.out = c;
    p.out_row = c_m;
    p.out_batch = c_l;
    p.rows = m;
    p.k = k;
    p.tokens = 1;
    p.batches = l;
    return lowbit::nvfp4::launch<__half, true, 1>(p, stream);
}
