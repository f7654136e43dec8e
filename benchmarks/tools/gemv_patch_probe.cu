// The library's CTA-local stream-K GEMV (launch_gemv, M = 1, bf16, K = PB) alone, cold: one graph of calls over
// rotating weight copies (> 200 MB, past L2), on five Llama-3-8B / 70B-sized shapes. Built against a patched copy of
// csrc/ to time a kernel variant without building the library; y of every shape goes to a file, so two builds'
// outputs can be compared bit for bit.
//
//   cp -r csrc /tmp/v && (cd /tmp/v && patch -p1 < .../stream_warps.patch)     # or token_lane_x.patch
//   nvcc -O3 -std=c++17 -arch=sm_90a -I/tmp/v/csrc -Ibenchmarks/tools -DPB=3 [-DLOWBIT_STREAM_WARPS=20 -DLOWBIT_STAGES_ADD=1]
//        [-DLOWBIT_XPRED -DLOWBIT_XPRED_ZERO] -o probe benchmarks/tools/gemv_patch_probe.cu
//   ./probe y.bin            # us per call and % of 3.0 TB/s per shape
//
// benchmarks/journal/2026-11-27_gemv_warps_lanes_chunks.md used it for 8-24 warps per CTA (and a stage more) and for x loaded
// by the token lanes only (the patches are in results/2026-11-27_h100_gemv_warps_lanes_chunks/).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "tiled/gemv.cuh"
#include "graph_timing.h"

int main(int argc, char** argv) {
    const char* out = argc > 1 ? argv[1] : "y.bin";
    const int shapes[][2] = {{4096, 6144}, {4096, 4096}, {14336, 4096}, {4096, 28672}, {8192, 29568}};
    FILE* fy = fopen(out, "wb");
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int occ = lowbit::gemv::gemv_occupancy<PB, __nv_bfloat16, 1>() / lowbit::gemv::kStreamWarps;
    float* cb = linear_codebook(1 << PB);
    for (auto& s : shapes) {
        const int k_in = s[0], n = s[1];
        const int tiles = (n + 15) / 16, groups = (k_in + 255) / 256;
        const size_t units = size_t(tiles) * groups;
        const size_t qw_words = units * PB * 32 * 4, qa_words = units * 8 * 4;
        const int copies = int(std::max<size_t>(2, (200u << 20) / (qw_words * 4 + qa_words * 4) + 1));
        const int ctas = tiles < sms * occ ? tiles : sms * occ;
        const int n_warps = ctas * lowbit::gemv::kStreamWarps;
        std::vector<uint32_t*> qw(copies), qa(copies);
        for (int c = 0; c < copies; ++c) {
            CHECK(cudaMalloc(&qw[c], qw_words * 4));
            CHECK(cudaMalloc(&qa[c], qa_words * 4));
            fill_bytes<<<1024, 256>>>(qw[c], qw_words, 17u + c, ~0u, 0u);
            fill_bytes<<<1024, 256>>>(qa[c], qa_words, 91u + c, 0x3f3f3f3fu, 0x30303030u);  // E4M4 near 1
        }
        float one = 1.f, *scale, *ws;
        int* counters;
        __nv_bfloat16 *x, *y;
        CHECK(cudaMalloc(&scale, 4));
        CHECK(cudaMemcpy(scale, &one, 4, cudaMemcpyHostToDevice));
        CHECK(cudaMalloc(&x, size_t(k_in) * 2));
        fill_bytes<<<64, 256>>>(reinterpret_cast<uint32_t*>(x), k_in / 2, 5u, 0x3f7f3f7fu, 0x3c003c00u);  // bf16 ~[0.0078, 1)
        CHECK(cudaMalloc(&y, size_t(n) * 2));
        CHECK(cudaMalloc(&ws, size_t(n_warps) * 2 * 128 * 4));
        CHECK(cudaMalloc(&counters, size_t(tiles) * 4));
        CHECK(cudaMemset(counters, 0, size_t(tiles) * 4));
        auto call = [&](int c) {
            int err = lowbit::gemv::launch_gemv<PB, __nv_bfloat16, 1>(x, qw[c], qa[c], cb, scale, y, nullptr, ws,
                                                                      counters, 1, n, k_in, n_warps,
                                                                      lowbit::gemv::kFlagLocal, nullptr, st);
            if (err) { fprintf(stderr, "launch: %s\n", cudaGetErrorString(cudaError_t(err))); exit(1); }
        };
        call(0);
        CHECK(cudaStreamSynchronize(st));
        std::vector<uint16_t> hy(n);
        CHECK(cudaMemcpy(hy.data(), y, size_t(n) * 2, cudaMemcpyDeviceToHost));
        fwrite(hy.data(), 2, n, fy);
        cudaGraphExec_t ge = graph_of(st, [&] { for (int c = 0; c < copies; ++c) call(c); });
        const double us = median_replay_us(ge, st, 20) / copies;
        const double mb = (qw_words + qa_words) * 4 / 1e6;
        printf("K=%d warps=%d %dx%d: %d CTAs x %d warps, %.2f us, %.1f%% of 3.0 TB/s\n", PB, lowbit::gemv::kStreamWarps,
               k_in, n, ctas, lowbit::gemv::kStreamWarps, us, 100.0 * mb / us / 3.0);
        fflush(stdout);
        for (int c = 0; c < copies; ++c) { cudaFree(qw[c]); cudaFree(qa[c]); }
        cudaFree(scale); cudaFree(x); cudaFree(y); cudaFree(ws); cudaFree(counters);
        cudaGraphExecDestroy(ge);
    }
    fclose(fy);
    return 0;
}
