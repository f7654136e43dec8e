// Decode attention: one query token per sequence against a KV cache (flash-decoding).
//   out[b, h, :] = softmax(scale * q[b, h] . K[b, h / G]^T, masked) @ V[b, h / G]
// Why lowbit has it: in a batch-1 decode step on the H100, torch's SDPA for a 512-token Llama-3-8B
// cache costs ~9 us per layer in two cuDNN kernels for ~2 MB of K/V (under 1 us of bandwidth), and
// it never lets the next projection's GEMV start early (this kernel: 10.0 us alone vs SDPA's 13.9,
// benchmarks/journal/2026-11-25_decode_step_pdl_attention.md).
//
// Work split: a CTA takes one (sequence, KV head, chunk of positions) and all G query heads that
// share the KV head (grouped-query attention reads each K/V row once for its G heads). Its 8 warps
// take 8 consecutive positions at a time (their K and V rows loaded together: one memory latency per
// step), lane l holding elements [l E, l E + E) of every row (E = D / 32). Scores are reduced across
// the warp with shuffles; each warp keeps an online softmax (running max, sum, weighted V sum) per
// head; the warps merge through shared memory. With more than one chunk, each CTA leaves its
// (max, sum, partial output) in fp32 and the last CTA of a (sequence, KV head) -- an atomic counter --
// merges them in chunk order (deterministic) and writes the output, rounded once.
// Masked positions (mask[b, p] false) never count: their K/V rows are loaded with the visible ones (so
// the loads need not wait for the mask) and their values dropped; a sequence with no visible position
// gets NaN, as torch's math attention gives; so does a head with a NaN score or value.
// Scores use exp2 with log2(e) folded into the scale.
// PDL (flags bit 0): q, K, V, mask and the outputs belong to the stream order, so the kernel waits
// at entry and triggers its dependents right after: the next kernel (the output projection's GEMV)
// starts loading its weights while attention runs.
// APPEND (flags bit 1): the step's rotary embedding and KV-cache append in the same launch. q and the
// new token's k, v arrive as the projections left them; the kernel rotates q and k (rotate-half RoPE,
// fp32, rounded to T as transformers' apply_rotary_pos_emb leaves them), writes k, v into the caches at
// the step's position, and attends with them. Every warp rotates the new k in its registers and uses
// those for that position (never the cache row another CTA is writing); one CTA per KV head writes it.
// In a decode step this replaces the 3-4 small kernels torch.compile makes of RoPE, the two cache writes
// and the query copy. The last CTA to arrive on a grid-wide counter (each arrives once it has read the
// position) advances the position by one, as transformers' cache update does: one small kernel per layer
// less. A position outside the cache writes nothing, stays, and gives NaN. Optionally (q_norm / k_norm
// weights: Qwen3's per-head q and k RMSNorm) q and k are normalized in registers before the rotation, as
// transformers' RMSNorm rounds them: two more small kernels per layer folded in.
// EARLY (flags bit 2, with APPEND and PDL): the first step's K/V rows and the position are loaded before the
// wait, behind the q|k|v projection's tail. Only this kernel writes the caches and the position (its new row
// comes from registers), so the kernel in flight before it -- the projection -- cannot be writing them; the
// mask, cos and sin may be its (or a glue kernel's) output and are read after the wait. L2-only loads: no L1
// line of an earlier kernel is read.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "attention/chunks.cuh"
#include "common.cuh"

namespace lowbit {
namespace attention {

// Timing hooks for benchmarks/tools/layer_probe.cu, compiled out of the library: thread 0 of each CTA records
// the SM clock at phase i (0 entry, 1 after the PDL wait, 2 after the position read, 10 before the loop,
// 3 after warp 0's loop, 4 after the warps' merge, 5 once the chunk merge's counter answered, 6 exit), the
// global timer (ns) at entry (7) and exit (8), and whether it merged the chunks (9).
#ifdef LOWBIT_ATTN_STAMPS
__device__ long long* g_attn_stamps;  // [CTA][12]
__device__ __forceinline__ long long* stamp_row() {
    return g_attn_stamps + (int64_t(blockIdx.z) * gridDim.y * gridDim.x + blockIdx.y * gridDim.x + blockIdx.x) * 12;
}
__device__ __forceinline__ long long global_ns() {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void stamp(int i, bool last = false) {
    if (threadIdx.x != 0 || g_attn_stamps == nullptr) return;
    long long* s = stamp_row();
    s[i] = clock64();
    if (i == 0) s[7] = global_ns();
    if (i == 6) { s[8] = global_ns(); s[9] = last; }
}
#else
__device__ __forceinline__ void stamp(int, bool = false) {}
#endif

constexpr int kWarps = 8;  // per CTA: one 8-position step each for a 64-position chunk
constexpr int kStep = 8;   // positions per warp step (K and V rows in registers)
static_assert(kStep == 8, "warp_sum8 reduces one step's 8 scores");

// E consecutive elements of T as one 4/8/16-byte load, and their float values.
template <int E> struct RawVec;
template <> struct RawVec<2> { uint32_t r[1]; };
template <> struct RawVec<4> { uint32_t r[2]; };
template <> struct RawVec<8> { uint32_t r[4]; };

template <int E, typename T>
__device__ __forceinline__ RawVec<E> load_vec(const T* p) {
    RawVec<E> v;
    if constexpr (E == 2) v.r[0] = *reinterpret_cast<const uint32_t*>(p);
    if constexpr (E == 4) { const uint2 u = *reinterpret_cast<const uint2*>(p); v.r[0] = u.x; v.r[1] = u.y; }
    if constexpr (E == 8) {
        const uint4 u = *reinterpret_cast<const uint4*>(p);
        v.r[0] = u.x; v.r[1] = u.y; v.r[2] = u.z; v.r[3] = u.w;
    }
    return v;
}

// The same through L2 only (ld.global.cg): for the loads issued before the PDL wait (EARLY).
template <int E, typename T>
__device__ __forceinline__ RawVec<E> load_vec_cg(const T* p) {
    RawVec<E> v;
    if constexpr (E == 2) v.r[0] = __ldcg(reinterpret_cast<const unsigned int*>(p));
    if constexpr (E == 4) { const uint2 u = __ldcg(reinterpret_cast<const uint2*>(p)); v.r[0] = u.x; v.r[1] = u.y; }
    if constexpr (E == 8) {
        const uint4 u = __ldcg(reinterpret_cast<const uint4*>(p));
        v.r[0] = u.x; v.r[1] = u.y; v.r[2] = u.z; v.r[3] = u.w;
    }
    return v;
}

template <int E, typename T>
__device__ __forceinline__ void to_floats(const RawVec<E>& v, float (&f)[E]) {
#pragma unroll
    for (int i = 0; i < E / 2; ++i) {
        const float2 p = to_float2<T>(v.r[i]);
        f[2 * i] = p.x;
        f[2 * i + 1] = p.y;
    }
}

// Warp sums of the 8 per-lane partials d[0..7] (one step's 8 scores), every lane getting all 8: the butterfly
// of a one-value warp sum (lane ^ 16, ^ 8, ^ 4, ^ 2, ^ 1, each lane adding its partner's value to its own, so
// every sum is bit-identical to one such sum per score), but each of the first three stages halves what a lane
// carries: 4 + 2 + 1 + 1 + 1 shuffles leave lane 4 j + r with position j's sum, 8 more hand them out -- 17
// shuffles, not 8 x 5.
__device__ __forceinline__ void warp_sum8(float (&d)[8], int lane) {
    const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
    float e[4], f[2];
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // lanes with bit 4 keep positions 4..7, the others 0..3
        const float keep = b4 ? d[i + 4] : d[i], send = b4 ? d[i] : d[i + 4];
        e[i] = keep + __shfl_xor_sync(kFullMask, send, 16);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float keep = b3 ? e[i + 2] : e[i], send = b3 ? e[i] : e[i + 2];
        f[i] = keep + __shfl_xor_sync(kFullMask, send, 8);
    }
    float v = (b2 ? f[1] : f[0]) + __shfl_xor_sync(kFullMask, b2 ? f[0] : f[1], 4);
    v += __shfl_xor_sync(kFullMask, v, 2);
    v += __shfl_xor_sync(kFullMask, v, 1);
#pragma unroll
    for (int j = 0; j < 8; ++j) d[j] = __shfl_sync(kFullMask, v, 4 * j);
}

// The reduction warp_sum8 replaced, one score at a time (5 shuffles each), kept for A/B timing (flags bit 3).
__device__ __forceinline__ void warp_sum_each(float (&d)[8]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) d[j] += __shfl_xor_sync(kFullMask, d[j], o);
    }
}

// Rotate-half RoPE of the lane's E elements [lane E, lane E + E) of a D-row (c, s: its cos, sin): x cos + rotate_half(x) sin,
// rotate_half(x)[i] = -x[i + D/2] (i < D/2), x[i - D/2] (else): the partner elements sit in lane ^ 16.
// Rounded to T (transformers' q_embed / k_embed dtype).
template <int E, typename T>
__device__ __forceinline__ void rope_lane(float (&x)[E], const float (&c)[E], const float (&s)[E], int lane) {
    const float sign = lane < 16 ? -1.f : 1.f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const float partner = __shfl_xor_sync(kFullMask, x[e], 16);
        x[e] = to_float(from_float<T>(fmaf(x[e], c[e], sign * partner * s[e])));
    }
}

// transformers' RMSNorm of one D-row held E elements per lane: x / sqrt(mean(x^2) + eps) rounded to T, times
// the weight w (the lane's E elements, as floats), rounded to T.
template <int E, typename T>
__device__ __forceinline__ void rms_norm_lane(float (&x)[E], const float (&w)[E], float eps) {
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) ss = fmaf(x[e], x[e], ss);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(kFullMask, ss, o);
    const float r = rsqrtf(ss / float(32 * E) + eps);
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = to_float(from_float<T>(w[e] * to_float(from_float<T>(x[e] * r))));
}

template <int E, typename T>
__device__ __forceinline__ RawVec<E> pack_vec(const float (&f)[E]) {
    RawVec<E> v;
#pragma unroll
    for (int i = 0; i < E / 2; ++i) {
        const T lo = from_float<T>(f[2 * i]), hi = from_float<T>(f[2 * i + 1]);
        v.r[i] = uint32_t(*reinterpret_cast<const uint16_t*>(&lo)) | (uint32_t(*reinterpret_cast<const uint16_t*>(&hi)) << 16);
    }
    return v;
}

template <int E, typename T>
__device__ __forceinline__ void store_vec(T* p, const RawVec<E>& v) {
    if constexpr (E == 2) *reinterpret_cast<uint32_t*>(p) = v.r[0];
    if constexpr (E == 4) *reinterpret_cast<uint2*>(p) = make_uint2(v.r[0], v.r[1]);
    if constexpr (E == 8) *reinterpret_cast<uint4*>(p) = make_uint4(v.r[0], v.r[1], v.r[2], v.r[3]);
}

template <typename T, int D, int G, bool APPEND>
__global__ void __launch_bounds__(kWarps * 32) decode_attention_kernel(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, int64_t k_sb, int64_t k_sh,
    int64_t v_sb, int64_t v_sh, const bool* __restrict__ mask, int64_t mask_sb, T* __restrict__ out,
    float* __restrict__ ws, int* __restrict__ counters, int L, int chunk, int kv_div, float scale_log2,
    const Append<T> ap, const bool early, const bool each) {
    constexpr int E = D / 32;
    const int b = blockIdx.z, h = blockIdx.y, c = blockIdx.x, chunks = gridDim.x, hkv = gridDim.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int p_begin = c * chunk, p_end = min(L, p_begin + chunk);
    const int kvh = h / kv_div;
    const T* kb = k + b * k_sb + kvh * k_sh + lane * E;
    const T* vb = v + b * v_sb + kvh * v_sh + lane * E;
    const bool* mb = mask == nullptr ? nullptr : mask + b * mask_sb;
    // One step's K/V rows and visibility. The rows are loaded whatever the mask says (their loads then
    // overlap the mask's instead of following them); a masked row's values are never used.
    RawVec<E> kr[kStep], vr[kStep];
    bool ok[kStep];
    auto load_rows = [&](int p0, bool cg) {
#pragma unroll
        for (int j = 0; j < kStep; ++j) {
            const int p = p0 + j;
            if (p < p_end) {
                kr[j] = cg ? load_vec_cg<E>(kb + int64_t(p) * D) : load_vec<E>(kb + int64_t(p) * D);
                vr[j] = cg ? load_vec_cg<E>(vb + int64_t(p) * D) : load_vec<E>(vb + int64_t(p) * D);
            } else {
                kr[j] = {};
                vr[j] = {};
            }
        }
    };
    auto load_ok = [&](int p0) {
#pragma unroll
        for (int j = 0; j < kStep; ++j) ok[j] = p0 + j < p_end && (mb == nullptr || mb[p0 + j]);
    };
    auto load_step = [&](int p0) {
        load_ok(p0);
        load_rows(p0, false);
    };
    const int p_first = p_begin + warp * kStep;
    stamp(0);
    __shared__ int64_t s_pos;  // APPEND: thread 0 reads the position for the CTA (see the arrival below)
    // EARLY (APPEND only): what no kernel but this one writes, before the wait (see the header)
    const bool early_rows = APPEND && early;
    if (early_rows) {
        if (threadIdx.x == 0) s_pos = __ldcg(ap.position);
        if (p_first < p_end) load_rows(p_first, true);
    }
    pdl_wait();  // no-ops unless launched with programmatic serialization (flags bit 0)
    pdl_launch_dependents();
    stamp(1);
    // Every independent load first -- q; APPEND: the position, the new token's k, v and cos, sin; the first
    // step's mask bytes and rows -- so the kernel waits for one memory latency, not a chain of them.
    const T* qb = APPEND ? q + b * ap.q_sb + int64_t(h) * G * D : q + (int64_t(b) * hkv * G + h * G) * D;
    RawVec<E> q_raw[G];
#pragma unroll
    for (int g = 0; g < G; ++g) q_raw[g] = load_vec<E>(qb + g * D + lane * E);
    int64_t pos = -1;
    RawVec<E> k_add, v_add;  // APPEND: the new row (k rotated below)
    float cs[E], sn[E], qn[E], kn[E];
    if constexpr (APPEND) {
        if (threadIdx.x == 0 && !early_rows) s_pos = *ap.position;
        k_add = load_vec<E>(ap.k_new + b * ap.kn_sb + int64_t(kvh) * D + lane * E);
        v_add = load_vec<E>(ap.v_new + b * ap.vn_sb + int64_t(kvh) * D + lane * E);
        to_floats<E, T>(load_vec<E>(ap.cos + b * ap.cs_sb + lane * E), cs);
        to_floats<E, T>(load_vec<E>(ap.sin + b * ap.cs_sb + lane * E), sn);
        if (ap.q_norm != nullptr) to_floats<E, T>(load_vec<E>(ap.q_norm + lane * E), qn);
        if (ap.k_norm != nullptr) to_floats<E, T>(load_vec<E>(ap.k_norm + lane * E), kn);
    }
    if (p_first < p_end) {
        if (early_rows) load_ok(p_first);
        else load_step(p_first);
    }
    // APPEND: the CTA's one read of the position is done once the barrier passes; thread 0 then arrives on
    // the grid's counter (it wraps to 0 at the last arrival: ready for the next launch). The count it gets
    // back is only looked at after the main loop, so its latency hides behind the K/V loads.
    unsigned arrived = 0;
    if constexpr (APPEND) {
        __syncthreads();
        pos = s_pos;
        stamp(2);
        const unsigned ctas = gridDim.x * gridDim.y * gridDim.z;
        if (threadIdx.x == 0) arrived = atomicInc(reinterpret_cast<unsigned*>(counters + gridDim.z * hkv), ctas - 1) + 1;
    }
    const bool bad_pos = APPEND && (pos < 0 || pos >= L);  // nothing is written: the output says so (NaN)
    if constexpr (APPEND) {
        // Every warp rotates the new k itself (registers: no barrier); warp 0 of the CTA whose chunk holds the
        // position writes it, one CTA per KV head. The cache row other warps may have loaded at that position
        // is never used: they take these registers instead.
        float kf[E];
        to_floats<E, T>(k_add, kf);
        if (ap.k_norm != nullptr) rms_norm_lane<E, T>(kf, kn, ap.norm_eps);
        rope_lane<E, T>(kf, cs, sn, lane);
        k_add = pack_vec<E, T>(kf);
        if (warp == 0 && h % kv_div == 0 && pos >= p_begin && pos < p_end) {
            store_vec<E, T>(ap.k_cache + b * k_sb + kvh * k_sh + pos * D + lane * E, k_add);
            store_vec<E, T>(ap.v_cache + b * v_sb + kvh * v_sh + pos * D + lane * E, v_add);
        }
    }
    // this lane's elements of the G query heads (APPEND: rotated), pre-scaled by scale * log2(e)
    float qf[G][E];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        float f[E];
        to_floats<E, T>(q_raw[g], f);
        if constexpr (APPEND) {
            if (ap.q_norm != nullptr) rms_norm_lane<E, T>(f, qn, ap.norm_eps);
            rope_lane<E, T>(f, cs, sn, lane);
        }
#pragma unroll
        for (int e = 0; e < E; ++e) qf[g][e] = f[e] * scale_log2;
    }
    float m[G], l[G], o[G][E];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) o[g][e] = 0.f;
    }
    stamp(10);
    for (int p0 = p_first; p0 < p_end; p0 += kWarps * kStep) {
        if (p0 != p_first) load_step(p0);
        if constexpr (APPEND) {
#pragma unroll
            for (int j = 0; j < kStep; ++j) {
                if (p0 + j == pos) {
                    kr[j] = k_add;
                    vr[j] = v_add;
                }
            }
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float s[kStep];
            float step_max = -INFINITY;
            bool nan = false;
#pragma unroll
            for (int j = 0; j < kStep; ++j) {
                float kf[E];
                to_floats<E, T>(kr[j], kf);
                float d = 0.f;
#pragma unroll
                for (int e = 0; e < E; ++e) d = fmaf(qf[g][e], kf[e], d);
                s[j] = d;
            }
            if (each) warp_sum_each(s);  // uniform across the warp (each: the A/B reference)
            else warp_sum8(s, lane);
#pragma unroll
            for (int j = 0; j < kStep; ++j) {
                s[j] = ok[j] ? s[j] : -INFINITY;
                nan |= s[j] != s[j];
                step_max = fmaxf(step_max, s[j]);  // fmaxf drops NaN: tracked apart
            }
            if (nan) l[g] = __int_as_float(0x7fffffff);  // a NaN score poisons the head's output, never dropped
            if (step_max == -INFINITY) continue;  // nothing visible in this step (warp-uniform)
            const float m_new = fmaxf(m[g], step_max);
            const float corr = merge_weight(m[g], m_new);
            l[g] *= corr;
#pragma unroll
            for (int e = 0; e < E; ++e) o[g][e] *= corr;
#pragma unroll
            for (int j = 0; j < kStep; ++j) {
                if (!ok[j]) continue;
                const float p = exp2f(s[j] - m_new);
                float vf[E];
                to_floats<E, T>(vr[j], vf);
                l[g] += p;
#pragma unroll
                for (int e = 0; e < E; ++e) o[g][e] = fmaf(p, vf[e], o[g][e]);
            }
            m[g] = m_new;
        }
    }

    stamp(3);
    // Merge the warps: [warp][g] (m, l) and [warp][g][D] o.
    __shared__ float s_ml[kWarps][G][2];
    __shared__ float s_o[kWarps][G][D];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        if (lane == 0) { s_ml[warp][g][0] = m[g]; s_ml[warp][g][1] = l[g]; }
#pragma unroll
        for (int e = 0; e < E; ++e) s_o[warp][g][lane * E + e] = o[g][e];
    }
    __syncthreads();
    stamp(4);
    // APPEND: the last CTA to arrive advances the position (every CTA has read it by then)
    if (APPEND && arrived == gridDim.x * gridDim.y * gridDim.z && !bad_pos) *ap.position = pos + 1;
    // thread t merges (g, d) = (i / D, i % D) for i = t, t + 256, ...; the CTA's state goes to
    // registers (one chunk) or the workspace [b][h][c][g][D + 2] (m, l at D, D + 1)
    float* cta_ws = ws + ((int64_t(b) * hkv + h) * chunks + c) * G * (D + 2);
    for (int i = threadIdx.x; i < G * D; i += kWarps * 32) {
        const int g = i / D, d = i % D;
        float m_all = -INFINITY;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, s_ml[w][g][0]);
        float l_all = 0.f, o_all = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
            const float wt = merge_weight(s_ml[w][g][0], m_all);
            l_all += wt * s_ml[w][g][1];
            o_all += wt * s_o[w][g][d];
        }
        if (chunks == 1) {
            out[(int64_t(b) * hkv * G + h * G + g) * D + d] = from_float<T>(bad_pos ? __int_as_float(0x7fffffff) : o_all / l_all);
        } else {
            cta_ws[g * (D + 2) + d] = o_all;
            if (d == 0) { cta_ws[g * (D + 2) + D] = m_all; cta_ws[g * (D + 2) + D + 1] = l_all; }
        }
    }
    if (chunks == 1) {
        stamp(6);
        return;
    }

    // The last CTA of (b, h) merges the chunks (chunks.cuh).
    const bool last = last_chunk_to_arrive(&counters[b * hkv + h], chunks);
    stamp(5);
    if (!last) {
        stamp(6);
        return;
    }
    merge_chunks<T, D, kWarps * 32>(ws + (int64_t(b) * hkv + h) * chunks * G * (D + 2), chunks, G,
                                    out + (int64_t(b) * hkv + h) * G * D, bad_pos);
    if (threadIdx.x == 0) counters[b * hkv + h] = 0;  // ready for the next launch (graph replays too)
    stamp(6, true);
}

template <typename T, int D, int G>
int launch(const void* q, const void* k, const void* v, int64_t k_sb, int64_t k_sh, int64_t v_sb, int64_t v_sh,
           const void* mask, int64_t mask_sb, void* out, float* ws, int* counters, int batch, int hkv, int kv_div,
           int L, int chunk, float scale, int flags, const Append<T>& ap, void* stream) {
    const int chunks = launch_chunks(k, v, batch, hkv, kv_div, L, chunk, D, flags, ap);
    if (chunks == 0) return static_cast<int>(cudaErrorInvalidValue);
    const bool append = flags & 2;
    Launch l(dim3(chunks, hkv, batch), kWarps * 32, 0, stream, flags & 1);
    const float scale_log2 = scale * 1.4426950408889634f;
    const bool early = append && (flags & 1) && (flags & 4);  // EARLY needs the append mode and PDL
    auto go = [&](auto kernel) {
        return cudaLaunchKernelEx(&l.cfg, kernel, static_cast<const T*>(q), static_cast<const T*>(k),
                                  static_cast<const T*>(v), k_sb, k_sh, v_sb, v_sh, static_cast<const bool*>(mask),
                                  mask_sb, static_cast<T*>(out), ws, counters, L, chunk, kv_div, scale_log2, ap,
                                  early, (flags & 8) != 0);
    };
    const cudaError_t err = append ? go(decode_attention_kernel<T, D, G, true>) : go(decode_attention_kernel<T, D, G, false>);
    if (err != cudaSuccess) return static_cast<int>(err);
    return static_cast<int>(cudaGetLastError());
}

// CTAs of an instance that fit on one SM (its registers decide: D = 128 with 4 heads per CTA holds one, with
// 2 heads two), for the host's grid plan (lowbit/kernels/attention.py); 0 if the runtime cannot say.
template <typename T, int D, int G>
int occupancy(int append) {
    return append ? resident_ctas(decode_attention_kernel<T, D, G, true>, kWarps * 32)
                  : resident_ctas(decode_attention_kernel<T, D, G, false>, kWarps * 32);
}

}  // namespace attention
}  // namespace lowbit

// q [batch, hkv * G, D] and out (same shape) contiguous; hkv head groups of G query heads, group h reading
// the K/V rows of KV head h / kv_div (kv_div > 1: a KV head's query heads split over kv_div CTAs, each
// re-reading its K/V, mostly from L2) at k + b * k_sb + (h / kv_div) * k_sh + p * D (element strides);
// mask: bool [batch, L] rows at mask_sb, or null; ws: fp32 [batch, hkv, ceil(L / chunk), G, D + 2];
// counters: int [batch * hkv (+ 1 in APPEND mode)], zero; ceil(L / chunk) <= 2 D.
// flags bit 2 (EARLY, with bits 0 and 1): see the header. flags bit 3: scores reduced one at a time (A/B of
// warp_sum8). flags bit 1 (APPEND): q's rows at q_sb (pre-RoPE); k_new, v_new [batch, hkv / kv_div, D] at kn_sb, vn_sb;
// cos, sin [batch, D] at cs_sb; *position (int64) the cache row written, then advanced by one; k, v the caches
// (written); q_norm, k_norm [D] (or null) RMSNorm weights applied to q and k before the rotation, with norm_eps.
#define LOWBIT_DEFINE_DECODE_ATTENTION(NAME, TYPE, D, G)                                                          \
    extern "C" int lowbit_decode_attention_##NAME##_d##D##_g##G(                                                  \
        const void* q, const void* k, const void* v, int64_t k_sb, int64_t k_sh, int64_t v_sb, int64_t v_sh,      \
        const void* mask, int64_t mask_sb, void* out, float* ws, int* counters, int batch, int hkv, int kv_div,   \
        int L, int chunk, float scale, int flags, const void* k_new, const void* v_new, const void* cos,          \
        const void* sin, int64_t q_sb, int64_t kn_sb, int64_t vn_sb, int64_t cs_sb, int64_t* position,            \
        const void* q_norm, const void* k_norm, float norm_eps, void* stream) {                                   \
        const lowbit::attention::Append<TYPE> ap{                                                                 \
            static_cast<const TYPE*>(k_new), static_cast<const TYPE*>(v_new), static_cast<const TYPE*>(cos),      \
            static_cast<const TYPE*>(sin), q_sb, kn_sb, vn_sb, cs_sb, position,                                    \
            static_cast<TYPE*>(const_cast<void*>(k)), static_cast<TYPE*>(const_cast<void*>(v)),                  \
            static_cast<const TYPE*>(q_norm), static_cast<const TYPE*>(k_norm), norm_eps};                        \
        return lowbit::attention::launch<TYPE, D, G>(q, k, v, k_sb, k_sh, v_sb, v_sh, mask, mask_sb, out, ws,     \
                                                     counters, batch, hkv, kv_div, L, chunk, scale, flags, ap,   \
                                                     stream);                                                     \
    }                                                                                                             \
    extern "C" int lowbit_decode_attention_occupancy_##NAME##_d##D##_g##G(int append) {                           \
        return lowbit::attention::occupancy<TYPE, D, G>(append);                                                  \
    }
#define LOWBIT_DEFINE_DECODE_ATTENTION_D(NAME, TYPE)  \
    LOWBIT_DEFINE_DECODE_ATTENTION(NAME, TYPE, 64, 1) \
    LOWBIT_DEFINE_DECODE_ATTENTION(NAME, TYPE, 64, 2) \
    LOWBIT_DEFINE_DECODE_ATTENTION(NAME, TYPE, 64, 4) \
    LOWBIT_DEFINE_DECODE_ATTENTION(NAME, TYPE, 64, 8) \
    LOWBIT_DEFINE_DECODE_ATTENTION(NAME, TYPE, 128, 1) \
    LOWBIT_DEFINE_DECODE_ATTENTION(NAME, TYPE, 128, 2) \
    LOWBIT_DEFINE_DECODE_ATTENTION(NAME, TYPE, 128, 4) \
    LOWBIT_DEFINE_DECODE_ATTENTION(NAME, TYPE, 128, 8) \
    LOWBIT_DEFINE_DECODE_ATTENTION(NAME, TYPE, 256, 1) \
    LOWBIT_DEFINE_DECODE_ATTENTION(NAME, TYPE, 256, 2) \
    LOWBIT_DEFINE_DECODE_ATTENTION(NAME, TYPE, 256, 4)
LOWBIT_DEFINE_DECODE_ATTENTION_D(fp16, __half)
LOWBIT_DEFINE_DECODE_ATTENTION_D(bf16, __nv_bfloat16)
