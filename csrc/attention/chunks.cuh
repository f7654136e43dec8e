// What both decode attention kernels (decode.cu on CUDA cores, decode_mma.cu on tensor cores) share: the append
// mode's operands and the merge of a sequence's chunks.
//
// A CTA that is one of several chunks of a (sequence, head group) leaves its state per query head -- the running
// max m (log2 units), the sum l and the unnormalized output o[D], fp32 -- in the workspace
// [batch][head group][chunk][head][D + 2] (o at 0..D-1, m at D, l at D + 1). The last CTA to arrive merges them in
// chunk order (deterministic) and writes the output, rounded once.
#pragma once
#include "common.cuh"

namespace lowbit {
namespace attention {

// APPEND mode's extra operands: the new token's k, v (pre-RoPE k) [b, hkv_real, D] at row strides kn_sb /
// vn_sb (elements); cos, sin [b, D] at cs_sb; q's batch stride; the step's position (int64, device;
// advanced by one at the end); the caches written (the same memory as k, v: the new row is written, never read, through these).
template <typename T>
struct Append {
    const T* k_new;
    const T* v_new;
    const T* cos;
    const T* sin;
    int64_t q_sb, kn_sb, vn_sb, cs_sb;
    int64_t* position;
    T* k_cache;
    T* v_cache;
    const T* q_norm;  // [D] RMSNorm weights of every q head / of k before the rotation, or null: none
    const T* k_norm;
    float norm_eps;
};

// counter += v at GPU scope with release and acquire semantics; returns the old value.
__device__ __forceinline__ int atomic_add_acq_rel(int* counter, int v) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(counter), "r"(v) : "memory");
    return old;
}

constexpr int kMergeRegs = 16;  // chunks the last CTA merges from registers, in one round of loads (<= 32)

// Merge a softmax state (m, l, o) scaled to the common max: weight 2^(m - m_all), 0 for an empty one.
__device__ __forceinline__ float merge_weight(float m, float m_all) {
    return m == -INFINITY ? 0.f : exp2f(m - m_all);
}

// Arrival of one chunk's CTA once its partials are in the workspace: one acq_rel atomic by thread 0 behind a CTA
// barrier releases them and, for the last CTA, acquires every other CTA's (the barrier after it passes that on to the
// CTA's threads); no per-thread fences. True in every thread of the last CTA.
__device__ __forceinline__ bool last_chunk_to_arrive(int* counter, int chunks) {
    __shared__ int s_last;
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomic_add_acq_rel(counter, 1) == chunks - 1;
    __syncthreads();
    return s_last;
}

// The last CTA's merge of `chunks` partial states of G heads (bh_ws: the (sequence, head group)'s workspace) into
// out_bh [G][D] (NaN everywhere if bad_pos). Thread i takes (g, d) = (i / D, i % D), i += THREADS (g is warp-uniform:
// D is a multiple of 32). Each thread asks for all it needs at once -- every chunk's (m, l) for its head and its
// element of every chunk's output -- so the merge costs one L2 round trip (up to kMergeRegs chunks; more: two).
template <typename T, int D, int THREADS>
__device__ __forceinline__ void merge_chunks(const float* bh_ws, int chunks, int G, T* out_bh, bool bad_pos) {
    static_assert(D % 32 == 0, "a head's elements span whole warps");
    const int lane = threadIdx.x & 31;
    for (int i = threadIdx.x; i < G * D; i += THREADS) {
        const int g = i / D, d = i % D;
        const float* col = bh_ws + g * (D + 2);  // chunk cc's row at col + cc * G * (D + 2)
        const int64_t row = int64_t(G) * (D + 2);
        float o_all = 0.f, den = 0.f;
        if (chunks <= kMergeRegs) {
            // lane cc holds chunk cc's (m, l) of head g, each thread its element of every chunk's output; the sums
            // run in chunk order, as in the loop below
            float m_c = -INFINITY, l_c = 0.f, oc[kMergeRegs];
            if (lane < chunks) {
                m_c = __ldcg(col + lane * row + D);
                l_c = __ldcg(col + lane * row + D + 1);
            }
#pragma unroll
            for (int cc = 0; cc < kMergeRegs; ++cc)
                if (cc < chunks) oc[cc] = __ldcg(col + cc * row + d);
            float m_all = m_c;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) m_all = fmaxf(m_all, __shfl_xor_sync(kFullMask, m_all, o));
            const float w_c = merge_weight(m_c, m_all);
#pragma unroll
            for (int cc = 0; cc < kMergeRegs; ++cc) {
                if (cc < chunks) {  // uniform across the CTA
                    const float wt = __shfl_sync(kFullMask, w_c, cc);
                    den += wt * __shfl_sync(kFullMask, l_c, cc);
                    o_all += wt * oc[cc];
                }
            }
        } else {  // the same sums, the (m, l) pass first
            float m_all = -INFINITY;
            for (int cc = 0; cc < chunks; ++cc) m_all = fmaxf(m_all, __ldcg(col + cc * row + D));
            for (int cc = 0; cc < chunks; ++cc) {
                const float wt = merge_weight(__ldcg(col + cc * row + D), m_all);
                den += wt * __ldcg(col + cc * row + D + 1);
                o_all += wt * __ldcg(col + cc * row + d);
            }
        }
        out_bh[g * D + d] = from_float<T>(bad_pos ? __int_as_float(0x7fffffff) : o_all / den);
    }
}

// The chunk count of a launch after the checks both launchers share (the grid, the append mode's operands), 0 if one
// fails. chunks <= 2 D: the grid plans' cap (lowbit/kernels/attention.py).
template <typename T>
int launch_chunks(const void* k, const void* v, int batch, int hkv, int kv_div, int L, int chunk, int D, int flags,
                  const Append<T>& ap) {
    if (batch < 1 || hkv < 1 || kv_div < 1 || hkv % kv_div || L < 1 || chunk < 1 || batch > 65535 || hkv > 65535)
        return 0;
    const int chunks = (L + chunk - 1) / chunk;
    if (chunks > 2 * D) return 0;
    if ((flags & 2) && (ap.k_new == nullptr || ap.v_new == nullptr || ap.cos == nullptr || ap.sin == nullptr ||
                        ap.position == nullptr || ap.k_cache != k || ap.v_cache != v))
        return 0;
    return chunks;
}

// CTAs of `kernel` (`threads` per CTA, static shared memory only) that fit on one SM, for the host's grid plans
// (lowbit/kernels/attention.py); 0 if the runtime cannot say (and no error is left behind as its last).
template <typename K>
int resident_ctas(K kernel, int threads) {
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return blocks;
}

}  // namespace attention
}  // namespace lowbit
