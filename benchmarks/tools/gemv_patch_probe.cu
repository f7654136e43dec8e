// The library's CTA-local stream-K GEMV (launch_gemv, M = 1, bf16, K = PB) alone, cold: one graph of calls over
// rotating weight copies (> 200 MB, past L2), on five Llama-3-8B / 70B-sized shapes. Built against a patched copy of
// csrc/ to time a kernel variant without building the library; y of every shape goes to a file, so two builds'
// outputs can be compared bit for bit.
//
//   cp -r csrc /tmp/v && (cd /tmp/v && patch -p1 < .../stream_warps.patch)
//   nvcc -O3 -std=c++17 -arch=sm_90a -I/tmp/v/csrc -Ibenchmarks/tools -DPB=3 -DLOWBIT_STREAM_WARPS=20 \
//        -o probe benchmarks/tools/gemv_patch_probe.cu
//   ./probe y.bin            # us per call and % of 3.0 TB/s per shape
//
// The patches and their switches (results/2026-11-27_h100_gemv_warps_lanes_chunks/): stream_warps.patch
// (-DLOWBIT_STREAM_WARPS=N, -DLOWBIT_STAGES_ADD=S), token_lane_x.patch (-DLOWBIT_XPRED [-DLOWBIT_XPRED_ZERO]),
// l2_prefetch_ahead.patch (-DLOWBIT_L2_AHEAD=A). Results: benchmarks/journal/2026-11-27_gemv_warps_lanes_chunks.md.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "tiled/gemv.cuh"
#include "graph_timing.h"

int main(int argc, char** argv) {
    using T = __nv_bfloat16;
    const char* out = argc > 1 ? argv[1] : "y.bin";
    const int shapes[][2] = {{4096, 6144}, {4096, 4096}, {14336, 4096}, {4096, 28672}, {8192, 29568}};
    FILE* fy = fopen(out, "wb");
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int warps = lowbit::gemv::kStreamWarps;
    const int occ = lowbit::gemv::gemv_occupancy<PB, T, 1>() / warps;
    for (auto& s : shapes) {
        const int k_in = s[0], n = s[1];
        KbitWeights<PB> wt(k_in, n);
        const int ctas = wt.n_tiles < sms * occ ? wt.n_tiles : sms * occ;
        const int n_warps = ctas * warps;
        float* ws;
        int* counters;
        T* y;
        CHECK(cudaMalloc(&y, size_t(n) * 2));
        CHECK(cudaMalloc(&ws, size_t(n_warps) * 2 * 128 * 4));
        CHECK(cudaMalloc(&counters, size_t(wt.n_tiles) * 4));
        CHECK(cudaMemset(counters, 0, size_t(wt.n_tiles) * 4));
        auto call = [&](int c) {
            int err = lowbit::gemv::launch_gemv<PB, T, 1>(wt.x, wt.qw[c], wt.qa[c], wt.codebook, wt.scale, y, nullptr, ws,
                                                          counters, 1, n, k_in, n_warps, lowbit::gemv::kFlagLocal,
                                                          nullptr, st);
            if (err) { fprintf(stderr, "launch: %s\n", cudaGetErrorString(cudaError_t(err))); exit(1); }
        };
        call(0);
        CHECK(cudaStreamSynchronize(st));
        std::vector<uint16_t> hy(n);
        CHECK(cudaMemcpy(hy.data(), y, size_t(n) * 2, cudaMemcpyDeviceToHost));
        fwrite(hy.data(), 2, n, fy);
        cudaGraphExec_t ge = graph_of(st, [&] { for (int c = 0; c < wt.copies; ++c) call(c); });
        const double us = median_replay_us(ge, st, 20) / wt.copies;
        printf("K=%d warps=%d %dx%d: %d CTAs x %d warps, %.2f us, %.1f%% of 3.0 TB/s\n", PB, warps, k_in, n, ctas, warps,
               us, 100.0 * wt.megabytes() / us / 3.0);
        fflush(stdout);
        CHECK(cudaFree(y)); CHECK(cudaFree(ws)); CHECK(cudaFree(counters));
        CHECK(cudaGraphExecDestroy(ge));
    }
    fclose(fy);
    return 0;
}
