// Helpers the standalone CUDA probes share: hashed fill of device buffers, a linear codebook, stream capture into a
// graph, and the median replay time of a graph (3 warm-up replays first).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda_check.h"

// p[i] = (hash(i, seed) & mask) | set, for n 32-bit words
__global__ void fill_bytes(uint32_t* p, size_t n, uint32_t seed, uint32_t mask, uint32_t set) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        uint32_t v = uint32_t(i) * 2654435761u ^ seed;
        v ^= v >> 15; v *= 2246822519u; v ^= v >> 13; v *= 3266489917u; v ^= v >> 16;
        p[i] = (v & mask) | set;
    }
}

// A device codebook of `values` evenly spaced values from -1 to 1 (the probes' weights are hashed codes over it).
inline float* linear_codebook(int values = 16) {
    float* d;
    CHECK(cudaMalloc(&d, values * sizeof(float)));
    std::vector<float> h(values);
    for (int i = 0; i < values; ++i) h[i] = -1.f + 2.f * i / float(values - 1);
    CHECK(cudaMemcpy(d, h.data(), sizeof(float) * values, cudaMemcpyHostToDevice));
    return d;
}

// What body() launches on st, captured as one graph.
template <typename Body>
cudaGraphExec_t graph_of(cudaStream_t st, Body&& body) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    body();
    CHECK(cudaStreamEndCapture(st, &g));
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    return ge;
}

// Median of `replays` timed replays of ge on st, in us.
inline double median_replay_us(cudaGraphExec_t ge, cudaStream_t st, int replays) {
    static cudaEvent_t e0 = nullptr, e1 = nullptr;
    if (e0 == nullptr) {
        CHECK(cudaEventCreate(&e0));
        CHECK(cudaEventCreate(&e1));
    }
    for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(ge, st));
    std::vector<float> ms;
    for (int r = 0; r < replays; ++r) {
        CHECK(cudaEventRecord(e0, st));
        CHECK(cudaGraphLaunch(ge, st));
        CHECK(cudaEventRecord(e1, st));
        CHECK(cudaEventSynchronize(e1));
        float v;
        CHECK(cudaEventElapsedTime(&v, e0, e1));
        ms.push_back(v);
    }
    std::sort(ms.begin(), ms.end());
    return double(ms[ms.size() / 2]) * 1e3;
}
