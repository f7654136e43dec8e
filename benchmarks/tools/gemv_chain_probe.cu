// What does a chain of kbit GEMVs lose between one GEMV and the next? The same GEMVs (lowbit's CTA-local stream-K
// decode, 16 warps per SM) timed several ways over the projections of L Llama-3-8B layers. Cold: every layer's
// weights are its own, ~116 MB each at K = 4. M = 1, bf16, and each GEMV's x is the previous one's y.
//
//   launches    one launch per GEMV under PDL (the library's kernel, as a decode step runs it);
//   split mix   the same with the dispatcher's split kernel for o_proj and down_proj;
//   persistent  one kernel runs every GEMV in turn. Between two, each CTA waits on a grid-wide counter (every
//               CTA has stored its outputs). It issues its first weight loads of the next GEMV *before* that wait
//               ("early") or after it ("late", to see what the early loads buy). Variants:
//               - the early loads plus an L2 prefetch of the warp's next 2 / 4 / 8 units;
//               - no wait at all: timing only (x is read while it is written), the chain without its dependency;
//               - per-group flags instead of the grid-wide wait: each CTA, once its tiles of a GEMV are stored,
//                 adds their count to a counter per 256-row group of that output (release); a warp of the next
//                 GEMV waits (acquire) only for the group of x its next unit reads. A dependency finer than the
//                 grid: a warp starts on x's groups that are already stored.
//
// The persistent kernel reuses the library's pieces (tiled/gemv.cuh): table, unit loop, decode. Its outputs are
// checked against the library's kernel on the same inputs, job by job: the same tile and unit partition, so
// equal bit for bit. A probe, not a library path: no epilogues, and no attention between the projections.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc -o gemv_chain_probe benchmarks/tools/gemv_chain_probe.cu
//   ./gemv_chain_probe [layers=8] [replays=20] [quick]   (quick: the two launch chains only, three rounds; for A/B
//   of kernel changes: build the probe once per csrc tree, -I<tree>)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tiled/gemv.cuh"

using T = __nv_bfloat16;
#ifndef PROBE_BITS
#define PROBE_BITS 4
#endif
constexpr int kBits = PROBE_BITS;  // -DPROBE_BITS=2|3|5 for the other widths

#include "graph_timing.h"

namespace lowbit {
namespace gemv {

struct Job {
    const T* x;
    const uint4* qw;
    const uint4* qa;
    const float* scale;
    T* y;
    int n, k_in, n_tiles, n_groups;
    StreamK tiles;  // CTA c's tiles
};

// This warp's units of job J in CTA-local mode (as kbit_gemv_kernel's local branch).
struct Range {
    int u_begin, u_end, first_tile, cta_tiles, unit_base;
    StreamK sk;
};
__device__ __forceinline__ Range range_of(const Job& J, int warp) {
    Range r;
    const int first = J.tiles.begin(blockIdx.x);
    r.cta_tiles = J.tiles.begin(blockIdx.x + 1) - first;
    const int units = r.cta_tiles * J.n_groups;
    r.sk = StreamK{units / kStreamWarps, units % kStreamWarps};
    r.unit_base = first * J.n_groups;
    r.u_begin = r.unit_base + r.sk.begin(warp);
    r.u_end = r.unit_base + r.sk.begin(warp + 1);
    r.first_tile = r.u_begin / J.n_groups;
    return r;
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// L2 prefetch of `bytes` at p (multiple of 16, 16-byte aligned): one bulk request
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

constexpr int kFlagStride = 128;  // counters per job: one per 256-row group of its output (n <= 32768)

template <int MAXM, bool EARLY, int PF = 0, bool NOWAIT = false, bool FLAGS = false>
__global__ void __launch_bounds__(kStreamWarps * 32, 1)
    chain_kernel(const Job* __restrict__ jobs, int n_jobs, const float* __restrict__ codebook, unsigned* bar, int m,
                 unsigned* flags = nullptr) {
    constexpr bool QUAD = kStreamQuad<kBits>();
    constexpr int S = kStreamStages(kBits, MAXM);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    m = m < MAXM ? m : MAXM;
    const float cb = Lut<kBits, QUAD>::fetch(codebook);
    GroupData<kBits> buf[S];
    Job J = jobs[0];
    Range R = range_of(J, warp);
    prologue<kBits, S>(buf, J.qw + lane, scale_lane<false>(J.qa, g, t), R.u_begin, R.u_end);
    Lut<kBits, QUAD>::template store<kStreamWarps * 32, T>(cb);
    __syncthreads();
    pdl_wait();
    float* red = reinterpret_cast<float*>(g_table + stream_table_bytes<kBits>());
    __shared__ unsigned long long s_ready;  // FLAGS: groups of the previous job's output known stored
    __shared__ int s_token;                 // FLAGS: a warp is polling the counters
    for (int j = 0; j < n_jobs; ++j) {
        if (j > 0) {  // job j - 1 stored by every CTA
            if (threadIdx.x == 0 && !NOWAIT && !FLAGS)
                while (ld_acquire(bar + j - 1) < gridDim.x) {
                }
            if (FLAGS && threadIdx.x == 0) {  // nothing of job j - 1 seen yet
                s_ready = 0;
                s_token = 0;
            }
            __syncthreads();
            if (!EARLY) prologue<kBits, S>(buf, J.qw + lane, scale_lane<false>(J.qa, g, t), R.u_begin, R.u_end);
        }
        const float scale = *J.scale;
        const LaneCtx<T> ctx = lane_ctx<kBits, QUAD, T>(J.x, J.k_in, m, J.k_in);
        const int n = J.n, n_groups = J.n_groups;
        auto store = [&](const float (&v)[4], int tile) {
            const int row0 = tile * 16 + g;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = row0 + (i >> 1) * 8, tok = 2 * t + (i & 1);
                if (tok < m && row < n) J.y[int64_t(tok) * n + row] = from_float<T>(v[i] * kGemvOutFix<false> * scale);
            }
        };
        auto flush = [&](const float (&acc)[4], int tile, int g0, int g1) {
            if (g0 == 0 && g1 == n_groups) {
                store(acc, tile);
                return;
            }
            float* p = red + (warp * 2 + (tile == R.first_tile ? 0 : 1)) * 128 + lane;
#pragma unroll
            for (int i = 0; i < 4; ++i) p[32 * i] = acc[i];
        };
        if constexpr (FLAGS) {
            // `seen`: x's groups (n_groups <= 64) this warp knows complete, i.e. holding all of the previous job's
            // 16-row tiles in that group. A poll reads every counter at once: lane l those of groups l and l + 32
            // (one L2 round trip per poll, not one per unit), then a ballot says which are complete. (Measured
            // before this form: lane 0 spinning on one group's counter per new group, 65 us per layer; every warp
            // polling, 58.5; see benchmarks/journal/2026-11-27_chain_flags_and_tp_recheck.md.)
            const unsigned* cnt = flags + (j - 1) * kFlagStride;
            const int prev_tiles = j == 0 ? 0 : jobs[j - 1].n_tiles;
            auto poll = [&]() {
                uint64_t ready = 0;
#pragma unroll
                for (int base = 0; base < 64; base += 32) {
                    const int grp = base + lane;
                    const bool ok = grp >= n_groups || ld_acquire(cnt + grp) >= unsigned(min(16, prev_tiles - grp * 16));
                    ready |= uint64_t(__ballot_sync(kFullMask, ok)) << base;
                }
                return ready;
            };
            // One warp of the CTA polls at a time (a shared token); the others read what it found in shared
            // memory, so that 132 pollers load the counters, not 2112.
            uint64_t seen = j == 0 ? ~0ull : 0ull;
            auto wait = [&](int grp) {
                while (!((seen >> grp) & 1)) {
                    seen |= *reinterpret_cast<volatile unsigned long long*>(&s_ready);
                    if ((seen >> grp) & 1) break;
                    int mine = 0;
                    if (lane == 0) mine = atomicCAS(&s_token, 0, 1) == 0;
                    if (__shfl_sync(kFullMask, mine, 0)) {
                        seen |= poll();
                        if (lane == 0) {
                            atomicOr(&s_ready, static_cast<unsigned long long>(seen));
                            atomicExch(&s_token, 0);
                        }
                    } else {
                        __nanosleep(64);
                    }
                }
            };
            run_units<kBits, QUAD, T, S, kXCoherent, false, false, 0u>(buf, J.qw + lane, scale_lane<false>(J.qa, g, t), ctx,
                                                                    R.u_begin, R.u_end, R.first_tile,
                                                                    R.u_begin - R.first_tile * n_groups, n_groups, flush,
                                                                    false, wait);
        } else {
            run_units<kBits, QUAD, T, S, kXCoherent, false, false, 0u>(buf, J.qw + lane, scale_lane<false>(J.qa, g, t), ctx,
                                                                    R.u_begin, R.u_end, R.first_tile,
                                                                    R.u_begin - R.first_tile * n_groups, n_groups, flush);
        }
        const Job Jc = J;
        const Range Rc = R;
        if (j + 1 < n_jobs) {  // the next job's first loads, before this one's tail and the grid-wide wait
            J = jobs[j + 1];
            R = range_of(J, warp);
            if (EARLY) prologue<kBits, S>(buf, J.qw + lane, scale_lane<false>(J.qa, g, t), R.u_begin, R.u_end);
            // PF: the warp's next PF units past the prologue's, asked of L2 now (DRAM idles at the boundary)
            const int p0 = R.u_begin + S - 1, p1 = min(R.u_end, p0 + PF);
            if (PF > 0 && p1 > p0 && lane < 2) {
                if (lane == 0) prefetch_l2(J.qw + int64_t(p0) * kBits * 32, uint32_t(p1 - p0) * kBits * 512);
                else prefetch_l2(J.qa + int64_t(p0) * 8, uint32_t(p1 - p0) * 128);
            }
        }
        __syncthreads();
        for (int jt = warp; jt < Rc.cta_tiles; jt += kStreamWarps) {
            const int w_first = Rc.sk.warp_of(jt * n_groups), w_last = Rc.sk.warp_of((jt + 1) * n_groups - 1);
            if (w_first == w_last) continue;
            float sum[4] = {0.f, 0.f, 0.f, 0.f};
            for (int v = w_first; v <= w_last; ++v) {
                const float* p = red + (v * 2 + (jt == Rc.sk.begin(v) / n_groups ? 0 : 1)) * 128 + lane;
#pragma unroll
                for (int i = 0; i < 4; ++i) sum[i] += p[32 * i];
            }
            const int row0 = (Rc.unit_base / n_groups + jt) * 16 + g;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = row0 + (i >> 1) * 8, tok = 2 * t + (i & 1);
                if (tok < m && row < n) Jc.y[int64_t(tok) * n + row] = from_float<T>(sum[i] * kGemvOutFix<false> * scale);
            }
        }
        __syncthreads();  // every store of this CTA issued (and red free for the next job)
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(bar + j, 1u);
            if constexpr (FLAGS) {  // this CTA's tiles [t0, t1) of job j, counted into their 256-row groups
                const int t0 = Rc.unit_base / n_groups, t1 = t0 + Rc.cta_tiles;
                for (int grp = t0 / 16; grp * 16 < t1; ++grp)
                    atomicAdd(flags + j * kFlagStride + grp, unsigned(min(t1, grp * 16 + 16) - max(t0, grp * 16)));
            }
        }
    }
}

}  // namespace gemv
}  // namespace lowbit

using namespace lowbit;
using namespace lowbit::gemv;

int main(int argc, char** argv) {
    const int layers = argc > 1 ? atoi(argv[1]) : 8;
    const int replays = argc > 2 ? atoi(argv[2]) : 20;
    const bool quick = argc > 3 && std::string(argv[3]) == "quick";
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs; %d layers of Llama-3-8B projections, K = %d, M = 1, bf16\n", prop.name, sms, layers, kBits);
    const int shapes[4][2] = {{4096, 6144}, {4096, 4096}, {4096, 28672}, {14336, 4096}};  // k_in, n
    const int n_jobs = 4 * layers;
    std::vector<Job> jobs(n_jobs);
    float* codebook = linear_codebook();
    float* scales;
    CHECK(cudaMalloc(&scales, sizeof(float) * n_jobs));
    std::vector<float> sh(n_jobs, 1.f);
    CHECK(cudaMemcpy(scales, sh.data(), sizeof(float) * n_jobs, cudaMemcpyHostToDevice));
    // activations: x of job 0, then each job's y (the next job's x: its first k_in values)
    std::vector<T*> acts(n_jobs + 1);
    CHECK(cudaMalloc(&acts[0], 8 * 4096 * sizeof(T)));
    {
        std::vector<T> xh(8 * 4096);
        for (size_t i = 0; i < xh.size(); ++i) xh[i] = __float2bfloat16(float((i * 7919) % 2001) / 1000.f - 1.f);
        CHECK(cudaMemcpy(acts[0], xh.data(), xh.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    double bytes = 0;
    for (int j = 0; j < n_jobs; ++j) {
        const int k_in = shapes[j % 4][0], n = shapes[j % 4][1];
        const int n_tiles = (n + 15) / 16, n_groups = (k_in + 255) / 256;
        const size_t units = size_t(n_tiles) * n_groups;
        uint4 *qw, *qa;
        CHECK(cudaMalloc(&qw, units * kBits * 32 * 16));
        CHECK(cudaMalloc(&qa, units * 8 * 16));
        fill_bytes<<<1024, 256>>>(reinterpret_cast<uint32_t*>(qw), units * kBits * 32 * 4, 17u + j, ~0u, 0u);
        // absmax bytes 0xA0..0xBF: 2^-5 .. 2^-4 (E4M4, fp16's exponent bias), so outputs stay O(1) along the chain
        fill_bytes<<<1024, 256>>>(reinterpret_cast<uint32_t*>(qa), units * 8 * 4, 91u + j, 0x1f1f1f1fu, 0xa0a0a0a0u);
        CHECK(cudaMalloc(&acts[j + 1], size_t(8) * n * sizeof(T)));
        CHECK(cudaMemset(acts[j + 1], 0, size_t(8) * n * sizeof(T)));
        const int grid = sms < n_tiles ? sms : n_tiles;
        jobs[j] = Job{acts[j], qw, qa, scales + j, acts[j + 1], n, k_in, n_tiles, n_groups,
                      StreamK{n_tiles / grid, n_tiles % grid}};
        bytes += double(units) * (kBits * 512 + 128);
    }
    CHECK(cudaDeviceSynchronize());
    Job* d_jobs;
    CHECK(cudaMalloc(&d_jobs, sizeof(Job) * n_jobs));
    CHECK(cudaMemcpy(d_jobs, jobs.data(), sizeof(Job) * n_jobs, cudaMemcpyHostToDevice));
    unsigned* bar;
    CHECK(cudaMalloc(&bar, sizeof(unsigned) * n_jobs));
    const size_t smem = stream_smem<kBits>();
    CHECK(cudaFuncSetAttribute(chain_kernel<1, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    CHECK(cudaFuncSetAttribute(chain_kernel<1, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    CHECK(cudaFuncSetAttribute(chain_kernel<1, true, 0, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    CHECK(cudaFuncSetAttribute(chain_kernel<1, true, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    CHECK(cudaFuncSetAttribute(chain_kernel<1, true, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    CHECK(cudaFuncSetAttribute(chain_kernel<1, true, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    CHECK(cudaFuncSetAttribute(chain_kernel<1, true, 0, false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    unsigned* flags;
    CHECK(cudaMalloc(&flags, sizeof(unsigned) * kFlagStride * n_jobs));
    const int split_ctas = occupancy(kbit_split_gemv_kernel<kBits, T, true>, split_smem<kBits>(1), kWarps) * sms;
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

    auto launches = [&](bool split_mix) {
        for (int j = 0; j < n_jobs; ++j) {
            const Job& J = jobs[j];
            int err;
            if (split_mix && (j % 4 == 1 || j % 4 == 3))
                err = launch_split<kBits, T>(J.x, nullptr, 1, J.qw, J.qa, codebook, J.scale, J.y, nullptr, 1, J.n, J.k_in,
                                             split_ctas, kFlagPdl, nullptr, st);
            else
                err = launch_gemv<kBits, T, 1>(J.x, J.qw, J.qa, codebook, J.scale, J.y, nullptr, nullptr, nullptr, 1, J.n,
                                               J.k_in, kStreamWarps * (sms < J.n_tiles ? sms : J.n_tiles),
                                               kFlagLocal | kFlagPdl, nullptr, st);
            if (err) {
                fprintf(stderr, "launch %d: %s\n", j, cudaGetErrorString(cudaError_t(err)));
                exit(1);
            }
        }
    };
    auto persistent = [&](bool early, int pf = 0) {
        CHECK(cudaMemsetAsync(bar, 0, sizeof(unsigned) * n_jobs, st));
        if (pf == -2) {  // per-group flags
            CHECK(cudaMemsetAsync(flags, 0, sizeof(unsigned) * kFlagStride * n_jobs, st));
            chain_kernel<1, true, 0, false, true><<<sms, kStreamWarps * 32, smem, st>>>(d_jobs, n_jobs, codebook, bar, 1, flags);
        } else if (pf < 0)
            chain_kernel<1, true, 0, true><<<sms, kStreamWarps * 32, smem, st>>>(d_jobs, n_jobs, codebook, bar, 1);
        else if (pf == 2)
            chain_kernel<1, true, 2><<<sms, kStreamWarps * 32, smem, st>>>(d_jobs, n_jobs, codebook, bar, 1);
        else if (pf == 4)
            chain_kernel<1, true, 4><<<sms, kStreamWarps * 32, smem, st>>>(d_jobs, n_jobs, codebook, bar, 1);
        else if (pf == 8)
            chain_kernel<1, true, 8><<<sms, kStreamWarps * 32, smem, st>>>(d_jobs, n_jobs, codebook, bar, 1);
        else if (early)
            chain_kernel<1, true><<<sms, kStreamWarps * 32, smem, st>>>(d_jobs, n_jobs, codebook, bar, 1);
        else
            chain_kernel<1, false><<<sms, kStreamWarps * 32, smem, st>>>(d_jobs, n_jobs, codebook, bar, 1);
        CHECK(cudaGetLastError());
    };

    // correctness: the persistent kernel's y of every job against the library kernel on the same x (the flags
    // kernel's first, five runs: a missed dependency would show as a difference; then the grid-wide wait's)
    std::vector<std::vector<T>> chain_out(n_jobs);
    auto read_chain = [&] {
        CHECK(cudaStreamSynchronize(st));
        for (int j = 0; j < n_jobs; ++j) {
            chain_out[j].resize(jobs[j].n);
            CHECK(cudaMemcpy(chain_out[j].data(), jobs[j].y, jobs[j].n * sizeof(T), cudaMemcpyDeviceToHost));
        }
    };
    std::vector<std::vector<T>> flag_out[5];
    for (int r = 0; r < 5; ++r) {
        for (int j = 0; j < n_jobs; ++j) CHECK(cudaMemsetAsync(jobs[j].y, 0xff, jobs[j].n * sizeof(T), st));
        persistent(true, -2);
        read_chain();
        flag_out[r] = chain_out;
    }
    persistent(true);
    read_chain();
    {
        int diff = 0;
        for (int r = 0; r < 5; ++r)
            for (int j = 0; j < n_jobs; ++j)
                for (int i = 0; i < jobs[j].n; ++i)
                    diff += memcmp(&flag_out[r][j][i], &chain_out[j][i], sizeof(T)) != 0;
        printf("check: the per-group flags kernel, 5 runs against the grid-wide wait's outputs: %d differ%s\n", diff,
               diff ? "  FAILED" : "");
        if (diff) return 1;
    }
    T* ref;
    CHECK(cudaMalloc(&ref, 28672 * sizeof(T)));
    int bad = 0, nan = 0;
    double max_abs = 0;
    for (int j = 0; j < n_jobs; ++j) {
        const Job& J = jobs[j];
        CHECK(cudaMemset(ref, 0xff, J.n * sizeof(T)));  // poisoned: NaN where nothing is written
        if (launch_gemv<kBits, T, 1>(J.x, J.qw, J.qa, codebook, J.scale, ref, nullptr, nullptr, nullptr, 1, J.n, J.k_in,
                                     kStreamWarps * (sms < J.n_tiles ? sms : J.n_tiles), kFlagLocal, nullptr, st))
            exit(1);
        CHECK(cudaStreamSynchronize(st));
        std::vector<T> rh(J.n);
        CHECK(cudaMemcpy(rh.data(), ref, J.n * sizeof(T), cudaMemcpyDeviceToHost));
        for (int i = 0; i < J.n; ++i) {
            const float a = __bfloat162float(chain_out[j][i]), b = __bfloat162float(rh[i]);
            if (std::isnan(a) || std::isnan(b)) ++nan;
            else if (a != b) ++bad;
            if (std::isfinite(a)) max_abs = fmax(max_abs, fabs(a));
        }
    }
    printf("check: %d outputs differ from the library kernel, %d NaN (max |y| %.3g)%s\n", bad, nan, max_abs,
           bad || nan ? "  FAILED" : "");

    cudaGraphExec_t g_launch = graph_of(st, [&] { launches(false); });
    cudaGraphExec_t g_mix = graph_of(st, [&] { launches(true); });
    cudaGraphExec_t g_early = graph_of(st, [&] { persistent(true); });
    cudaGraphExec_t g_late = graph_of(st, [&] { persistent(false); });
    cudaGraphExec_t g_pf[3] = {graph_of(st, [&] { persistent(true, 2); }), graph_of(st, [&] { persistent(true, 4); }),
                               graph_of(st, [&] { persistent(true, 8); })};
    cudaGraphExec_t g_nowait = graph_of(st, [&] { persistent(true, -1); });
    cudaGraphExec_t g_flags = graph_of(st, [&] { persistent(true, -2); });
    auto time_graph = [&](cudaGraphExec_t ge) { return median_replay_us(ge, st, replays); };
    printf("weights %.1f MB per layer, %.2f us per layer at 3.0 TB/s\n", bytes / layers / 1e6, bytes / layers / 3.0e6);
    if (quick) {
        for (int round = 0; round < 3; ++round) {
            const double a = time_graph(g_launch), b = time_graph(g_mix);
            printf("round %d, us per layer (%% of 3.0 TB/s): launches %.2f (%.1f%%), split mix %.2f (%.1f%%)\n", round,
                   a / layers, bytes / a / 3.0e4, b / layers, bytes / b / 3.0e4);
        }
        return bad || nan ? 1 : 0;
    }
    for (int round = 0; round < 2; ++round) {
        const double a = time_graph(g_launch), b = time_graph(g_mix), c = time_graph(g_early), d = time_graph(g_late);
        printf("round %d, us per layer (%% of 3.0 TB/s): launches %.2f (%.1f%%), split mix %.2f (%.1f%%), "
               "persistent early %.2f (%.1f%%), persistent late %.2f (%.1f%%)\n",
               round, a / layers, bytes / a / 3.0e4, b / layers, bytes / b / 3.0e4, c / layers, bytes / c / 3.0e4,
               d / layers, bytes / d / 3.0e4);
        const double f = time_graph(g_nowait);
        printf("  persistent, no wait between GEMVs (timing only: x read while written): %.2f (%.1f%%)\n", f / layers,
               bytes / f / 3.0e4);
        const double fl = time_graph(g_flags);
        printf("  persistent, per-group flags (a warp waits for the 256-row group of x its unit reads): %.2f (%.1f%%)\n",
               fl / layers, bytes / fl / 3.0e4);
        for (int i = 0; i < 3; ++i) {
            const double e = time_graph(g_pf[i]);
            printf("  persistent early + L2 prefetch of the next %d units per warp: %.2f (%.1f%%)\n", 2 << i, e / layers,
                   bytes / e / 3.0e4);
        }
    }
    return bad || nan ? 1 : 0;
}
