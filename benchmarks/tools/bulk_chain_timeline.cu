// A decode layer's three chained bulk-copy GEMVs, warp by warp, as the step runs them under PDL: o_proj (residual
// add and the next norm's weight in its epilogue) -> gate|up (SwiGLU epilogue) -> down_proj (residual, norm weight).
// Where bulk_timeline.cu traces one call alone, this shows what a call does beside its neighbours: when its CTAs
// get an SM (the kernel before must leave it: a bulk CTA takes the whole register file), when its first bytes land
// against the kernel before's end, and how its end overlaps the next call's start.
//
// Built, as bulk_timeline.cu, against a csrc/ copy with bulk_timeline_marks.patch applied
// (benchmarks/results/2026-11-27_h100_decode_ceiling_and_tails/):
//   cp -r csrc /tmp/bt && (cd /tmp/bt && patch -p0 < .../bulk_timeline_marks.patch)
//   nvcc -O3 -std=c++17 -arch=sm_90a -I/tmp/bt/csrc -Ibenchmarks/tools -DPB=4 -o bulk_chain4 benchmarks/tools/bulk_chain_timeline.cu
//   ./bulk_chain4 [hidden 4096] [intermediate 14336]
//
// Every layer's weights come in rotating copies (~200 MB each kind, past L2); one chain, on the coldest copies, is
// traced. Times are us from the first o_proj entry: percentiles over warps (p0 p10 p50 p90 p100), then over CTAs.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bulk_marks.h"

// The traced kernels, told apart by their (K_in, N): each writes its marks into its own buffer.
__device__ int g_key_k[3], g_key_n[3];
__device__ unsigned long long* g_buf[3];
__device__ __forceinline__ void bt_put(int k_in, int n, int ev, unsigned long long v) {
    if ((threadIdx.x & 31) != 0) return;
    unsigned long long* b = nullptr;
    for (int i = 0; i < 3; ++i)
        if (g_key_k[i] == k_in && g_key_n[i] == n) b = g_buf[i];
    if (b != nullptr) bt_store(b, ev, v);
}
// expanded inside the kernel, where its k_in and n are in scope
#define BT_MARK(ev) bt_put(k_in, n, ev, bt_now())
#define BT_VALUE(ev, v) bt_put(k_in, n, ev, v)
#include "tiled/bulk_gemv.cuh"
#include "graph_timing.h"

using T = __nv_bfloat16;

int main(int argc, char** argv) {
    const int hidden = argc > 1 ? std::atoi(argv[1]) : 4096, inter = argc > 2 ? std::atoi(argv[2]) : 14336;
    if (hidden == inter || hidden % 256 || inter % 256) {  // the kernels are told apart by (K_in, N)
        fprintf(stderr, "hidden and intermediate must differ and be multiples of 256\n");
        return 1;
    }
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    // o_proj: hidden -> hidden; gate|up: hidden -> 2 inter (SwiGLU: y is [1, inter]); down: inter -> hidden
    KbitWeights<PB> o(hidden, hidden), gu(hidden, 2 * inter), dn(inter, hidden);
    const int dims[3][2] = {{hidden, hidden}, {hidden, 2 * inter}, {inter, hidden}};
    const char* names3[3] = {"o_proj", "gate|up", "down"};
    const int ctas[3] = {std::min(o.n_tiles, sms), std::min(gu.n_tiles / 2, sms), std::min(dn.n_tiles, sms)};
    T *h_o, *yw_o, *act, *h_dn, *yw_dn, *nw;
    for (T** p : {&h_o, &yw_o, &h_dn, &yw_dn, &nw}) CHECK(cudaMalloc(p, size_t(hidden) * 2));
    CHECK(cudaMalloc(&act, size_t(inter) * 2));
    CHECK(cudaMemset(nw, 0x3c, size_t(hidden) * 2));
    CHECK(cudaMemset(h_o, 0, size_t(hidden) * 2));
    CHECK(cudaMemset(h_dn, 0, size_t(hidden) * 2));
    // o_proj: x (o.x) -> y = h_o (its own residual: the stream), yw_o = norm(h_o) * w; gate|up: x = yw_o -> act;
    // down: x = act -> h_dn (residual h_o), yw_dn
    const lowbit_epilogue e_o{nullptr, h_o, nw, yw_o, 1e-5f, 0}, e_gu{nullptr, nullptr, nullptr, nullptr, 0.f, 1},
        e_dn{nullptr, h_o, nw, yw_dn, 1e-5f, 0};
    auto check = [](int e) {
        if (e) {
            fprintf(stderr, "launch: %s\n", cudaGetErrorString(cudaError_t(e)));
            exit(1);
        }
    };
    auto chain = [&](int c) {
        using lowbit::gemv::launch_bulk_gemv;
        check(launch_bulk_gemv<PB, T>(o.x, o.qw[c % o.copies], o.qa[c % o.copies], o.codebook, o.scale, h_o, nullptr, 1,
                                      hidden, hidden, ctas[0], lowbit::gemv::kFlagPdl, &e_o, st));
        check(launch_bulk_gemv<PB, T>(yw_o, gu.qw[c % gu.copies], gu.qa[c % gu.copies], gu.codebook, gu.scale, act,
                                      nullptr, 1, 2 * inter, hidden, ctas[1], lowbit::gemv::kFlagPdl, &e_gu, st));
        check(launch_bulk_gemv<PB, T>(act, dn.qw[c % dn.copies], dn.qa[c % dn.copies], dn.codebook, dn.scale, h_dn,
                                      nullptr, 1, hidden, inter, ctas[2], lowbit::gemv::kFlagPdl, &e_dn, st));
    };
    const int copies = std::max({o.copies, gu.copies, dn.copies});
    for (int r = 0; r < 2; ++r)
        for (int c = 0; c < copies; ++c) chain(c);  // untraced: no keys set
    // the whole chain, timed over graph replays of every copy (cold)
    cudaGraphExec_t ge = graph_of(st, [&] { for (int c = 0; c < copies; ++c) chain(c); });
    const double us_chain = median_replay_us(ge, st, 10) / copies;
    CHECK(cudaGraphExecDestroy(ge));
    std::vector<unsigned long long*> buf(3);
    std::vector<size_t> slots(3);
    for (int i = 0; i < 3; ++i) {
        slots[i] = size_t(ctas[i]) * lowbit::gemv::kStreamWarps * kMarks;
        CHECK(cudaMalloc(&buf[i], slots[i] * 8));
        CHECK(cudaMemset(buf[i], 0, slots[i] * 8));
    }
    for (int c = 1; c < copies; ++c) chain(c);  // copy 0 is the coldest now
    CHECK(cudaStreamSynchronize(st));
    int kk[3], nn[3];
    for (int i = 0; i < 3; ++i) kk[i] = dims[i][0], nn[i] = dims[i][1];
    CHECK(cudaMemcpyToSymbol(g_key_k, kk, sizeof(kk)));
    CHECK(cudaMemcpyToSymbol(g_key_n, nn, sizeof(nn)));
    CHECK(cudaMemcpyToSymbol(g_buf, buf.data(), 3 * sizeof(unsigned long long*)));
    chain(0);
    CHECK(cudaStreamSynchronize(st));
    CHECK(cudaGetLastError());
    std::vector<std::vector<unsigned long long>> h(3);
    unsigned long long t0 = ~0ull;
    for (int i = 0; i < 3; ++i) {
        h[i].resize(slots[i]);
        CHECK(cudaMemcpy(h[i].data(), buf[i], slots[i] * 8, cudaMemcpyDeviceToHost));
    }
    for (size_t w = 0; w * kMarks < slots[0]; ++w) t0 = std::min(t0, h[0][w * kMarks]);
    auto pct = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        auto at = [&](double q) { return v[std::min(v.size() - 1, size_t(q * (v.size() - 1) + 0.5))]; };
        return std::vector<double>{at(0), at(0.1), at(0.5), at(0.9), at(1)};
    };
    const char* names[8] = {"entry", "table built", "past the PDL wait", "stage 0 here", "stage 0 decoded",
                            "last stage here", "stages done", "done"};
    printf("K=%d layer chain %d / %d under PDL, one cold chain traced; us from the first o_proj entry (p0 p10 p50 p90 "
           "p100 over warps); graph of every copy's chain: %.2f us per chain\n", PB, hidden, inter, us_chain);
    for (int i = 0; i < 3; ++i) {
        const int warps = ctas[i] * lowbit::gemv::kStreamWarps;
        const double mb = i == 0 ? o.megabytes() : i == 1 ? gu.megabytes() : dn.megabytes();
        printf(" %s %dx%d, %d CTAs, %.1f MB (%.2f us at 3.0 TB/s)\n", names3[i], dims[i][0], dims[i][1], ctas[i], mb,
               mb / 3.0);
        for (int ev = 0; ev < 8; ++ev) {
            std::vector<double> v;
            for (int w = 0; w < warps; ++w)
                if (h[i][w * kMarks + ev] != 0) v.push_back((double(h[i][w * kMarks + ev]) - double(t0)) * 1e-3);
            if (v.empty()) continue;
            auto p = pct(v);
            printf("  %-18s %6.2f %6.2f %6.2f %6.2f %6.2f\n", names[ev], p[0], p[1], p[2], p[3], p[4]);
        }
        std::vector<double> waited, cta_done(ctas[i], 0.0), cta_entry(ctas[i], 1e30);
        bool has_done = false;  // the SwiGLU instance returns before the "done" mark
        for (int w = 0; w < warps; ++w) {
            waited.push_back(h[i][w * kMarks + 8] * 1e-3);
            const int c = w / lowbit::gemv::kStreamWarps;
            has_done |= h[i][w * kMarks + 7] != 0;
            cta_done[c] = std::max(cta_done[c], (double(h[i][w * kMarks + 7]) - double(t0)) * 1e-3);
            cta_entry[c] = std::min(cta_entry[c], (double(h[i][w * kMarks + 0]) - double(t0)) * 1e-3);
        }
        auto p = pct(waited);
        printf("  %-18s %6.2f %6.2f %6.2f %6.2f %6.2f  (us per warp in the full-barrier waits)\n", "waited", p[0], p[1],
               p[2], p[3], p[4]);
        p = pct(cta_entry);
        printf("  %-18s %6.2f %6.2f %6.2f %6.2f %6.2f  (over CTAs)\n", "CTA entry", p[0], p[1], p[2], p[3], p[4]);
        if (has_done) {
            p = pct(cta_done);
            printf("  %-18s %6.2f %6.2f %6.2f %6.2f %6.2f  (over CTAs)\n", "CTA done", p[0], p[1], p[2], p[3], p[4]);
        }
    }
    return 0;
}
