// MoE router for decode: logits = x W^T, softmax, top-k and (optionally) renormalized top-k weights, in
// one launch. transformers' softmax routers (Qwen2/3-MoE, Qwen3-Next, OLMoE, Mixtral, ...) spend four
// kernels on this per layer at batch 1 -- a cuBLAS GEMV for a 128 x 2048 weight, a softmax, and
// torch.topk's gather + bitonic sort -- 14.5 us on the H100 for a few hundred KB of weight
// (Qwen3-30B-A3B, benchmarks/journal/2026-11-25_nvfp4_paths_and_the_moe_router.md).
//
// Work split: a CTA takes 1-8 expert rows (one CTA per SM at most) for every token, its 256 threads
// splitting the hidden dimension (more loads in flight than a warp per row: that first version took
// 14 us on Qwen3-30B-A3B's 128 x 2048 router, one DRAM round trip per 256 values); each logit is rounded
// to T, as F.linear's output is, and stored. The last CTA to finish (an atomic counter, as in decode
// attention) then takes one token per warp: softmax in fp32 over the rounded logits, then the top k
// (higher probability first, ties to the lower expert, NaN before everything, as torch.topk orders them):
// with at most 256 (token, expert) pairs and 128 experts each thread ranks one against its token's others, otherwise
// top_k rounds of a warp arg-max over each lane's own best; renormalization. Fixed orders: deterministic.
// PDL (flags bit 0): x and the outputs belong to the stream order, so the kernel waits at entry and
// triggers its dependents right after.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common.cuh"

namespace lowbit {
namespace moe {

constexpr int kWarps = 8;
constexpr int kMaxTokens = 8;     // decode; the op takes larger batches through the reference
constexpr int kMaxExperts = 1024; // the last CTA's shared memory: kMaxTokens x kMaxExperts x 12 bytes
constexpr int kMaxTopK = 64;
// The last CTA ranks (token, expert) pairs all at once, a thread each, when they fit its threads and each
// token has at most kRankMaxExperts (a rank costs ~15 cycles per other expert: 2 pairs per thread or 512
// experts were 1.1x / 1.8x slower than the rounds; benchmarks/journal/2026-11-26_moe_block_routed.md).
constexpr int kRankMaxExperts = 128;

// Up to 4 chunks of 8 hidden values per thread and row, loaded together (one memory latency per group).
constexpr int kGroup = 4;

template <typename T, int R>
__device__ __forceinline__ void load_rows(uint4 (&wv)[R][kGroup], const T* __restrict__ w, int e0, int experts,
                                          int hidden, int chunk0) {
    const int chunks = hidden / 8;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < kGroup; ++j) {
            const int c = chunk0 + j * kWarps * 32;
            wv[r][j] = (c < chunks && e0 + r < experts)
                           ? ld_stream(reinterpret_cast<const uint4*>(w + int64_t(e0 + r) * hidden) + c)
                           : make_uint4(0, 0, 0, 0);
        }
}

template <typename T, int R, bool PDL>
__global__ void __launch_bounds__(kWarps * 32) moe_router_kernel(
    const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ logits, void* __restrict__ scores,
    int64_t* __restrict__ indices, int* __restrict__ counter, int tokens, int experts, int hidden, int top_k,
    int flags) {
    extern __shared__ __align__(16) float s_p[];  // [tokens][experts] probabilities, then [tokens][experts] keys
    float* s_keys = s_p + ((tokens * experts + 3) & ~3);  // 16-byte aligned
    __shared__ float s_red[kWarps][R][kMaxTokens];
    __shared__ float s_top_v[kMaxTokens][kMaxTopK];
    __shared__ int s_top_e[kMaxTokens][kMaxTopK];
    __shared__ int s_last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int e0 = blockIdx.x * R, chunks = hidden / 8;

    // 1. R expert rows per CTA, the hidden dimension over all its threads (thread i: chunks i, i + 256, ...).
    // The first weight loads are issued before waiting for the predecessor (weights are constants).
    float acc[R][kMaxTokens];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < kMaxTokens; ++t) acc[r][t] = 0.f;
    uint4 wv[R][kGroup];
    int c0 = threadIdx.x;
    load_rows<T, R>(wv, w, e0, experts, hidden, c0);
    if constexpr (PDL) {
        pdl_wait();
        pdl_launch_dependents();
    }
    while (c0 < chunks) {
#pragma unroll
        for (int t = 0; t < kMaxTokens; ++t) {
            if (t < tokens) {
#pragma unroll
                for (int j = 0; j < kGroup; ++j) {
                    const int c = c0 + j * kWarps * 32;
                    if (c < chunks) {
                        const uint4 xv = ld_x(reinterpret_cast<const uint4*>(x + int64_t(t) * hidden) + c);
                        const uint32_t xr[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
                        for (int r = 0; r < R; ++r) {
                            const uint32_t wr[4] = {wv[r][j].x, wv[r][j].y, wv[r][j].z, wv[r][j].w};
#pragma unroll
                            for (int i = 0; i < 4; ++i) {
                                const float2 a = to_float2<T>(wr[i]), b = to_float2<T>(xr[i]);
                                acc[r][t] = fmaf(a.x, b.x, acc[r][t]);
                                acc[r][t] = fmaf(a.y, b.y, acc[r][t]);
                            }
                        }
                    }
                }
            }
        }
        c0 += kGroup * kWarps * 32;
        if (c0 < chunks) load_rows<T, R>(wv, w, e0, experts, hidden, c0);
    }
    // warp sums, then the 8 warps' in warp order (deterministic); logits rounded to T as F.linear's are
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < kMaxTokens; ++t) {
            if (t < tokens) {
                float v = acc[r][t];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
                if (lane == 0) s_red[warp][r][t] = v;
            }
        }
    __syncthreads();
    if (threadIdx.x < R * kMaxTokens) {
        const int r = threadIdx.x / kMaxTokens, t = threadIdx.x % kMaxTokens;
        if (t < tokens && e0 + r < experts) {
            float v = 0.f;
#pragma unroll
            for (int wi = 0; wi < kWarps; ++wi) v += s_red[wi][r][t];
            logits[int64_t(t) * experts + e0 + r] = from_float<T>(v);
        }
    }

    // 2. The last CTA, one token per warp: softmax, top-k, renormalization. (Ranking every probability
    // against all others in parallel instead, an O(E) loop per thread, took 10 us per 256 of them.)
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(counter, 1) == int(gridDim.x) - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    for (int i = threadIdx.x; i < tokens * experts; i += kWarps * 32) {
        const unsigned short raw = __ldcg(reinterpret_cast<const unsigned short*>(logits) + i);
        T v;
        memcpy(&v, &raw, sizeof(v));
        s_p[i] = to_float(v);
    }
    __syncthreads();
    // Few (token, expert) pairs (decode): a thread per pair ranks its probability against its token's others
    // (rank = how many order before it; one broadcast shared load per other) instead of top_k rounds of a
    // warp arg-max in one warp per token -- the same order, in ~E steps all at once instead of ~top_k x 10.
    const int pairs = tokens * experts;
    const bool rank_all = pairs <= kWarps * 32 && experts <= kRankMaxExperts;
    auto write_top = [&](int t, float total) {  // one warp: token t's top_k, renormalized by total (flags bit 1)
        const float den = (flags & 2) ? total : 1.f;
        for (int r = lane; r < top_k; r += 32) {
            const int64_t o = int64_t(t) * top_k + r;
            const float v = s_top_v[t][r] / den;
            if (flags & 4) static_cast<float*>(scores)[o] = v;
            else static_cast<T*>(scores)[o] = from_float<T>(v);
            indices[o] = s_top_e[t][r];
        }
    };
    for (int t = warp; t < tokens; t += kWarps) {
        float* p = s_p + t * experts;
        float m = -INFINITY;  // a NaN logit makes the row NaN, as torch's softmax does
        int nan = 0;
        for (int i = lane; i < experts; i += 32) { m = fmaxf(m, p[i]); nan |= p[i] != p[i]; }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            m = fmaxf(m, __shfl_xor_sync(kFullMask, m, o));
            nan |= __shfl_xor_sync(kFullMask, nan, o);
        }
        float sum = 0.f;
        for (int i = lane; i < experts; i += 32) {
            const float ex = nan ? __int_as_float(0x7fc00000) : expf(p[i] - m);
            p[i] = ex;
            sum += ex;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFullMask, sum, o);
        for (int i = lane; i < experts; i += 32) p[i] = p[i] / sum;
        if (rank_all) continue;  // ranked by the whole CTA below
        // top_k rounds of a warp arg-max over the lanes' own bests; only the lane that owned the pick
        // rescans its experts (i = lane + 32 q). A probability and its expert as one 64-bit key: the
        // bits of a float >= 0 order as unsigned integers, a (positive) NaN above +inf, and the low word
        // 0xffffffff - expert puts the lower expert first among equals -- torch.topk's order, in one
        // integer max per step. A taken entry's key is 0.
        uint64_t* keys = reinterpret_cast<uint64_t*>(s_keys) + t * experts;
        uint64_t mine = 0;
        for (int i = lane; i < experts; i += 32) {
            const float v = p[i];
            const uint64_t key = (uint64_t(__float_as_uint(v != v ? __int_as_float(0x7fc00000) : v)) << 32) |
                                 (0xffffffffu - uint32_t(i));
            keys[i] = key;
            mine = key > mine ? key : mine;
        }
        float total = 0.f;  // in rank order, the same in every lane
        for (int r = 0; r < top_k; ++r) {
            uint64_t best = mine;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const uint64_t other = __shfl_xor_sync(kFullMask, best, o);
                best = other > best ? other : best;
            }
            const int be = int(0xffffffffu - uint32_t(best));
            const float bv = __uint_as_float(uint32_t(best >> 32));
            total += bv;
            if (lane == 0) {
                s_top_v[t][r] = bv;
                s_top_e[t][r] = be;
            }
            if ((be & 31) == lane) {
                keys[be] = 0;
                mine = 0;
                for (int i = lane; i < experts; i += 32) mine = keys[i] > mine ? keys[i] : mine;
            }
        }
        __syncwarp();
        write_top(t, total);
    }
    if (rank_all) {
        __syncthreads();  // every token's probabilities
        uint64_t* keys = reinterpret_cast<uint64_t*>(s_keys);
        for (int i = threadIdx.x; i < pairs; i += kWarps * 32) {
            const int e = i % experts;
            const float v = s_p[i];
            keys[i] = (uint64_t(__float_as_uint(v != v ? __int_as_float(0x7fc00000) : v)) << 32) | (0xffffffffu - uint32_t(e));
        }
        __syncthreads();
        for (int i = threadIdx.x; i < pairs; i += kWarps * 32) {
            const int t = i / experts;
            const uint64_t key = keys[i], *mine = keys + t * experts;
            // two keys per 16-byte load, two counts: half the loads, no chain through one adder
            int r0 = 0, r1 = 0, j = 0;
            if ((t * experts) % 2 == 0) {
#pragma unroll 4
                for (; j + 2 <= experts; j += 2) {
                    const ulonglong2 v = *reinterpret_cast<const ulonglong2*>(mine + j);
                    r0 += v.x > key;
                    r1 += v.y > key;
                }
            }
            for (; j < experts; ++j) r0 += mine[j] > key;
            const int rank = r0 + r1;
            if (rank < top_k) {
                s_top_v[t][rank] = __uint_as_float(uint32_t(key >> 32));
                s_top_e[t][rank] = i - t * experts;
            }
        }
        __syncthreads();
        for (int t = warp; t < tokens; t += kWarps) {
            float total = 0.f;  // in rank order, as the rounds add it
            for (int r = 0; r < top_k; ++r) total += s_top_v[t][r];
            write_top(t, total);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) *counter = 0;  // ready for the next launch (graph replays too)
}

template <typename T>
int launch(const void* x, const void* w, void* logits, void* scores, int64_t* indices, int* counter, int tokens,
           int experts, int hidden, int top_k, int rows, int flags, void* stream) {
    if (tokens < 1 || tokens > kMaxTokens || experts < 1 || experts > kMaxExperts || hidden < 8 || hidden % 8 ||
        top_k < 1 || top_k > experts || top_k > kMaxTopK || (rows != 1 && rows != 2 && rows != 4 && rows != 8))
        return static_cast<int>(cudaErrorInvalidValue);
    const size_t smem = size_t(tokens) * experts * (sizeof(float) + sizeof(uint64_t)) + 3 * sizeof(float);
    Launch l((experts + rows - 1) / rows, kWarps * 32, smem, stream, flags & 1);
    const T* xt = static_cast<const T*>(x);
    const T* wt = static_cast<const T*>(w);
    T* lt = static_cast<T*>(logits);
    auto go = [&](auto kernel) {
        if (smem > 48 * 1024) {  // above 48 KB a kernel must opt in (on this device)
            const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
            if (e != cudaSuccess) return e;
        }
        return cudaLaunchKernelEx(&l.cfg, kernel, xt, wt, lt, scores, indices, counter, tokens, experts, hidden, top_k, flags);
    };
    const bool pdl = flags & 1;
    const cudaError_t err =
        rows == 1 ? (pdl ? go(moe_router_kernel<T, 1, true>) : go(moe_router_kernel<T, 1, false>))
        : rows == 2 ? (pdl ? go(moe_router_kernel<T, 2, true>) : go(moe_router_kernel<T, 2, false>))
        : rows == 4 ? (pdl ? go(moe_router_kernel<T, 4, true>) : go(moe_router_kernel<T, 4, false>))
                    : (pdl ? go(moe_router_kernel<T, 8, true>) : go(moe_router_kernel<T, 8, false>));
    if (err != cudaSuccess) return static_cast<int>(err);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace moe
}  // namespace lowbit

// x [tokens, hidden] and w [experts, hidden] contiguous, 16-byte aligned; logits [tokens, experts] (x's type);
// scores [tokens, top_k] (x's type, or fp32 with flags bit 2); indices int64 [tokens, top_k]; counter: one
// zeroed int; rows: expert rows per CTA (1, 2, 4 or 8). flags: bit 0 PDL, bit 1 renormalize the top-k
// probabilities, bit 2 fp32 scores.
#define LOWBIT_DEFINE_MOE_ROUTER(NAME, TYPE)                                                                      \
    extern "C" int lowbit_moe_router_##NAME(const void* x, const void* w, void* logits, void* scores,             \
                                            int64_t* indices, int* counter, int tokens, int experts, int hidden,  \
                                            int top_k, int rows, int flags, void* stream) {                       \
        return lowbit::moe::launch<TYPE>(x, w, logits, scores, indices, counter, tokens, experts, hidden, top_k, \
                                         rows, flags, stream);                                                    \
    }
LOWBIT_DEFINE_MOE_ROUTER(fp16, __half)
LOWBIT_DEFINE_MOE_ROUTER(bf16, __nv_bfloat16)
