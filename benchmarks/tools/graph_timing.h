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

// The tiled kbit weights of one K_in x N GEMV (16 x 256-weight units: K * 512 bytes of codes and 128 of absmax each) in
// `copies` rotating copies, ~200 MB in all (past L2: cold); hashed codes, absmax bytes fill_bytes(mask, set). With a
// codebook of 2^K values, a unit scale and x of hashed bf16 values in [2^-7, 1): the probes time y = x W^T on these.
template <int BITS>
struct KbitWeights {
    int n_tiles, n_groups, copies;
    size_t units, qw_words, qa_words;
    std::vector<uint32_t*> qw, qa;
    float *codebook, *scale;
    uint16_t* x;  // bf16 bits
    KbitWeights(int k_in, int n, uint32_t absmax_mask = 0x3f3f3f3fu, uint32_t absmax_set = 0x30303030u)
        : n_tiles((n + 15) / 16), n_groups((k_in + 255) / 256) {
        units = size_t(n_tiles) * n_groups;
        qw_words = units * BITS * 128;
        qa_words = units * 32;
        copies = int(std::max<size_t>(2, (200u << 20) / (4 * (qw_words + qa_words)) + 1));
        qw.resize(copies);
        qa.resize(copies);
        for (int c = 0; c < copies; ++c) {
            CHECK(cudaMalloc(&qw[c], qw_words * 4));
            CHECK(cudaMalloc(&qa[c], qa_words * 4));
            fill_bytes<<<1024, 256>>>(qw[c], qw_words, 17u + c, ~0u, 0u);
            fill_bytes<<<1024, 256>>>(qa[c], qa_words, 91u + c, absmax_mask, absmax_set);
        }
        codebook = linear_codebook(1 << BITS);
        const float one = 1.f;
        CHECK(cudaMalloc(&scale, sizeof(float)));
        CHECK(cudaMemcpy(scale, &one, sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMalloc(&x, size_t(k_in) * 2));
        fill_bytes<<<64, 256>>>(reinterpret_cast<uint32_t*>(x), k_in / 2, 5u, 0x3f7f3f7fu, 0x3c003c00u);
    }
    KbitWeights(const KbitWeights&) = delete;  // owns device buffers
    KbitWeights& operator=(const KbitWeights&) = delete;
    double megabytes() const { return 4e-6 * double(qw_words + qa_words); }
    ~KbitWeights() {
        for (int c = 0; c < copies; ++c) {
            CHECK(cudaFree(qw[c]));
            CHECK(cudaFree(qa[c]));
        }
        CHECK(cudaFree(codebook));
        CHECK(cudaFree(scale));
        CHECK(cudaFree(x));
    }
};
