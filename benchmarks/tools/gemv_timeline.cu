// Timeline of the kbit stream-K GEMV, per warp: where a mid-size GEMV's time goes.
//
// Builds lowbit's kernel header with LOWBIT_TRACE defined to record %globaltimer (ns) at each step
// of every warp (entry, table built, past the PDL wait, each unit decoded, units done, partials
// published, done), plus the SM. Times a few back-to-back calls over rotating weight copies (cold
// L2), then traces two back-to-back calls, so the gap between kernels shows too.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc -o gemv_timeline benchmarks/tools/gemv_timeline.cu
//   ./gemv_timeline K_IN N [local=1] [copies=8] > timeline.csv   (analysis: gemv_timeline.py)
//
// Random codes and absmax bytes: the timing does not depend on the values.
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int kEvents = 24;  // per warp: events 0..21, 22 = SM id
// [2][warps][kEvents]: over two back-to-back traced calls, the first call's times are the minima and
// the second's the maxima, so neither call waits on anything but the other.
__device__ unsigned long long* g_trace_buf;
__device__ size_t g_trace_half;

__device__ __forceinline__ void lowbit_trace(int ev) {
    unsigned long long* b = g_trace_buf;
    if (b == nullptr || (threadIdx.x & 31) != 0) return;
    const int w = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    atomicMin(b + w * kEvents + ev, t);
    atomicMax(b + g_trace_half + w * kEvents + ev, t);
    if (ev == 0) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        b[w * kEvents + 22] = sm;
    }
}
#define LOWBIT_TRACE(ev) lowbit_trace(ev)
#include "tiled/gemv.cuh"

#include "cuda_check.h"

__global__ void fill_bytes(uint32_t* p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        uint32_t v = uint32_t(i) * 2654435761u ^ seed;
        v ^= v >> 15; v *= 2246822519u; v ^= v >> 13;
        p[i] = v;
    }
}

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s K_IN N [local=1] [copies=8]\n", argv[0]);
        return 2;
    }
    const int k_in = atoi(argv[1]), n = atoi(argv[2]);
    const bool local = argc > 3 ? atoi(argv[3]) != 0 : true;
    const int copies = argc > 4 ? atoi(argv[4]) : 8;
    constexpr int BITS = 4;
    const int tiles = (n + 15) / 16, groups = (k_in + 255) / 256;
    const size_t units = size_t(tiles) * groups;
    const size_t qw_words = units * BITS * 32 * 4, qa_words = units * 8 * 4;
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int occ = lowbit::gemv::gemv_occupancy<BITS, __half, 1>() / lowbit::gemv::kStreamWarps;
    const int ctas = local ? (tiles < sms * occ ? tiles : sms * occ) : sms * occ;
    const int n_warps = int(units < size_t(ctas) * 16 ? units : size_t(ctas) * 16);
    const int warps_launched = ((n_warps + 15) / 16) * 16;

    std::vector<uint32_t*> qw(copies), qa(copies);
    for (int c = 0; c < copies; ++c) {
        CHECK(cudaMalloc(&qw[c], qw_words * 4));
        CHECK(cudaMalloc(&qa[c], qa_words * 4));
        fill_bytes<<<1024, 256>>>(qw[c], qw_words, 17u + c);
        fill_bytes<<<1024, 256>>>(qa[c], qa_words, 91u + c);
    }
    float cb_host[16], one = 1.f;
    for (int i = 0; i < 16; ++i) cb_host[i] = -1.f + i / 7.5f;
    float *cb, *scale, *ws;
    int* counters;
    __half *x, *y;
    CHECK(cudaMalloc(&cb, sizeof cb_host));
    CHECK(cudaMalloc(&scale, 4));
    CHECK(cudaMemcpy(cb, cb_host, sizeof cb_host, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(scale, &one, 4, cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&x, size_t(k_in) * 2));
    CHECK(cudaMemset(x, 0, size_t(k_in) * 2));
    CHECK(cudaMalloc(&y, size_t(n) * 2));
    CHECK(cudaMalloc(&ws, size_t(warps_launched) * 2 * 128 * 4));
    CHECK(cudaMalloc(&counters, size_t(tiles) * 4));
    CHECK(cudaMemset(counters, 0, size_t(tiles) * 4));
    const int flags = local ? lowbit::gemv::kFlagLocal : 0;
    auto call = [&](int c) {
        int err = lowbit::gemv::launch_gemv<BITS, __half, 1>(x, qw[c], qa[c], cb, scale, y, nullptr, ws, counters, 1, n,
                                                             k_in, n_warps, flags, nullptr, nullptr);
        if (err) {
            fprintf(stderr, "launch: %s\n", cudaGetErrorString(cudaError_t(err)));
            exit(1);
        }
    };
    for (int r = 0; r < 3; ++r)
        for (int c = 0; c < copies; ++c) call(c);
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    const int reps = 20 * copies;
    CHECK(cudaEventRecord(e0));
    for (int r = 0; r < reps; ++r) call(r % copies);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    fprintf(stderr, "%dx%d K=4 %s: %d CTAs, %d warps, %zu units; %.2f us per call (stream, back to back, %d copies)\n",
            k_in, n, local ? "CTA-local" : "stream-K", ctas, n_warps, units, 1e3 * ms / reps, copies);

    // two back-to-back traced calls (minima: the first, maxima: the second)
    const size_t slots = size_t(warps_launched) * kEvents;
    std::vector<unsigned long long> h(2 * slots);
    for (size_t i = 0; i < slots; ++i) h[i] = ~0ull, h[slots + i] = 0;
    unsigned long long* buf;
    CHECK(cudaMalloc(&buf, 2 * slots * 8));
    CHECK(cudaMemcpy(buf, h.data(), 2 * slots * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyToSymbol(g_trace_buf, &buf, sizeof(void*)));
    CHECK(cudaMemcpyToSymbol(g_trace_half, &slots, sizeof(size_t)));
    CHECK(cudaDeviceSynchronize());
    call(0);
    call(1);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h.data(), buf, 2 * slots * 8, cudaMemcpyDeviceToHost));
    printf("call,warp,sm,event,ns\n");
    for (int i = 0; i < 2; ++i)
        for (int w = 0; w < warps_launched; ++w)
            for (int ev = 0; ev < 22; ++ev) {
                const unsigned long long v = h[i * slots + w * kEvents + ev];
                if (v != ~0ull && v != 0) printf("%d,%d,%llu,%d,%llu\n", i, w, h[w * kEvents + 22], ev, v);
            }
    return 0;
}
