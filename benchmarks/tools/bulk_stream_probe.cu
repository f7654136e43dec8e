// Does a CTA that streams its weights with 1D bulk copies (the TMA engine, cp.async.bulk) into a shared-memory ring
// read HBM faster than the library's GEMV, where each warp streams its own unit range through registers? The
// round-3 study (benchmarks/journal/2026-11-23_round_3_large_shapes_what_limits.md) found the per-warp access pattern
// capped at ~71% of read bandwidth for K = 2 even with the decode removed, and named bulk copies per CTA as an untried
// pattern. In CTA-local mode a CTA's units are one contiguous byte range, so one thread can stream all of it.
//
// Two probe kernels, 16 warps, one CTA per SM, the library's CTA-local tile cut; lane 0 of warp 0 also fills a ring
// of R shared-memory stages by bulk copies (codes and absmax, completed on the stage's mbarrier):
//   bulk (with `all`)  stage s holds the CTA's units [16 s, 16 s + 16); warp w takes unit w of it and either
//                      xor:    folds its words into a checksum (the access pattern alone, as round 3's "decode
//                              removed"), or
//                      decode: runs the library's decode and MMAs on them (compute_group, x staged as the library
//                              stages it) and adds each tile's partial sums to an fp32 output with atomics;
//   x-stationary       stages go slice by slice (16 groups of UPW tiles), so warp w always decodes the same group
//                      and keeps its x in registers; partial sums in shared memory, summed in warp order at the end
//                      (M = 1, n_groups % 16 == 0; `which` picks the variants).
// Each is checked against the library kernel (rel. L2 of the outputs; summation orders differ) and timed cold
// (rotating copies of ~200 MB, 4x the L2) beside it, M = 1, bf16.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc -Ibenchmarks/tools -o bulk_stream_probe benchmarks/tools/bulk_stream_probe.cu
//   ./bulk_stream_probe [k_in=8192] [n=29568] [replays=20] [all=0] [which=0]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tiled/bulk_gemv.cuh"

using T = __nv_bfloat16;

#include "graph_timing.h"

using namespace lowbit;
using namespace lowbit::gemv;

constexpr int kUnitsPerStage = kStreamWarps;  // one unit per warp per stage
constexpr int kThreads = kStreamWarps * 32;      // 16 warps: 128 registers each (a 17th warp would cap them at 96)

// mbarrier and bulk-copy helpers: the library's (tiled/bulk_gemv.cuh)

template <int BITS> __host__ __device__ constexpr size_t code_bytes() { return size_t(BITS) * 512; }
template <int BITS> __host__ __device__ constexpr size_t stage_bytes() { return kUnitsPerStage * (code_bytes<BITS>() + 128); }
__host__ __device__ inline size_t align128(size_t v) { return (v + 127) & ~size_t(127); }
template <int BITS> __host__ __device__ size_t ring_offset(int k_in) { return align128(stream_table_bytes<BITS>() + x_row_bytes(k_in)); }

template <int BITS, int R, bool DECODE, unsigned K2MASK = kK2RegBlocks(1, false)>
__global__ void __launch_bounds__(kThreads, 1)
    bulk_gemv(const T* __restrict__ x, const uint4* __restrict__ qw, const uint4* __restrict__ qa,
              const float* __restrict__ codebook, const float* __restrict__ scale_ptr, float* __restrict__ yf, int n,
              int k_in, int n_tiles, int n_groups, unsigned* sink) {
    constexpr bool QUAD = kStreamQuad<BITS>();
    constexpr unsigned K2REG = QUAD ? K2MASK : 0u;  // K = 2: blocks decoded in registers
    __shared__ __align__(8) uint64_t full[R], empty[R];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const StreamK tiles{n_tiles / int(gridDim.x), n_tiles % int(gridDim.x)};
    const int t0 = tiles.begin(blockIdx.x), t1 = tiles.begin(blockIdx.x + 1);
    const int64_t u0 = int64_t(t0) * n_groups;
    const int units = (t1 - t0) * n_groups, stages = (units + kUnitsPerStage - 1) / kUnitsPerStage;
    T* xs = reinterpret_cast<T*>(g_table + stream_table_bytes<BITS>());
    char* ring = g_table + ring_offset<BITS>(k_in);
    if (threadIdx.x == 0) {
        for (int s = 0; s < R; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], kStreamWarps);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    float cb = 0.f;
    if (DECODE) cb = Lut<BITS, QUAD>::fetch(codebook);
    __syncthreads();  // barriers initialized
    // The producer is lane 0 of warp 0: stage s goes to slot s % R once every warp has consumed stage s - R.
    const char* qw_b = reinterpret_cast<const char*>(qw) + u0 * code_bytes<BITS>();
    const char* qa_b = reinterpret_cast<const char*>(qa) + u0 * 128;
    const bool producer = threadIdx.x == 0;
    auto issue = [&](int s) {
        const int slot = s % R;
        const int cnt = min(kUnitsPerStage, units - s * kUnitsPerStage);
        const uint32_t cbytes = uint32_t(cnt * code_bytes<BITS>()), abytes = uint32_t(cnt * 128);
        char* st = ring + size_t(slot) * stage_bytes<BITS>();
        mbar_expect_tx(&full[slot], cbytes + abytes);
        bulk_copy(st, qw_b + size_t(s) * kUnitsPerStage * code_bytes<BITS>(), cbytes, &full[slot]);
        bulk_copy(st + kUnitsPerStage * code_bytes<BITS>(), qa_b + size_t(s) * kUnitsPerStage * 128, abytes, &full[slot]);
    };
    if (producer)
        for (int s = 0; s < R && s < stages; ++s) issue(s);
    LaneCtx<T> ctx{};
    if constexpr (DECODE) {
        Lut<BITS, QUAD>::template store<kStreamWarps * 32, T>(cb);
        stage_x<K2REG>(xs, x, 1, k_in);
        __syncthreads();
        ctx = lane_ctx<BITS, QUAD, T>(xs, x_row_bytes(k_in) / sizeof(T), 1, k_in);
        if constexpr (K2REG != 0) ctx.cb2 = cb2_regs<T>(cb);
    }
    const float scale = *scale_ptr;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    unsigned fold = 0;
    int cur_tile = -1;
    int tile = t0 + warp / n_groups, grp = warp % n_groups;  // this warp's unit of stage 0, then advanced by 16 units
    auto flush = [&] {
        if (cur_tile < 0) return;
        if (t == 0) {  // token 0: acc[0] row g, acc[2] row g + 8
            atomicAdd(yf + cur_tile * 16 + g, acc[0] * kGemvOutFix<false> * scale);
            atomicAdd(yf + cur_tile * 16 + g + 8, acc[2] * kGemvOutFix<false> * scale);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] = 0.f;
    };
    for (int s = 0; s < stages; ++s) {
        const int slot = s % R;
        if (producer && s >= 1 && s - 1 + R < stages) {  // refill the slot of stage s - 1 (one stage of slack)
            mbar_wait(&empty[(s - 1) % R], ((s - 1) / R) & 1);
            issue(s - 1 + R);
        }
        mbar_wait(&full[slot], (s / R) & 1);
        const int j = s * kUnitsPerStage + warp;  // this warp's unit within the CTA
        GroupData<BITS> d;
        const bool has = j < units;
        if (has) {
            const char* st = ring + size_t(slot) * stage_bytes<BITS>();
#pragma unroll
            for (int c = 0; c < BITS; ++c) d.w[c] = lds_u128(st + ((warp * BITS + c) * 32 + lane) * 16);
            d.a = lds_u128(st + kUnitsPerStage * code_bytes<BITS>() + (warp * 8 + g) * 16);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[slot]);  // the words are in registers: the slot may be refilled
        const int u_tile = tile, u_grp = grp;
        for (grp += kUnitsPerStage; grp >= n_groups; grp -= n_groups) ++tile;
        if (!has) continue;
        if constexpr (DECODE) {
            if (u_tile != cur_tile) {
                flush();
                cur_tile = u_tile;
            }
            compute_group<BITS, QUAD, T, kXShared, false, false, K2REG>(acc, d, ctx, u_grp);
        } else {
#pragma unroll
            for (int c = 0; c < BITS; ++c) fold ^= d.w[c].x ^ d.w[c].y ^ d.w[c].z ^ d.w[c].w;
            fold ^= d.a.x ^ d.a.w;
        }
    }
    if constexpr (DECODE) flush();
    else if (fold == 0x12345678u) sink[0] = fold;  // keeps the loads
}


// The weights of one shape in `copies` rotating copies (~200 MB in all: cold), its codebook and scale, and x.
template <int BITS>
struct Inputs {
    int n_tiles, n_groups, copies;
    size_t units;
    double bytes;
    std::vector<uint4*> qw, qa;
    float *codebook, *scale;
    T* x;
    Inputs(int k_in, int n) : n_tiles((n + 15) / 16), n_groups((k_in + 255) / 256) {
        units = size_t(n_tiles) * n_groups;
        bytes = double(units) * (code_bytes<BITS>() + 128);
        copies = std::max(2, int(std::ceil(200e6 / bytes)));
        qw.resize(copies);
        qa.resize(copies);
        for (int c = 0; c < copies; ++c) {
            CHECK(cudaMalloc(&qw[c], units * code_bytes<BITS>()));
            CHECK(cudaMalloc(&qa[c], units * 128));
            fill_bytes<<<1024, 256>>>(reinterpret_cast<uint32_t*>(qw[c]), units * code_bytes<BITS>() / 4, 17u, ~0u, 0u);
            fill_bytes<<<1024, 256>>>(reinterpret_cast<uint32_t*>(qa[c]), units * 128 / 4, 91u, 0x1f1f1f1fu, 0xa0a0a0a0u);
        }
        codebook = linear_codebook(1 << BITS);
        const float one = 1.f;
        CHECK(cudaMalloc(&scale, sizeof(float)));
        CHECK(cudaMemcpy(scale, &one, sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMalloc(&x, k_in * sizeof(T)));
        std::vector<T> xh(k_in);
        for (int i = 0; i < k_in; ++i) xh[i] = __float2bfloat16(float((i * 7919) % 2001) / 1000.f - 1.f);
        CHECK(cudaMemcpy(x, xh.data(), k_in * sizeof(T), cudaMemcpyHostToDevice));
    }
    ~Inputs() {
        for (int c = 0; c < copies; ++c) {
            CHECK(cudaFree(qw[c]));
            CHECK(cudaFree(qa[c]));
        }
        CHECK(cudaFree(x));
    }
};

// x-stationary order (M = 1): the CTA's stages go slice by slice -- slice h is groups [16 h, 16 h + 16) of every tile
// of the CTA; a stage holds UPW tiles' 16-unit chunks (one contiguous copy each) -- so warp w always decodes group
// 16 h + w (UPW units per stage) and keeps its x in registers (loaded once per slice): no x traffic through shared
// memory. Each unit's token-0 partial sums go to shared memory [tile][warp][16 rows] (the same warp adds its later
// slices), summed in warp order at the end. POLL: the producer (lane 0 of warp 0) issues every stage whose slot is
// free at each step (non-blocking test) instead of one stage behind with a blocking wait.
template <int BITS> __host__ __device__ constexpr size_t chunk_bytes() { return kUnitsPerStage * (code_bytes<BITS>() + 128); }
template <int BITS, int R, int UPW, bool POLL, unsigned K2MASK = kK2RegBlocks(1, false)>
__global__ void __launch_bounds__(kThreads, 1)
    xstat_gemv(const T* __restrict__ x, const uint4* __restrict__ qw, const uint4* __restrict__ qa,
               const float* __restrict__ codebook, const float* __restrict__ scale_ptr, T* __restrict__ y, int n,
               int k_in, int n_tiles, int n_groups) {
    constexpr bool QUAD = kStreamQuad<BITS>();
    constexpr unsigned K2REG = QUAD ? K2MASK : 0u;
    constexpr size_t kStage = UPW * chunk_bytes<BITS>();
    __shared__ __align__(8) uint64_t full[R], empty[R];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const StreamK tiles{n_tiles / int(gridDim.x), n_tiles % int(gridDim.x)};
    const int t0 = tiles.begin(blockIdx.x), cta_tiles = tiles.begin(blockIdx.x + 1) - t0;
    const int per_slice = (cta_tiles + UPW - 1) / UPW;  // stages per slice
    const int slices = n_groups / kUnitsPerStage, stages = slices * per_slice;  // host-checked: n_groups % 16 == 0
    float* part = reinterpret_cast<float*>(g_table + stream_table_bytes<BITS>());  // [cta_tiles][16 warps][16 rows]
    char* ring = g_table + align128(stream_table_bytes<BITS>() + size_t(cta_tiles) * kStreamWarps * 16 * sizeof(float));
    if (threadIdx.x == 0) {
        for (int s = 0; s < R; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], kStreamWarps);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    const float cb = Lut<BITS, QUAD>::fetch(codebook);
    __syncthreads();
    const bool producer = threadIdx.x == 0;
    auto issue = [&](int s) {
        const int slot = s % R, h = s / per_slice, k0 = (s - h * per_slice) * UPW, cnt = min(UPW, cta_tiles - k0);
        char* st = ring + size_t(slot) * kStage;
        mbar_expect_tx(&full[slot], uint32_t(cnt * chunk_bytes<BITS>()));
        for (int i = 0; i < cnt; ++i) {
            const int64_t u = int64_t(t0 + k0 + i) * n_groups + h * kUnitsPerStage;
            char* c = st + i * chunk_bytes<BITS>();
            bulk_copy(c, reinterpret_cast<const char*>(qw) + u * code_bytes<BITS>(), kUnitsPerStage * code_bytes<BITS>(),
                     &full[slot]);
            bulk_copy(c + kUnitsPerStage * code_bytes<BITS>(), reinterpret_cast<const char*>(qa) + u * 128,
                     kUnitsPerStage * 128, &full[slot]);
        }
    };
    int next = 0;  // producer: the next stage to issue
    if (producer)
        for (; next < R && next < stages; ++next) issue(next);
    Lut<BITS, QUAD>::template store<kStreamWarps * 32, T>(cb);
    __syncthreads();  // the table
    LaneCtx<T> ctx = lane_ctx<BITS, QUAD, T>(x, k_in, 1, k_in);
    if constexpr (K2REG != 0) ctx.cb2 = cb2_regs<T>(cb);
    const float scale = *scale_ptr;
    uint4 xv[kGroupBlocks];
    for (int s = 0; s < stages; ++s) {
        const int slot = s % R, h = s / per_slice, k0 = (s - h * per_slice) * UPW, cnt = min(UPW, cta_tiles - k0);
        if (k0 == 0) {  // a new slice: this warp's group's x, in the register decode's order where it applies
            load_x<kXGlobal>(xv, ctx, h * kUnitsPerStage + warp);
#pragma unroll
            for (int j = 0; j < kGroupBlocks; ++j)
                if ((K2REG >> j) & 1) xv[j] = cb2_x(xv[j]);
        }
        if (producer) {
            if constexpr (POLL) {  // every stage whose slot is free now; block only when stage s itself is not issued
                while (next < stages && (next == s || mbar_done(&empty[next % R], ((next / R) - 1) & 1))) {
                    if (next == s) mbar_wait(&empty[next % R], ((next / R) - 1) & 1);
                    issue(next++);
                }
            } else if (s >= 1 && s - 1 + R < stages) {  // the slot of stage s - 1, once every warp has read it
                mbar_wait(&empty[(s - 1) % R], ((s - 1) / R) & 1);
                issue(s - 1 + R);
            }
        }
        mbar_wait(&full[slot], (s / R) & 1);
        const char* st = ring + size_t(slot) * kStage;
        GroupData<BITS> d[UPW];
#pragma unroll
        for (int i = 0; i < UPW; ++i) {
            if (i < cnt) {
                const char* c = st + i * chunk_bytes<BITS>();
#pragma unroll
                for (int b = 0; b < BITS; ++b) d[i].w[b] = lds_u128(c + ((warp * BITS + b) * 32 + lane) * 16);
                d[i].a = lds_u128(c + kUnitsPerStage * code_bytes<BITS>() + (warp * 8 + g) * 16);
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[slot]);
#pragma unroll
        for (int i = 0; i < UPW; ++i) {
            if (i < cnt) {
                float acc[4] = {0.f, 0.f, 0.f, 0.f};
                decode_group<BITS, QUAD, T, false, false, K2REG, K2REG != 0>(acc, d[i], xv, ctx);
                if (t == 0) {  // token 0: rows g (acc[0]) and g + 8 (acc[2])
                    float* p = part + ((k0 + i) * kStreamWarps + warp) * 16;
                    p[g] = h == 0 ? acc[0] : p[g] + acc[0];
                    p[g + 8] = h == 0 ? acc[2] : p[g + 8] + acc[2];
                }
            }
        }
    }
    __syncthreads();
    for (int o = threadIdx.x; o < cta_tiles * 16; o += kThreads) {  // the CTA's outputs, summed in warp order
        const int k = o / 16, r = o % 16;
        float sum = 0.f;
        for (int w = 0; w < kStreamWarps; ++w) sum += part[(k * kStreamWarps + w) * 16 + r];
        const int row = (t0 + k) * 16 + r;
        if (row < n) y[row] = from_float<T>(sum * kGemvOutFix<false> * scale);
    }
}

// One shape and K: the library kernel against the x-stationary kernel's variants (R stages of UPW tiles; POLL).
template <int BITS, int R, int UPW, bool POLL, unsigned K2MASK = kK2RegBlocks(1, false)>
void time_xstat(int k_in, int n, int replays, int sms, const char* tag) {
    if ((k_in + 255) / 256 % kUnitsPerStage) return;
    Inputs<BITS> in(k_in, n);
    const int n_tiles = in.n_tiles, n_groups = in.n_groups, copies = in.copies;
    const double bytes = in.bytes;
    const std::vector<uint4*>&qw = in.qw, &qa = in.qa;
    float *codebook = in.codebook, *scale = in.scale;
    T* x = in.x;
    T *y, *y2;
    CHECK(cudaMalloc(&y, n * sizeof(T)));
    CHECK(cudaMalloc(&y2, n * sizeof(T)));
    const int ctas = std::min(sms, n_tiles);
    const int max_cta_tiles = (n_tiles + ctas - 1) / ctas;
    const size_t smem = align128(stream_table_bytes<BITS>() + size_t(max_cta_tiles) * kStreamWarps * 16 * sizeof(float)) +
                        R * UPW * chunk_bytes<BITS>();
    if (smem > 227 * 1024) {
        printf("K = %d %s: %zu B of shared memory, skipped\n", BITS, tag, smem);
        return;
    }
    CHECK(cudaFuncSetAttribute(xstat_gemv<BITS, R, UPW, POLL, K2MASK>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    auto library = [&](int c) {
        if (launch_gemv<BITS, T, 1>(x, qw[c], qa[c], codebook, scale, y, nullptr, nullptr, nullptr, 1, n, k_in,
                                    kStreamWarps * ctas, kFlagLocal, nullptr, st))
            exit(1);
    };
    auto xs = [&](int c) {
        xstat_gemv<BITS, R, UPW, POLL, K2MASK><<<ctas, kThreads, smem, st>>>(x, qw[c], qa[c], codebook, scale, y2, n, k_in, n_tiles,
                                                                     n_groups);
        CHECK(cudaGetLastError());
    };
    CHECK(cudaMemsetAsync(y2, 0xff, n * sizeof(T), st));
    library(0);
    xs(0);
    CHECK(cudaStreamSynchronize(st));
    std::vector<T> a(n), b(n);
    CHECK(cudaMemcpy(a.data(), y, n * sizeof(T), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(b.data(), y2, n * sizeof(T), cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    int nan = 0;
    for (int i = 0; i < n; ++i) {
        const double va = __bfloat162float(a[i]), vb = __bfloat162float(b[i]);
        if (std::isnan(vb)) { ++nan; continue; }
        num += (va - vb) * (va - vb);
        den += va * va;
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    auto graph = [&](auto&& launch) {
        return graph_of(st, [&] {
            for (int c = 0; c < copies; ++c) launch(c);
        });
    };
    cudaGraphExec_t g_lib = graph(library), g_xs = graph(xs);
    double tl[2], tx[2];
    for (int r = 0; r < 2; ++r) {
        tl[r] = median_replay_us(g_lib, st, replays) / copies;
        tx[r] = median_replay_us(g_xs, st, replays) / copies;
    }
    printf("K = %d, %d x %d, x-stationary %s (R %d x %d tiles, smem %zu, register blocks 0x%x): rel. L2 vs library %.2e, "
           "%d NaN%s; us: library %.2f / %.2f (%.1f%%), x-stationary %.2f / %.2f (%.1f%%)\n",
           BITS, k_in, n, tag, R, UPW, smem, BITS == 2 ? K2MASK : 0u, rel, nan, rel > 1e-2 || nan ? "  FAILED" : "", tl[0], tl[1],
           bytes / tl[1] / 3.0e4, tx[0], tx[1], bytes / tx[1] / 3.0e4);
    CHECK(cudaFree(y));
    CHECK(cudaFree(y2));
}

template <int BITS, int R, unsigned K2MASK = kK2RegBlocks(1, false)>
struct Case {
    static void run(int k_in, int n, int replays, int sms) {
        Inputs<BITS> in(k_in, n);
        const int n_tiles = in.n_tiles, n_groups = in.n_groups, copies = in.copies;
        const double bytes = in.bytes;
        const std::vector<uint4*>&qw = in.qw, &qa = in.qa;
        float *codebook = in.codebook, *scale = in.scale, *yf;
        T* x = in.x;
        T* y;
        CHECK(cudaMalloc(&yf, n * sizeof(float)));
        CHECK(cudaMalloc(&y, n * sizeof(T)));
        unsigned* sink;
        CHECK(cudaMalloc(&sink, sizeof(unsigned)));
        const int ctas = std::min(sms, n_tiles);
        const size_t smem = ring_offset<BITS>(k_in) + R * stage_bytes<BITS>();
        CHECK(cudaFuncSetAttribute(bulk_gemv<BITS, R, true, K2MASK>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        CHECK(cudaFuncSetAttribute(bulk_gemv<BITS, R, false, K2MASK>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));

        cudaStream_t st;
        CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        auto library = [&](int c) {
            if (launch_gemv<BITS, T, 1>(x, qw[c], qa[c], codebook, scale, y, nullptr, nullptr, nullptr, 1, n, k_in,
                                        kStreamWarps * ctas, kFlagLocal, nullptr, st)) {
                fprintf(stderr, "library launch failed\n");
                exit(1);
            }
        };
        auto bulk = [&](int c, bool decode) {
            if (decode) {
                CHECK(cudaMemsetAsync(yf, 0, n * sizeof(float), st));
                bulk_gemv<BITS, R, true, K2MASK><<<ctas, kThreads, smem, st>>>(x, qw[c], qa[c], codebook, scale, yf, n, k_in,
                                                                       n_tiles, n_groups, sink);
            } else {
                bulk_gemv<BITS, R, false, K2MASK><<<ctas, kThreads, smem, st>>>(x, qw[c], qa[c], codebook, scale, yf, n, k_in,
                                                                        n_tiles, n_groups, sink);
            }
            CHECK(cudaGetLastError());
        };
        // check: the decode variant against the library kernel (fp32 atomics in another order: a bound, not bits)
        CHECK(cudaMemsetAsync(y, 0xff, n * sizeof(T), st));
        library(0);
        bulk(0, true);
        CHECK(cudaStreamSynchronize(st));
        std::vector<T> yh(n);
        std::vector<float> fh(n);
        CHECK(cudaMemcpy(yh.data(), y, n * sizeof(T), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(fh.data(), yf, n * sizeof(float), cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        int nan = 0, nan_lib = 0, first_nan = -1;
        for (int i = 0; i < n; ++i) {
            const double a = __bfloat162float(yh[i]), b = fh[i];
            nan_lib += std::isnan(a);
            if (std::isnan(a) || std::isnan(b)) {
                if (first_nan < 0) first_nan = i;
                ++nan;
                continue;
            }
            num += (a - b) * (a - b);
            den += a * a;
        }
        if (nan) printf("  NaN: %d in the library's output; first at row %d (library %g, bulk %g)\n", nan_lib, first_nan,
                        double(__bfloat162float(yh[first_nan])), double(fh[first_nan]));
        const double rel = std::sqrt(num / std::max(den, 1e-30));
        printf("K = %d, %d x %d, %.1f MB, %d copies, ring %d x %zu B (smem %zu), register blocks 0x%x: decode vs library "
               "rel. L2 %.2e, %d NaN%s\n",
               BITS, k_in, n, bytes / 1e6, copies, R, stage_bytes<BITS>(), smem, BITS == 2 ? K2MASK : 0u, rel, nan,
               rel > 1e-2 || nan > nan_lib ? "  FAILED" : "");
        auto graph = [&](auto&& launch) {
            return graph_of(st, [&] {
                for (int c = 0; c < copies; ++c) launch(c);
            });
        };
        cudaGraphExec_t g_lib = graph(library), g_xor = graph([&](int c) { bulk(c, false); }),
                        g_dec = graph([&](int c) { bulk(c, true); });
        for (int round = 0; round < 2; ++round) {
            const double a = median_replay_us(g_lib, st, replays) / copies, b = median_replay_us(g_xor, st, replays) / copies,
                         d = median_replay_us(g_dec, st, replays) / copies;
            printf("  round %d, us (%% of 3.0 TB/s): library %.2f (%.1f%%), bulk xor %.2f (%.1f%%), bulk decode %.2f (%.1f%%)\n",
                   round, a, bytes / a / 3.0e4, b, bytes / b / 3.0e4, d, bytes / d / 3.0e4);
        }
        CHECK(cudaFree(yf));
        CHECK(cudaFree(y));
    }
};

int main(int argc, char** argv) {
    const int k_in = argc > 1 ? atoi(argv[1]) : 8192;
    const int n = argc > 2 ? atoi(argv[2]) : 29568;
    const int replays = argc > 3 ? atoi(argv[3]) : 20;
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs, M = 1, bf16, cold\n", prop.name, sms);
    const bool all = argc > 4 && atoi(argv[4]) != 0;  // also the plain bulk kernel (xor and decode)
    if (all) {
        Case<2, 4>::run(k_in, n, replays, sms);
        Case<3, 7>::run(k_in, n, replays, sms);
        Case<4, 4>::run(k_in, n, replays, sms);
    }
    const int which = argc > 5 ? atoi(argv[5]) : 0;  // 0: the first sweep's variants; 1: K = 2 variants
    if (which == 0) {
        time_xstat<2, 4, 1, false>(k_in, n, replays, sms, "blocking");
        time_xstat<2, 3, 2, false>(k_in, n, replays, sms, "blocking");
        time_xstat<2, 3, 2, true>(k_in, n, replays, sms, "poll");
        time_xstat<3, 6, 1, false>(k_in, n, replays, sms, "blocking");
        time_xstat<3, 3, 2, false>(k_in, n, replays, sms, "blocking");
        time_xstat<4, 4, 1, true>(k_in, n, replays, sms, "poll");
        time_xstat<4, 2, 2, true>(k_in, n, replays, sms, "poll");
    } else {
        time_xstat<2, 3, 2, false>(k_in, n, replays, sms, "blocking");
        time_xstat<2, 2, 4, false>(k_in, n, replays, sms, "blocking");
        time_xstat<2, 3, 2, false, 0x11>(k_in, n, replays, sms, "blocking");
        time_xstat<2, 3, 2, false, 0x01>(k_in, n, replays, sms, "blocking");
        time_xstat<2, 3, 2, false, 0x00>(k_in, n, replays, sms, "blocking");
        time_xstat<3, 2, 4, false>(k_in, n, replays, sms, "blocking");
    }
    return 0;
}
