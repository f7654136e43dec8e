// The library's CTA-local stream-K GEMV (launch_gemv, M = 1, bf16, K = PB) alone, cold: one graph of calls over
// rotating weight copies (> 200 MB, past L2), on five Llama-3-8B / 70B-sized shapes. Built against a patched copy of
// csrc/ to time a kernel variant without building the library; y of every shape goes to a file, so two builds'
// outputs can be compared bit for bit.
//
//   cp -r csrc /tmp/v && (cd /tmp/v && patch -p1 < .../stream_warps.patch)
//   nvcc -O3 -std=c++17 -arch=sm_90a -I/tmp/v/csrc -Ibenchmarks/tools -DPB=3 -DLOWBIT_STREAM_WARPS=20 \
//        -o probe benchmarks/tools/gemv_patch_probe.cu
//   ./probe y.bin            # us per call and % of 3.0 TB/s per shape
//   ./probe y.bin bulk hot   # the bulk-copy GEMV (launch_bulk_gemv) instead; hot: every call on one weight copy
//                            # (L2-resident where it fits: the kernel's rate without DRAM), with weights per SM-clock
//   ./probe y.bin bulk cold rms   # with the decode step's input norm fused (lowbit_epilogue.rms_x: another k_in row)
//
// The patches and their switches (results/2026-11-27_h100_gemv_warps_lanes_chunks/): stream_warps.patch
// (-DLOWBIT_STREAM_WARPS=N, -DLOWBIT_STAGES_ADD=S), token_lane_x.patch (-DLOWBIT_XPRED [-DLOWBIT_XPRED_ZERO]),
// l2_prefetch_ahead.patch (-DLOWBIT_L2_AHEAD=A). Results: benchmarks/journal/2026-11-27_gemv_warps_lanes_chunks.md.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "tiled/bulk_gemv.cuh"
#include "graph_timing.h"

int main(int argc, char** argv) {
    using T = __nv_bfloat16;
    const char* out = argc > 1 ? argv[1] : "y.bin";
    const bool bulk = argc > 2 && std::string(argv[2]) == "bulk", hot = argc > 3 && std::string(argv[3]) == "hot";
    const bool rms = argc > 4 && std::string(argv[4]) == "rms";
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
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
        const int ctas = bulk ? std::min(wt.n_tiles, sms) : wt.n_tiles < sms * occ ? wt.n_tiles : sms * occ;
        const int n_warps = ctas * warps;
        float* ws;
        int* counters;
        T* y;
        CHECK(cudaMalloc(&y, size_t(n) * 2));
        CHECK(cudaMalloc(&ws, size_t(n_warps) * 2 * 128 * 4));
        CHECK(cudaMalloc(&counters, size_t(wt.n_tiles) * 4));
        uint16_t* rms_x;  // the norm's input: bf16 in [1, 2)
        CHECK(cudaMalloc(&rms_x, size_t(k_in) * 2));
        fill_bytes<<<64, 256>>>(reinterpret_cast<uint32_t*>(rms_x), k_in / 2, 9u, 0x007f007fu, 0x3f803f80u);
        lowbit_epilogue epi_rms{rms_x, nullptr, nullptr, nullptr, 1e-5f, 0};
        const lowbit_epilogue* epi = rms ? &epi_rms : nullptr;
        CHECK(cudaMemset(counters, 0, size_t(wt.n_tiles) * 4));
        auto call = [&](int c) {
            if (hot) c = 0;
            int err = bulk ? lowbit::gemv::launch_bulk_gemv<PB, T>(wt.x, wt.qw[c], wt.qa[c], wt.codebook, wt.scale, y,
                                                                   nullptr, 1, n, k_in, ctas, 0, epi, st)
                           : lowbit::gemv::launch_gemv<PB, T, 1>(wt.x, wt.qw[c], wt.qa[c], wt.codebook, wt.scale, y,
                                                                 nullptr, ws, counters, 1, n, k_in, n_warps,
                                                                 lowbit::gemv::kFlagLocal, epi, st);
            if (err) { fprintf(stderr, "launch: %s\n", cudaGetErrorString(cudaError_t(err))); exit(1); }
        };
        call(0);
        CHECK(cudaStreamSynchronize(st));
        std::vector<uint16_t> hy(n);
        CHECK(cudaMemcpy(hy.data(), y, size_t(n) * 2, cudaMemcpyDeviceToHost));
        fwrite(hy.data(), 2, n, fy);
        cudaGraphExec_t ge = graph_of(st, [&] { for (int c = 0; c < wt.copies; ++c) call(c); });
        const double us = median_replay_us(ge, st, 20) / wt.copies;
        const double w_clk = double(k_in) * n / ctas / (us * 1e-6) / (clock_khz * 1e3);  // at the max clock
        printf("K=%d %s %s warps=%d %dx%d: %d CTAs x %d warps, %.2f us, %.1f%% of 3.0 TB/s, %.1f weights per SM-clock "
               "(at %d MHz)%s\n", PB, bulk ? "bulk" : "local", hot ? "hot" : "cold", warps, k_in, n, ctas, warps, us,
               100.0 * wt.megabytes() / us / 3.0, w_clk, clock_khz / 1000, rms ? ", input norm fused" : "");
        fflush(stdout);
        CHECK(cudaFree(y)); CHECK(cudaFree(ws)); CHECK(cudaFree(counters)); CHECK(cudaFree(rms_x));
        CHECK(cudaGraphExecDestroy(ge));
    }
    fclose(fy);
    return 0;
}
