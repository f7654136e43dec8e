// Probe: decode attention (one query token per sequence, GQA) on tensor cores, against an fp32 reference, timed as
// attn_decode_bench.py times the library's kernel (32 layers' caches in one CUDA graph, cold).
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc -Ibenchmarks/tools -o attn_mma benchmarks/tools/attn_mma_probe.cu
//   ./attn_mma BATCH KV_HEADS G CACHE VISIBLE CHUNK [CHUNK ...]    e.g. ./attn_mma 16 8 4 590 530 64 128 192 0
//   (each chunk size with 4 warps per CTA, 4 warps loading the next step ahead, and 8 warps)
//
// Why: at batch 16 the library's kernel (csrc/attention/decode.cu) takes 27.5 us per Llama-3-8B layer for 38.7 MB of
// K/V (44% of 3.0 TB/s); ncu puts ~40% of its instructions on the FMA pipe (scores and the weighted V sum, per head)
// and 45% of the issue slots busy (benchmarks/journal/2026-11-28_moe_crossover_tune_and_gemm_m16.md). Here a warp
// takes 16 positions per step for all G <= 8 query heads of its KV head with 24 MMAs:
//   S^T [heads x 16 positions] = Q [heads (M = 16, G used) x D] . K^T: 2 n-tiles x 8 k-steps. A lane loads 16-byte
//     pieces of its K row (position g of the tile) and of q (head g); each piece is the B / A halves of two MMAs, the
//     D columns permuted alike on both sides (a dot product does not care).
//   online softmax per head: a head's 16 scores sit in the 4 lanes of one quad (2 shuffles).
//   out^T [D x heads] += V^T [D (M) x 16 positions] . P^T [16 positions x heads (N = 8)]: P^T's B fragments are S^T's
//     accumulators as they are (packed to bf16), V^T's A fragments come from the lane's V row pieces through one
//     movmatrix.trans each: 8 MMAs for D = 128, out^T in 32 fp32 registers.
// Chunks of CHUNK positions per CTA (0: one chunk per sequence); with more than one, partial (max, sum, out) go to a
// workspace and the last CTA of a (sequence, KV head) merges them in chunk order (a fence and a counter), as the
// library's kernel does. Not handled here: the append mode, PDL, masks other than a visible prefix, fp16.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "graph_timing.h"
#include "common.cuh"  // mma16816, Pack2, movmatrix_trans

using lowbit::mma16816;
using lowbit::movmatrix_trans;
using lowbit::Pack2;
using T = __nv_bfloat16;
constexpr int D = 128;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// The dim of out^T row r (0..15) of PV MMA (cc, jp): rows g and g + 8 come from pieces 2 jp and 2 jp + 1.
__device__ __forceinline__ int out_dim(int cc, int jp, int r) {
    const int g = r & 7, j = 2 * jp + (r >> 3);
    return 32 * cc + 8 * (g >> 1) + 2 * j + (g & 1);
}

// K and V rows p0 + g and p0 + 8 + g of one step: this lane's four 16-byte pieces of each.
struct StepRows {
    uint4 k0[4], k1[4], v0[4], v1[4];
};
__device__ __forceinline__ void load_step(StepRows& r, const T* kb, const T* vb, int p0, int g, int t, int L) {
    const int r0 = min(p0 + g, L - 1), r1 = min(p0 + 8 + g, L - 1);  // rows past the cache: any finite row
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
        r.k0[cc] = *reinterpret_cast<const uint4*>(kb + int64_t(r0) * D + 32 * cc + 8 * t);
        r.k1[cc] = *reinterpret_cast<const uint4*>(kb + int64_t(r1) * D + 32 * cc + 8 * t);
        r.v0[cc] = *reinterpret_cast<const uint4*>(vb + int64_t(r0) * D + 32 * cc + 8 * t);
        r.v1[cc] = *reinterpret_cast<const uint4*>(vb + int64_t(r1) * D + 32 * cc + 8 * t);
    }
}

// grid (chunks, batch * kv_heads), W * 32 threads; PF: the next step's rows load while this one computes.
// q [b, kvh * G, D], k / v [b, kvh, L, D], out [b, kvh * G, D];
// positions [0, visible) count. ws: [b * kvh][chunk][G][D + 2] fp32; counters [b * kvh], zero between launches.
template <int G, int W, bool PF>
__global__ void __launch_bounds__(W * 32) attn_mma_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                           const T* __restrict__ v, T* __restrict__ out,
                                                           float* __restrict__ ws, int* __restrict__ counters,
                                                           int kvh, int L, int visible, int chunk, float scale) {
    static_assert(G >= 1 && G <= 8, "N = 8 heads per MMA");
    const int bh = blockIdx.y, c = blockIdx.x, chunks = gridDim.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int p_begin = c * chunk, p_end = min(visible, p_begin + chunk);
    const T* kb = k + int64_t(bh) * L * D;
    const T* vb = v + int64_t(bh) * L * D;
    uint4 qv[4];
#pragma unroll
    for (int cc = 0; cc < 4; ++cc)
        qv[cc] = g < G ? *reinterpret_cast<const uint4*>(q + (int64_t(bh) * G + g) * D + 32 * cc + 8 * t)
                       : make_uint4(0, 0, 0, 0);
    const float sl = scale * kLog2e;
    float m_run = -INFINITY, l_part = 0.f;  // head g's running max (log2 units) and this lane's share of the sum
    float acc[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    StepRows nxt;
    if (PF && p_begin + warp * 16 < p_end) load_step(nxt, kb, vb, p_begin + warp * 16, g, t, L);
    for (int p0 = p_begin + warp * 16; p0 < p_end; p0 += W * 16) {
        StepRows cur;
        if constexpr (PF) {
            cur = nxt;
            if (p0 + W * 16 < p_end) load_step(nxt, kb, vb, p0 + W * 16, g, t, L);
        } else {
            load_step(cur, kb, vb, p0, g, t, L);
        }
        const uint4 (&k0)[4] = cur.k0, (&k1)[4] = cur.k1, (&v0)[4] = cur.v0, (&v1)[4] = cur.v1;
        float s0[4] = {0.f, 0.f, 0.f, 0.f}, s1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int cc = 0; cc < 4; ++cc)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint32_t a[4] = {word(qv[cc], 2 * h), 0u, word(qv[cc], 2 * h + 1), 0u};
                mma16816<T>(s0, a, word(k0[cc], 2 * h), word(k0[cc], 2 * h + 1));
                mma16816<T>(s1, a, word(k1[cc], 2 * h), word(k1[cc], 2 * h + 1));
            }
        // head g's scores at positions p0 + 2t + e (s0[e]) and p0 + 8 + 2t + e (s1[e])
        float x[4];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            x[e] = p0 + 2 * t + e < p_end ? s0[e] * sl : -INFINITY;
            x[2 + e] = p0 + 8 + 2 * t + e < p_end ? s1[e] * sl : -INFINITY;
        }
        float mx = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run, mx), base = m_new == -INFINITY ? 0.f : m_new;
        const float alpha = exp2f(m_run - base);
        float p[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = exp2f(x[i] - base);
        l_part = l_part * alpha + (p[0] + p[1]) + (p[2] + p[3]);
        m_run = m_new;
        // out^T's columns are heads 2t, 2t + 1: their factors live in quads 2t, 2t + 1
        const float a_lo = __shfl_sync(0xffffffffu, alpha, 8 * t), a_hi = __shfl_sync(0xffffffffu, alpha, 8 * t + 4);
        const uint32_t b0 = Pack2<T>::pack(p[0], p[1]), b1 = Pack2<T>::pack(p[2], p[3]);
#pragma unroll
        for (int cc = 0; cc < 4; ++cc)
#pragma unroll
            for (int jp = 0; jp < 2; ++jp) {
                float(&o)[4] = acc[2 * cc + jp];
                o[0] *= a_lo; o[1] *= a_hi; o[2] *= a_lo; o[3] *= a_hi;
                const uint32_t a[4] = {
                    movmatrix_trans(word(v0[cc], 2 * jp)), movmatrix_trans(word(v0[cc], 2 * jp + 1)),
                    movmatrix_trans(word(v1[cc], 2 * jp)), movmatrix_trans(word(v1[cc], 2 * jp + 1))};
                mma16816<T>(o, a, b0, b1);
            }
    }
    l_part += __shfl_xor_sync(0xffffffffu, l_part, 1);
    l_part += __shfl_xor_sync(0xffffffffu, l_part, 2);
    // the warps merge through shared memory: (max, sum) per head, out^T as [D][8 heads]
    __shared__ float s_m[W][8], s_l[W][8];
    __shared__ float s_o[W][D][8];
    if (t == 0) { s_m[warp][g] = m_run; s_l[warp][g] = l_part; }
#pragma unroll
    for (int cc = 0; cc < 4; ++cc)
#pragma unroll
        for (int jp = 0; jp < 2; ++jp)
#pragma unroll
            for (int i = 0; i < 4; ++i) s_o[warp][out_dim(cc, jp, g + 8 * (i >> 1))][2 * t + (i & 1)] = acc[2 * cc + jp][i];
    __syncthreads();
    // thread (head h, dim d) pairs: the chunk's (max, sum, unnormalized out) of head h
    float* wsb = ws + int64_t(bh) * chunks * G * (D + 2);
    for (int e = threadIdx.x; e < G * D; e += W * 32) {
        const int h = e / D, d = e % D;
        float m = -INFINITY;
        for (int w = 0; w < W; ++w) m = fmaxf(m, s_m[w][h]);
        const float base = m == -INFINITY ? 0.f : m;
        float l = 0.f, o = 0.f;
        for (int w = 0; w < W; ++w) {
            const float f = exp2f(s_m[w][h] - base);
            l += s_l[w][h] * f;
            o += s_o[w][d][h] * f;
        }
        if (chunks == 1) {
            out[(int64_t(bh) * G + h) * D + d] = __float2bfloat16(o / l);
        } else {
            float* row = wsb + (int64_t(c) * G + h) * (D + 2);
            row[2 + d] = o;
            if (d == 0) { row[0] = m; row[1] = l; }
        }
    }
    if (chunks == 1) return;
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(counters + bh, 1) == chunks - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int e = threadIdx.x; e < G * D; e += W * 32) {
        const int h = e / D, d = e % D;
        float m = -INFINITY;
        for (int cc = 0; cc < chunks; ++cc) m = fmaxf(m, __ldcg(wsb + (int64_t(cc) * G + h) * (D + 2)));
        const float base = m == -INFINITY ? 0.f : m;
        float l = 0.f, o = 0.f;
        for (int cc = 0; cc < chunks; ++cc) {  // chunk order: deterministic
            const float* row = wsb + (int64_t(cc) * G + h) * (D + 2);
            const float f = exp2f(__ldcg(row) - base);
            l += __ldcg(row + 1) * f;
            o += __ldcg(row + 2 + d) * f;
        }
        out[(int64_t(bh) * G + h) * D + d] = __float2bfloat16(o / l);
    }
    if (threadIdx.x == 0) counters[bh] = 0;
}

// fp32 reference: one CTA per (sequence, query head), one thread per dim.
__global__ void attn_reference(const T* q, const T* k, const T* v, float* out, int kvh, int G, int L, int visible,
                               float scale) {
    const int bq = blockIdx.x, d = threadIdx.x;  // bq = (b * kvh + kv head) * G + head in group
    const int bh = bq / G;
    __shared__ float qs[D], red[D];
    qs[d] = __bfloat162float(q[int64_t(bq) * D + d]);
    __syncthreads();
    float m = -INFINITY;
    for (int p = 0; p < visible; ++p) {  // pass 1: the max
        red[d] = qs[d] * __bfloat162float(k[(int64_t(bh) * L + p) * D + d]);
        __syncthreads();
        for (int s = D / 2; s; s >>= 1) { if (d < s) red[d] += red[d + s]; __syncthreads(); }
        m = fmaxf(m, red[0] * scale);
        __syncthreads();
    }
    float l = 0.f, o = 0.f;
    for (int p = 0; p < visible; ++p) {
        red[d] = qs[d] * __bfloat162float(k[(int64_t(bh) * L + p) * D + d]);
        __syncthreads();
        for (int s = D / 2; s; s >>= 1) { if (d < s) red[d] += red[d + s]; __syncthreads(); }
        const float w = expf(red[0] * scale - m);
        l += w;
        o += w * __bfloat162float(v[(int64_t(bh) * L + p) * D + d]);
        __syncthreads();
    }
    out[int64_t(bq) * D + d] = o / l;
}

template <int G, int W, bool PF>
void launch(int chunk, int batch, int kvh, int L, int visible, const T* q, const T* k, const T* v, T* out, float* ws,
            int* cnt, cudaStream_t st) {
    const int c = chunk > 0 ? chunk : visible;
    dim3 grid((visible + c - 1) / c, batch * kvh);
    attn_mma_kernel<G, W, PF><<<grid, W * 32, 0, st>>>(q, k, v, out, ws, cnt, kvh, L, visible, c, 1.f / sqrtf(float(D)));
}

int main(int argc, char** argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s BATCH KV_HEADS G CACHE VISIBLE CHUNK [CHUNK ...]\n", argv[0]);
        return 2;
    }
    const int batch = atoi(argv[1]), kvh = atoi(argv[2]), G = atoi(argv[3]), L = atoi(argv[4]), visible = atoi(argv[5]);
    if (G != 4 && G != 8) { fprintf(stderr, "G must be 4 or 8\n"); return 2; }
    if (visible < 1 || visible > L) { fprintf(stderr, "VISIBLE must be in 1..CACHE\n"); return 2; }
    const int layers = 32;
    const size_t kv_elems = size_t(batch) * kvh * L * D, q_elems = size_t(batch) * kvh * G * D;
    std::vector<T*> qs(layers), ks(layers), vs(layers), outs(layers);
    for (int i = 0; i < layers; ++i) {
        CHECK(cudaMalloc(&qs[i], q_elems * 2));
        CHECK(cudaMalloc(&ks[i], kv_elems * 2));
        CHECK(cudaMalloc(&vs[i], kv_elems * 2));
        CHECK(cudaMalloc(&outs[i], q_elems * 2));
        // bf16 bits: sign, exponent 120..127 (|x| in [2^-7, 2)), any mantissa
        fill_bytes<<<512, 256>>>(reinterpret_cast<uint32_t*>(qs[i]), q_elems / 2, 11 + i, 0x83ff83ffu, 0x3c003c00u);
        fill_bytes<<<512, 256>>>(reinterpret_cast<uint32_t*>(ks[i]), kv_elems / 2, 101 + i, 0x83ff83ffu, 0x3c003c00u);
        fill_bytes<<<512, 256>>>(reinterpret_cast<uint32_t*>(vs[i]), kv_elems / 2, 1001 + i, 0x83ff83ffu, 0x3c003c00u);
    }
    float *ws, *ref;
    int* cnt;
    const int max_chunks = (visible + 63) / 64;
    CHECK(cudaMalloc(&ws, size_t(batch) * kvh * max_chunks * G * (D + 2) * 4));
    CHECK(cudaMalloc(&cnt, size_t(batch) * kvh * 4));
    CHECK(cudaMemset(cnt, 0, size_t(batch) * kvh * 4));
    CHECK(cudaMalloc(&ref, q_elems * 4));
    attn_reference<<<batch * kvh * G, D>>>(qs[0], ks[0], vs[0], ref, kvh, G, L, visible, 1.f / sqrtf(float(D)));
    CHECK(cudaDeviceSynchronize());
    std::vector<float> href(q_elems);
    CHECK(cudaMemcpy(href.data(), ref, q_elems * 4, cudaMemcpyDeviceToHost));
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    const double mb = double(kv_elems) * 2 * 2 / 1e6;
    printf("batch %d, %d KV heads x %d, cache %d, %d visible: %.1f MB of K/V per layer\n", batch, kvh, G, L, visible, mb);
    for (int a = 6; a < argc; ++a) {
        const int chunk = atoi(argv[a]);
        if (chunk < 0 || chunk % 64) { fprintf(stderr, "chunk %d: a multiple of 64 (0: one chunk)\n", chunk); return 2; }
      for (int variant = 0; variant < 3; ++variant) {  // 4 warps; 4 warps + prefetch; 8 warps
        const char* names[3] = {"4 warps", "4 warps, prefetch", "8 warps"};
        auto run = [&](int i) {
            auto go = [&](auto launcher) {
                launcher(chunk, batch, kvh, L, visible, qs[i], ks[i], vs[i], outs[i], ws, cnt, st);
            };
            if (G == 4) {
                if (variant == 0) go(launch<4, 4, false>);
                else if (variant == 1) go(launch<4, 4, true>);
                else go(launch<4, 8, false>);
            } else {
                if (variant == 0) go(launch<8, 4, false>);
                else if (variant == 1) go(launch<8, 4, true>);
                else go(launch<8, 8, false>);
            }
        };
        CHECK(cudaMemsetAsync(outs[0], 0xff, q_elems * 2, st));  // poisoned: NaN unless written
        run(0);
        CHECK(cudaGetLastError());
        CHECK(cudaStreamSynchronize(st));
        std::vector<uint16_t> hout(q_elems);
        CHECK(cudaMemcpy(hout.data(), outs[0], q_elems * 2, cudaMemcpyDeviceToHost));
        double err = 0, mag = 0;
        for (size_t i = 0; i < q_elems; ++i) {
            uint32_t bits = uint32_t(hout[i]) << 16;
            float f;
            memcpy(&f, &bits, 4);
            const double e = std::isfinite(f) ? fabs(double(f) - href[i]) : INFINITY;
            err = std::max(err, e);
            mag = std::max(mag, double(fabs(href[i])));
        }
        cudaGraphExec_t ge = graph_of(st, [&] { for (int i = 0; i < layers; ++i) run(i); });
        const double us = median_replay_us(ge, st, 20) / layers;
        printf("chunk %4d, %-18s: %7.2f us per layer, %6.2f TB/s (%4.1f%% of 3.0), max |out - fp32 ref| %.3e (max |ref| %.3f)%s\n",
               chunk, names[variant], us, mb / us, 100.0 * mb / us / 3.0, err, mag, err < 2e-2 * std::max(1.0, mag) ? "" : "  FAILED");
        CHECK(cudaGraphExecDestroy(ge));
      }
    }
    return 0;
}
