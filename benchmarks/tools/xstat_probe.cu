// x-stationary GEMV with register-streamed weights: the bulk-copy GEMV's work order (warp w always decodes group
// 16 h + w of the CTA's tiles, slice h by slice h, x in registers; partial sums in shared memory, summed in warp order
// at the end) but each warp loads its own units into registers through an S-deep pipeline (the stream-K kernel's
// loads) instead of reading a shared-memory ring filled by bulk copies. Why: the decode is bound by the shared-memory
// data path (benchmarks/tools/decode_ceiling.cu): its table lookups move 2 bytes per weight, the ring adds the weight
// bytes twice (the copy's write, the warps' read) and the stream-K kernel's x reads 1 byte per weight; this order
// moves the lookups and the weights' one pass through L1 only. Timed cold beside the library's bulk-copy and CTA-local
// kernels (M = 1, bf16); y is compared with the bulk-copy kernel's, which sums in the same order (bit-equal expected).
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc -Ibenchmarks/tools -DPB=3 -o xstat3 benchmarks/tools/xstat_probe.cu
//   ./xstat3
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tiled/bulk_gemv.cuh"
#include "graph_timing.h"

using namespace lowbit;
using namespace lowbit::gemv;
using T = __nv_bfloat16;

template <int BITS, int S>
__global__ void __launch_bounds__(kStreamWarps * 32, 1)
    xstat_gemv(const T* __restrict__ x, const uint4* __restrict__ qweight, const uint4* __restrict__ qabsmax,
               const float* __restrict__ codebook, const float* __restrict__ scale_ptr, T* __restrict__ y, int n,
               int k_in, int n_groups, StreamK tiles) {
    constexpr bool QUAD = kStreamQuad<BITS>();
    constexpr unsigned K2REG = QUAD ? kBulkK2Reg : 0u;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int t0 = tiles.begin(blockIdx.x), T_ = tiles.begin(blockIdx.x + 1) - t0;
    const int slices = (n_groups + kBulkSlice - 1) / kBulkSlice, total = slices * T_;
    float* part = reinterpret_cast<float*>(g_table + stream_table_bytes<BITS>());  // [T_][16 warps][16 rows]
    const uint4* qw_lane = qweight + lane;
    const uint4* qa_lane = scale_lane<false>(qabsmax, g, t);
    auto unit = [&](int i) { return int64_t(t0 + i % T_) * n_groups + (i / T_) * kBulkSlice + warp; };
    auto valid = [&](int i) { return i < total && (i / T_) * kBulkSlice + warp < n_groups; };
    const float cb = Lut<BITS, QUAD>::fetch(codebook);
    GroupData<BITS> buf[S];
#pragma unroll
    for (int s = 0; s + 1 < S; ++s)
        if (valid(s)) load_group<BITS>(buf[s], qw_lane, qa_lane, unit(s));
    const float scale = *scale_ptr;
    Lut<BITS, QUAD>::template store<kStreamWarps * 32, T>(cb);
    const CbRegs cb2 = K2REG ? cb2_regs<T>(cb) : CbRegs{0, 0};
    __syncthreads();
    LaneCtx<T> ctx = lane_ctx<BITS, QUAD, T>(x, k_in, 1, k_in);
    if constexpr (K2REG != 0) ctx.cb2 = cb2;
    uint4 xv[kGroupBlocks];
    for (int i0 = 0; i0 < total; i0 += S) {
#pragma unroll
        for (int s = 0; s < S; ++s) {  // unrolled: buf[] indices are compile-time
            const int i = i0 + s;
            if (i < total) {
                if (valid(i + S - 1)) load_group<BITS>(buf[(s + S - 1) % S], qw_lane, qa_lane, unit(i + S - 1));
                const int h = i / T_, k = i % T_;
                if (h * kBulkSlice + warp < n_groups) {
                    if (k == 0) {
                        load_x<kXGlobal>(xv, ctx, h * kBulkSlice + warp);
#pragma unroll
                        for (int j = 0; j < kGroupBlocks; ++j)
                            if ((K2REG >> j) & 1) xv[j] = cb2_x(xv[j]);
                    }
                    float acc[4] = {0.f, 0.f, 0.f, 0.f};
                    decode_group<BITS, QUAD, T, false, false, K2REG, K2REG != 0>(acc, buf[s], xv, ctx);
                    if (t == 0) {
                        float* p = part + (k * kStreamWarps + warp) * 16;
                        p[g] = h == 0 ? acc[0] : p[g] + acc[0];
                        p[g + 8] = h == 0 ? acc[2] : p[g + 8] + acc[2];
                    }
                }
            }
        }
    }
    __syncthreads();
    const int warps_used = n_groups < kStreamWarps ? n_groups : kStreamWarps;
    for (int o = threadIdx.x; o < T_ * 16; o += kStreamWarps * 32) {
        const int k = o >> 4, r = o & 15, row = (t0 + k) * 16 + r;
        if (row >= n) continue;
        float sum = 0.f;
        for (int w = 0; w < warps_used; ++w) sum += part[(k * kStreamWarps + w) * 16 + r];
        y[row] = from_float<T>(fmaf(sum * kGemvOutFix<false>, scale, 0.f));
    }
}

int main(int argc, char** argv) {
    const int shapes[][2] = {{4096, 6144}, {4096, 4096}, {14336, 4096}, {4096, 28672}, {8192, 29568}};
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    constexpr int S = PB == 2 ? 3 : 2;
    auto kx = xstat_gemv<PB, S>;
    for (auto& s : shapes) {
        const int k_in = s[0], n = s[1];
        KbitWeights<PB> wt(k_in, n);
        const int ctas = std::min(wt.n_tiles, sms);
        const StreamK tiles{wt.n_tiles / ctas, wt.n_tiles % ctas};
        const size_t smem = stream_table_bytes<PB>() + size_t(tiles.q + 1) * kStreamWarps * 16 * 4;
        CHECK(cudaFuncSetAttribute(kx, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        const int occ = gemv_occupancy<PB, T, 1>() / kStreamWarps;
        const int n_warps = (wt.n_tiles < sms * occ ? wt.n_tiles : sms * occ) * kStreamWarps;
        T *y0, *y1;
        float* ws;
        int* counters;
        CHECK(cudaMalloc(&y0, size_t(n) * 2));
        CHECK(cudaMalloc(&y1, size_t(n) * 2));
        CHECK(cudaMalloc(&ws, size_t(n_warps) * 2 * 128 * 4));
        CHECK(cudaMalloc(&counters, size_t(wt.n_tiles) * 4));
        CHECK(cudaMemset(counters, 0, size_t(wt.n_tiles) * 4));
        auto xstat = [&](int c, T* y) {
            xstat_gemv<PB, S><<<ctas, kStreamWarps * 32, smem, st>>>(
                reinterpret_cast<const T*>(wt.x), reinterpret_cast<const uint4*>(wt.qw[c]),
                reinterpret_cast<const uint4*>(wt.qa[c]), wt.codebook, wt.scale, y, n, k_in, wt.n_groups, tiles);
        };
        auto bulk = [&](int c, T* y) {
            if (int e = launch_bulk_gemv<PB, T>(wt.x, wt.qw[c], wt.qa[c], wt.codebook, wt.scale, y, nullptr, 1, n, k_in,
                                                ctas, 0, nullptr, st)) {
                fprintf(stderr, "bulk: %s\n", cudaGetErrorString(cudaError_t(e)));
                exit(1);
            }
        };
        auto local = [&](int c, T* y) {
            if (int e = launch_gemv<PB, T, 1>(wt.x, wt.qw[c], wt.qa[c], wt.codebook, wt.scale, y, nullptr, ws, counters, 1,
                                              n, k_in, n_warps, kFlagLocal, nullptr, st)) {
                fprintf(stderr, "local: %s\n", cudaGetErrorString(cudaError_t(e)));
                exit(1);
            }
        };
        CHECK(cudaMemset(y0, 0xFF, size_t(n) * 2));  // poisoned: NaN unless written
        CHECK(cudaMemset(y1, 0xFF, size_t(n) * 2));
        xstat(0, y0);
        bulk(0, y1);
        CHECK(cudaStreamSynchronize(st));
        std::vector<uint16_t> h0(n), h1(n);
        CHECK(cudaMemcpy(h0.data(), y0, size_t(n) * 2, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(h1.data(), y1, size_t(n) * 2, cudaMemcpyDeviceToHost));
        int diff = 0;
        for (int i = 0; i < n; ++i) diff += h0[i] != h1[i];
        double us[3];
        {
            cudaGraphExec_t ge = graph_of(st, [&] { for (int c = 0; c < wt.copies; ++c) xstat(c, y0); });
            us[0] = median_replay_us(ge, st, 20) / wt.copies;
            CHECK(cudaGraphExecDestroy(ge));
            ge = graph_of(st, [&] { for (int c = 0; c < wt.copies; ++c) bulk(c, y1); });
            us[1] = median_replay_us(ge, st, 20) / wt.copies;
            CHECK(cudaGraphExecDestroy(ge));
            ge = graph_of(st, [&] { for (int c = 0; c < wt.copies; ++c) local(c, y1); });
            us[2] = median_replay_us(ge, st, 20) / wt.copies;
            CHECK(cudaGraphExecDestroy(ge));
        }
        printf("K=%d %5dx%-5d x-stationary (registers) %6.2f us (%5.1f%%) | bulk %6.2f (%5.1f%%) | CTA-local %6.2f (%5.1f%%)"
               " | y vs bulk: %d of %d differ\n", PB, k_in, n, us[0], 100.0 * wt.megabytes() / us[0] / 3.0, us[1],
               100.0 * wt.megabytes() / us[1] / 3.0, us[2], 100.0 * wt.megabytes() / us[2] / 3.0, diff, n);
        fflush(stdout);
        CHECK(cudaFree(y0)); CHECK(cudaFree(y1)); CHECK(cudaFree(ws)); CHECK(cudaFree(counters));
    }
    return 0;
}
