// Can a tensor-parallel decode step use the all-reduce's idle HBM? At TP = 2 a rank's row-split GEMVs (o_proj,
// down_proj) are each followed by a ~8.6 us all-reduce of a few KB (2 x H100, torch's one-shot kernel): DRAM sits
// idle while the next GEMV (gate|up, the next layer's q|k|v) waits for the sum. This probe runs one rank's GEMV
// chain on one GPU with a stand-in for the all-reduce (a one-CTA kernel that spins `ar_ns` on the global timer)
// and asks L2 for the first bytes of every warp's unit range of the next GEMV while the stand-in runs:
//
//   none        the stand-in alone;
//   side        a prefetch kernel on a second stream, forked after the row GEMV and joined before the next GEMV
//               (how a graph runs it beside torch's all-reduce kernel);
//   inside      the stand-in kernel issues the same prefetches itself (no fork: the ideal overlap).
//
// Weights: Llama-3-70B shapes split over `tp` ranks (q|k|v 8192 -> 10240 / tp, o 8192 / tp -> 8192, gate|up
// 8192 -> 57344 / tp, down 28672 / tp -> 8192), K = 4, M = 1, bf16, every layer's weights its own (cold), the
// library's CTA-local stream-K kernel under PDL, x = the previous GEMV's y. Budgets: MB of the next GEMV asked for
// per stand-in, cut equally over its warps' first units (codes and absmax).
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc -o tp_prefetch_probe benchmarks/tools/tp_prefetch_probe.cu
//   ./tp_prefetch_probe [layers=6] [replays=20] [ar_ns=8600] [tp=2]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tiled/gemv.cuh"

using T = __nv_bfloat16;
constexpr int kBits = 4;
constexpr int kUnitCodeBytes = kBits * 512, kUnitScaleBytes = 128;

#include "graph_timing.h"

using namespace lowbit;
using namespace lowbit::gemv;

__device__ __forceinline__ long long global_ns() {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

// One range of units per thread: [begin, begin + count) of the weight's codes and absmax, asked of L2.
struct UnitRange {
    int begin, count;
};
// WARP = false: one range per thread, two bulk requests; true: one range per warp, lane l asking for its 32nd of it
// (in 16-byte multiples), so that more SMs' bulk-copy units share the requests.
template <bool WARP>
__device__ __forceinline__ void prefetch_ranges(const char* qw, const char* qa, const UnitRange* ranges, int n) {
    const int lanes = WARP ? 32 : 1, sub = WARP ? threadIdx.x & 31 : 0;
    const int first = (blockIdx.x * blockDim.x + threadIdx.x) / lanes, stride = gridDim.x * blockDim.x / lanes;
    for (int i = first; i < n; i += stride) {
        const UnitRange r = ranges[i];
        if (r.count <= 0) continue;
        const int64_t cb = int64_t(r.count) * kUnitCodeBytes, sb = int64_t(r.count) * kUnitScaleBytes;
        const int64_t c0 = cb * sub / lanes / 16 * 16, c1 = cb * (sub + 1) / lanes / 16 * 16;
        const int64_t s0 = sb * sub / lanes / 16 * 16, s1 = sb * (sub + 1) / lanes / 16 * 16;
        if (c1 > c0) prefetch_l2(qw + int64_t(r.begin) * kUnitCodeBytes + c0, uint32_t(c1 - c0));
        if (s1 > s0) prefetch_l2(qa + int64_t(r.begin) * kUnitScaleBytes + s0, uint32_t(s1 - s0));
    }
}

template <bool WARP>
__global__ void prefetch_kernel(const char* qw, const char* qa, const UnitRange* ranges, int n) {
    prefetch_ranges<WARP>(qw, qa, ranges, n);
}

// The all-reduce's stand-in: spins ns on the global timer (after the prefetches, when given some).
__global__ void spin_kernel(long long ns, const char* qw, const char* qa, const UnitRange* ranges, int n) {
    const long long t0 = global_ns();
    if (ranges != nullptr) prefetch_ranges<false>(qw, qa, ranges, n);
    if (threadIdx.x == 0 && blockIdx.x == 0)
        while (global_ns() - t0 < ns) {
        }
}

struct Proj {
    int k_in, n;
    uint4* qw;
    uint4* qa;
    T* y;
    int n_tiles, n_groups, ctas;
    std::vector<UnitRange> warp_ranges;  // every warp's units, as the CTA-local kernel cuts them
};

int main(int argc, char** argv) {
    const int layers = argc > 1 ? atoi(argv[1]) : 6;
    const int replays = argc > 2 ? atoi(argv[2]) : 20;
    const long long ar_ns = argc > 3 ? atoll(argv[3]) : 8600;
    const int tp = argc > 4 ? atoi(argv[4]) : 2;
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    const int shapes[4][2] = {{8192, 10240 / tp}, {8192 / tp, 8192}, {8192, 57344 / tp}, {28672 / tp, 8192}};
    printf("device %s, %d SMs; %d layers of Llama-3-70B projections / TP %d, K = %d, M = 1, bf16; all-reduce stand-in %lld ns\n",
           prop.name, sms, layers, tp, kBits, ar_ns);
    float* codebook = linear_codebook();
    float* scale;
    CHECK(cudaMalloc(&scale, sizeof(float)));
    const float one = 1.f;
    CHECK(cudaMemcpy(scale, &one, sizeof(float), cudaMemcpyHostToDevice));
    T* x0;
    CHECK(cudaMalloc(&x0, 8 * 8192 * sizeof(T)));
    {
        std::vector<T> xh(8 * 8192);
        for (size_t i = 0; i < xh.size(); ++i) xh[i] = __float2bfloat16(float((i * 7919) % 2001) / 1000.f - 1.f);
        CHECK(cudaMemcpy(x0, xh.data(), xh.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    std::vector<Proj> projs(4 * layers);
    double bytes = 0;
    for (int j = 0; j < 4 * layers; ++j) {
        Proj& P = projs[j];
        P.k_in = shapes[j % 4][0];
        P.n = shapes[j % 4][1];
        P.n_tiles = (P.n + 15) / 16;
        P.n_groups = (P.k_in + 255) / 256;
        const size_t units = size_t(P.n_tiles) * P.n_groups;
        CHECK(cudaMalloc(&P.qw, units * kUnitCodeBytes));
        CHECK(cudaMalloc(&P.qa, units * kUnitScaleBytes));
        fill_bytes<<<1024, 256>>>(reinterpret_cast<uint32_t*>(P.qw), units * kUnitCodeBytes / 4, 17u + j, ~0u, 0u);
        fill_bytes<<<1024, 256>>>(reinterpret_cast<uint32_t*>(P.qa), units * kUnitScaleBytes / 4, 91u + j, 0x1f1f1f1fu,
                                  0xa0a0a0a0u);
        CHECK(cudaMalloc(&P.y, size_t(8) * P.n * sizeof(T)));
        CHECK(cudaMemset(P.y, 0, size_t(8) * P.n * sizeof(T)));
        P.ctas = sms < P.n_tiles ? sms : P.n_tiles;
        // kbit_gemv_kernel's local branch on the host: StreamK::begin of `total` over `parts` at i
        auto begin = [](int total, int parts, int i) { return i * (total / parts) + std::min(i, total % parts); };
        for (int c = 0; c < P.ctas; ++c) {
            const int first = begin(P.n_tiles, P.ctas, c), cta_units = (begin(P.n_tiles, P.ctas, c + 1) - first) * P.n_groups;
            for (int w = 0; w < kStreamWarps; ++w)
                P.warp_ranges.push_back({first * P.n_groups + begin(cta_units, kStreamWarps, w),
                                         begin(cta_units, kStreamWarps, w + 1) - begin(cta_units, kStreamWarps, w)});
        }
        bytes += double(units) * (kUnitCodeBytes + kUnitScaleBytes);
    }
    CHECK(cudaDeviceSynchronize());
    printf("weights %.1f MB per layer, %.2f us per layer at 3.0 TB/s\n", bytes / layers / 1e6, bytes / layers / 3.0e6);

    // Per budget, the prefetch list of every projection that follows an all-reduce (gate|up: j % 4 == 2; q|k|v of the
    // next layer: j % 4 == 0, j > 0): each warp's first units, the budget cut equally over the warps.
    const std::vector<int> budgets_mb = {0, 4, 8, 12, 16, 24};
    std::vector<std::vector<UnitRange*>> lists(budgets_mb.size(), std::vector<UnitRange*>(projs.size(), nullptr));
    for (size_t b = 0; b < budgets_mb.size(); ++b)
        for (size_t j = 0; j < projs.size(); ++j) {
            const Proj& P = projs[j];
            const double per_warp = budgets_mb[b] * 1e6 / P.warp_ranges.size() / (kUnitCodeBytes + kUnitScaleBytes);
            std::vector<UnitRange> r = P.warp_ranges;
            for (UnitRange& u : r) u.count = std::min(u.count, int(per_warp + 0.5));
            CHECK(cudaMalloc(&lists[b][j], r.size() * sizeof(UnitRange)));
            CHECK(cudaMemcpy(lists[b][j], r.data(), r.size() * sizeof(UnitRange), cudaMemcpyHostToDevice));
        }

    cudaStream_t st, side;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    std::vector<cudaEvent_t> forks(projs.size()), joins(projs.size());
    for (size_t j = 0; j < projs.size(); ++j) {
        CHECK(cudaEventCreateWithFlags(&forks[j], cudaEventDisableTiming));
        CHECK(cudaEventCreateWithFlags(&joins[j], cudaEventDisableTiming));
    }
    // mode: 0 no stand-in, 1 stand-in only, 2 side-stream prefetch, 3 prefetch inside the stand-in, 4 side stream,
    // a warp per range
    auto chain = [&](int mode, size_t b) {
        const bool warp_pf = mode == 4;
        mode = mode == 4 ? 2 : mode;
        for (size_t j = 0; j < projs.size(); ++j) {
            const Proj& P = projs[j];
            const int nr = int(P.warp_ranges.size());
            const bool after_ar = (j % 4 == 2) || (j % 4 == 0 && j > 0);
            if (after_ar && mode >= 1) {
                const char* qw = reinterpret_cast<const char*>(P.qw);
                const char* qa = reinterpret_cast<const char*>(P.qa);
                const bool pf = budgets_mb[b] > 0;
                if (mode == 2 && pf) {
                    CHECK(cudaEventRecord(forks[j], st));
                    CHECK(cudaStreamWaitEvent(side, forks[j], 0));
                    if (warp_pf)
                        prefetch_kernel<true><<<(nr + 7) / 8, 256, 0, side>>>(qw, qa, lists[b][j], nr);
                    else
                        prefetch_kernel<false><<<(nr + 255) / 256, 256, 0, side>>>(qw, qa, lists[b][j], nr);
                    CHECK(cudaEventRecord(joins[j], side));
                }
                if (mode == 3 && pf)
                    spin_kernel<<<(nr + 255) / 256, 256, 0, st>>>(ar_ns, qw, qa, lists[b][j], nr);
                else
                    spin_kernel<<<1, 32, 0, st>>>(ar_ns, nullptr, nullptr, nullptr, 0);
                if (mode == 2 && pf) CHECK(cudaStreamWaitEvent(st, joins[j], 0));
            }
            const T* x = j == 0 ? x0 : projs[j - 1].y;
            const int err = launch_gemv<kBits, T, 1>(x, P.qw, P.qa, codebook, scale, P.y, nullptr, nullptr, nullptr, 1, P.n,
                                                     P.k_in, kStreamWarps * P.ctas, kFlagLocal | kFlagPdl, nullptr, st);
            if (err) {
                fprintf(stderr, "launch %zu: %s\n", j, cudaGetErrorString(cudaError_t(err)));
                exit(1);
            }
        }
    };
    // every mode's outputs equal the plain chain's (prefetches change no value)
    std::vector<T> ref, got;
    auto last_y = [&](std::vector<T>& v) {
        CHECK(cudaStreamSynchronize(st));
        const Proj& P = projs.back();
        v.resize(P.n);
        CHECK(cudaMemcpy(v.data(), P.y, P.n * sizeof(T), cudaMemcpyDeviceToHost));
    };
    chain(0, 0);
    last_y(ref);
    for (int mode = 2; mode <= 4; ++mode) {
        CHECK(cudaMemsetAsync(projs.back().y, 0xff, projs.back().n * sizeof(T), st));
        chain(mode, budgets_mb.size() - 1);
        last_y(got);
        int diff = 0;
        for (size_t i = 0; i < ref.size(); ++i) diff += memcmp(&ref[i], &got[i], sizeof(T)) != 0;
        printf("check: mode %d, last output %d of %zu differ%s\n", mode, diff, ref.size(), diff ? "  FAILED" : "");
        if (diff) return 1;
    }

    cudaGraphExec_t g_plain = graph_of(st, [&] { chain(0, 0); });
    cudaGraphExec_t g_ar = graph_of(st, [&] { chain(1, 0); });
    std::vector<cudaGraphExec_t> g_side, g_inside, g_warp;
    for (size_t b = 1; b < budgets_mb.size(); ++b) {
        g_side.push_back(graph_of(st, [&] { chain(2, b); }));
        g_inside.push_back(graph_of(st, [&] { chain(3, b); }));
        g_warp.push_back(graph_of(st, [&] { chain(4, b); }));
    }
    auto per_layer = [&](cudaGraphExec_t ge) { return median_replay_us(ge, st, replays) / layers; };
    for (int round = 0; round < 2; ++round) {
        printf("round %d, us per layer: no all-reduce %.2f, stand-ins without prefetch %.2f\n", round, per_layer(g_plain),
               per_layer(g_ar));
        for (size_t b = 1; b < budgets_mb.size(); ++b)
            printf("  %2d MB before each of the two GEMVs: side stream %.2f, inside the stand-in %.2f, side stream with a warp "
                   "per range %.2f\n", budgets_mb[b], per_layer(g_side[b - 1]), per_layer(g_inside[b - 1]),
                   per_layer(g_warp[b - 1]));
    }
    return 0;
}
