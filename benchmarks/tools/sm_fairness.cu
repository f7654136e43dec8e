// Does HBM serve every SM alike? One CTA per SM reads an equal contiguous share of a cold buffer (16 warps, 4 x 16-byte
// loads in flight per thread); each CTA records its SM, start and end (%globaltimer). Repeated runs show whether the
// same SMs finish late (a structural share, e.g. by GPC) or different ones (noise). A kernel that cuts work equally
// per SM ends when its slowest SM does. Then the same bytes in 32 KB chunks (read_chunks), handed out statically or,
// past a fraction of the rounds, from a global counter: what balancing the tail would buy.
// Results: benchmarks/journal/2026-11-27_decode_ceiling_and_tails.md.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Ibenchmarks/tools -o sm_fairness benchmarks/tools/sm_fairness.cu
//   ./sm_fairness [MB per SM = 1] [runs = 4]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "cuda_check.h"

__global__ void __launch_bounds__(512, 1) read_share(const uint4* __restrict__ p, size_t per_cta, unsigned long long* rec,
                                                    uint4* sink) {
    unsigned long long t0, t1;
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    __syncthreads();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    const uint4* q = p + blockIdx.x * per_cta;
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (size_t i = threadIdx.x; i < per_cta; i += 4 * 512) {
        uint4 v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const size_t j = i + size_t(k) * 512;
            if (j < per_cta) asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w) : "l"(q + j));
            else v[k] = make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) { acc.x ^= v[k].x; acc.y ^= v[k].y; acc.z ^= v[k].z; acc.w ^= v[k].w; }
    }
    __syncthreads();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    if (acc.x == 0x12345678u) sink[threadIdx.x] = acc;  // keeps the loads
    if (threadIdx.x == 0) {
        rec[3 * blockIdx.x] = sm;
        rec[3 * blockIdx.x + 1] = t0;
        rec[3 * blockIdx.x + 2] = t1;
    }
}

// The same bytes in 32 KB chunks, one per round of the CTA (a barrier per round), handed out statically (chunk
// blockIdx + r * grid) or, past `fixed` rounds, from a global counter: claims are pipelined D = 2 rounds ahead (thread
// r % D holds the claim for round r), so no thread waits for an atomic's round trip. The last CTA resets the counter.
constexpr int kChunk = 2048;  // uint4 per chunk: 32 KB, 4 per thread
__global__ void __launch_bounds__(512, 1) read_chunks(const uint4* __restrict__ p, int chunks, int fixed, unsigned* ctr,
                                                     unsigned long long* rec, uint4* sink) {
    __shared__ int q[2];
    unsigned long long t0, t1;
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const int G = gridDim.x;
    int mine = -1;  // threads 0, 1: the claim for a round ahead
    if (threadIdx.x < 2) {
        const int r = threadIdx.x;  // rounds 0, 1
        q[r] = r < fixed ? int(blockIdx.x) + r * G : int(atomicAdd(ctr, 1u)) + fixed * G;
    }
    __syncthreads();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (int r = 0;; ++r) {
        const int c = q[r & 1];
        if (c >= chunks) break;  // every thread reads the same value after the barrier below
        const int nr = r + 2;    // the round whose claim this round's owner makes
        if (threadIdx.x == (r & 1)) mine = nr < fixed ? int(blockIdx.x) + nr * G : int(atomicAdd(ctr, 1u)) + fixed * G;
        const uint4* b = p + size_t(c) * kChunk;
        uint4 v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
            asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w) : "l"(b + threadIdx.x + k * 512));
#pragma unroll
        for (int k = 0; k < 4; ++k) { acc.x ^= v[k].x; acc.y ^= v[k].y; acc.z ^= v[k].z; acc.w ^= v[k].w; }
        __syncthreads();  // every thread has read q[r & 1]
        if (threadIdx.x == (r & 1)) q[r & 1] = mine;
        __syncthreads();
    }
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    if (acc.x == 0x12345678u) sink[threadIdx.x] = acc;
    if (threadIdx.x == 0) {
        rec[3 * blockIdx.x] = sm;
        rec[3 * blockIdx.x + 1] = t0;
        rec[3 * blockIdx.x + 2] = t1;
        __threadfence();
        if (atomicAdd(ctr + 1, 1u) == unsigned(G) - 1) {  // the last CTA: reset for the next launch
            ctr[0] = 0;
            ctr[1] = 0;
        }
    }
}

// Time `launch(copy)` over cold copies: median kernel time (us) of `reps` graphs of one call each.
template <typename L>
double time_cold(L&& launch, int copies, int reps) {
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
        CHECK(cudaEventRecord(e0));
        for (int c = 0; c < copies; ++c) launch(c);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float v;
        CHECK(cudaEventElapsedTime(&v, e0, e1));
        ms.push_back(v * 1e3f / copies);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

int main(int argc, char** argv) {
    const double mb = argc > 1 ? std::atof(argv[1]) : 1.0;
    const int runs = argc > 2 ? std::atoi(argv[2]) : 4;
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const size_t per_cta = size_t(mb * (1 << 20)) / 16;
    const size_t total = per_cta * sms;
    const int copies = int(std::max<size_t>(2, (size_t(400) << 20) / (total * 16) + 1));
    std::vector<uint4*> bufs(copies);
    for (auto& b : bufs) {
        CHECK(cudaMalloc(&b, total * 16));
        CHECK(cudaMemset(b, 1, total * 16));
    }
    unsigned long long* rec;
    uint4* sink;
    CHECK(cudaMalloc(&rec, size_t(sms) * 3 * 8));
    CHECK(cudaMalloc(&sink, 512 * 16));
    std::vector<std::vector<double>> dur(runs, std::vector<double>(sms, 0.0));  // by SM id
    std::printf("%d SMs, %.2f MB per SM, %d runs (each on a cold copy)\n", sms, mb, runs);
    for (int r = 0; r < runs + 1; ++r) {
        read_share<<<sms, 512>>>(bufs[r % copies], per_cta, rec, sink);
        CHECK(cudaDeviceSynchronize());
        if (r == 0) continue;  // warm-up
        std::vector<unsigned long long> h(size_t(sms) * 3);
        CHECK(cudaMemcpy(h.data(), rec, h.size() * 8, cudaMemcpyDeviceToHost));
        unsigned long long s0 = ~0ull, e1 = 0;
        std::vector<double> start(sms), end(sms);
        for (int c = 0; c < sms; ++c) { s0 = std::min(s0, h[3 * c + 1]); e1 = std::max(e1, h[3 * c + 2]); }
        for (int c = 0; c < sms; ++c) {
            const int sm = int(h[3 * c]);
            start[sm] = (h[3 * c + 1] - s0) * 1e-3;
            end[sm] = (h[3 * c + 2] - s0) * 1e-3;
            dur[r - 1][sm] = end[sm] - start[sm];
        }
        std::vector<double> e = end, st = start;
        std::sort(e.begin(), e.end());
        std::sort(st.begin(), st.end());
        std::printf("run %d: kernel %.2f us (%.2f TB/s); starts p0 %.2f p50 %.2f p100 %.2f; ends p0 %.2f p10 %.2f p50 %.2f "
                    "p90 %.2f p100 %.2f us\n", r, (e1 - s0) * 1e-3, total * 16 / ((e1 - s0) * 1e-9) / 1e12, st[0],
                    st[sms / 2], st[sms - 1], e[0], e[sms / 10], e[sms / 2], e[sms * 9 / 10], e[sms - 1]);
    }
    // does the same SM come out slow every run? correlation of per-SM durations between runs
    auto corr = [&](const std::vector<double>& a, const std::vector<double>& b) {
        const double ma = std::accumulate(a.begin(), a.end(), 0.0) / a.size(), mb2 = std::accumulate(b.begin(), b.end(), 0.0) / b.size();
        double sab = 0, saa = 0, sbb = 0;
        for (size_t i = 0; i < a.size(); ++i) { sab += (a[i] - ma) * (b[i] - mb2); saa += (a[i] - ma) * (a[i] - ma); sbb += (b[i] - mb2) * (b[i] - mb2); }
        return sab / std::sqrt(saa * sbb);
    };
    for (int r = 1; r < runs; ++r) std::printf("per-SM duration correlation, run 1 vs run %d: %.2f\n", r + 1, corr(dur[0], dur[r]));
    std::printf("per-SM mean duration (us), by SM id:\n");
    for (int sm = 0; sm < sms; ++sm) {
        double m = 0;
        for (int r = 0; r < runs; ++r) m += dur[r][sm];
        std::printf("%5.2f%s", m / runs, sm % 12 == 11 ? "\n" : " ");
    }
    std::printf("\n");
    // chunked rounds: static against a dynamic tail
    unsigned* ctr;
    CHECK(cudaMalloc(&ctr, 8));
    CHECK(cudaMemset(ctr, 0, 8));
    const int chunks = int(total / kChunk);
    const int rounds = chunks / sms;  // whole static rounds
    std::printf("chunks of 32 KB: %d (%.1f per SM); back-to-back launches over %d cold copies, us per launch:\n", chunks,
                double(chunks) / sms, copies);
    for (int frac : {100, 90, 75, 50, 0}) {
        const int fixed = rounds * frac / 100;
        auto launch = [&](int c) { read_chunks<<<sms, 512>>>(bufs[c], chunks, fixed, ctr, rec, sink); };
        const double us = time_cold(launch, copies, 9);
        std::printf("  static rounds %3d%% (%d of %d): %.2f us (%.2f TB/s)\n", frac, fixed, rounds, us,
                    double(chunks) * kChunk * 16 / (us * 1e-6) / 1e12);
    }
    return 0;
}
