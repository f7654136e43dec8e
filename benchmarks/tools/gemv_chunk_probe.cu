// The kbit GEMV (M = 1, bf16, K = PB) with its units handed out in chunks of C (one tile's groups [p C, p C + C)),
// beside the library's CTA-local stream-K kernel on the same data (cold, rotating copies, graphs; y compared):
//   global (default): every chunk from one global counter (warp w starts on chunk w, then takes one chunk ahead),
//     its partial in a global slot, the tile's last chunk (atomic counter, fences) sums the slots in chunk order;
//   LOCAL_DYN=1: the library's CTA-local cut of the tiles; inside a CTA, chunks from a shared-memory counter, their
//     partials in shared memory, each tile summed in chunk order after one barrier.
// Either way the sums do not depend on which warp took which chunk.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc -Ibenchmarks/tools -DPB=3 -o chunk3 benchmarks/tools/gemv_chunk_probe.cu
//   ./chunk3 4                  # C = 4, global chunks
//   LOCAL_DYN=1 ./chunk3 4      # C = 4, chunks inside each CTA
//
// Results: benchmarks/journal/2026-11-27_gemv_warps_lanes_chunks.md.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "tiled/gemv.cuh"
#include "graph_timing.h"

using namespace lowbit::gemv;
using namespace lowbit;
using T = __nv_bfloat16;

struct Dyn {
    int n, k_in, n_tiles, n_groups, C, P, n_chunks, n_warps;
};

template <int BITS>
__global__ void __launch_bounds__(kStreamWarps * 32, 1) dyn_kernel(const T* __restrict__ x, const uint4* __restrict__ qweight,
        const uint4* __restrict__ qabsmax, const float* __restrict__ codebook, const float* __restrict__ scale_ptr,
        T* __restrict__ y, float* __restrict__ ws, int* __restrict__ tile_cnt, int* __restrict__ grab, const Dyn d) {
    constexpr bool QUAD = kStreamQuad<BITS>();
    constexpr int S = kStreamStages(BITS, 1);
    constexpr unsigned K2REG = QUAD ? kK2RegBlocks(1, false) : 0u;
    constexpr bool XS = BITS <= 3;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint4* qw_lane = qweight + lane;
    const uint4* qa_lane = qabsmax + g;
    const float cb = Lut<BITS, QUAD>::fetch(codebook);
    // chunk w first (static), then chunks n_warps + k for k from the counter, taken one chunk ahead: the atomic
    // is issued a chunk before its value is needed. A warp stops after the first taken chunk past the end.
    const int w = blockIdx.x * kStreamWarps + (threadIdx.x >> 5);
    int pend = 0;
    auto issue = [&]() { if (lane == 0) pend = atomicAdd(grab, 1); };
    auto resolve = [&]() { return d.n_warps + __shfl_sync(kFullMask, pend, 0); };
    int cur = w;
    if (cur < d.n_chunks) issue();
    auto first_unit = [&](int c) { return (c / d.P) * d.n_groups + (c % d.P) * d.C; };
    auto len = [&](int c) { const int g0 = (c % d.P) * d.C; return min(d.C, d.n_groups - g0); };
    GroupData<BITS> buf[S];
    int lc = cur < d.n_chunks ? cur : -1, li = 0;  // load cursor: chunk lc (-1: none), index li
    int nxt = d.n_chunks;                          // resolved after the table build
#pragma unroll
    for (int s = 0; s + 1 < S; ++s) {
        if (lc >= 0) {
            load_group<BITS>(buf[s], qw_lane, qa_lane, first_unit(lc) + li);
            if (++li == len(lc)) { lc = -2; li = 0; }  // -2: past cur, nxt not known yet
        }
    }
    const float scale = *scale_ptr;
    Lut<BITS, QUAD>::template store<kStreamWarps * 32, T>(cb);
    const Cb2Regs cb2 = K2REG ? cb2_regs<T>(cb) : Cb2Regs{0, 0};
    T* xs = reinterpret_cast<T*>(g_table + stream_smem<BITS>());
    if constexpr (XS) stage_x<kXPerm<BITS, QUAD, kXShared, false> ? K2REG : 0u>(xs, x, 1, d.k_in);
    __syncthreads();
    if (cur >= d.n_chunks) {
        if (lane == 0 && atomicAdd(grab + 1, 1) == d.n_warps - 1) { grab[0] = 0; grab[1] = 0; }
        return;
    }
    nxt = resolve();
    if (nxt < d.n_chunks) issue();
    if (lc == -2) lc = nxt < d.n_chunks ? nxt : -1;
    LaneCtx<T> ctx = XS ? lane_ctx<BITS, QUAD, T>(xs, x_row_bytes(d.k_in) / sizeof(T), 1, d.k_in)
                        : lane_ctx<BITS, QUAD, T>(x, d.k_in, 1, d.k_in);
    if constexpr (K2REG != 0) ctx.cb2 = cb2;
    constexpr int XSRC = XS ? kXShared : kXCoherent;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    int ci = 0;
    bool done = false;
    while (!done) {
#pragma unroll
        for (int i = 0; i < S; ++i) {
            if (!done) {
                if (lc >= 0) {
                    load_group<BITS>(buf[(i + S - 1) % S], qw_lane, qa_lane, first_unit(lc) + li);
                    if (++li == len(lc)) { lc = lc == cur ? (nxt < d.n_chunks ? nxt : -1) : -2; li = 0; }
                }
                const int grp = (cur % d.P) * d.C + ci;
                compute_group<BITS, QUAD, T, XSRC, false, false, K2REG>(acc, buf[i], ctx, grp);
                if (++ci == len(cur)) {
                    const int tile = cur / d.P;
                    if (d.P == 1) {
                        if (t == 0) {
                            y[tile * 16 + g] = from_float<T>(acc[0] * kScaleFix * scale);
                            y[tile * 16 + g + 8] = from_float<T>(acc[2] * kScaleFix * scale);
                        }
                    } else {
                        if (t == 0) { ws[cur * 16 + g] = acc[0]; ws[cur * 16 + g + 8] = acc[2]; }
                        __threadfence();
                        int last = 0;
                        if (lane == 0) last = atomicAdd(&tile_cnt[tile], 1) == d.P - 1;
                        last = __shfl_sync(kFullMask, last, 0);
                        if (last) {
                            __threadfence();
                            if (t == 0) {
                                float s0 = 0.f, s1 = 0.f;
                                for (int p = 0; p < d.P; ++p) {  // chunk order
                                    s0 += __ldcg(ws + (tile * d.P + p) * 16 + g);
                                    s1 += __ldcg(ws + (tile * d.P + p) * 16 + g + 8);
                                }
                                y[tile * 16 + g] = from_float<T>(s0 * kScaleFix * scale);
                                y[tile * 16 + g + 8] = from_float<T>(s1 * kScaleFix * scale);
                            }
                            if (lane == 0) tile_cnt[tile] = 0;
                        }
                    }
#pragma unroll
                    for (int r = 0; r < 4; ++r) acc[r] = 0.f;
                    ci = 0;
                    if (nxt >= d.n_chunks) {
                        done = true;
                    } else {
                        cur = nxt;
                        nxt = resolve();
                        if (nxt < d.n_chunks) issue();
                        if (lc == -2) lc = nxt < d.n_chunks ? nxt : -1;
                    }
                }
            }
        }
    }
    if (lane == 0 && atomicAdd(grab + 1, 1) == d.n_warps - 1) { grab[0] = 0; grab[1] = 0; }
}


// The same within each CTA only: CTA c owns whole tiles (the library's CTA-local cut), its chunks are handed out by a
// shared-memory counter, their partials wait in shared memory, and after one barrier each tile is summed in chunk
// order. No global atomics or fences.
template <int BITS>
__global__ void __launch_bounds__(kStreamWarps * 32, 1) local_dyn_kernel(const T* __restrict__ x,
        const uint4* __restrict__ qweight, const uint4* __restrict__ qabsmax, const float* __restrict__ codebook,
        const float* __restrict__ scale_ptr, T* __restrict__ y, const Dyn d, StreamK tiles) {
    constexpr bool QUAD = kStreamQuad<BITS>();
    constexpr int S = kStreamStages(BITS, 1);
    constexpr unsigned K2REG = QUAD ? kK2RegBlocks(1, false) : 0u;
    constexpr bool XS = BITS <= 3;
    __shared__ int s_grab;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    const int tb = tiles.begin(blockIdx.x), cta_tiles = tiles.begin(blockIdx.x + 1) - tb;
    const int nc = cta_tiles * d.P;
    const uint4* qw_lane = qweight + lane;
    const uint4* qa_lane = qabsmax + g;
    const float cb = Lut<BITS, QUAD>::fetch(codebook);
    if (threadIdx.x == 0) s_grab = 0;
    int pend = 0;
    auto issue = [&]() { if (lane == 0) pend = atomicAdd(&s_grab, 1); };
    auto resolve = [&]() { return kStreamWarps + __shfl_sync(kFullMask, pend, 0); };
    auto first_unit = [&](int c) { return (tb + c / d.P) * d.n_groups + (c % d.P) * d.C; };
    auto len = [&](int c) { const int g0 = (c % d.P) * d.C; return min(d.C, d.n_groups - g0); };
    int cur = warp;
    GroupData<BITS> buf[S];
    int lc = cur < nc ? cur : -1, li = 0;
    int nxt = nc;
#pragma unroll
    for (int s = 0; s + 1 < S; ++s) {
        if (lc >= 0) {
            load_group<BITS>(buf[s], qw_lane, qa_lane, first_unit(lc) + li);
            if (++li == len(lc)) { lc = -2; li = 0; }
        }
    }
    const float scale = *scale_ptr;
    Lut<BITS, QUAD>::template store<kStreamWarps * 32, T>(cb);
    const Cb2Regs cb2 = K2REG ? cb2_regs<T>(cb) : Cb2Regs{0, 0};
    T* xs = reinterpret_cast<T*>(g_table + stream_smem<BITS>());
    float* parts = reinterpret_cast<float*>(g_table + stream_smem<BITS>() + (XS ? kStageXMaxBytes : 0));
    if constexpr (XS) stage_x<kXPerm<BITS, QUAD, kXShared, false> ? K2REG : 0u>(xs, x, 1, d.k_in);
    __syncthreads();
    if (cur < nc) {
        issue();
        LaneCtx<T> ctx = XS ? lane_ctx<BITS, QUAD, T>(xs, x_row_bytes(d.k_in) / sizeof(T), 1, d.k_in)
                            : lane_ctx<BITS, QUAD, T>(x, d.k_in, 1, d.k_in);
        if constexpr (K2REG != 0) ctx.cb2 = cb2;
        constexpr int XSRC = XS ? kXShared : kXCoherent;
        nxt = resolve();
        if (nxt < nc) issue();
        if (lc == -2) lc = nxt < nc ? nxt : -1;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        int ci = 0;
        bool done = false;
        while (!done) {
#pragma unroll
            for (int i = 0; i < S; ++i) {
                if (!done) {
                    if (lc >= 0) {
                        load_group<BITS>(buf[(i + S - 1) % S], qw_lane, qa_lane, first_unit(lc) + li);
                        if (++li == len(lc)) { lc = lc == cur ? (nxt < nc ? nxt : -1) : -2; li = 0; }
                    }
                    compute_group<BITS, QUAD, T, XSRC, false, false, K2REG>(acc, buf[i], ctx, (cur % d.P) * d.C + ci);
                    if (++ci == len(cur)) {
                        if (t == 0) { parts[cur * 16 + g] = acc[0]; parts[cur * 16 + g + 8] = acc[2]; }
#pragma unroll
                        for (int r = 0; r < 4; ++r) acc[r] = 0.f;
                        ci = 0;
                        if (nxt >= nc) {
                            done = true;
                        } else {
                            cur = nxt;
                            nxt = resolve();
                            if (nxt < nc) issue();
                            if (lc == -2) lc = nxt < nc ? nxt : -1;
                        }
                    }
                }
            }
        }
    }
    __syncthreads();
    for (int j = warp; j < cta_tiles; j += kStreamWarps) {
        if (t == 0) {
            float s0 = 0.f, s1 = 0.f;
            for (int p = 0; p < d.P; ++p) { s0 += parts[(j * d.P + p) * 16 + g]; s1 += parts[(j * d.P + p) * 16 + g + 8]; }
            y[(tb + j) * 16 + g] = from_float<T>(s0 * kScaleFix * scale);
            y[(tb + j) * 16 + g + 8] = from_float<T>(s1 * kScaleFix * scale);
        }
    }
}

int main(int argc, char** argv) {
    const int C = argc > 1 ? atoi(argv[1]) : 4;
    const int shapes[][2] = {{4096, 6144}, {4096, 4096}, {14336, 4096}, {4096, 28672}, {8192, 29568}};
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int occ = gemv_occupancy<PB, T, 1>() / kStreamWarps;
    float* cb = linear_codebook(1 << PB);
    const bool local_dyn = getenv("LOCAL_DYN") != nullptr;
    const size_t smem = stream_smem<PB>() + (PB <= 3 ? kStageXMaxBytes : 0) + (local_dyn ? 48 * 1024 : 0);
    CHECK(cudaFuncSetAttribute(dyn_kernel<PB>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    CHECK(cudaFuncSetAttribute(local_dyn_kernel<PB>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    for (auto& s : shapes) {
        const int k_in = s[0], n = s[1];
        const int tiles = (n + 15) / 16, groups = (k_in + 255) / 256;
        const size_t units = size_t(tiles) * groups;
        const size_t qw_words = units * PB * 32 * 4, qa_words = units * 8 * 4;
        const int copies = int(std::max<size_t>(2, (200u << 20) / (qw_words * 4 + qa_words * 4) + 1));
        const int ctas = tiles < sms * occ ? tiles : sms * occ;
        const int n_warps = ctas * kStreamWarps;
        Dyn d{n, k_in, tiles, groups, C, (groups + C - 1) / C, 0, sms * kStreamWarps};
        d.n_chunks = tiles * d.P;
        std::vector<uint32_t*> qw(copies), qa(copies);
        for (int c = 0; c < copies; ++c) {
            CHECK(cudaMalloc(&qw[c], qw_words * 4));
            CHECK(cudaMalloc(&qa[c], qa_words * 4));
            fill_bytes<<<1024, 256>>>(qw[c], qw_words, 17u + c, ~0u, 0u);
            fill_bytes<<<1024, 256>>>(qa[c], qa_words, 91u + c, 0x3f3f3f3fu, 0x30303030u);
        }
        float one = 1.f, *scale, *ws, *wsd;
        int *counters, *tcnt, *grab;
        T *x, *y, *y2;
        CHECK(cudaMalloc(&scale, 4));
        CHECK(cudaMemcpy(scale, &one, 4, cudaMemcpyHostToDevice));
        CHECK(cudaMalloc(&x, size_t(k_in) * 2));
        fill_bytes<<<64, 256>>>(reinterpret_cast<uint32_t*>(x), k_in / 2, 5u, 0x3f7f3f7fu, 0x3c003c00u);
        CHECK(cudaMalloc(&y, size_t(n) * 2));
        CHECK(cudaMalloc(&y2, size_t(n) * 2));
        CHECK(cudaMalloc(&ws, size_t(n_warps) * 2 * 128 * 4));
        CHECK(cudaMalloc(&wsd, size_t(d.n_chunks) * 16 * 4));
        CHECK(cudaMalloc(&counters, size_t(tiles) * 4));
        CHECK(cudaMemset(counters, 0, size_t(tiles) * 4));
        CHECK(cudaMalloc(&tcnt, size_t(tiles) * 4));
        CHECK(cudaMemset(tcnt, 0, size_t(tiles) * 4));
        CHECK(cudaMalloc(&grab, 8));
        CHECK(cudaMemset(grab, 0, 8));
        auto lib = [&](int c) {
            int err = launch_gemv<PB, T, 1>(x, qw[c], qa[c], cb, scale, y, nullptr, ws, counters, 1, n, k_in, n_warps,
                                            kFlagLocal, nullptr, st);
            if (err) { fprintf(stderr, "launch: %s\n", cudaGetErrorString(cudaError_t(err))); exit(1); }
        };
        const StreamK cut{tiles / ctas, tiles % ctas};
        if (local_dyn && size_t(cut.q + 1) * d.P * 64 > 48 * 1024) { printf("skip %dx%d: partials\n", k_in, n); continue; }
        auto dyn = [&](int c) {
            if (local_dyn) {
                local_dyn_kernel<PB><<<ctas, kStreamWarps * 32, smem, st>>>(x, reinterpret_cast<const uint4*>(qw[c]),
                    reinterpret_cast<const uint4*>(qa[c]), cb, scale, y2, d, cut);
                return;
            }
            dyn_kernel<PB><<<sms, kStreamWarps * 32, smem, st>>>(x, reinterpret_cast<const uint4*>(qw[c]),
                reinterpret_cast<const uint4*>(qa[c]), cb, scale, y2, wsd, tcnt, grab, d);
        };
        lib(0); dyn(0); dyn(0);
        CHECK(cudaStreamSynchronize(st));
        CHECK(cudaGetLastError());
        std::vector<uint16_t> a(n), b(n);
        CHECK(cudaMemcpy(a.data(), y, size_t(n) * 2, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(b.data(), y2, size_t(n) * 2, cudaMemcpyDeviceToHost));
        double maxd = 0, maxa = 0;
        int bad = 0;
        for (int i = 0; i < n; ++i) {
            uint32_t ua = uint32_t(a[i]) << 16, ub = uint32_t(b[i]) << 16;
            float fa, fb;
            memcpy(&fa, &ua, 4); memcpy(&fb, &ub, 4);
            if (!(fb == fb)) ++bad;
            maxd = std::max(maxd, double(fabsf(fa - fb)));
            maxa = std::max(maxa, double(fabsf(fa)));
        }
        cudaGraphExec_t g1 = graph_of(st, [&] { for (int c = 0; c < copies; ++c) lib(c); });
        cudaGraphExec_t g2 = graph_of(st, [&] { for (int c = 0; c < copies; ++c) dyn(c); });
        double t1 = 1e9, t2 = 1e9;
        for (int r = 0; r < 3; ++r) {
            t1 = std::min(t1, median_replay_us(g1, st, 15) / copies);
            t2 = std::min(t2, median_replay_us(g2, st, 15) / copies);
        }
        const double mb = (qw_words + qa_words) * 4 / 1e6;
        printf("%s K=%d C=%d %5dx%-5d P=%d chunks=%d: local %.2f us (%.1f%%), dynamic %.2f us (%.1f%%) %+.1f%%; max|diff| %.3g of max %.3g, NaN %d\n",
               local_dyn ? "CTA-local chunks" : "global chunks", PB, C, k_in, n, d.P, d.n_chunks, t1, 100 * mb / t1 / 3.0, t2, 100 * mb / t2 / 3.0, 100 * (t2 / t1 - 1),
               maxd, maxa, bad);
        fflush(stdout);
        for (int c = 0; c < copies; ++c) { cudaFree(qw[c]); cudaFree(qa[c]); }
        cudaFree(scale); cudaFree(x); cudaFree(y); cudaFree(y2); cudaFree(ws); cudaFree(wsd); cudaFree(counters);
        cudaFree(tcnt); cudaFree(grab);
        cudaGraphExecDestroy(g1); cudaGraphExecDestroy(g2);
    }
    return 0;
}
