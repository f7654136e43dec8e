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
#include <cstring>
#include <vector>
#include "tiled/gemv.cuh"
#include "graph_timing.h"

using namespace lowbit::gemv;
using namespace lowbit;
using T = __nv_bfloat16;

// chunk c: tile c / P (within the tiles a kernel walks), groups [(c % P) C, min((c % P + 1) C, n_groups))
struct Chunks {
    int k_in, n_groups, C, P, n_warps;
    __device__ int len(int c) const { return min(C, n_groups - (c % P) * C); }
    __device__ int group(int c, int i) const { return (c % P) * C + i; }
};

constexpr int kNone = -1, kPastCur = -2;  // load cursor states: nothing left; past the current chunk, the next unknown

// The first S - 1 units of chunk `cur` (< limit), issued before the table is built; (lc, li) is the load cursor after.
template <int BITS, int S, typename Unit>
__device__ void chunk_prologue(GroupData<BITS> (&buf)[S], const uint4* qw_lane, const uint4* qa_lane, const Chunks& d,
                               int cur, int limit, int& lc, int& li, Unit unit) {
    lc = cur < limit ? cur : kNone;
    li = 0;
#pragma unroll
    for (int s = 0; s + 1 < S; ++s) {
        if (lc >= 0) {
            load_group<BITS>(buf[s], qw_lane, qa_lane, unit(lc, li));
            if (++li == d.len(lc)) { lc = kPastCur; li = 0; }
        }
    }
}

// The lookup table, x's copy (K <= 3) and this lane's decode context; every thread of the CTA, one barrier.
template <int BITS>
__device__ LaneCtx<T> chunk_setup(float cb, const T* __restrict__ x, int k_in) {
    constexpr bool QUAD = kStreamQuad<BITS>();
    constexpr unsigned K2REG = QUAD ? kK2RegBlocks(1, false) : 0u;
    Lut<BITS, QUAD>::template store<kStreamWarps * 32, T>(cb);
    const CbRegs cb2 = K2REG ? cb2_regs<T>(cb) : CbRegs{0, 0};
    T* xs = reinterpret_cast<T*>(g_table + stream_smem<BITS>());
    if constexpr (BITS <= 3) stage_x<kXPerm<BITS, QUAD, kXShared, false> ? K2REG : 0u>(xs, x, 1, k_in);
    __syncthreads();
    LaneCtx<T> ctx = BITS <= 3 ? lane_ctx<BITS, QUAD, T>(xs, x_row_bytes(k_in) / sizeof(T), 1, k_in)
                               : lane_ctx<BITS, QUAD, T>(x, k_in, 1, k_in);
    if constexpr (K2REG != 0) ctx.cb2 = cb2;
    return ctx;
}

// A warp's walk: chunk `cur`, then next() (the chunk after the current one, >= limit: none) until none is left; the
// loads run S - 1 units ahead across chunk ends. done(acc, c) takes chunk c's sums (token 0: lanes t = 0, acc[0]
// row g, acc[2] row g + 8).
template <int BITS, int S, typename Unit, typename Next, typename Done>
__device__ void chunk_loop(GroupData<BITS> (&buf)[S], const uint4* qw_lane, const uint4* qa_lane, const LaneCtx<T>& ctx,
                           const Chunks& d, int cur, int limit, int lc, int li, Unit unit, Next next, Done done) {
    constexpr bool QUAD = kStreamQuad<BITS>();
    constexpr unsigned K2REG = QUAD ? kK2RegBlocks(1, false) : 0u;
    constexpr int XSRC = BITS <= 3 ? kXShared : kXCoherent;
    int nxt = next();
    if (lc == kPastCur) lc = nxt < limit ? nxt : kNone;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    int ci = 0;
    bool finished = false;
    while (!finished) {
#pragma unroll
        for (int i = 0; i < S; ++i) {
            if (finished) continue;
            if (lc >= 0) {
                load_group<BITS>(buf[(i + S - 1) % S], qw_lane, qa_lane, unit(lc, li));
                if (++li == d.len(lc)) { lc = lc == cur ? (nxt < limit ? nxt : kNone) : kPastCur; li = 0; }
            }
            compute_group<BITS, QUAD, T, XSRC, false, false, K2REG>(acc, buf[i], ctx, d.group(cur, ci));
            if (++ci < d.len(cur)) continue;
            done(acc, cur);
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[r] = 0.f;
            ci = 0;
            if (nxt >= limit) {
                finished = true;
            } else {
                cur = nxt;
                nxt = next();
                if (lc == kPastCur) lc = nxt < limit ? nxt : kNone;
            }
        }
    }
}

// Global: chunks 0 .. n_chunks over all tiles; warp w starts on chunk w, then takes n_warps + (the counter), asked one
// chunk ahead (the atomic is not waited for). Partials to ws[chunk][16], the tile's last chunk (counter, fences) sums.
// grab[0]: the counter, grab[1]: warps done taking; the last resets both for the next launch.
template <int BITS>
__global__ void __launch_bounds__(kStreamWarps * 32, 1) global_chunks_kernel(const T* __restrict__ x,
        const uint4* __restrict__ qweight, const uint4* __restrict__ qabsmax, const float* __restrict__ codebook,
        const float* __restrict__ scale_ptr, T* __restrict__ y, float* __restrict__ ws, int* __restrict__ tile_cnt,
        int* __restrict__ grab, const Chunks d, int n_chunks) {
    constexpr int S = kStreamStages(BITS, 1);
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint4* qw_lane = qweight + lane;
    const uint4* qa_lane = qabsmax + g;
    const float cb = Lut<BITS, kStreamQuad<BITS>()>::fetch(codebook);
    int pend = 0;
    auto next = [&]() {
        const int c = d.n_warps + __shfl_sync(kFullMask, pend, 0);
        if (c < n_chunks && lane == 0) pend = atomicAdd(grab, 1);
        return c;
    };
    auto unit = [&](int c, int i) { return (c / d.P) * d.n_groups + d.group(c, i); };
    const int cur = blockIdx.x * kStreamWarps + (threadIdx.x >> 5);
    if (cur < n_chunks && lane == 0) pend = atomicAdd(grab, 1);
    GroupData<BITS> buf[S];
    int lc, li;
    chunk_prologue<BITS>(buf, qw_lane, qa_lane, d, cur, n_chunks, lc, li, unit);
    const float scale = *scale_ptr * kScaleFix;
    const LaneCtx<T> ctx = chunk_setup<BITS>(cb, x, d.k_in);
    if (cur < n_chunks) {
        chunk_loop<BITS>(buf, qw_lane, qa_lane, ctx, d, cur, n_chunks, lc, li, unit, next, [&](const float (&acc)[4], int c) {
            const int tile = c / d.P;
            if (t == 0) { ws[c * 16 + g] = acc[0]; ws[c * 16 + g + 8] = acc[2]; }
            __threadfence();
            int last = 0;
            if (lane == 0) last = atomicAdd(&tile_cnt[tile], 1) == d.P - 1;
            if (!__shfl_sync(kFullMask, last, 0)) return;
            __threadfence();
            if (t == 0) {
                float s0 = 0.f, s1 = 0.f;
                for (int p = 0; p < d.P; ++p) {  // chunk order
                    s0 += __ldcg(ws + (tile * d.P + p) * 16 + g);
                    s1 += __ldcg(ws + (tile * d.P + p) * 16 + g + 8);
                }
                y[tile * 16 + g] = from_float<T>(s0 * scale);
                y[tile * 16 + g + 8] = from_float<T>(s1 * scale);
            }
            if (lane == 0) tile_cnt[tile] = 0;
        });
    }
    if (lane == 0 && atomicAdd(grab + 1, 1) == d.n_warps - 1) { grab[0] = 0; grab[1] = 0; }
}

// CTA-local: CTA c owns the library's CTA-local cut of the tiles; its chunks from a shared counter (warp w starts on
// chunk w), partials in shared memory [chunk][16], each tile summed in chunk order after one barrier.
template <int BITS>
__global__ void __launch_bounds__(kStreamWarps * 32, 1) local_chunks_kernel(const T* __restrict__ x,
        const uint4* __restrict__ qweight, const uint4* __restrict__ qabsmax, const float* __restrict__ codebook,
        const float* __restrict__ scale_ptr, T* __restrict__ y, const Chunks d, StreamK tiles) {
    constexpr int S = kStreamStages(BITS, 1);
    __shared__ int counter;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    const int tb = tiles.begin(blockIdx.x), cta_tiles = tiles.begin(blockIdx.x + 1) - tb, nc = cta_tiles * d.P;
    const uint4* qw_lane = qweight + lane;
    const uint4* qa_lane = qabsmax + g;
    const float cb = Lut<BITS, kStreamQuad<BITS>()>::fetch(codebook);
    if (threadIdx.x == 0) counter = 0;  // published by chunk_setup's barrier
    int pend = 0;
    auto next = [&]() {
        const int c = kStreamWarps + __shfl_sync(kFullMask, pend, 0);
        if (c < nc && lane == 0) pend = atomicAdd(&counter, 1);
        return c;
    };
    auto unit = [&](int c, int i) { return (tb + c / d.P) * d.n_groups + d.group(c, i); };
    GroupData<BITS> buf[S];
    int lc, li;
    chunk_prologue<BITS>(buf, qw_lane, qa_lane, d, warp, nc, lc, li, unit);
    const float scale = *scale_ptr * kScaleFix;
    const LaneCtx<T> ctx = chunk_setup<BITS>(cb, x, d.k_in);
    float* parts = reinterpret_cast<float*>(g_table + stream_smem<BITS>() + (BITS <= 3 ? kStageXMaxBytes : 0));
    if (warp < nc) {
        if (lane == 0) pend = atomicAdd(&counter, 1);
        chunk_loop<BITS>(buf, qw_lane, qa_lane, ctx, d, warp, nc, lc, li, unit, next, [&](const float (&acc)[4], int c) {
            if (t == 0) { parts[c * 16 + g] = acc[0]; parts[c * 16 + g + 8] = acc[2]; }
        });
    }
    __syncthreads();
    for (int j = warp; j < cta_tiles; j += kStreamWarps) {
        if (t != 0) continue;
        float s0 = 0.f, s1 = 0.f;
        for (int p = 0; p < d.P; ++p) { s0 += parts[(j * d.P + p) * 16 + g]; s1 += parts[(j * d.P + p) * 16 + g + 8]; }
        y[(tb + j) * 16 + g] = from_float<T>(s0 * scale);
        y[(tb + j) * 16 + g + 8] = from_float<T>(s1 * scale);
    }
}

// max |a - b| over n bf16 values, the largest |a|, and the NaNs in b
static void compare(const uint16_t* a, const uint16_t* b, int n, double& maxd, double& maxa, int& nans) {
    maxd = maxa = 0;
    nans = 0;
    for (int i = 0; i < n; ++i) {
        const uint32_t ua = uint32_t(a[i]) << 16, ub = uint32_t(b[i]) << 16;
        float fa, fb;
        memcpy(&fa, &ua, 4);
        memcpy(&fb, &ub, 4);
        nans += fb != fb;
        maxd = std::max(maxd, double(fabsf(fa - fb)));
        maxa = std::max(maxa, double(fabsf(fa)));
    }
}

int main(int argc, char** argv) {
    const int C = argc > 1 ? atoi(argv[1]) : 4;
    const bool local = getenv("LOCAL_DYN") != nullptr;
    constexpr size_t kPartBytes = 48 * 1024;  // CTA-local: the chunks' partials
    const int shapes[][2] = {{4096, 6144}, {4096, 4096}, {14336, 4096}, {4096, 28672}, {8192, 29568}};
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int occ = gemv_occupancy<PB, T, 1>() / kStreamWarps;
    const size_t smem = stream_smem<PB>() + (PB <= 3 ? kStageXMaxBytes : 0) + (local ? kPartBytes : 0);
    CHECK(cudaFuncSetAttribute(global_chunks_kernel<PB>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    CHECK(cudaFuncSetAttribute(local_chunks_kernel<PB>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    for (auto& s : shapes) {
        const int k_in = s[0], n = s[1];
        KbitWeights<PB> wt(k_in, n);
        const int tiles = wt.n_tiles, groups = wt.n_groups;
        const int ctas = tiles < sms * occ ? tiles : sms * occ;
        const int n_warps = ctas * kStreamWarps;
        const Chunks d{k_in, groups, C, (groups + C - 1) / C, sms * kStreamWarps};
        const int n_chunks = tiles * d.P;
        const StreamK cut{tiles / ctas, tiles % ctas};  // the library's CTA-local cut
        if (local && size_t(cut.q + 1) * d.P * 64 > kPartBytes) {
            printf("skip %dx%d: the partials pass %zu bytes\n", k_in, n, kPartBytes);
            continue;
        }
        const T* x = reinterpret_cast<const T*>(wt.x);
        float *ws, *wsd;
        int *counters, *tcnt, *grab;
        T *y, *y2;
        CHECK(cudaMalloc(&y, size_t(n) * 2));
        CHECK(cudaMalloc(&y2, size_t(n) * 2));
        CHECK(cudaMalloc(&ws, size_t(n_warps) * 2 * 128 * 4));
        CHECK(cudaMalloc(&wsd, size_t(n_chunks) * 16 * 4));
        CHECK(cudaMalloc(&counters, size_t(tiles) * 4));
        CHECK(cudaMemset(counters, 0, size_t(tiles) * 4));
        CHECK(cudaMalloc(&tcnt, size_t(tiles) * 4));
        CHECK(cudaMemset(tcnt, 0, size_t(tiles) * 4));
        CHECK(cudaMalloc(&grab, 8));
        CHECK(cudaMemset(grab, 0, 8));
        auto lib = [&](int c) {
            int err = launch_gemv<PB, T, 1>(x, wt.qw[c], wt.qa[c], wt.codebook, wt.scale, y, nullptr, ws, counters, 1, n,
                                            k_in, n_warps, kFlagLocal, nullptr, st);
            if (err) { fprintf(stderr, "launch: %s\n", cudaGetErrorString(cudaError_t(err))); exit(1); }
        };
        auto chunked = [&](int c) {
            const uint4* qw = reinterpret_cast<const uint4*>(wt.qw[c]);
            const uint4* qa = reinterpret_cast<const uint4*>(wt.qa[c]);
            if (local)
                local_chunks_kernel<PB><<<ctas, kStreamWarps * 32, smem, st>>>(x, qw, qa, wt.codebook, wt.scale, y2, d, cut);
            else
                global_chunks_kernel<PB><<<sms, kStreamWarps * 32, smem, st>>>(x, qw, qa, wt.codebook, wt.scale, y2, wsd,
                                                                              tcnt, grab, d, n_chunks);
        };
        lib(0); chunked(0); chunked(0);  // twice: the counters reset themselves
        CHECK(cudaStreamSynchronize(st));
        CHECK(cudaGetLastError());
        std::vector<uint16_t> a(n), b(n);
        CHECK(cudaMemcpy(a.data(), y, size_t(n) * 2, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(b.data(), y2, size_t(n) * 2, cudaMemcpyDeviceToHost));
        double maxd, maxa;
        int nans;
        compare(a.data(), b.data(), n, maxd, maxa, nans);
        cudaGraphExec_t g1 = graph_of(st, [&] { for (int c = 0; c < wt.copies; ++c) lib(c); });
        cudaGraphExec_t g2 = graph_of(st, [&] { for (int c = 0; c < wt.copies; ++c) chunked(c); });
        double t1 = 1e9, t2 = 1e9;
        for (int r = 0; r < 3; ++r) {
            t1 = std::min(t1, median_replay_us(g1, st, 15) / wt.copies);
            t2 = std::min(t2, median_replay_us(g2, st, 15) / wt.copies);
        }
        const double mb = wt.megabytes();
        printf("%s K=%d C=%d %5dx%-5d P=%d chunks=%d: local %.2f us (%.1f%%), chunks %.2f us (%.1f%%) %+.1f%%; "
               "max|diff| %.3g of max %.3g, NaN %d\n", local ? "CTA-local chunks" : "global chunks", PB, C, k_in, n,
               d.P, n_chunks, t1, 100 * mb / t1 / 3.0, t2, 100 * mb / t2 / 3.0, 100 * (t2 / t1 - 1), maxd, maxa, nans);
        fflush(stdout);
        CHECK(cudaFree(y)); CHECK(cudaFree(y2)); CHECK(cudaFree(ws)); CHECK(cudaFree(wsd));
        CHECK(cudaFree(counters)); CHECK(cudaFree(tcnt)); CHECK(cudaFree(grab));
        CHECK(cudaGraphExecDestroy(g1)); CHECK(cudaGraphExecDestroy(g2));
    }
    return 0;
}
