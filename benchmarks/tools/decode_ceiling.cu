// The kbit decode alone: how many weights per SM-clock the library's group decode (decode_group, tiled/gemv.cuh:
// table lookups, MMAs, block scales) reaches when nothing else limits it -- no DRAM, no ring barriers, no x loads.
// Each warp decodes the same groups over and over: its code words come from a small per-warp buffer in shared memory
// (SRC = 1: K + 1 16-byte loads per group, as the bulk-copy GEMV reads its ring) or from registers laundered each
// round by an XOR with a zero the compiler cannot see (SRC = 0: 4 (K + 1) LOP3 per group). x stays in registers (as in
// the bulk-copy GEMV) or, XS = 1..3, is read from a shared copy each group (as in the stream-K kernel: all lanes, the
// token lanes only, ldmatrix). XS = 9 replaces the table decode by a cost probe of a table-free one (grid_group).
// The rate is weights per SM-clock from clock64 (clock-rate free), and the weights per second at the measured clock;
// compare with the bytes rate HBM needs: 3.0 TB/s over 132 SMs at 1.98 GHz is 11.5 bytes per SM-clock, i.e.
// 21.6 / 28.3 / 40.8 weights per SM-clock at K = 4 / 3 / 2 (4.25 / 3.25 / 2.25 bits).
// Results: benchmarks/journal/2026-11-27_decode_ceiling_and_tails.md.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc -Ibenchmarks/tools -o decode_ceiling benchmarks/tools/decode_ceiling.cu
//   ./decode_ceiling [iters]
#include <cstdio>
#include <cuda_bf16.h>

#include "graph_timing.h"
#include "tiled/bulk_gemv.cuh"

using namespace lowbit;
using namespace lowbit::gemv;
using T = __nv_bfloat16;

constexpr int kBuf = 2;  // groups in a warp's shared buffer (SRC = 1)

// GRID (K = 3 only, a cost probe for a format that does not exist): codebook values on an int8 grid (value = s q), 8
// codes' q in two registers; a code's 3 bits sit in a nibble (24 codes per 3 words: bits 0-2 of each nibble; the
// nibbles' bit 3 hold the other 8 codes, gathered), so (word & 0x77777777) is 8 byte-permute selectors. One PRMT
// picks 4 codes' q bytes, two more put each under a 0x64 high byte: fp16 1024 + 128 + q. The offset comes off
// through 2 MMAs per block with a constant A of -1152 (its x is the block's). No table, no shared memory.
// two blocks (32 codes) from a word triple: 4 selector words, 16 A-fragment registers
__device__ __forceinline__ void grid_pair_blocks(uint32_t (&frag)[2][2][4], uint32_t w0, uint32_t w1, uint32_t w2,
                                                 uint32_t cb_lo, uint32_t cb_hi, uint32_t k64) {
    uint32_t sel[4];
    sel[0] = w0 & 0x77777777u;
    sel[1] = w1 & 0x77777777u;
    sel[2] = w2 & 0x77777777u;
    sel[3] = ((w0 >> 3) & 0x11111111u) | ((w1 >> 2) & 0x22222222u) | ((w2 >> 1) & 0x44444444u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t q_lo = prmt(cb_lo, cb_hi, sel[i]);        // q bytes of the word's codes 0..3
        const uint32_t q_hi = prmt(cb_lo, cb_hi, sel[i] >> 16);  // codes 4..7
        uint32_t* f = frag[i >> 1][i & 1];
        f[0] = prmt(q_lo, k64, 0x4140u);
        f[1] = prmt(q_lo, k64, 0x4342u);
        f[2] = prmt(q_hi, k64, 0x4140u);
        f[3] = prmt(q_hi, k64, 0x4342u);
    }
}
template <typename Tt>
__device__ __forceinline__ void grid_group(float (&acc)[4], const GroupData<3>& d, const uint4 (&xv)[kGroupBlocks],
                                           uint32_t cb_lo, uint32_t cb_hi) {
    const uint32_t w[12] = {d.w[0].x, d.w[0].y, d.w[0].z, d.w[0].w, d.w[1].x, d.w[1].y,
                            d.w[1].z, d.w[1].w, d.w[2].x, d.w[2].y, d.w[2].z, d.w[2].w};
    const uint32_t a[4] = {d.a.x, d.a.y, d.a.z, d.a.w};
    const uint32_t k64 = 0x64646464u, off[4] = {0xE480E480u, 0xE480E480u, 0xE480E480u, 0xE480E480u};
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // word triple r: blocks 2r, 2r + 1
        uint32_t frag[2][2][4];
        grid_pair_blocks(frag, w[3 * r], w[3 * r + 1], w[3 * r + 2], cb_lo, cb_hi, k64);
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            const int J = 2 * r + b;
            const uint4 x = xv[J];
            float part[4] = {0.f, 0.f, 0.f, 0.f};
            mma16816<Tt>(part, frag[b][0], x.x, x.y);
            mma16816<Tt>(part, frag[b][1], x.z, x.w);
            mma16816<Tt>(part, off, x.x, x.y);
            mma16816<Tt>(part, off, x.z, x.w);
            const int q = 8 * (J % 4);
            const uint32_t v_lo = a[J / 4], v_hi = a[2 + J / 4];  // as block_scales: byte J % 4 to bits 19..26
            const float s_lo = e4m4_scaled_down(q <= 19 ? v_lo << (19 - q) : v_lo >> (q - 19));
            const float s_hi = e4m4_scaled_down(q <= 19 ? v_hi << (19 - q) : v_hi >> (q - 19));
            acc[0] = fmaf(s_lo, part[0], acc[0]);
            acc[1] = fmaf(s_lo, part[1], acc[1]);
            acc[2] = fmaf(s_hi, part[2], acc[2]);
            acc[3] = fmaf(s_hi, part[3], acc[3]);
        }
    }
}

// XS: x read from a shared copy each group (the stream-K kernel's 8 16-byte loads per lane per group) instead of kept in
// registers (the bulk-copy kernel's); XS = 2: only the lanes of token 0 (g = 0) load, the others' registers keep
// whatever they held (they feed MMA columns of tokens that do not exist at M = 1).
__device__ __forceinline__ uint4 lds_token_lanes(const void* p, uint32_t on) {
    uint4 v;
    asm volatile("{\n.reg .pred q;\nsetp.ne.u32 q, %5, 0;\n@q ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n}\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))), "r"(on));
    return v;
}
// XS = 3: one ldmatrix.x4 per block, every row address of matrix q at chunk q (M = 1: the 8 rows are one token's);
// with x stored permuted (chunk q = the 8 columns lane t's register q needs) it lands in the kernel's register order.
__device__ __forceinline__ uint4 ldsm_x4(const void* p) {
    uint4 v;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
    return v;
}
template <int BITS, int WARPS, int SRC, unsigned K2REG, int ILP, int XS = 0>
__global__ void __launch_bounds__(WARPS * 32, 1)
    decode_ceiling(const float* __restrict__ codebook, const uint4* __restrict__ src, float* out, long long* cycles,
                   int iters, unsigned zero) {
    constexpr bool QUAD = BITS == 2;
    constexpr size_t kTable = Lut<BITS, QUAD>::kBytes;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    Lut<BITS, QUAD>::template build<WARPS * 32, T>(codebook);
    // the warp's buffer: kBuf groups of (BITS + 1) x 32 lanes x 16 bytes, after the table
    uint4* buf = reinterpret_cast<uint4*>(g_table + kTable) + size_t(warp) * kBuf * (BITS + 1) * 32;
    // XS: a 4096-column x row after the buffers (16 groups of 512 bytes)
    uint4* xrow = reinterpret_cast<uint4*>(g_table + kTable) + size_t(WARPS) * kBuf * (BITS + 1) * 32;
    for (int i = threadIdx.x; i < 512; i += WARPS * 32) xrow[i] = make_uint4(0x3F803F80u, 0x3F803F80u, 0x3F803F80u, 0x3F803F80u);
    const uint4* s = src + (size_t(blockIdx.x) * WARPS + warp) * kBuf * (BITS + 1) * 32;
    for (int i = 0; i < kBuf * (BITS + 1); ++i) buf[i * 32 + lane] = s[i * 32 + lane];
    __syncthreads();
    LaneCtx<T> ctx = lane_ctx<BITS, QUAD, T>(reinterpret_cast<const T*>(src), 0, 1, 4096);
    if constexpr (K2REG != 0) ctx.cb2 = cb2_regs<T>(Lut<BITS, QUAD>::fetch(codebook));
    uint4 xv[kGroupBlocks];
#pragma unroll
    for (int j = 0; j < kGroupBlocks; ++j) xv[j] = s[j * 32 + lane];  // any bits: a probe
#pragma unroll
    for (int j = 0; j < kGroupBlocks; ++j) {  // finite x: bf16 values in [1, 2)
        xv[j].x = (xv[j].x & 0x007F007Fu) | 0x3F803F80u; xv[j].y = (xv[j].y & 0x007F007Fu) | 0x3F803F80u;
        xv[j].z = (xv[j].z & 0x007F007Fu) | 0x3F803F80u; xv[j].w = (xv[j].w & 0x007F007Fu) | 0x3F803F80u;
    }
    GroupData<BITS> reg[ILP];
#pragma unroll
    for (int k = 0; k < ILP; ++k) {
#pragma unroll
        for (int c = 0; c < BITS; ++c) reg[k].w[c] = buf[(k * (BITS + 1) + c) * 32 + lane];
        reg[k].a = buf[(k * (BITS + 1) + BITS) * 32 + lane];
    }
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    __syncthreads();
    const long long t0 = clock64();
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int k = 0; k < ILP; ++k) {
            GroupData<BITS> d;
            if constexpr (SRC == 1) {
                const uint4* b = buf + ((it * ILP + k) % kBuf) * (BITS + 1) * 32 + lane;
#pragma unroll
                for (int c = 0; c < BITS; ++c) d.w[c] = lds_u128(reinterpret_cast<const char*>(b + c * 32));
                d.a = lds_u128(reinterpret_cast<const char*>(b + BITS * 32));
            } else {
                const unsigned z = zero * unsigned(it);  // 0, unknown to the compiler
#pragma unroll
                for (int c = 0; c < BITS; ++c)
                    d.w[c] = make_uint4(reg[k].w[c].x ^ z, reg[k].w[c].y ^ z, reg[k].w[c].z ^ z, reg[k].w[c].w ^ z);
                d.a = make_uint4(reg[k].a.x ^ z, reg[k].a.y ^ z, reg[k].a.z ^ z, reg[k].a.w ^ z);
            }
            if constexpr (XS == 9) {  // GRID, x in registers
                grid_group<T>(acc, reinterpret_cast<const GroupData<3>&>(d), xv, ctx.lane_op, ctx.table);
            } else if constexpr (XS) {
                const T* xg = reinterpret_cast<const T*>(xrow) + ((it * ILP + k) % 16) * 256 + 8 * (lane & 3);
                uint4 xw[kGroupBlocks];
#pragma unroll
                for (int j = 0; j < kGroupBlocks; ++j)
                    xw[j] = XS == 3   ? ldsm_x4(xg - 8 * (lane & 3) + 32 * j + 8 * (lane >> 3))
                            : XS == 2 ? lds_token_lanes(xg + 32 * j, lane < 4)
                                      : x_chunk<kXShared>(xg + 32 * j);
                decode_group<BITS, QUAD, T, false, false, K2REG, K2REG != 0>(acc, d, xw, ctx);
            } else {
                decode_group<BITS, QUAD, T, false, false, K2REG, K2REG != 0>(acc, d, xv, ctx);
            }
        }
    }
    const long long t1 = clock64();
    out[size_t(blockIdx.x) * WARPS * 32 + threadIdx.x] = acc[0] + acc[1] + acc[2] + acc[3];
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int BITS, int WARPS, int SRC, unsigned K2REG, int ILP, int XS = 0>
void run(const char* name, const float* cb, const uint4* src, float* out, long long* cyc, int iters, int sms) {
    constexpr bool QUAD = BITS == 2;
    const size_t smem = Lut<BITS, QUAD>::kBytes + size_t(WARPS) * kBuf * (BITS + 1) * 32 * 16 + 8192;
    auto k = decode_ceiling<BITS, WARPS, SRC, K2REG, ILP, XS>;
    CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, WARPS * 32, smem));
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, k));
    const int iters_each = iters / ILP;
    k<<<sms, WARPS * 32, smem>>>(cb, src, out, cyc, iters_each, 0u);  // warm-up
    CHECK(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    CHECK(cudaEventRecord(e0));
    k<<<sms, WARPS * 32, smem>>>(cb, src, out, cyc, iters_each, 0u);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaDeviceSynchronize());
    float ms = 0.f;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    std::vector<long long> c(sms);
    CHECK(cudaMemcpy(c.data(), cyc, sizeof(long long) * sms, cudaMemcpyDeviceToHost));
    std::sort(c.begin(), c.end());
    const double weights = double(WARPS) * iters_each * ILP * 4096.0;  // per CTA (one per SM)
    const double w_clk = weights / double(c[sms / 2]);
    const double bits = BITS + 0.25;
    const double tbs = weights * sms * bits / 8.0 / (ms * 1e-3) / 1e12;
    std::printf("%-34s K=%d warps=%2d regs=%3d spill=%3d B  %5.1f w/SM-clk (median CTA; min %5.1f)  = %.2f TB/s of "
                "%.2f-bit weights (wall %.1f us)%s\n",
                name, BITS, WARPS, fa.numRegs, int(fa.localSizeBytes), w_clk, weights / double(c[sms - 1]), tbs, bits,
                ms * 1e3, per_sm < 1 ? "  [does not fit]" : "");
}

int main(int argc, char** argv) {
    const int iters = argc > 1 ? std::atoi(argv[1]) : 2000;
    int dev = 0, sms = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, dev));
    std::printf("%s, %d SMs; %d groups (4096 weights) per warp\n", p.name, sms, iters);
    const size_t words = size_t(sms) * 32 * kBuf * 6 * 32 * 4;
    uint32_t* src;
    float *cb8, *out;
    long long* cyc;
    CHECK(cudaMalloc(&src, words * 4));
    CHECK(cudaMalloc(&out, size_t(sms) * 1024 * 4));
    CHECK(cudaMalloc(&cyc, size_t(sms) * 8));
    // absmax bytes: E4M4 in a modest range (bits 3..6 of the exponent nibble clear: no huge scales)
    fill_bytes<<<264, 256>>>(src, words, 7u, 0xFFFFFFFFu, 0u);
    CHECK(cudaDeviceSynchronize());
    cb8 = linear_codebook(32);
    const uint4* s = reinterpret_cast<const uint4*>(src);
    run<4, 16, 1, 0, 1>("words from smem (bulk-like)", cb8, s, out, cyc, iters, sms);
    run<3, 16, 1, 0, 1>("words from smem (bulk-like)", cb8, s, out, cyc, iters, sms);
    run<2, 16, 1, kBulkK2Reg, 1>("words from smem, K2 block 0 in regs", cb8, s, out, cyc, iters, sms);
    run<2, 16, 1, 0x11u, 1>("words from smem, K2 blocks 0,4 in regs", cb8, s, out, cyc, iters, sms);
    run<2, 16, 1, 0, 1>("words from smem, K2 all by table", cb8, s, out, cyc, iters, sms);
    run<2, 16, 1, 0xFFu, 1>("words from smem, K2 all in regs", cb8, s, out, cyc, iters, sms);
    run<4, 16, 1, 0, 1, 1>("smem words, x from smem (stream-K)", cb8, s, out, cyc, iters, sms);
    run<3, 16, 1, 0, 1, 1>("smem words, x from smem (stream-K)", cb8, s, out, cyc, iters, sms);
    run<2, 16, 1, 0x15u, 1, 1>("smem, x from smem, K2 blocks 0,2,4", cb8, s, out, cyc, iters, sms);
    run<4, 16, 1, 0, 1, 2>("smem words, x by token lanes only", cb8, s, out, cyc, iters, sms);
    run<3, 16, 1, 0, 1, 2>("smem words, x by token lanes only", cb8, s, out, cyc, iters, sms);
    run<2, 16, 1, 0x15u, 1, 2>("smem, x token lanes, K2 0,2,4", cb8, s, out, cyc, iters, sms);
    run<2, 16, 1, 0x01u, 1, 2>("smem, x token lanes, K2 block 0", cb8, s, out, cyc, iters, sms);
    run<4, 16, 1, 0, 1, 3>("smem words, x by ldmatrix.x4", cb8, s, out, cyc, iters, sms);
    run<3, 16, 1, 0, 1, 3>("smem words, x by ldmatrix.x4", cb8, s, out, cyc, iters, sms);
    run<2, 16, 1, 0x15u, 1, 3>("smem, x ldmatrix, K2 0,2,4", cb8, s, out, cyc, iters, sms);
    run<2, 16, 1, 0x01u, 1, 3>("smem, x ldmatrix, K2 block 0", cb8, s, out, cyc, iters, sms);
    run<3, 16, 1, 0, 1, 9>("smem words, int8-grid decode (no table)", cb8, s, out, cyc, iters, sms);
    run<3, 16, 0, 0, 1, 9>("register words, int8-grid decode", cb8, s, out, cyc, iters, sms);
    run<4, 16, 0, 0, 1>("words in registers", cb8, s, out, cyc, iters, sms);
    run<3, 16, 0, 0, 1>("words in registers", cb8, s, out, cyc, iters, sms);
    run<2, 16, 0, 0x11u, 1>("words in registers, K2 blocks 0,4", cb8, s, out, cyc, iters, sms);
    run<4, 16, 1, 0, 2>("smem, 2 groups per round", cb8, s, out, cyc, iters, sms);
    run<3, 16, 1, 0, 2>("smem, 2 groups per round", cb8, s, out, cyc, iters, sms);
    run<4, 8, 1, 0, 1>("words from smem, 8 warps", cb8, s, out, cyc, iters, sms);
    run<3, 8, 1, 0, 1>("words from smem, 8 warps", cb8, s, out, cyc, iters, sms);
    run<4, 24, 1, 0, 1>("words from smem, 24 warps", cb8, s, out, cyc, iters, sms);
    run<3, 24, 1, 0, 1>("words from smem, 24 warps", cb8, s, out, cyc, iters, sms);
    run<3, 32, 1, 0, 1>("words from smem, 32 warps", cb8, s, out, cyc, iters, sms);
    return 0;
}
