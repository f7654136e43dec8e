#pragma once
// kbit decode GEMV for a few tokens (M <= 8), its weights streamed by bulk copies (the TMA engine) in the
// "x-stationary" order: y[M, N] = x[M, K_in] @ W^T.
//
// Why: the stream-K kernel (tiled/gemv.cuh) streams each warp's unit range through registers. With the decode
// replaced by an XOR that access pattern reads ~71% of HBM bandwidth at K = 2 and ~88% at K = 4; one bulk copy
// stream per CTA reads 89% and 92% (benchmarks/journal/2026-11-27_bulk_copies_and_allreduce_prefetch.md). Bytes
// that land in shared memory must be read back through the shared-memory pipe, which the decode's table lookups
// already load, so this kernel takes x off that pipe: warp w always decodes group 16 h + w of a tile (slice h), so
// its x (8 blocks, 32 registers) is loaded once per slice and stays in registers. Measured against the stream-K
// kernel (H100, cold): K = 4 8192x29568 51.7 -> 48.7 us, 28672x8192 -3.3%, 4096x28672 -1.6%; K = 2 28672x8192
// -18.5% (its x, 56 KB, is past what the stream-K kernel stages); K = 3 and K = 2 with x staged lose or tie. In the
// decode layers, under PDL, a CTA's weights are all in flight before the wait and it wins more widely (Llama-3-8B
// b1: kbit4 432.5 -> 453.1 tok/s). lowbit/kernels/tiled.py: bulk_ctas picks where it runs.
//
// Layout of the work: the CTA-local cut of tiles (CTA c owns tiles [t0, t1), tiles.begin). Stage s of a CTA holds
// UPW tiles' chunks of one slice (the slice's <= 16 groups of a tile are contiguous units: one bulk copy of codes,
// one of absmax per tile). A ring of `ring` stages, each with a `full` mbarrier (the copies' bytes) and an `empty`
// one (16 warp arrivals): thread 0 issues the first `ring` stages; after that, stage s + ring is issued into stage s's
// slot by the warp that reads stage s last (a shared counter per slot elects it), so no warp waits for a producer that
// is itself behind. (Refilled by warp 0's thread 0 as it passed, the ring ran dry behind that warp, the slowest: ncu
// put 17% of the warps' stall samples on the full-barrier wait at 58% of HBM bandwidth. H100, cold, us, warp 0 ->
// last reader: 8192x29568 K = 3 49.06 -> 41.40, 4096x28672 K = 3 26.81 -> 23.82, K = 4 26.31 -> 25.80, 14336x4096
// K = 4 16.93 -> 16.21; Llama-3-8B b1 kbit4 446.7 -> 466.3 tok/s; benchmarks/journal/2026-11-27_bulk_ring_relay.md.)
// Each warp adds its unit's partial sums into a shared [tile][warp][16 rows][M tokens] fp32 array (its own slot: no
// race); at the end one thread per output sums the warps in warp order (deterministic) and writes y. Tokens are the
// MMA's N (lane g reads token min(g, M - 1)'s x), so M tokens cost the decode and the MMAs of one; only the partial
// sums grow with M (1 KB per tile and token), and a shape whose ring then no longer fits takes another kernel.
// Unrotated kbit only.
// EPI: the decode step's glue (gemv.cuh's Epilogue, without SwiGLU): the input norm's factor from rms_x, summed by
// the CTA after the PDL wait; the residual and the next norm's weight, loaded into the writing threads' registers
// right after the wait (they are the threads' own output rows), added and applied where y is written.
// SWI (with EPI): y = silu(round(gate)) * round(up), the weight's rows [gate; up] (n / 2 each, n % 32 == 0), as the
// stream-K kernel's SwiGLU epilogue: the CTAs cut the tile pairs (gate tile j, up tile j + n_tiles / 2), a CTA's
// local tiles are its gate tiles then its up tiles, and each output sums both halves' partials.
// PDL: the table, the barriers and the first `prewait` stages' copies (one token: the whole ring; more: one stage,
// bulk_prewait) come before griddepcontrol.wait; x, the epilogue's tensors and y after.
#include "tiled/gemv.cuh"

namespace lowbit {
namespace gemv {

// Stages of the ring at most (its mbarriers are static). Kept at 8 under a two-stage default: a build with the
// arrays sized 2 (and no `prewait`) ran Llama-3-8B kbit4 b1 at 531.5 tok/s against this form's 564.8, reproducibly,
// not yet understood. Not the ring's alignment: that build's ring began at 80 / 48 bytes mod 128 and this form's at
// 64 / 32; moving it to a 128-byte boundary (kBulkRingAlign) bought 0.8%.
constexpr int kBulkMaxRing = 8;
// The ring's depth where it fits: one stage being read while the next lands. Deeper rings were slower on every shape
// and K measured (H200, cold, PDL, M = 1, us, as many as fit (3-6) -> 2: K = 4 14336x4096 12.00 -> 11.28, 4096x6144
// 6.46 -> 5.91, 4096x28672 18.51 -> 17.99; K = 3 14336x4096 12.37 -> 11.12; K = 2 4096x28672 15.93 -> 15.13; M = 4
// 14336x4096 14.16 -> 12.79; Llama-3-8B kbit4 b1 548.7 -> 564.8 tok/s; benchmarks/journal/2026-11-28_bulk_ring_depth.md).
// Two stages of K = 4 hold ~2 us of an SM's share of HBM bandwidth.
constexpr int kBulkRing = 2;
constexpr int kBulkMaxM = kRmsRows;       // tokens at most: the MMA's N
constexpr int kBulkSlice = kStreamWarps;  // groups per slice: one per warp

// K = 2: two tiles per stage (half the stage handshakes per byte); K >= 3: one (measured best per K in the probe).
template <int BITS> constexpr int kBulkTiles = BITS == 2 ? 2 : 1;
// K = 2: with x out of the shared-memory pipe the table has room again: one block of a group decoded in registers.
constexpr unsigned kBulkK2Reg = 0x01u;

template <int BITS> __host__ __device__ constexpr size_t bulk_code_bytes() { return size_t(BITS) * 512; }
// one tile's slice: 16 units' codes, then their absmax
template <int BITS> __host__ __device__ constexpr size_t bulk_chunk_bytes() {
    return kBulkSlice * (bulk_code_bytes<BITS>() + 128);
}
template <int BITS> __host__ __device__ constexpr size_t bulk_stage_bytes() { return kBulkTiles<BITS> * bulk_chunk_bytes<BITS>(); }
// The ring starts at a 128-byte shared address. The dynamic area follows the static one, 16-byte aligned only, so the
// kernel moves the ring up to the next multiple of 128 and the launch asks for this much more. (H200, Llama-3-8B kbit4
// b1, alternated on one machine: 562.9, 562.8 -> 566.9, 568.2 tok/s; the 2026-11-28_bulk_ring_align entry.)
constexpr size_t kBulkRingAlign = 128;
// dynamic shared memory: the table, the partial sums of at most `cta_tiles` tiles and m tokens, then (from the next
// 128-byte shared address) the ring
template <int BITS> __host__ __device__ constexpr size_t bulk_ring_offset(int cta_tiles, int m) {
    return stream_table_bytes<BITS>() + size_t(cta_tiles) * m * kStreamWarps * 16 * sizeof(float);
}
template <int BITS> __host__ __device__ constexpr size_t bulk_smem_bytes(int cta_tiles, int m, int ring) {
    return bulk_ring_offset<BITS>(cta_tiles, m) + kBulkRingAlign + size_t(ring) * bulk_stage_bytes<BITS>();
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b)) : "memory");
}
// Wait until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred p;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT_%=;\n}\n" ::"r"(smem_u32(b)), "r"(parity) : "memory");
}
// The same without waiting: has it completed?
__device__ __forceinline__ bool mbar_done(uint64_t* b, uint32_t parity) {
    uint32_t ok;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok) : "r"(smem_u32(b)), "r"(parity) : "memory");
    return ok != 0;
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) global -> shared, counted on `bar`'s transaction count.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}
// The ring's barriers, by one thread (a CTA barrier then publishes them): each slot's `full` (one arrival, plus the
// copies' bytes) and `empty` (one arrival per warp), and its count of readers.
__device__ __forceinline__ void ring_init(uint64_t* full, uint64_t* empty, unsigned* readers, int ring) {
    for (int s = 0; s < ring; ++s) {
        mbar_init(&full[s], 1);
        mbar_init(&empty[s], kStreamWarps);
        readers[s] = 0;
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ uint4 lds_u128(const char* p) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(smem_u32(p)));
    return v;
}

// MULTI: m may exceed 1. Its instances index the partial sums by token; the one-token ones fold m = 1 in: their hot
// loop stays as short as it was (in the decode-bound one-token step, a few instructions per stage cost ~4% end to end).
template <int BITS, typename T, bool EPI, bool SWI = false, bool MULTI = false>
__global__ void __launch_bounds__(kStreamWarps * 32, 1) kbit_bulk_gemv_kernel(
    const T* __restrict__ x, const uint4* __restrict__ qweight, const uint4* __restrict__ qabsmax,
    const float* __restrict__ codebook, const float* __restrict__ scale_ptr, T* __restrict__ y, const T* __restrict__ bias,
    int m, int n, int k_in, int n_groups, StreamK tiles, int ring, int prewait, const Epilogue<T> epi) {
    constexpr bool QUAD = kStreamQuad<BITS>();
    constexpr unsigned K2REG = QUAD ? kBulkK2Reg : 0u;
    constexpr int UPW = kBulkTiles<BITS>;
    constexpr size_t kCode = bulk_code_bytes<BITS>(), kChunk = bulk_chunk_bytes<BITS>(), kStage = bulk_stage_bytes<BITS>();
    __shared__ __align__(8) uint64_t full[kBulkMaxRing], empty[kBulkMaxRing];
    __shared__ unsigned readers[kBulkMaxRing];  // warps done reading each slot, counted up for good
    __shared__ float rms_part[EPI ? kStreamWarps : 1][kRmsRows];  // EPI: the input norm's per-warp sums of squares
    __shared__ float rms_f[kRmsRows];  // EPI: the tokens' norm factors (static shared memory must stay under 1 KB)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    static_assert(!SWI || EPI, "SwiGLU is an epilogue");
    if constexpr (!MULTI) m = 1;  // a constant from here on
    // tiles (SWI: tile pairs) [t0, t0 + owned); local tile k is global tile gtile(k) (SWI: the gates, then the ups)
    const int t0 = tiles.begin(blockIdx.x), owned = tiles.begin(blockIdx.x + 1) - t0;
    const int cta_tiles = SWI ? 2 * owned : owned, pairs = (n + 31) / 32;
    auto gtile = [&](int k) { return SWI && k >= owned ? pairs + t0 + (k - owned) : t0 + k; };
    const int per_slice = (cta_tiles + UPW - 1) / UPW;  // stages per slice
    const int stages = (n_groups + kBulkSlice - 1) / kBulkSlice * per_slice;
    // [cta_tiles][16 warps][16 rows][m tokens]: a warp's stores of one fragment element hit 16 distinct banks at m = 4
    float* part = reinterpret_cast<float*>(g_table + stream_table_bytes<BITS>());
    char* ring_base = g_table + bulk_ring_offset<BITS>((SWI ? 2 : 1) * (tiles.q + (tiles.r > 0)), m);
    ring_base += (kBulkRingAlign - smem_u32(ring_base) % kBulkRingAlign) % kBulkRingAlign;
    const char* qw_b = reinterpret_cast<const char*>(qweight);
    const char* qa_b = reinterpret_cast<const char*>(qabsmax);
    if (threadIdx.x == 0) ring_init(full, empty, readers, ring);
    const float cb = Lut<BITS, QUAD>::fetch(codebook);
    __syncthreads();  // the barriers exist
    auto issue = [&](int s) {  // stage s into slot s % ring: its tiles' chunks of slice h
        const int slot = s % ring, h = s / per_slice, k0 = (s - h * per_slice) * UPW;
        const int cnt = min(UPW, cta_tiles - k0), gs = min(kBulkSlice, n_groups - h * kBulkSlice);
        char* st = ring_base + size_t(slot) * kStage;
        mbar_expect_tx(&full[slot], uint32_t(cnt * gs * (kCode + 128)));
        for (int i = 0; i < cnt; ++i) {
            const int64_t u = int64_t(gtile(k0 + i)) * n_groups + h * kBulkSlice;  // first unit of the chunk
            bulk_copy(st + i * kChunk, qw_b + u * kCode, uint32_t(gs * kCode), &full[slot]);
            bulk_copy(st + i * kChunk + kBulkSlice * kCode, qa_b + u * 128, uint32_t(gs * 128), &full[slot]);
        }
    };
    if (threadIdx.x == 0)
        for (int s = 0; s < prewait && s < stages; ++s) issue(s);
    Lut<BITS, QUAD>::template store<kStreamWarps * 32, T>(cb);
    const CbRegs cb2 = K2REG ? cb2_regs<T>(cb) : CbRegs{};
    const float scale = *scale_ptr;
    __syncthreads();  // the table
    pdl_wait();  // x, the epilogue's tensors and y belong to the stream order
    pdl_launch_dependents();
    if (threadIdx.x == 0)
        for (int s = prewait; s < ring && s < stages; ++s) issue(s);
    // EPI: this thread's output's residual and norm weight, in registers long before the store (one pass of the
    // final loop covers every output when the CTA has <= 512 of them, token-major; beyond, write_out loads them there)
    const int out_rows = cta_tiles * 16;
    const bool pre = EPI && !SWI && m * out_rows <= kStreamWarps * 32;
    const int my_tok = MULTI ? int(threadIdx.x) / out_rows : 0, my_row = t0 * 16 + int(threadIdx.x) - my_tok * out_rows;
    T res = from_float<T>(0.f), nw = res;
    if (pre && int(threadIdx.x) < m * out_rows && my_row < n) {
        if (epi.residual != nullptr) res = epi.residual[int64_t(my_tok) * n + my_row];
        if (epi.yw != nullptr) nw = epi.norm_w[my_row];
    }
    LaneCtx<T> ctx = lane_ctx<BITS, QUAD, T>(x, k_in, m, k_in);
    if constexpr (K2REG != 0) ctx.cb2 = cb2;
    uint4 xv[kGroupBlocks];
    auto to_decode_order = [&] {  // K2REG: the register decode's order of x
#pragma unroll
        for (int j = 0; j < kGroupBlocks; ++j)
            if ((K2REG >> j) & 1) xv[j] = cb2_x(xv[j]);
    };
    // Slice 0's x is requested before the norm's statistics read rms_x, so that both wait on one L2 round trip (one
    // after the other, they were two on the path from the previous kernel's end to this one's first decode).
    if (warp < n_groups) load_x<kXCoherent>(xv, ctx, warp);
    if (EPI && epi.rms_x != nullptr) rms_partials<kStreamWarps>(rms_part, epi.rms_x, m, k_in);  // published below
    to_decode_order();
    int h = 0, k0 = 0, slot = 0;
    uint32_t phase = 0;
    for (int s = 0; s < stages; ++s) {
        const int cnt = min(UPW, cta_tiles - k0), gs = min(kBulkSlice, n_groups - h * kBulkSlice);
        const bool active = warp < gs;  // the last slice may have fewer groups than warps
        if (k0 == 0 && h > 0 && active) {  // a new slice: this warp's group's x
            load_x<kXCoherent>(xv, ctx, h * kBulkSlice + warp);
            to_decode_order();
        }
        mbar_wait(&full[slot], phase);
        const char* st = ring_base + size_t(slot) * kStage;
        GroupData<BITS> d[UPW];
        if (active) {
#pragma unroll
            for (int i = 0; i < UPW; ++i) {
                if (i < cnt) {
                    const char* c = st + i * kChunk;
#pragma unroll
                    for (int b = 0; b < BITS; ++b) d[i].w[b] = lds_u128(c + ((warp * BITS + b) * 32 + lane) * 16);
                    d[i].a = lds_u128(c + kBulkSlice * kCode + (warp * 8 + g) * 16);
                }
            }
        }
        __syncwarp();
        if (lane == 0) {  // the words are in registers: the slot may be refilled, by the warp that reads it last
            mbar_arrive(&empty[slot]);
            if (atomicAdd(&readers[slot], 1u) % kStreamWarps == kStreamWarps - 1 && s + ring < stages) {
                mbar_wait(&empty[slot], phase);  // every warp's arrival (each arrived before it counted)
                issue(s + ring);
            }
        }
        if (active) {
#pragma unroll
            for (int i = 0; i < UPW; ++i) {
                if (i < cnt) {
                    float acc[4] = {0.f, 0.f, 0.f, 0.f};
                    decode_group<BITS, QUAD, T, false, false, K2REG, K2REG != 0>(acc, d[i], xv, ctx);
                    float* p = part + ((k0 + i) * kStreamWarps + warp) * 16 * m;
                    if constexpr (MULTI) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) {  // acc[e]: row g + 8 (e >> 1), token 2t + (e & 1)
                            const int tok = 2 * t + (e & 1);
                            if (tok < m) {
                                float& o = p[(g + 8 * (e >> 1)) * m + tok];
                                o = h == 0 ? acc[e] : o + acc[e];
                            }
                        }
                    } else if (t == 0) {  // token 0: rows g (acc[0]) and g + 8 (acc[2])
                        p[g] = h == 0 ? acc[0] : p[g] + acc[0];
                        p[g + 8] = h == 0 ? acc[2] : p[g + 8] + acc[2];
                    }
                }
            }
        }
        k0 += UPW;
        if (k0 >= cta_tiles) {
            k0 = 0;
            ++h;
        }
        if (++slot == ring) {
            slot = 0;
            phase ^= 1u;
        }
    }
    __syncthreads();  // every partial sum stored (and EPI's sums of squares)
    // EPI with rms_x: warp 0 sums the tokens' norm factors once (not once per output: the summation and the division
    // at every store of a MULTI instance were most of its tail), and tile_sum issues its 16 loads together (the loop
    // ran 4 at a time). H200, Llama-3-8B kbit4 b4 1792 -> 1815 tok/s, b1 534.1 -> 536.5
    // (benchmarks/journal/2026-11-28_bulk_tail_and_h200_recheck.md).
    const bool rms = EPI && epi.rms_x != nullptr;
    if (rms) {
        if (warp == 0) rms_factors<kStreamWarps>(rms_f, rms_part, m, k_in, epi.eps);
        __syncthreads();
    }
    auto factor = [&](int tok) { return rms ? rms_f[MULTI ? tok : 0] * scale : scale; };  // times the scale
    const int warps_used = n_groups < kStreamWarps ? n_groups : kStreamWarps;  // slice 0 had a group for each
    auto tile_sum = [&](int k, int r, int tok) {  // local tile k's row r for a token, summed in warp order
        const float* p = part + (k * kStreamWarps * 16 + r) * m + tok;
        float v[kStreamWarps];
#pragma unroll
        for (int w = 0; w < kStreamWarps; ++w) v[w] = w < warps_used ? p[w * 16 * m] : 0.f;  // every load in flight
        float sum = 0.f;  // (+0 for absent warps: the same bits)
#pragma unroll
        for (int w = 0; w < kStreamWarps; ++w) sum += v[w];
        return sum;
    };
    if constexpr (SWI) {  // every row exists (n % 32 == 0); y is [m, n / 2]
        const int rows = owned * 16;
        for (int o = threadIdx.x; o < m * rows; o += kStreamWarps * 32) {
            const int tok = MULTI ? o / rows : 0, lr = o - tok * rows, k = lr >> 4, r = lr & 15;
            const int row = (t0 + k) * 16 + r, up_row = (pairs + t0 + k) * 16 + r;
            const float f = factor(tok);
            const float gv =
                to_float(from_float<T>(fmaf(tile_sum(k, r, tok) * kGemvOutFix<false>, f, bias_of(bias, row))));
            const float uv =
                to_float(from_float<T>(fmaf(tile_sum(owned + k, r, tok) * kGemvOutFix<false>, f, bias_of(bias, up_row))));
            y[int64_t(tok) * (pairs * 16) + row] = from_float<T>(silu_mul(gv, uv));
        }
    } else {
        for (int o = threadIdx.x; o < m * out_rows; o += kStreamWarps * 32) {
            const int tok = MULTI ? o / out_rows : 0, lr = o - tok * out_rows, k = lr >> 4, r = lr & 15;
            const int row = (t0 + k) * 16 + r;
            if (row >= n) continue;
            // one fused multiply-add, written out, in every instance: a zero residual gives the plain GEMV's bits
            const float v = fmaf(tile_sum(k, r, tok) * kGemvOutFix<false>, factor(tok), bias_of(bias, row));
            const int64_t idx = int64_t(tok) * n + row;
            if constexpr (EPI) {
                if (pre) write_out_staged(y, epi, idx, v, res, nw);
                else write_out(y, epi, idx, row, v);
            } else {
                y[idx] = from_float<T>(v);
            }
        }
    }
}

// Stages of the ring for an N x K_in weight and m tokens on `ctas` CTAs (one per SM, at most one per tile; swi: per
// tile pair); 0: it does not fit (fewer than two stages beside the table and the partial sums) or m is out of range.
template <int BITS>
int bulk_gemv_ring(int n, int ctas, int swi, int m) {
    if ((swi && n % 32) || m < 1 || m > kBulkMaxM) return 0;
    const int owned = swi ? n / 32 : (n + 15) / 16;  // what the CTAs cut: tiles, or tile pairs
    if (ctas < 1 || ctas > owned) return 0;
    const int max_tiles = (swi ? 2 : 1) * (owned / ctas + (owned % ctas > 0));
    const int64_t room = int64_t(dynamic_smem_limit()) - int64_t(bulk_smem_bytes<BITS>(max_tiles, m, 0));
    const int64_t r = room > 0 ? room / int64_t(bulk_stage_bytes<BITS>()) : 0;
    return r < 2 ? 0 : int(r < kBulkMaxRing ? r : kBulkMaxRing);
}

// Stages a launch requests before its PDL wait: one token, the whole ring (its weights are in flight while the
// kernel before it ends); more, only the first. Several tokens' x loads put M times the requests into the load pipe
// right after the wait, and there they queued behind the ring's other copies (ncu: the loop's entry waited on them,
// benchmarks/journal/2026-11-28_bulk_entry_and_step_b4.md). H200, K = 4, M = 4, cold, PDL, us, 2 -> 1 stage:
// 4096x4096 5.58 -> 5.05, 14336x4096 12.65 -> 12.35, 4096x28672 and 8192x29568 tied; Llama-3-8B kbit4 b4 1882.1 /
// 1888.2 -> 1894.4 / 1895.1 tok/s (benchmarks/journal/2026-11-29_bulk_prewait_and_k3_rule.md).
inline int bulk_prewait(int m, int ring) { return m > 1 ? 1 : ring; }

// 1 <= m <= kBulkMaxM tokens; flags: kFlagPdl only (rotated weights have no instance here); epi: the glue (null:
// none; SwiGLU with nothing else, on n % 32 == 0 rows; y then [m, n / 2]).
template <int BITS, typename T>
int launch_bulk_gemv(const void* x, const void* qweight, const void* qabsmax, const float* codebook, const float* scale,
                     void* y, const void* bias, int m, int n, int k_in, int ctas, int flags, const lowbit_epilogue* epi,
                     void* stream) {
    if (m < 1 || m > kBulkMaxM || k_in < 32 || k_in % 32 || n < 1 || (flags & ~kFlagPdl))
        return static_cast<int>(cudaErrorInvalidValue);
    const bool swi = epi != nullptr && epi->swiglu;
    if (swi && (epi->residual != nullptr || epi->yw != nullptr || epi->norm_weight != nullptr))
        return static_cast<int>(cudaErrorInvalidValue);
    int ring = bulk_gemv_ring<BITS>(n, ctas, swi, m);
    if (ring == 0) return static_cast<int>(cudaErrorInvalidValue);
    // The ring's depth (kBulkRing; LOWBIT_BULK_RING, 2..kBulkMaxRing, overrides it where it fits) and the stages
    // requested before the PDL wait (bulk_prewait; LOWBIT_BULK_PREWAIT, 1..ring, overrides it): knobs for measuring
    // on a new GPU.
    static const int ring_env = env_int("LOWBIT_BULK_RING"), pre_env = env_int("LOWBIT_BULK_PREWAIT");
    const int depth = ring_env >= 2 ? ring_env : kBulkRing;
    if (depth < ring) ring = depth;
    const int prewait = pre_env > 0 ? (pre_env < ring ? pre_env : ring) : bulk_prewait(m, ring);
    const int n_tiles = (n + 15) / 16, n_groups = (k_in + 255) / 256, owned = swi ? n_tiles / 2 : n_tiles;
    if (int64_t(n_tiles) * n_groups >= (int64_t(1) << 31)) return static_cast<int>(cudaErrorInvalidValue);
    const StreamK tiles{owned / ctas, owned % ctas};
    const size_t smem = bulk_smem_bytes<BITS>((swi ? 2 : 1) * (tiles.q + (tiles.r > 0)), m, ring);
    auto kernel = kbit_bulk_gemv_kernel<BITS, T, false>;  // <EPI, SWI, MULTI>
    if (m == 1 && swi) kernel = kbit_bulk_gemv_kernel<BITS, T, true, true>;
    else if (m == 1 && epi != nullptr) kernel = kbit_bulk_gemv_kernel<BITS, T, true>;
    else if (swi) kernel = kbit_bulk_gemv_kernel<BITS, T, true, true, true>;
    else if (epi != nullptr) kernel = kbit_bulk_gemv_kernel<BITS, T, true, false, true>;
    else if (m > 1) kernel = kbit_bulk_gemv_kernel<BITS, T, false, false, true>;
    if (int err = configure(kernel, size_t(dynamic_smem_limit()))) return err;  // one attribute: the most any call takes
    Launch l(ctas, kStreamWarps * 32, smem, stream, flags & kFlagPdl);
    const cudaError_t err = cudaLaunchKernelEx(&l.cfg, kernel, static_cast<const T*>(x), static_cast<const uint4*>(qweight),
                                               static_cast<const uint4*>(qabsmax), codebook, scale, static_cast<T*>(y),
                                               static_cast<const T*>(bias), m, n, k_in, n_groups, tiles, ring, prewait,
                                               epilogue_of<T>(epi));
    if (err != cudaSuccess) return static_cast<int>(err);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace gemv
}  // namespace lowbit
