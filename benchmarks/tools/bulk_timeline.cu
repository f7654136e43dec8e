// Where a bulk-copy GEMV call's time goes, warp by warp: the kernel built with marks at its steps (entry, table built,
// past the PDL wait, stage 0's bytes here, stage 0 decoded, the last stage's bytes here, the warp's stages done, done)
// and the time each warp spent waiting on the ring's full barriers. The library's kernel has no marks: the probe is
// built against a csrc/ copy with bulk_timeline_marks.patch applied
// (benchmarks/results/2026-11-27_h100_decode_ceiling_and_tails/).
//
//   cp -r csrc /tmp/bt && (cd /tmp/bt && patch -p0 < .../bulk_timeline_marks.patch)
//   nvcc -O3 -std=c++17 -arch=sm_90a -I/tmp/bt/csrc -Ibenchmarks/tools -DPB=3 -o bulk_tl3 benchmarks/tools/bulk_timeline.cu
//   ./bulk_tl3 4096 6144
//
// One cold call is traced (its weight copy evicted by the copies before it); times are us from the earliest entry,
// as percentiles over the launch's warps, then over CTAs (a CTA's last warp).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bulk_marks.h"

__device__ unsigned long long* g_bt;
__device__ __forceinline__ void bt_put(int ev, unsigned long long v) {
    unsigned long long* b = g_bt;
    if (b == nullptr || (threadIdx.x & 31) != 0) return;
    bt_store(b, ev, v);
}
#define BT_MARK(ev) bt_put(ev, bt_now())
#define BT_VALUE(ev, v) bt_put(ev, v)
#include "tiled/bulk_gemv.cuh"
#include "graph_timing.h"

using T = __nv_bfloat16;

int main(int argc, char** argv) {
    const int k_in = argc > 1 ? std::atoi(argv[1]) : 4096, n = argc > 2 ? std::atoi(argv[2]) : 6144;
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    KbitWeights<PB> wt(k_in, n);
    const int ctas = std::min(wt.n_tiles, sms), warps = ctas * lowbit::gemv::kStreamWarps;
    T* y;
    CHECK(cudaMalloc(&y, size_t(n) * 2));
    auto call = [&](int c) {
        if (int e = lowbit::gemv::launch_bulk_gemv<PB, T>(wt.x, wt.qw[c], wt.qa[c], wt.codebook, wt.scale, y, nullptr, 1,
                                                          n, k_in, ctas, 0, nullptr, nullptr)) {
            fprintf(stderr, "launch: %s\n", cudaGetErrorString(cudaError_t(e)));
            exit(1);
        }
    };
    for (int r = 0; r < 3; ++r)
        for (int c = 0; c < wt.copies; ++c) call(c);  // untraced: g_bt is null
    unsigned long long* buf;
    const size_t slots = size_t(warps) * kMarks;
    CHECK(cudaMalloc(&buf, slots * 8));
    CHECK(cudaMemset(buf, 0, slots * 8));
    for (int c = 1; c < wt.copies; ++c) call(c);  // copy 0 is the coldest now
    CHECK(cudaMemcpyToSymbol(g_bt, &buf, sizeof(buf)));
    call(0);
    CHECK(cudaDeviceSynchronize());
    std::vector<unsigned long long> h(slots);
    CHECK(cudaMemcpy(h.data(), buf, slots * 8, cudaMemcpyDeviceToHost));
    unsigned long long t0 = ~0ull;
    for (int w = 0; w < warps; ++w) t0 = std::min(t0, h[w * kMarks]);
    const char* names[8] = {"entry", "table built", "past the PDL wait", "stage 0 here", "stage 0 decoded",
                            "last stage here", "stages done", "done"};
    auto pct = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        auto at = [&](double q) { return v[std::min(v.size() - 1, size_t(q * (v.size() - 1) + 0.5))]; };
        return std::vector<double>{at(0), at(0.1), at(0.5), at(0.9), at(1)};
    };
    printf("K=%d %dx%d bulk-copy GEMV, %d CTAs, one cold call traced; us from the first entry (p0 p10 p50 p90 p100 over "
           "warps)\n", PB, k_in, n, ctas);
    for (int ev = 0; ev < 8; ++ev) {
        std::vector<double> v;
        for (int w = 0; w < warps; ++w)
            if (h[w * kMarks + ev] != 0) v.push_back((h[w * kMarks + ev] - t0) * 1e-3);
        if (v.empty()) continue;
        auto p = pct(v);
        printf("  %-18s %6.2f %6.2f %6.2f %6.2f %6.2f\n", names[ev], p[0], p[1], p[2], p[3], p[4]);
    }
    std::vector<double> waited, stage_span, cta_done(ctas, 0.0);
    for (int w = 0; w < warps; ++w) {
        waited.push_back(h[w * kMarks + 8] * 1e-3);
        if (h[w * kMarks + 6] && h[w * kMarks + 3]) stage_span.push_back((h[w * kMarks + 6] - h[w * kMarks + 3]) * 1e-3);
        const int c = w / lowbit::gemv::kStreamWarps;
        cta_done[c] = std::max(cta_done[c], (h[w * kMarks + 7] - t0) * 1e-3);
    }
    auto p = pct(waited);
    printf("  %-18s %6.2f %6.2f %6.2f %6.2f %6.2f  (us per warp in the full-barrier waits)\n", "waited", p[0], p[1], p[2],
           p[3], p[4]);
    p = pct(stage_span);
    printf("  %-18s %6.2f %6.2f %6.2f %6.2f %6.2f  (stage 0 here -> stages done)\n", "streaming span", p[0], p[1], p[2],
           p[3], p[4]);
    p = pct(cta_done);
    printf("  %-18s %6.2f %6.2f %6.2f %6.2f %6.2f  (over CTAs)\n", "CTA done", p[0], p[1], p[2], p[3], p[4]);
    printf("  weights: %.1f MB (%.2f us at 3.0 TB/s)\n", wt.megabytes(), wt.megabytes() / 3.0);
    return 0;
}
