// The bulk-copy GEMV with its tail handed out at run time: a probe of the lead in
// benchmarks/journal/2026-11-27_decode_ceiling_and_tails.md (section 4). One slice only (K_in <= 4096: every stage is
// one whole tile, x loaded once per warp), K = 3 / 4, M = 1, no epilogue.
//
// CTA c first decodes its static tiles [c S0, c S0 + S0); the tiles from G S0 on are claimed from a global counter.
// The lane that refills a ring slot (the stage's last reader, as in the library) issues the tile claimed for that
// slot one ring cycle earlier and claims the next, reading the claim after its decode: no warp waits on the atomic.
// The first 2 ring stages are static (S0 >= 2 ring), so under PDL no claim would come before the wait. A claim past the last tile fills the slot with "no tile", which ends every warp's loop
// there. A CTA claims at most 10 tiles beyond its static ones (their partials' storage). As in the library, every
// tile's 16 warp partials are summed in warp order at the end, so y does not depend on which CTA took which tile: it
// must equal the library's static kernel bit for bit. The counter is reset either by the launch's last CTA (an atomic
// count of finished CTAs, after the outputs) or, with one counter per launch of the graph, by the launch before.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc -Ibenchmarks/tools -DPB=4 -o bulk_dyn4 benchmarks/tools/bulk_dyn_probe.cu
//   ./bulk_dyn4 [static fraction %, repeatable]
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tiled/bulk_gemv.cuh"
#include "graph_timing.h"

using namespace lowbit;
using namespace lowbit::gemv;
using T = __nv_bfloat16;

constexpr int kDynMaxRing = 8;

template <int BITS, bool RESET_AT_END>
__global__ void __launch_bounds__(kStreamWarps * 32, 1)
    bulk_dyn(const T* __restrict__ x, const uint4* __restrict__ qweight, const uint4* __restrict__ qabsmax,
             const float* __restrict__ codebook, const float* __restrict__ scale_ptr, T* __restrict__ y, int n, int k_in,
             int n_groups, int n_tiles, int s0, int maxt, int ring, unsigned* counters, unsigned* next_counter) {
    constexpr bool QUAD = kStreamQuad<BITS>();
    constexpr size_t kCode = bulk_code_bytes<BITS>(), kChunk = bulk_chunk_bytes<BITS>();
    __shared__ __align__(8) uint64_t full[kDynMaxRing], empty[kDynMaxRing];
    __shared__ unsigned readers[kDynMaxRing];
    __shared__ int stage_tile[kDynMaxRing], claim[kDynMaxRing];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int G = gridDim.x, first = blockIdx.x * s0;
    // [maxt][16 warps][16 rows] partials, then the tiles' ids, then the ring
    float* part = reinterpret_cast<float*>(g_table + stream_table_bytes<BITS>());
    int* tile_of = reinterpret_cast<int*>(part + size_t(maxt) * kStreamWarps * 16);
    char* ring_base = g_table + ((stream_table_bytes<BITS>() + size_t(maxt) * (kStreamWarps * 16 * 4 + 4) + 127) & ~size_t(127));
    const char* qw_b = reinterpret_cast<const char*>(qweight);
    const char* qa_b = reinterpret_cast<const char*>(qabsmax);
    if (threadIdx.x == 0) ring_init(full, empty, readers, ring);
    // RESET_AT_END = 0: this launch zeroes the next launch's counter (that launch runs after this one has finished)
    // instead of its last CTA zeroing its own after an atomic count of the finished CTAs
    if (!RESET_AT_END && blockIdx.x == 0 && threadIdx.x == 0) *next_counter = 0;
    const float cb = Lut<BITS, QUAD>::fetch(codebook);
    __syncthreads();
    const int gs = n_groups;  // one slice: n_groups <= 16
    auto issue = [&](int slot, int tile) {  // tile < 0: nothing left (the phase completes with no bytes)
        stage_tile[slot] = tile;
        if (tile < 0) {
            mbar_arrive(&full[slot]);
            return;
        }
        char* st = ring_base + size_t(slot) * kChunk;
        mbar_expect_tx(&full[slot], uint32_t(gs * (kCode + 128)));
        const int64_t u = int64_t(tile) * n_groups;
        bulk_copy(st, qw_b + u * kCode, uint32_t(gs * kCode), &full[slot]);
        bulk_copy(st + kBulkSlice * kCode, qa_b + u * 128, uint32_t(gs * 128), &full[slot]);
    };
    auto static_tile = [&](int q) { return first + q < n_tiles ? first + q : -1; };
    // The first 2 ring stages are static (s0 >= 2 ring: the host's choice), so no claim comes before the PDL wait.
    if (threadIdx.x == 0)
        for (int q = 0; q < ring; ++q) issue(q, static_tile(q));
    if (threadIdx.x < kDynMaxRing) claim[threadIdx.x] = -1;
    Lut<BITS, QUAD>::template store<kStreamWarps * 32, T>(cb);
    const float scale = *scale_ptr;
    __syncthreads();
    pdl_wait();
    pdl_launch_dependents();
    LaneCtx<T> ctx = lane_ctx<BITS, QUAD, T>(x, k_in, 1, k_in);
    uint4 xv[kGroupBlocks];
    const bool active = warp < gs;
    if (active) load_x<kXCoherent>(xv, ctx, warp);
    uint32_t phase = 0;
    int slot = 0, done_stages = 0;
    for (int s = 0;; ++s) {
        mbar_wait(&full[slot], phase);
        const int tile = stage_tile[slot];
        if (tile < 0) break;  // the same slot for every warp: a uniform exit
        const char* st = ring_base + size_t(slot) * kChunk;
        GroupData<BITS> d;
        if (active) {
#pragma unroll
            for (int b = 0; b < BITS; ++b) d.w[b] = lds_u128(st + ((warp * BITS + b) * 32 + lane) * 16);
            d.a = lds_u128(st + kBulkSlice * kCode + (warp * 8 + g) * 16);
        }
        __syncwarp();
        int refill = -3;  // lane 0 of the slot's last reader: the tile for stage s + ring
        int next_claim = -3;  // and its claim for stage s + 2 ring, read after the decode
        if (lane == 0) {
            mbar_arrive(&empty[slot]);
            if (atomicAdd(&readers[slot], 1u) % kStreamWarps == kStreamWarps - 1) {
                mbar_wait(&empty[slot], phase);  // every warp's arrival; also publishes claim[slot]
                const int q = s + ring;
                refill = q < s0 ? static_tile(q) : q < maxt ? claim[slot] : -1;  // claimed one ring cycle ago
                if (refill >= n_tiles) refill = -1;
                if (q + ring >= s0 && q + ring < maxt) next_claim = int(atomicAdd(counters, 1u)) + G * s0;
                issue(slot, refill);
            }
        }
        if (threadIdx.x == 0) tile_of[s] = tile;
        if (active) {
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            decode_group<BITS, QUAD, T, false, false, 0u, false>(acc, d, xv, ctx);
            if (t == 0) {
                float* p = part + (s * kStreamWarps + warp) * 16;
                p[g] = acc[0];
                p[g + 8] = acc[2];
            }
        }
        done_stages = s + 1;
        if (lane == 0 && next_claim != -3) claim[slot] = next_claim;  // read at the slot's next refill, past its empty wait
        if (++slot == ring) {
            slot = 0;
            phase ^= 1u;
        }
    }
    __syncthreads();  // every partial stored; as the library, one thread per output sums the warps in warp order
    for (int o = threadIdx.x; o < done_stages * 16; o += kStreamWarps * 32) {
        const int k = o >> 4, r = o & 15, row = tile_of[k] * 16 + r;
        if (row >= n) continue;
        float sum = 0.f;
        const int used = gs < kStreamWarps ? gs : kStreamWarps;
        for (int w = 0; w < used; ++w) sum += part[(k * kStreamWarps + w) * 16 + r];
        y[row] = from_float<T>(fmaf(sum * kGemvOutFix<false>, scale, 0.f));
    }
    if (RESET_AT_END && threadIdx.x == 0) {  // the last CTA resets the claim counter for the next launch
        __threadfence();
        if (atomicAdd(counters + 1, 1u) == unsigned(G) - 1) {
            counters[0] = 0;
            counters[1] = 0;
            __threadfence();
        }
    }
}

int main(int argc, char** argv) {
    std::vector<int> fracs;
    for (int i = 1; i < argc; ++i) fracs.push_back(std::atoi(argv[i]));
    if (fracs.empty()) fracs = {100, 90, 75, 50};
    const int shapes[][2] = {{4096, 14336}, {4096, 28672}, {4096, 57344}};
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    unsigned* counters;  // [0, 1]: the reset-at-end counter and its count of finished CTAs; [2 + c]: copy c's launch
    CHECK(cudaMalloc(&counters, 4 * 1024));
    CHECK(cudaMemset(counters, 0, 4 * 1024));
    CHECK(cudaFuncSetAttribute(bulk_dyn<PB, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic_smem_limit()));
    CHECK(cudaFuncSetAttribute(bulk_dyn<PB, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic_smem_limit()));
    for (auto& s : shapes) {
        const int k_in = s[0], n = s[1];
        KbitWeights<PB> wt(k_in, n);
        const int ctas = std::min(wt.n_tiles, sms);
        T *y0, *y1;
        CHECK(cudaMalloc(&y0, size_t(n) * 2));
        CHECK(cudaMalloc(&y1, size_t(n) * 2));
        auto lib = [&](int c, T* y) {
            if (int e = launch_bulk_gemv<PB, T>(wt.x, wt.qw[c], wt.qa[c], wt.codebook, wt.scale, y, nullptr, 1, n, k_in,
                                                ctas, 0, nullptr, st)) {
                fprintf(stderr, "bulk: %s\n", cudaGetErrorString(cudaError_t(e)));
                exit(1);
            }
        };
        const int max_dyn = 10;  // tiles a CTA may claim beyond its static ones (bounds the partials' storage)
        CHECK(cudaMemset(y1, 0xFF, size_t(n) * 2));
        lib(0, y1);
        CHECK(cudaStreamSynchronize(st));
        std::vector<uint16_t> h0(n), h1(n);
        CHECK(cudaMemcpy(h1.data(), y1, size_t(n) * 2, cudaMemcpyDeviceToHost));
        cudaGraphExec_t ge = graph_of(st, [&] { for (int c = 0; c < wt.copies; ++c) lib(c, y1); });
        const double us_lib = median_replay_us(ge, st, 20) / wt.copies;
        CHECK(cudaGraphExecDestroy(ge));
        printf("K=%d %dx%d (%d tiles, %.1f per CTA): library (static) %.2f us (%.1f%%)\n", PB, k_in, n,
               wt.n_tiles, double(wt.n_tiles) / ctas, us_lib, 100.0 * wt.megabytes() / us_lib / 3.0);
        for (int f : fracs) {
            int s0 = 0, ring = 0, maxt = 0;
            for (int r = kDynMaxRing; r >= 2 && ring == 0; --r) {  // the deepest ring that fits beside the partials
                s0 = std::max(2 * r, int(int64_t(wt.n_tiles) * f / 100 / ctas));  // the first 2 ring stages static
                maxt = s0 + max_dyn;
                const size_t head = (stream_table_bytes<PB>() + size_t(maxt) * (kStreamWarps * 16 * 4 + 4) + 127) & ~size_t(127);
                if (int64_t(head) + int64_t(r) * int64_t(bulk_chunk_bytes<PB>()) <= dynamic_smem_limit()) ring = r;
            }
            const size_t smem = ((stream_table_bytes<PB>() + size_t(maxt) * (kStreamWarps * 16 * 4 + 4) + 127) & ~size_t(127)) +
                                size_t(ring) * bulk_chunk_bytes<PB>();
            for (int reset_at_end = 1; reset_at_end >= 0; --reset_at_end) {
            auto dyn = [&](int c, T* y) {
                unsigned* mine = reset_at_end ? counters : counters + 2 + c;
                unsigned* next = counters + 2 + (c + 1) % wt.copies;
                auto kern = reset_at_end ? bulk_dyn<PB, true> : bulk_dyn<PB, false>;
                kern<<<ctas, kStreamWarps * 32, smem, st>>>(
                    reinterpret_cast<const T*>(wt.x), reinterpret_cast<const uint4*>(wt.qw[c]),
                    reinterpret_cast<const uint4*>(wt.qa[c]), wt.codebook, wt.scale, y, n, k_in, wt.n_groups, wt.n_tiles,
                    s0, maxt, ring, mine, next);
            };
            if (!reset_at_end) CHECK(cudaMemset(counters + 2, 0, 4 * 1000));
            if (int64_t(maxt) * ctas < wt.n_tiles + int64_t(ctas) * 2) {
                printf("   static %3d%%: the partials' storage (%d tiles per CTA) cannot hold every tile; skipped\n", f, maxt);
                break;
            }
            CHECK(cudaMemset(y0, 0xFF, size_t(n) * 2));  // poisoned: NaN unless written
            dyn(0, y0);
            CHECK(cudaStreamSynchronize(st));
            CHECK(cudaGetLastError());
            CHECK(cudaMemcpy(h0.data(), y0, size_t(n) * 2, cudaMemcpyDeviceToHost));
            int diff = 0;
            for (int i = 0; i < n; ++i) diff += h0[i] != h1[i];
            if (!reset_at_end) CHECK(cudaMemset(counters + 2, 0, 4 * 1000));  // copy 0's counter, used just now
            ge = graph_of(st, [&] { for (int c = 0; c < wt.copies; ++c) dyn(c, y0); });
            const double us = median_replay_us(ge, st, 20) / wt.copies;
            CHECK(cudaGraphExecDestroy(ge));
            // after every replay (the counters reset between launches): the last copy's y against the library's
            CHECK(cudaMemcpy(h0.data(), y0, size_t(n) * 2, cudaMemcpyDeviceToHost));
            lib(wt.copies - 1, y1);
            CHECK(cudaStreamSynchronize(st));
            std::vector<uint16_t> h2(n);
            CHECK(cudaMemcpy(h2.data(), y1, size_t(n) * 2, cudaMemcpyDeviceToHost));
            int diff_replayed = 0;
            for (int i = 0; i < n; ++i) diff_replayed += h0[i] != h2[i];
            printf("   static %3d%% (S0 = %d of each CTA's tiles static, at most %d in all; ring %d; counter reset %s): %.2f us "
                   "(%.1f%%), y vs the library: %d of %d differ (after the replays: %d)\n", f, s0, maxt, ring,
                   reset_at_end ? "at the end" : "by the launch before", us, 100.0 * wt.megabytes() / us / 3.0, diff, n,
                   diff_replayed);
        }
        }
        CHECK(cudaFree(y0));
        CHECK(cudaFree(y1));
    }
    return 0;
}
