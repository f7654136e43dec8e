// Decode attention on tensor cores: the operation, operands, modes and workspace of decode.cu (read its header:
// masks, NaN, PDL, APPEND with RoPE / q and k norms / the cache write / the position, EARLY, chunks), computed with
// mma.sync instead of per-lane dot products.
//
// Why: decode.cu spends its issue slots on scalar FMAs and shuffles (per head: a dot product per position, a warp
// reduction, a weighted V sum), so from batch 4 on it runs well below HBM's rate: 27.5 us per Llama-3-8B layer at
// batch 16 (38.7 MB of K/V: 47% of 3.0 TB/s). A warp here takes 16 positions per step for up to 8 query heads of
// its KV head in 24 MMAs (D = 128): 17.5 us there, 74% of 3.0 TB/s
// (benchmarks/journal/2026-11-28_tensor_core_decode_attention.md).
//
// One step of a warp, positions p0 .. p0 + 15, lane (g, t) = (lane / 4, lane % 4):
//   loads  the lane's 16-byte pieces (dims 32 cc + 8 t + [0, 8), cc < D / 32) of K and V rows p0 + g and
//          p0 + 8 + g, one step ahead of their use (the next step's rows load while this one computes);
//   S^T    [16 heads (G used) x 8 positions] = Q . K^T per 8 positions: A = q's pieces of head g (rows g + 8 zero),
//          B = the K pieces, both in the same permuted dim order (a dot product does not care): D / 16 MMAs each;
//   softmax head g's scores sit in the 4 lanes of quad g (positions 2 t, 2 t + 1, 8 + 2 t, 9 + 2 t): an online
//          softmax per quad, the running max in log2 units (scale * log2(e) applied to the fp32 scores);
//   P.V    out^T [D x 8 heads] += V^T [D x 16 positions] . P^T [16 positions x 8 heads]: P^T's B fragments are the
//          score accumulators as they lie (rounded to T, as flash attention rounds P), V^T's A fragments are the
//          lane's V pieces through one movmatrix.trans each: D / 16 MMAs, out^T in D / 4 fp32 registers per lane.
// Masked positions and rows past the chunk: scores -inf and V rows zeroed (0 * NaN would poison the MMA's sum), so
// a cache row never written cannot leak in. A NaN score or value at a visible position reaches the output, as in
// decode.cu; a sequence with nothing visible gets 0 / 0 = NaN.
// The warps merge (max, sum, out) through shared memory; with more than one chunk the CTA's state goes to the
// workspace and the last CTA merges (chunks.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "attention/chunks.cuh"
#include "common.cuh"

namespace lowbit {
namespace attention {
namespace mma {

constexpr int kHeads = 8;  // query heads per CTA at most: the P.V MMA's N

__device__ __forceinline__ uint32_t word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// The D dim of out^T row r (0..15) of P.V MMA (cc, jp): its rows come from V pieces 2 jp (r < 8) and 2 jp + 1.
__device__ __forceinline__ int out_dim(int cc, int jp, int r) {
    const int g = r & 7, j = 2 * jp + (r >> 3);
    return 32 * cc + 8 * (g >> 1) + 2 * j + (g & 1);
}

// One warp step: the lane's pieces of K and V rows p0 + g (k0, v0) and p0 + 8 + g (k1, v1); lanes 0..15: whether
// position p0 + lane is visible.
template <int NC>
struct Step {
    uint4 k0[NC], k1[NC], v0[NC], v1[NC];
    bool visible;
};

// The lane's 8 T elements -> floats, and back (rounded).
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 p = to_float2<T>(word(u, i));
        f[2 * i] = p.x;
        f[2 * i + 1] = p.y;
    }
}
template <typename T>
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
    return make_uint4(Pack2<T>::pack(f[0], f[1]), Pack2<T>::pack(f[2], f[3]), Pack2<T>::pack(f[4], f[5]),
                      Pack2<T>::pack(f[6], f[7]));
}

// A D-row held as NC pieces by each of the 4 lanes of a quad (lane t: dims 32 cc + 8 t + [0, 8)): Qwen3's RMSNorm
// (w: the same pieces of the weights, null: none) then rotate-half RoPE, rounded to T after each as transformers
// rounds them (decode.cu's rms_norm_lane and rope_lane, in this layout). The rotation's partner of dim i < D / 2 is
// i + D / 2: piece cc + NC / 2 of the same lane.
template <typename T, int NC>
__device__ __forceinline__ void norm_rope(uint4 (&row)[NC], const T* w, float eps, const uint4 (&cs)[NC],
                                          const uint4 (&sn)[NC], int t) {
    float x[NC][8];
#pragma unroll
    for (int cc = 0; cc < NC; ++cc) unpack8<T>(row[cc], x[cc]);
    if (w != nullptr) {
        float ss = 0.f;
#pragma unroll
        for (int cc = 0; cc < NC; ++cc)
#pragma unroll
            for (int e = 0; e < 8; ++e) ss = fmaf(x[cc][e], x[cc][e], ss);
        ss += __shfl_xor_sync(kFullMask, ss, 1);
        ss += __shfl_xor_sync(kFullMask, ss, 2);
        const float r = rsqrtf(ss / float(32 * NC) + eps);
#pragma unroll
        for (int cc = 0; cc < NC; ++cc) {
            float wf[8];
            unpack8<T>(*reinterpret_cast<const uint4*>(w + 32 * cc + 8 * t), wf);
#pragma unroll
            for (int e = 0; e < 8; ++e) x[cc][e] = to_float(from_float<T>(wf[e] * to_float(from_float<T>(x[cc][e] * r))));
        }
    }
#pragma unroll
    for (int cc = 0; cc < NC; ++cc) {
        float c[8], s[8], y[8];
        unpack8<T>(cs[cc], c);
        unpack8<T>(sn[cc], s);
        const int pc = cc ^ (NC / 2);
        const float sign = cc < NC / 2 ? -1.f : 1.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) y[e] = fmaf(x[cc][e], c[e], sign * x[pc][e] * s[e]);
        row[cc] = pack8<T>(y);
    }
}

template <typename T, int D, int W, bool APPEND>
__global__ void __launch_bounds__(W * 32) decode_attention_mma_kernel(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, int64_t k_sb, int64_t k_sh,
    int64_t v_sb, int64_t v_sh, const bool* __restrict__ mask, int64_t mask_sb, T* __restrict__ out,
    float* __restrict__ ws, int* __restrict__ counters, int L, int chunk, int kv_div, int G, float scale_log2,
    const Append<T> ap, const bool early) {
    constexpr int NC = D / 32;  // 16-byte pieces of a row per lane
    const int b = blockIdx.z, h = blockIdx.y, c = blockIdx.x, chunks = gridDim.x, hkv = gridDim.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int p_begin = c * chunk, p_end = min(L, p_begin + chunk);
    const int kvh = h / kv_div;
    const T* kb = k + b * k_sb + kvh * k_sh + 8 * t;
    const T* vb = v + b * v_sb + kvh * v_sh + 8 * t;
    const bool* mb = mask == nullptr ? nullptr : mask + b * mask_sb;

    // Rows past the cache load row L - 1 (any row of it: past the chunk nothing counts).
    auto load_rows = [&](Step<NC>& s, int p0, bool cg) {
        const int64_t r0 = min(p0 + g, L - 1), r1 = min(p0 + 8 + g, L - 1);
#pragma unroll
        for (int cc = 0; cc < NC; ++cc) {
            const uint4* k0 = reinterpret_cast<const uint4*>(kb + r0 * D + 32 * cc);
            const uint4* k1 = reinterpret_cast<const uint4*>(kb + r1 * D + 32 * cc);
            const uint4* v0 = reinterpret_cast<const uint4*>(vb + r0 * D + 32 * cc);
            const uint4* v1 = reinterpret_cast<const uint4*>(vb + r1 * D + 32 * cc);
            s.k0[cc] = cg ? __ldcg(k0) : *k0;
            s.k1[cc] = cg ? __ldcg(k1) : *k1;
            s.v0[cc] = cg ? __ldcg(v0) : *v0;
            s.v1[cc] = cg ? __ldcg(v1) : *v1;
        }
    };
    auto load_visible = [&](Step<NC>& s, int p0) {
        const int p = p0 + lane;
        s.visible = lane < 16 && p < p_end && (mb == nullptr || mb[p]);
    };

    const int p_first = p_begin + 16 * warp;
    Step<NC> nxt;
    __shared__ int64_t s_pos;
    const bool early_rows = APPEND && early;  // decode.cu's EARLY: only this kernel writes the caches and position
    if (early_rows) {
        if (threadIdx.x == 0) s_pos = __ldcg(ap.position);
        if (p_first < p_end) load_rows(nxt, p_first, true);
    }
    pdl_wait();  // no-ops unless launched with programmatic serialization
    pdl_launch_dependents();

    // q (APPEND: with cos, sin and the new k, v), then the first step, all in flight at once
    const T* qb = APPEND ? q + b * ap.q_sb + int64_t(h) * G * D : q + (int64_t(b) * hkv + h) * G * D;
    uint4 qv[NC];
#pragma unroll
    for (int cc = 0; cc < NC; ++cc)
        qv[cc] = g < G ? *reinterpret_cast<const uint4*>(qb + g * D + 32 * cc + 8 * t) : make_uint4(0, 0, 0, 0);
    uint4 cs[NC], sn[NC], kn[NC], vn[NC];
    if constexpr (APPEND) {
        if (threadIdx.x == 0 && !early_rows) s_pos = *ap.position;
#pragma unroll
        for (int cc = 0; cc < NC; ++cc) {
            cs[cc] = *reinterpret_cast<const uint4*>(ap.cos + b * ap.cs_sb + 32 * cc + 8 * t);
            sn[cc] = *reinterpret_cast<const uint4*>(ap.sin + b * ap.cs_sb + 32 * cc + 8 * t);
            if (warp == 0) {
                kn[cc] = *reinterpret_cast<const uint4*>(ap.k_new + b * ap.kn_sb + int64_t(kvh) * D + 32 * cc + 8 * t);
                vn[cc] = *reinterpret_cast<const uint4*>(ap.v_new + b * ap.vn_sb + int64_t(kvh) * D + 32 * cc + 8 * t);
            }
        }
    }
    if (p_first < p_end) {
        if (!early_rows) load_rows(nxt, p_first, false);
        load_visible(nxt, p_first);
    }

    // APPEND: warp 0 rotates the new k (each quad the whole row) and leaves it and v in shared memory for the step
    // that holds the position; the CTA of chunk c whose range holds it writes them into the caches (one per KV head).
    // After the barrier every thread has the position; thread 0 then arrives on the grid's counter (decode.cu).
    __shared__ __align__(16) T s_knew[D], s_vnew[D];
    int64_t pos = -1;
    unsigned arrived = 0;
    if constexpr (APPEND) {
        if (warp == 0) {
            norm_rope<T, NC>(kn, ap.k_norm, ap.norm_eps, cs, sn, t);
            if (g == 0) {
#pragma unroll
                for (int cc = 0; cc < NC; ++cc) {
                    *reinterpret_cast<uint4*>(s_knew + 32 * cc + 8 * t) = kn[cc];
                    *reinterpret_cast<uint4*>(s_vnew + 32 * cc + 8 * t) = vn[cc];
                }
            }
        }
        __syncthreads();
        pos = s_pos;
        const unsigned ctas = gridDim.x * gridDim.y * gridDim.z;
        if (threadIdx.x == 0) arrived = atomicInc(reinterpret_cast<unsigned*>(counters + gridDim.z * hkv), ctas - 1) + 1;
        if (warp == 0 && g == 0 && h % kv_div == 0 && pos >= p_begin && pos < p_end) {
#pragma unroll
            for (int cc = 0; cc < NC; ++cc) {
                *reinterpret_cast<uint4*>(ap.k_cache + b * k_sb + kvh * k_sh + pos * D + 32 * cc + 8 * t) = kn[cc];
                *reinterpret_cast<uint4*>(ap.v_cache + b * v_sb + kvh * v_sh + pos * D + 32 * cc + 8 * t) = vn[cc];
            }
        }
        // every lane (the norm shuffles across the quad); rows past G feed only heads that are never written
        norm_rope<T, NC>(qv, ap.q_norm, ap.norm_eps, cs, sn, t);
    }
    const bool bad_pos = APPEND && (pos < 0 || pos >= L);  // nothing is written: the output says so (NaN)

    float m_run = -INFINITY, l_part = 0.f;  // head g's running max (log2 units); this lane's share of its sum
    float acc[2 * NC][4];                   // out^T: P.V MMA (cc, jp) at acc[2 cc + jp]
#pragma unroll
    for (int i = 0; i < 2 * NC; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

    for (int p0 = p_first; p0 < p_end; p0 += 16 * W) {
        Step<NC> cur = nxt;
        if (p0 + 16 * W < p_end) {
            load_rows(nxt, p0 + 16 * W, false);
            load_visible(nxt, p0 + 16 * W);
        }
        if constexpr (APPEND) {
            if (p0 + g == pos) {
#pragma unroll
                for (int cc = 0; cc < NC; ++cc) {
                    cur.k0[cc] = *reinterpret_cast<const uint4*>(s_knew + 32 * cc + 8 * t);
                    cur.v0[cc] = *reinterpret_cast<const uint4*>(s_vnew + 32 * cc + 8 * t);
                }
            }
            if (p0 + 8 + g == pos) {
#pragma unroll
                for (int cc = 0; cc < NC; ++cc) {
                    cur.k1[cc] = *reinterpret_cast<const uint4*>(s_knew + 32 * cc + 8 * t);
                    cur.v1[cc] = *reinterpret_cast<const uint4*>(s_vnew + 32 * cc + 8 * t);
                }
            }
        }
        const unsigned vis = __ballot_sync(kFullMask, cur.visible);  // bit j: position p0 + j
        if (!((vis >> g) & 1u)) {
#pragma unroll
            for (int cc = 0; cc < NC; ++cc) cur.v0[cc] = make_uint4(0, 0, 0, 0);
        }
        if (!((vis >> (8 + g)) & 1u)) {
#pragma unroll
            for (int cc = 0; cc < NC; ++cc) cur.v1[cc] = make_uint4(0, 0, 0, 0);
        }
        float s0[4] = {0.f, 0.f, 0.f, 0.f}, s1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int cc = 0; cc < NC; ++cc)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const uint32_t a[4] = {word(qv[cc], 2 * hh), 0u, word(qv[cc], 2 * hh + 1), 0u};
                mma16816<T>(s0, a, word(cur.k0[cc], 2 * hh), word(cur.k0[cc], 2 * hh + 1));
                mma16816<T>(s1, a, word(cur.k1[cc], 2 * hh), word(cur.k1[cc], 2 * hh + 1));
            }
        // head g's scores at positions p0 + 2t + e (s0[e]) and p0 + 8 + 2t + e (s1[e])
        float x[4];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            x[e] = (vis >> (2 * t + e)) & 1u ? s0[e] * scale_log2 : -INFINITY;
            x[2 + e] = (vis >> (8 + 2 * t + e)) & 1u ? s1[e] * scale_log2 : -INFINITY;
        }
        float mx = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));  // fmaxf drops NaN: it reaches l and out via p
        mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
        const float m_new = fmaxf(m_run, mx), base = m_new == -INFINITY ? 0.f : m_new;
        const float alpha = exp2f(m_run - base);
        float p[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = exp2f(x[i] - base);
        l_part = l_part * alpha + (p[0] + p[1]) + (p[2] + p[3]);
        m_run = m_new;
        // out^T's columns 2t, 2t + 1 are heads 2t, 2t + 1: their factors live in quads 2t, 2t + 1
        const float a_lo = __shfl_sync(kFullMask, alpha, 8 * t), a_hi = __shfl_sync(kFullMask, alpha, 8 * t + 4);
        const uint32_t b0 = Pack2<T>::pack(p[0], p[1]), b1 = Pack2<T>::pack(p[2], p[3]);
#pragma unroll
        for (int cc = 0; cc < NC; ++cc)
#pragma unroll
            for (int jp = 0; jp < 2; ++jp) {
                float(&o)[4] = acc[2 * cc + jp];
                o[0] *= a_lo;
                o[1] *= a_hi;
                o[2] *= a_lo;
                o[3] *= a_hi;
                const uint32_t a[4] = {movmatrix_trans(word(cur.v0[cc], 2 * jp)), movmatrix_trans(word(cur.v0[cc], 2 * jp + 1)),
                                       movmatrix_trans(word(cur.v1[cc], 2 * jp)), movmatrix_trans(word(cur.v1[cc], 2 * jp + 1))};
                mma16816<T>(o, a, b0, b1);
            }
    }
    l_part += __shfl_xor_sync(kFullMask, l_part, 1);
    l_part += __shfl_xor_sync(kFullMask, l_part, 2);

    // The warps merge through shared memory: (max, sum) per head, out^T as [D][8 heads].
    __shared__ float s_m[W][kHeads], s_l[W][kHeads];
    __shared__ float s_o[W][D][kHeads];
    if (t == 0) {
        s_m[warp][g] = m_run;
        s_l[warp][g] = l_part;
    }
#pragma unroll
    for (int cc = 0; cc < NC; ++cc)
#pragma unroll
        for (int jp = 0; jp < 2; ++jp)
#pragma unroll
            for (int i = 0; i < 4; ++i) s_o[warp][out_dim(cc, jp, g + 8 * (i >> 1))][2 * t + (i & 1)] = acc[2 * cc + jp][i];
    __syncthreads();
    // APPEND: the last CTA to arrive advances the position (every CTA has read it by then)
    if (APPEND && arrived == gridDim.x * gridDim.y * gridDim.z && !bad_pos) *ap.position = pos + 1;
    T* out_bh = out + (int64_t(b) * hkv + h) * G * D;
    float* cta_ws = ws + ((int64_t(b) * hkv + h) * chunks + c) * G * (D + 2);
    for (int i = threadIdx.x; i < G * D; i += W * 32) {
        const int hh = i / D, d = i % D;
        float m_all = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; ++w) m_all = fmaxf(m_all, s_m[w][hh]);
        float l_all = 0.f, o_all = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) {
            const float wt = merge_weight(s_m[w][hh], m_all);
            l_all += wt * s_l[w][hh];
            o_all += wt * s_o[w][d][hh];
        }
        if (chunks == 1) {
            out_bh[hh * D + d] = from_float<T>(bad_pos ? __int_as_float(0x7fffffff) : o_all / l_all);
        } else {
            cta_ws[hh * (D + 2) + d] = o_all;
            if (d == 0) {
                cta_ws[hh * (D + 2) + D] = m_all;
                cta_ws[hh * (D + 2) + D + 1] = l_all;
            }
        }
    }
    if (chunks == 1) return;
    if (!last_chunk_to_arrive(&counters[b * hkv + h], chunks)) return;
    merge_chunks<T, D, W * 32>(ws + (int64_t(b) * hkv + h) * chunks * G * (D + 2), chunks, G, out_bh, bad_pos);
    if (threadIdx.x == 0) counters[b * hkv + h] = 0;  // ready for the next launch (graph replays too)
}

template <typename T, int D, int W>
int launch(const void* q, const void* k, const void* v, int64_t k_sb, int64_t k_sh, int64_t v_sb, int64_t v_sh,
           const void* mask, int64_t mask_sb, void* out, float* ws, int* counters, int batch, int hkv, int kv_div,
           int G, int L, int chunk, float scale, int flags, const Append<T>& ap, void* stream) {
    if (G < 1 || G > kHeads || chunk % 16) return static_cast<int>(cudaErrorInvalidValue);
    const int chunks = launch_chunks(k, v, batch, hkv, kv_div, L, chunk, D, flags, ap);
    if (chunks == 0) return static_cast<int>(cudaErrorInvalidValue);
    const bool append = flags & 2;
    Launch l(dim3(chunks, hkv, batch), W * 32, 0, stream, flags & 1);
    const float scale_log2 = scale * 1.4426950408889634f;
    const bool early = append && (flags & 1) && (flags & 4);  // EARLY needs the append mode and PDL
    auto go = [&](auto kernel) {
        return cudaLaunchKernelEx(&l.cfg, kernel, static_cast<const T*>(q), static_cast<const T*>(k),
                                  static_cast<const T*>(v), k_sb, k_sh, v_sb, v_sh, static_cast<const bool*>(mask),
                                  mask_sb, static_cast<T*>(out), ws, counters, L, chunk, kv_div, G, scale_log2, ap,
                                  early);
    };
    const cudaError_t err = append ? go(decode_attention_mma_kernel<T, D, W, true>)
                                   : go(decode_attention_mma_kernel<T, D, W, false>);
    if (err != cudaSuccess) return static_cast<int>(err);
    return static_cast<int>(cudaGetLastError());
}

template <typename T, int D, int W>
int occupancy(int append) {
    return append ? resident_ctas(decode_attention_mma_kernel<T, D, W, true>, W * 32)
                  : resident_ctas(decode_attention_mma_kernel<T, D, W, false>, W * 32);
}

}  // namespace mma
}  // namespace attention
}  // namespace lowbit

// decode.cu's lowbit_decode_attention_* with the query heads per CTA (g, 1..8) an argument and W warps per CTA
// (16 positions each per step); chunk a multiple of 16.
#define LOWBIT_DEFINE_DECODE_ATTENTION_MMA(NAME, TYPE, D, W)                                                       \
    extern "C" int lowbit_decode_attention_mma_##NAME##_d##D##_w##W(                                               \
        const void* q, const void* k, const void* v, int64_t k_sb, int64_t k_sh, int64_t v_sb, int64_t v_sh,      \
        const void* mask, int64_t mask_sb, void* out, float* ws, int* counters, int batch, int hkv, int kv_div,   \
        int g, int L, int chunk, float scale, int flags, const void* k_new, const void* v_new, const void* cos,   \
        const void* sin, int64_t q_sb, int64_t kn_sb, int64_t vn_sb, int64_t cs_sb, int64_t* position,            \
        const void* q_norm, const void* k_norm, float norm_eps, void* stream) {                                   \
        const lowbit::attention::Append<TYPE> ap{                                                                 \
            static_cast<const TYPE*>(k_new), static_cast<const TYPE*>(v_new), static_cast<const TYPE*>(cos),      \
            static_cast<const TYPE*>(sin), q_sb, kn_sb, vn_sb, cs_sb, position,                                    \
            static_cast<TYPE*>(const_cast<void*>(k)), static_cast<TYPE*>(const_cast<void*>(v)),                  \
            static_cast<const TYPE*>(q_norm), static_cast<const TYPE*>(k_norm), norm_eps};                        \
        return lowbit::attention::mma::launch<TYPE, D, W>(q, k, v, k_sb, k_sh, v_sb, v_sh, mask, mask_sb, out,    \
                                                          ws, counters, batch, hkv, kv_div, g, L, chunk, scale,   \
                                                          flags, ap, stream);                                     \
    }                                                                                                             \
    extern "C" int lowbit_decode_attention_mma_occupancy_##NAME##_d##D##_w##W(int append) {                       \
        return lowbit::attention::mma::occupancy<TYPE, D, W>(append);                                             \
    }
#define LOWBIT_DEFINE_DECODE_ATTENTION_MMA_ALL(NAME, TYPE)  \
    LOWBIT_DEFINE_DECODE_ATTENTION_MMA(NAME, TYPE, 64, 4)   \
    LOWBIT_DEFINE_DECODE_ATTENTION_MMA(NAME, TYPE, 64, 8)   \
    LOWBIT_DEFINE_DECODE_ATTENTION_MMA(NAME, TYPE, 128, 4)  \
    LOWBIT_DEFINE_DECODE_ATTENTION_MMA(NAME, TYPE, 128, 8)
LOWBIT_DEFINE_DECODE_ATTENTION_MMA_ALL(fp16, __half)
LOWBIT_DEFINE_DECODE_ATTENTION_MMA_ALL(bf16, __nv_bfloat16)
