// Where does a decode layer's attention time go? L Llama-3-8B layers as a decode step runs them under PDL, cold
// (every layer's weights its own): q|k|v GEMV (4096 -> 6144), lowbit's decode attention in its append mode (RoPE,
// the cache write, attention over a `ctx`-position cache, 2 query heads per CTA, 64 positions per CTA: the grid
// plan's batch-1 choice), o (split), gate|up, down (split). K = 4, M = 1, bf16. No norms or residuals: the GEMVs
// are the plain kernels.
//
// It times, as CUDA graphs (median replay, us per layer):
//   layer           the five kernels;
//   no attention    the four GEMVs, o reading q|k|v's first 4096 outputs: the layer minus attention's cost;
//   attention only  the attention launches alone, back to back under PDL;
//   floor           the layer with a do-nothing kernel in attention's place (PDL wait, q copied to the output):
//                   what any kernel between q|k|v and o costs;
// and, built with -DLOWBIT_ATTN_STAMPS (as below), each phase of the last layer's attention in the layer graph:
// the SM clock at its phases in every CTA (decode.cu's stamp()), as medians and maxima over CTAs, with the chunk
// merger's own chain.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc -DLOWBIT_ATTN_STAMPS -o layer_probe benchmarks/tools/layer_probe.cu
//   ./layer_probe [layers=8] [replays=20] [ctx=590]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "attention/decode.cu"
#include "tiled/gemv.cuh"

using T = __nv_bfloat16;
constexpr int kBits = 4;
#ifndef PROBE_G
#define PROBE_G 2  // query heads per attention CTA (-DPROBE_G=1 / 4 for the other plans)
#endif

#include "graph_timing.h"

using namespace lowbit;
using namespace lowbit::gemv;

// bf16 values in [-1, 1) from the same hash
__global__ void fill_bf16(T* p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        uint32_t v = uint32_t(i) * 2654435761u ^ seed;
        v ^= v >> 15; v *= 2246822519u; v ^= v >> 13;
        p[i] = __float2bfloat16(float(v & 0xffff) / 32768.f - 1.f);
    }
}

// The floor of any kernel between q|k|v and o: the attention grid's shape, waiting under PDL, then copying q to the
// output (one L2 round trip), no work. "layer with the floor kernel" - "no attention" = what a kernel there costs at least.
__global__ void floor_kernel(const T* __restrict__ q, T* __restrict__ out, int n) {
    pdl_wait();
    pdl_launch_dependents();
    const int per = (n + gridDim.x - 1) / gridDim.x;
    for (int i = blockIdx.x * per + threadIdx.x; i < min(n, (blockIdx.x + 1) * per); i += blockDim.x) out[i] = q[i];
}

struct Gemv {
    const uint4* qw;
    const uint4* qa;
    int n, k_in;
};

int main(int argc, char** argv) {
    const int layers = argc > 1 ? atoi(argv[1]) : 8;
    const int replays = argc > 2 ? atoi(argv[2]) : 20;
    const int ctx = argc > 3 ? atoi(argv[3]) : 590;
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    constexpr int D = 128, HQ = 32, HKV = 8, G = PROBE_G, KV_DIV = HQ / HKV / G, CHUNK = 64;
    const int L = ctx, chunks = (L + CHUNK - 1) / CHUNK, groups = HQ / G;
    const int64_t start_pos = L - 60;  // room for every replay's step: the graph rewinds it first
    printf("device %s, %d SMs; %d Llama-3-8B layers, K = %d, M = 1, bf16; attention: %d-position cache, step at %lld, "
           "%d x %d CTAs\n", prop.name, sms, layers, kBits, L, (long long)start_pos, chunks, groups);

    float* codebook = linear_codebook();
    float* scale;
    CHECK(cudaMalloc(&scale, sizeof(float)));
    const float one = 1.f;
    CHECK(cudaMemcpy(scale, &one, sizeof(float), cudaMemcpyHostToDevice));
    const int shapes[4][2] = {{4096, 6144}, {4096, 4096}, {4096, 28672}, {14336, 4096}};  // k_in, n
    std::vector<Gemv> gemvs(4 * layers);
    double bytes = 0;
    for (int j = 0; j < 4 * layers; ++j) {
        const int k_in = shapes[j % 4][0], n = shapes[j % 4][1];
        const size_t units = size_t((n + 15) / 16) * ((k_in + 255) / 256);
        uint4 *qw, *qa;
        CHECK(cudaMalloc(&qw, units * kBits * 32 * 16));
        CHECK(cudaMalloc(&qa, units * 8 * 16));
        fill_bytes<<<1024, 256>>>(reinterpret_cast<uint32_t*>(qw), units * kBits * 32 * 4, 17u + j, ~0u, 0u);
        fill_bytes<<<1024, 256>>>(reinterpret_cast<uint32_t*>(qa), units * 8 * 4, 91u + j, 0x1f1f1f1fu, 0xa0a0a0a0u);
        gemvs[j] = Gemv{qw, qa, n, k_in};
        bytes += double(units) * (kBits * 512 + 128);
    }
    // activations: x, then per layer q|k|v out, attention out, o out, gate|up out, down out (the next x)
    T *x0, *qkv, *attn, *o_out, *gu, *down;
    CHECK(cudaMalloc(&x0, 4096 * sizeof(T)));
    CHECK(cudaMalloc(&qkv, 6144 * sizeof(T)));
    CHECK(cudaMalloc(&attn, 4096 * sizeof(T)));
    CHECK(cudaMalloc(&o_out, 4096 * sizeof(T)));
    CHECK(cudaMalloc(&gu, 28672 * sizeof(T)));
    CHECK(cudaMalloc(&down, 4096 * sizeof(T)));
    fill_bf16<<<16, 256>>>(x0, 4096, 5u);
    // per layer: K/V caches [1, HKV, L, D], position, mask (true below the step), cos/sin [1, D]
    std::vector<T*> kc(layers), vc(layers);
    int64_t* pos;
    int64_t* pos0;
    CHECK(cudaMalloc(&pos, layers * sizeof(int64_t)));
    CHECK(cudaMalloc(&pos0, layers * sizeof(int64_t)));
    {
        std::vector<int64_t> ph(layers, start_pos);
        CHECK(cudaMemcpy(pos0, ph.data(), layers * sizeof(int64_t), cudaMemcpyHostToDevice));
    }
    for (int l = 0; l < layers; ++l) {
        CHECK(cudaMalloc(&kc[l], size_t(HKV) * L * D * sizeof(T)));
        CHECK(cudaMalloc(&vc[l], size_t(HKV) * L * D * sizeof(T)));
        fill_bf16<<<256, 256>>>(kc[l], size_t(HKV) * L * D, 300u + l);
        fill_bf16<<<256, 256>>>(vc[l], size_t(HKV) * L * D, 700u + l);
    }
    bool* mask;
    CHECK(cudaMalloc(&mask, L));
    {
        std::vector<char> mh(L);
        for (int p = 0; p < L; ++p) mh[p] = p < L - 1;  // every row the steps reach is visible
        CHECK(cudaMemcpy(mask, mh.data(), L, cudaMemcpyHostToDevice));
    }
    T *cs, *sn;
    CHECK(cudaMalloc(&cs, D * sizeof(T)));
    CHECK(cudaMalloc(&sn, D * sizeof(T)));
    fill_bf16<<<1, 128>>>(cs, D, 11u);
    fill_bf16<<<1, 128>>>(sn, D, 13u);
    float* ws;
    CHECK(cudaMalloc(&ws, size_t(groups) * chunks * G * (D + 2) * sizeof(float)));
    int* counters;
    CHECK(cudaMalloc(&counters, (groups + 1) * sizeof(int)));
    CHECK(cudaMemset(counters, 0, (groups + 1) * sizeof(int)));
    long long* stamps = nullptr;
    const int ctas = chunks * groups;
#ifdef LOWBIT_ATTN_STAMPS
    CHECK(cudaMalloc(&stamps, size_t(ctas) * 12 * sizeof(long long)));
#endif
    CHECK(cudaDeviceSynchronize());

    const int split_ctas = occupancy(kbit_split_gemv_kernel<kBits, T, true>, split_smem<kBits>(1), kWarps) * sms;
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    auto gemv = [&](const Gemv& g, const T* x, T* y, bool split) {
        int err;
        if (split)
            err = launch_split<kBits, T>(x, nullptr, 1, g.qw, g.qa, codebook, scale, y, nullptr, 1, g.n, g.k_in,
                                         split_ctas, kFlagPdl, nullptr, st);
        else {
            const int n_tiles = (g.n + 15) / 16;
            err = launch_gemv<kBits, T, 1>(x, g.qw, g.qa, codebook, scale, y, nullptr, nullptr, nullptr, 1, g.n, g.k_in,
                                           kStreamWarps * (sms < n_tiles ? sms : n_tiles), kFlagLocal | kFlagPdl,
                                           nullptr, st);
        }
        if (err) {
            fprintf(stderr, "gemv launch: %s\n", cudaGetErrorString(cudaError_t(err)));
            exit(1);
        }
    };
    auto attention = [&](int l, int flags) {
        const attention::Append<T> ap{qkv + 4096, qkv + 5120, cs, sn, 6144, 6144, 6144, 0, pos + l, kc[l], vc[l],
                                      nullptr, nullptr, 1e-6f};
        const int err = attention::launch<T, D, G>(qkv, kc[l], vc[l], int64_t(HKV) * L * D, int64_t(L) * D,
                                                   int64_t(HKV) * L * D, int64_t(L) * D, mask, L, attn, ws, counters,
                                                   1, groups, KV_DIV, L, CHUNK, 1.f / sqrtf(float(D)), flags, ap, st);
        if (err) {
            fprintf(stderr, "attention launch: %s\n", cudaGetErrorString(cudaError_t(err)));
            exit(1);
        }
    };
    auto floor_launch = [&] {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(chunks * groups);
        cfg.blockDim = dim3(256);
        cfg.stream = st;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        CHECK(cudaLaunchKernelEx(&cfg, floor_kernel, static_cast<const T*>(qkv), attn, 4096));
    };
    constexpr int kAttnFlags = 1 | 2 | 4;  // PDL, append, early K/V rows (the step's flags)
    auto rewind = [&] { CHECK(cudaMemcpyAsync(pos, pos0, layers * sizeof(int64_t), cudaMemcpyDeviceToDevice, st)); };
    auto layer_chain = [&](bool with_attention, bool floor = false) {
        rewind();
        const T* x = x0;
        for (int l = 0; l < layers; ++l) {
            const Gemv* g = &gemvs[4 * l];
            gemv(g[0], x, qkv, false);
            if (floor) floor_launch();
            else if (with_attention) attention(l, kAttnFlags);
            gemv(g[1], with_attention || floor ? attn : qkv, o_out, true);
            gemv(g[2], o_out, gu, false);
            gemv(g[3], gu, down, true);
            x = down;
        }
    };
    auto attention_only = [&] {
        rewind();
        for (int l = 0; l < layers; ++l) attention(l, kAttnFlags);
    };
    auto time_graph = [&](cudaGraphExec_t ge) { return median_replay_us(ge, st, replays) / layers; };
    cudaGraphExec_t g_layer = graph_of(st, [&] { layer_chain(true); });
    cudaGraphExec_t g_plain = graph_of(st, [&] { layer_chain(false); });
    cudaGraphExec_t g_attn = graph_of(st, attention_only);
    cudaGraphExec_t g_floor = graph_of(st, [&] { layer_chain(false, true); });
    printf("weights %.1f MB per layer, %.2f us per layer at 3.0 TB/s\n", bytes / layers / 1e6, bytes / layers / 3.0e6);
    for (int round = 0; round < 3; ++round) {
        const double a = time_graph(g_layer), b = time_graph(g_plain), c = time_graph(g_attn);
        const double f = time_graph(g_floor);
        printf("round %d, us per layer: layer %.2f, no attention %.2f (attention's cost %.2f), attention only %.2f; "
               "with the floor kernel instead %.2f (its cost %.2f)\n", round, a, b, a - b, c, f, f - b);
    }
    // the attention output is finite (a NaN would mean a bad step position or a broken merge)
    {
        std::vector<T> ah(4096);
        CHECK(cudaMemcpy(ah.data(), attn, 4096 * sizeof(T), cudaMemcpyDeviceToHost));
        int nan = 0;
        for (T v : ah) nan += !std::isfinite(__bfloat162float(v));
        printf("attention output: %d of 4096 not finite%s\n", nan, nan ? "  FAILED" : "");
        if (nan) return 1;
    }
#ifdef LOWBIT_ATTN_STAMPS
    // stamps of the last layer's attention, in one replay of the layer graph
    CHECK(cudaMemcpyToSymbol(attention::g_attn_stamps, &stamps, sizeof(stamps)));
    for (int rep = 0; rep < 3; ++rep) {
        CHECK(cudaMemset(stamps, 0, size_t(ctas) * 12 * sizeof(long long)));
        CHECK(cudaGraphLaunch(g_layer, st));
        CHECK(cudaStreamSynchronize(st));
        std::vector<long long> s(size_t(ctas) * 12);
        CHECK(cudaMemcpy(s.data(), stamps, s.size() * sizeof(long long), cudaMemcpyDeviceToHost));
        // the SM clock's rate, from each CTA's cycles and nanoseconds between entry and exit (median)
        std::vector<double> rates;
        for (int c = 0; c < ctas; ++c)
            if (s[c * 12 + 8] > s[c * 12 + 7]) rates.push_back(double(s[c * 12 + 6] - s[c * 12]) / (s[c * 12 + 8] - s[c * 12 + 7]));
        std::sort(rates.begin(), rates.end());
        const double ghz = rates.empty() ? 1.98 : rates[rates.size() / 2];
        long long t_first = s[7];
        for (int c = 0; c < ctas; ++c) t_first = std::min(t_first, s[c * 12 + 7]);
        std::vector<double> entry, wait, pos_read, prep, loop, merge, counter, exit_, end_ns;
        for (int c = 0; c < ctas; ++c) {
            const long long* r = &s[c * 12];
            entry.push_back((r[7] - t_first) / 1e3);
            end_ns.push_back((r[8] - t_first) / 1e3);
            wait.push_back((r[1] - r[0]) / ghz / 1e3);
            pos_read.push_back((r[2] - r[1]) / ghz / 1e3);
            prep.push_back((r[10] - r[2]) / ghz / 1e3);
            loop.push_back((r[3] - r[10]) / ghz / 1e3);
            merge.push_back((r[4] - r[3]) / ghz / 1e3);
            counter.push_back((r[5] - r[4]) / ghz / 1e3);
            if (r[9]) {
                exit_.push_back((r[6] - r[5]) / ghz / 1e3);
            }
        }
        auto stat = [](std::vector<double> v) {
            std::sort(v.begin(), v.end());
            static char buf[64];
            snprintf(buf, sizeof buf, "%6.2f / %6.2f / %6.2f", v.front(), v[v.size() / 2], v.back());
            return std::string(buf);
        };
        printf("replay %d, the last layer's attention, us (min / median / max over %d CTAs; SM clock at %.2f GHz):\n",
               rep, ctas, ghz);
        printf("  entry (global timer, from the first CTA)  %s\n", stat(entry).c_str());
        printf("  entry -> PDL wait done                    %s\n", stat(wait).c_str());
        printf("  -> position read (q, k, v, cos, sin asked) %s\n", stat(pos_read).c_str());
        printf("  -> q, k rotated (warp 0)                  %s\n", stat(prep).c_str());
        printf("  -> warp 0's loop done                     %s\n", stat(loop).c_str());
        printf("  -> warps merged                           %s\n", stat(merge).c_str());
        printf("  -> partials stored, counter answered      %s\n", stat(counter).c_str());
        printf("  chunk mergers (%zu): -> output stored      %s\n", exit_.size(), stat(exit_).c_str());
        printf("  exit (global timer, from the first CTA)   %s\n", stat(end_ns).c_str());
    }
#endif
    return 0;
}
