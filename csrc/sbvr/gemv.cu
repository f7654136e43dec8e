// SBVR's kernels (lowbit/formats/sbvr): the authors' popcount GEMV on the binary tensor cores, the
// activation encoder it needs, and a dequantize for the weight-only path (cuBLAS above M = 8).
//
// The popcount GEMV. A weight group is num_sums bitvectors w_j and coefficients c_j; the activations
// of a group are rounded to 8-bit integers q = sum_l 2^l x_l (x ~ m + s q). The group's product is
//     sum_j c_j (s sum_l 2^l popc(w_j & x_l) + m popc(w_j)),
// and one mma.m16n8k128.b1.and.popc computes the popcounts of 16 rows x 128 inputs of one plane j
// against the 8 bit-planes x_0 .. x_7 of one token (its 8 columns). The zero-point term popc(w_j)
// needs no column: each lane counts its own weight words (once per chunk, shared by the tokens) and
// the quad's final sum adds them up. (The authors spend a column on it and keep 7 activation bits.)
// No weight is ever decoded: the bitvectors go from DRAM straight into the MMA, which is why this
// path can keep up with HBM at M = 1. Its work grows with M (one MMA and one epilogue per plane and
// token), the weight-only path's does not: the dispatcher measures where they cross.
//
// Layouts (lowbit/formats/sbvr/tiled.py): 16-row tiles x 128-input chunks; lane (g, t) of a warp
// holds rows g and g + 8, word t of the chunk -- the b1 MMA's A fragment. Groups smaller than 128
// (64, 32) are one MMA each with the other lanes' words zeroed; larger groups (multiples of 128)
// span several chunks. The activations use groups of min(group, 128) so every MMA sees one (s, m).
#include <cstdint>

#include "../common.cuh"

namespace lowbit {
namespace sbvr {

constexpr int kChunk = 128;     // inputs per MMA
constexpr int kActBits = 8;     // activation bit-planes = the MMA's 8 columns
constexpr int kMaxWarps = 16;

__device__ __forceinline__ void bmma_and_popc(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
    asm volatile(
        "mma.sync.aligned.m16n8k128.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(b));
}

__device__ __forceinline__ float warp_min(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fminf(v, __shfl_xor_sync(kFullMask, v, o));
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
    return v;
}

// One warp per (token, chunk): x -> 8 bit-plane words x 4 (xq [m][chunks][8][4]) and per activation
// group (ag = 32, 64 or 128 inputs) xs [m][k / ag][2] = (s, m). Rounding as encode_activations:
// s = (hi - lo) / 255 (1 for a constant group), q = rint((x - lo) / s) clamped -- the same IEEE fp32
// operations, so q and s are bit-exact with the reference. A group with a NaN or Inf gets s = NaN: the
// product is NaN, as x @ W^T would be.
template <typename T>
__global__ void encode_x_kernel(const T* __restrict__ x, uint32_t* __restrict__ xq, float* __restrict__ xs, int m,
                                int k, int ag) {
    const int chunks = (k + kChunk - 1) / kChunk;
    const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    if (warp >= int64_t(m) * chunks) return;
    const int lane = threadIdx.x % 32, token = int(warp / chunks), c = int(warp % chunks);
    const T* xr = x + int64_t(token) * k;
    float v[4], lo[4], hi[4];
    bool bad[4];  // a NaN or Inf in the word: fminf/fmaxf would drop a NaN, so it is tracked apart
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const int e = c * kChunk + 32 * t + lane;
        const bool valid = c * kChunk + 32 * t < k;  // k % 32 == 0: whole words are in or out
        v[t] = valid ? to_float(xr[e]) : 0.f;
        lo[t] = warp_min(valid ? v[t] : INFINITY);
        hi[t] = warp_max(valid ? v[t] : -INFINITY);
        bad[t] = __any_sync(kFullMask, valid && !isfinite(v[t]));
    }
    const int words = ag / 32;  // words per activation group: 1, 2 or 4
    const float lo2[2] = {fminf(lo[0], lo[1]), fminf(lo[2], lo[3])}, hi2[2] = {fmaxf(hi[0], hi[1]), fmaxf(hi[2], hi[3])};
    const float lo4 = fminf(lo2[0], lo2[1]), hi4 = fmaxf(hi2[0], hi2[1]);
    const bool bad2[2] = {bad[0] || bad[1], bad[2] || bad[3]}, bad4 = bad2[0] || bad2[1];
    uint32_t out = 0;           // lane (l, t) writes plane l, word t
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const bool valid = c * kChunk + 32 * t < k;
        const int first = t / words * words;  // the group's first word
        const float glo = words == 1 ? lo[t] : words == 2 ? lo2[t / 2] : lo4;
        const float ghi = words == 1 ? hi[t] : words == 2 ? hi2[t / 2] : hi4;
        float s = (ghi - glo) / float((1 << kActBits) - 1);
        s = s > 0.f ? s : 1.f;
        if (words == 1 ? bad[t] : words == 2 ? bad2[t / 2] : bad4) s = __int_as_float(0x7fc00000);  // NaN in, NaN out
        const float q = fminf(fmaxf(rintf((v[t] - glo) / s), 0.f), float((1 << kActBits) - 1));
        const uint32_t qi = valid ? uint32_t(q) : 0u;
#pragma unroll
        for (int l = 0; l < kActBits; ++l) {
            const uint32_t word = __ballot_sync(kFullMask, (qi >> l) & 1u);
            if (lane == l * 4 + t) out = word;
        }
        if (t == first && valid && lane < 2) {
            const int64_t gi = (int64_t(c) * kChunk + 32 * t) / ag;
            xs[(int64_t(token) * (k / ag) + gi) * 2 + lane] = lane == 0 ? s : glo;
        }
    }
    xq[(int64_t(token) * chunks + c) * 32 + lane] = out;
}

template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// Loads of the lane's 2 * NS bitvector words (rows g, g + 8: planes 0..NS-1 each), streamed.
template <int NS>
__device__ __forceinline__ void load_bits(uint32_t (&a)[2 * NS], const uint32_t* p) {
    if constexpr ((2 * NS) % 4 == 0) {
#pragma unroll
        for (int i = 0; i < 2 * NS / 4; ++i) {
            const uint4 v = ld_stream(reinterpret_cast<const uint4*>(p) + i);
            a[4 * i] = v.x, a[4 * i + 1] = v.y, a[4 * i + 2] = v.z, a[4 * i + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < NS; ++i) {
            uint32_t lo, hi;
            asm volatile("ld.global.L1::no_allocate.v2.u32 {%0,%1}, [%2];\n" : "=r"(lo), "=r"(hi) : "l"(p + 2 * i));
            a[2 * i] = lo, a[2 * i + 1] = hi;
        }
    }
}

// A coefficient line (8 fp16, NS used): loaded raw (so it can be fetched a chunk ahead), then as floats.
__device__ __forceinline__ uint4 load_line(const uint4* cache8, uint32_t line) { return __ldg(cache8 + line); }
template <int NS>
__device__ __forceinline__ void unpack_line(float (&c)[NS], const uint4& v) {
    const __half* h = reinterpret_cast<const __half*>(&v);
#pragma unroll
    for (int j = 0; j < NS; ++j) c[j] = __half2float(h[j]);
}
template <int NS>
__device__ __forceinline__ void load_coeffs(float (&c)[NS], const uint4* cache8, uint32_t line) {
    unpack_line<NS>(c, load_line(cache8, line));
}

// A count (non-negative, < 2^23) as a float in two full-rate instructions (I2F is quarter rate).
__device__ __forceinline__ float count_to_float(int v) {
    return __uint_as_float(uint32_t(v) | 0x4B000000u) - 8388608.f;
}

// Everything a chunk's first weight group needs, loaded one chunk ahead (software pipeline): the
// bitvectors (DRAM), the activation planes and (s, m) of each token and the two rows' coefficient
// lines (L2/L1). The line indices themselves are fetched two chunks ahead, so no load waits on another.
template <int NS, int M>
struct Stage {
    uint32_t a[2 * NS];
    uint32_t b[M];
    float2 sm[M];
    uint4 c_lo, c_hi;
};

template <int NS, int M>
__device__ __forceinline__ void load_stage(Stage<NS, M>& st, const uint32_t* qb, const uint4* cache8,
                                           const uint32_t* xq, const float2* xs, int c, int chunks, int n_act,
                                           int ai, uint32_t lines, int lane, int m_rows) {
    load_bits<NS>(st.a, qb + c * 64 * NS);
#pragma unroll
    for (int mt = 0; mt < M; ++mt) {
        if (mt < m_rows) {
            st.b[mt] = __ldg(xq + (mt * chunks + c) * 32 + lane);
            st.sm[mt] = __ldg(xs + mt * n_act + ai);
        }
    }
    st.c_lo = load_line(cache8, lines & 0xFFFFu);
    st.c_hi = load_line(cache8, lines >> 16);
}

// One 16-row tile of the product for up to M rows of x (m_rows of them real): the CTA's warps split the
// chunks (warp w: chunks w, w + W, ...) and reduce in shared memory in a fixed order (deterministic).
// Per weight group in a chunk and token: NS MMAs. Lane (g, t) gets the counts of columns (bit-planes)
// 2t and 2t + 1, which weigh s 4^t (1, 2): one integer d0 + 2 d1 per plane and row, times c_j, summed
// over the planes, times s 4^t. `qbits`, `qidx` and `cache8` point at this weight's (expert's) data,
// `xq`, `xs` and `y` at the first row.
template <int NS, int M, typename T>
__device__ __forceinline__ void tile_gemv(const uint32_t* __restrict__ qbits, const uint32_t* __restrict__ qidx,
                                          const uint4* __restrict__ cache8, const uint32_t* __restrict__ xq,
                                          const float2* __restrict__ xs, const T* __restrict__ bias,
                                          T* __restrict__ y, int n, int k, int group, int tile, int m_rows,
                                          float (&red)[kMaxWarps][M][16]) {
    const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    // group is a power of two (lowbit/formats/sbvr/definition.py): group and chunk indices by shifts
    const int lg = __ffs(group) - 1, lag = lg < 7 ? lg : 7;  // log2 of the group and the activation group
    const int chunks = (k + kChunk - 1) / kChunk, n_groups = k >> lg, n_act = k >> lag;
    const int parts = lg < 7 ? 1 << (7 - lg) : 1, lpw = lg < 7 ? lg - 5 : 2;  // parts per chunk, log2 words per part
    const float four_t = float(1 << (2 * t));
    // the tile's data (64-bit offsets once; 32-bit offsets within a tile)
    const uint32_t* qb = qbits + (int64_t(tile) * chunks * 32 + lane) * 2 * NS;  // + chunk * 64 NS
    const uint32_t* qi = qidx + int64_t(tile) * n_groups * 8 + g;                // + group * 8
    auto lines_of = [&](int c) { return c < chunks ? __ldg(qi + ((c << 7) >> lg) * 8) : 0u; };
    float acc[M][2] = {};
    Stage<NS, M> cur, nxt;
    uint32_t lines_next = lines_of(warp + warps);
    if (warp < chunks)
        load_stage<NS, M>(cur, qb, cache8, xq, xs, warp, chunks, n_act, (warp << 7) >> lag, lines_of(warp), lane, m_rows);
    for (int c = warp; c < chunks; c += warps) {
        const int cn = c + warps;
        if (cn < chunks) {
            load_stage<NS, M>(nxt, qb, cache8, xq, xs, cn, chunks, n_act, (cn << 7) >> lag, lines_next, lane, m_rows);
            lines_next = lines_of(cn + warps);
        }
        for (int p = 0; p < parts; ++p) {
            const int first = (c << 7) + (p << lg);  // the part's first input
            if (first >= k) break;                    // past the last group
            float c_lo[NS], c_hi[NS];
            float2 sm_p[M];
            if (p == 0) {
                unpack_line<NS>(c_lo, cur.c_lo);
                unpack_line<NS>(c_hi, cur.c_hi);
#pragma unroll
                for (int mt = 0; mt < M; ++mt) sm_p[mt] = cur.sm[mt];
            } else {  // groups of 32 or 64: the chunk's later groups, loaded here
                const uint32_t ln = __ldg(qi + (first >> lg) * 8);
                load_coeffs<NS>(c_lo, cache8, ln & 0xFFFFu);
                load_coeffs<NS>(c_hi, cache8, ln >> 16);
#pragma unroll
                for (int mt = 0; mt < M; ++mt)
                    if (mt < m_rows) sm_p[mt] = __ldg(xs + mt * n_act + (first >> lag));
            }
            const bool mine = (t >> lpw) == p;  // this lane's word is in the part
            float z_lo = 0.f, z_hi = 0.f;        // the zero point's share: sum_j c_j popc(own word of w_j)
#pragma unroll
            for (int j = 0; j < NS; ++j) {
                z_lo = fmaf(c_lo[j], count_to_float(mine ? __popc(cur.a[j]) : 0), z_lo);
                z_hi = fmaf(c_hi[j], count_to_float(mine ? __popc(cur.a[NS + j]) : 0), z_hi);
            }
#pragma unroll
            for (int mt = 0; mt < M; ++mt) {
                if (mt >= m_rows) break;  // uniform: the block's row count
                float p_lo = 0.f, p_hi = 0.f;
#pragma unroll
                for (int j = 0; j < NS; ++j) {
                    int d[4] = {0, 0, 0, 0};
                    bmma_and_popc(d, mine ? cur.a[j] : 0u, mine ? cur.a[NS + j] : 0u, cur.b[mt]);
                    p_lo = fmaf(c_lo[j], count_to_float(d[0] + 2 * d[1]), p_lo);
                    p_hi = fmaf(c_hi[j], count_to_float(d[2] + 2 * d[3]), p_hi);
                }
                const float s4 = sm_p[mt].x * four_t;
                acc[mt][0] = fmaf(s4, p_lo, fmaf(sm_p[mt].y, z_lo, acc[mt][0]));
                acc[mt][1] = fmaf(s4, p_hi, fmaf(sm_p[mt].y, z_hi, acc[mt][1]));
            }
        }
        cur = nxt;
    }
    // the quad's 4 lanes hold the 8 columns (and the zero point's shares) of rows g, g + 8: sum them,
    // then the warps
#pragma unroll
    for (int mt = 0; mt < M; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float v = acc[mt][h];
            v += __shfl_xor_sync(kFullMask, v, 1);
            v += __shfl_xor_sync(kFullMask, v, 2);
            if (t == 0) red[warp][mt][g + 8 * h] = v;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < M * 16; i += blockDim.x) {
        const int mt = i / 16, r = i % 16, row = tile * 16 + r;
        float v = 0.f;
        for (int w = 0; w < warps; ++w) v += red[w][mt][r];
        if (row < n && mt < m_rows) {
            if (bias != nullptr) v += to_float(bias[row]);
            y[int64_t(mt) * n + row] = from_float<T>(v);
        }
    }
    __syncthreads();  // red is free again (the grouped kernel calls this once per block of rows)
}

// Dense: one CTA per 16-row tile, M rows of x.
template <int NS, int M, typename T>
__global__ void __launch_bounds__(kMaxWarps * 32, 1) popcount_gemv_kernel(
    const uint32_t* __restrict__ qbits, const uint32_t* __restrict__ qidx, const uint4* __restrict__ cache8,
    const uint32_t* __restrict__ xq, const float* __restrict__ xs, const T* __restrict__ bias, T* __restrict__ y,
    int n, int k, int group) {
    __shared__ float red[kMaxWarps][M][16];
    tile_gemv<NS, M, T>(qbits, qidx, cache8, xq, reinterpret_cast<const float2*>(xs), bias, y, n, k, group,
                        blockIdx.x, M, red);
}

// Grouped (MoE): CTA (tile, expert e) takes the rows offsets[e] .. offsets[e + 1] (sorted by expert) in
// blocks of kGroupedM; expert e's weights are the e-th of the stacked layouts, its cache lines start at
// cache_offsets[e] of the concatenated cache. An expert without rows costs its CTAs one load.
constexpr int kGroupedM = 4;

template <int NS, typename T>
__global__ void __launch_bounds__(kMaxWarps * 32, 1) popcount_grouped_kernel(
    const uint32_t* __restrict__ qbits, const uint32_t* __restrict__ qidx, const uint4* __restrict__ cache8,
    const int* __restrict__ cache_offsets, const int64_t* __restrict__ offsets, const uint32_t* __restrict__ xq,
    const float* __restrict__ xs, T* __restrict__ y, int n, int k, int group) {
    __shared__ float red[kMaxWarps][kGroupedM][16];
    const int e = blockIdx.y;
    const int64_t r0 = offsets[e], r1 = offsets[e + 1];
    if (r0 >= r1) return;
    const int tiles = (n + 15) / 16, chunks = (k + kChunk - 1) / kChunk, lg = __ffs(group) - 1;
    const int n_act = k >> (lg < 7 ? lg : 7);
    const uint32_t* qb = qbits + int64_t(e) * tiles * chunks * 32 * 2 * NS;
    const uint32_t* qi = qidx + int64_t(e) * tiles * (k >> lg) * 8;
    const uint4* c8 = cache8 + cache_offsets[e];
    for (int64_t rb = r0; rb < r1; rb += kGroupedM) {
        const int m_rows = int(r1 - rb < kGroupedM ? r1 - rb : kGroupedM);
        tile_gemv<NS, kGroupedM, T>(qb, qi, c8, xq + rb * chunks * 32, reinterpret_cast<const float2*>(xs) + rb * n_act,
                                    nullptr, y + rb * n, n, k, group, blockIdx.x, m_rows, red);
    }
}

// The weight in x's dtype, [n, k] row-major, from the tiled layout: one thread per (row, word);
// each element is its subset sum of the fp16 coefficients in fp32 (exact: a few fp16 values of a
// narrow exponent range), rounded once -- the reference decode, bit for bit.
template <int NS, typename T>
__global__ void dequant_kernel(const uint32_t* __restrict__ qbits, const uint32_t* __restrict__ qidx,
                               const uint4* __restrict__ cache8, T* __restrict__ out, int n, int k, int group) {
    const int words = k / 32, chunks = (k + kChunk - 1) / kChunk, n_groups = k / group;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= int64_t(n) * words) return;
    const int row = int(i / words), word = int(i % words);
    const int tile = row / 16, r = row % 16, g = r % 8, h = r / 8, c = word / 4, t = word % 4;
    const uint32_t* a = qbits + ((int64_t(tile) * chunks + c) * 32 + g * 4 + t) * 2 * NS + h * NS;
    const uint32_t lines = __ldg(qidx + (int64_t(tile) * n_groups + ((word * 32) >> (__ffs(group) - 1))) * 8 + g);
    float coef[NS];
    load_coeffs<NS>(coef, cache8, h ? lines >> 16 : lines & 0xFFFFu);
    uint32_t bits[NS];
#pragma unroll
    for (int j = 0; j < NS; ++j) bits[j] = __ldg(a + j);
    // 32 outputs as four 16-byte stores (2-byte stores cost ~10x: every one a partial sector)
    uint4* o = reinterpret_cast<uint4*>(out + int64_t(row) * k + int64_t(word) * 32);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        uint32_t packed[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float v[2] = {0.f, 0.f};
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
#pragma unroll
                for (int j = 0; j < NS; ++j) v[h2] += (bits[j] >> (8 * q + 2 * e + h2) & 1u) ? coef[j] : 0.f;
            }
            packed[e] = pack2<T>(v[0], v[1]);
        }
        o[q] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
}

// Warps per CTA (one CTA per tile): 4, doubled while the grid has fewer than ~15 warps per SM (measured on
// the H100 over Llama shapes, benchmarks/tools/sbvr_warps.py: more warps per CTA only add wave tails),
// never more than the chunks.
inline int pick_warps(int tiles, int chunks) {
    int sms = 132, device = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    int w = 4;
    while (w < kMaxWarps && int64_t(tiles) * w < int64_t(sms) * 15 && 2 * w <= chunks) w *= 2;
    return w;
}

template <typename T>
int launch_encode_x(const void* x, uint32_t* xq, float* xs, int m, int k, int group, void* stream) {
    const int chunks = (k + kChunk - 1) / kChunk, ag = group < kChunk ? group : kChunk;
    const int64_t threads = int64_t(m) * chunks * 32;
    encode_x_kernel<T><<<ceil_div(threads, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), xq, xs, m, k, ag);
    return static_cast<int>(cudaGetLastError());
}

template <int NS, int M, typename T>
int launch_gemv(const uint32_t* qbits, const uint32_t* qidx, const void* cache8, const uint32_t* xq, const float* xs,
                const void* bias, void* y, int n, int k, int group, int warps, void* stream) {
    const int tiles = (n + 15) / 16, chunks = (k + kChunk - 1) / kChunk;
    if (warps <= 0) warps = pick_warps(tiles, chunks);
    if (warps > kMaxWarps) return static_cast<int>(cudaErrorInvalidValue);
    popcount_gemv_kernel<NS, M, T><<<tiles, warps * 32, 0, static_cast<cudaStream_t>(stream)>>>(
        qbits, qidx, static_cast<const uint4*>(cache8), xq, xs, static_cast<const T*>(bias), static_cast<T*>(y), n, k,
        group);
    return static_cast<int>(cudaGetLastError());
}

template <int NS, typename T>
int launch_grouped(const uint32_t* qbits, const uint32_t* qidx, const void* cache8, const int* cache_offsets,
                   const int64_t* offsets, const uint32_t* xq, const float* xs, void* y, int rows, int n_experts,
                   int n, int k, int group, int warps, void* stream) {
    const int tiles = (n + 15) / 16, chunks = (k + kChunk - 1) / kChunk;
    if (warps <= 0) warps = pick_warps(tiles * (rows < n_experts ? rows : n_experts), chunks);  // tiles with rows
    if (warps > kMaxWarps || n_experts > 65535) return static_cast<int>(cudaErrorInvalidValue);
    popcount_grouped_kernel<NS, T><<<dim3(tiles, n_experts), warps * 32, 0, static_cast<cudaStream_t>(stream)>>>(
        qbits, qidx, static_cast<const uint4*>(cache8), cache_offsets, offsets, xq, xs, static_cast<T*>(y), n, k, group);
    return static_cast<int>(cudaGetLastError());
}

template <int NS, typename T>
int launch_dequant(const uint32_t* qbits, const uint32_t* qidx, const void* cache8, void* out, int n, int k, int group,
                   void* stream) {
    const int64_t threads = int64_t(n) * (k / 32);
    dequant_kernel<NS, T><<<ceil_div(threads, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        qbits, qidx, static_cast<const uint4*>(cache8), static_cast<T*>(out), n, k, group);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace sbvr
}  // namespace lowbit

#define LOWBIT_SBVR_GEMV(NS, NAME, TYPE, M)                                                                       \
    extern "C" int lowbit_sbvr_gemv_b##NS##_##NAME##_m##M(const uint32_t* qbits, const uint32_t* qidx,           \
                                                           const void* cache8, const uint32_t* xq, const float* xs, \
                                                           const void* bias, void* y, int n, int k, int group,      \
                                                           int warps, void* stream) {                               \
        return lowbit::sbvr::launch_gemv<NS, M, TYPE>(qbits, qidx, cache8, xq, xs, bias, y, n, k, group, warps,      \
                                                      stream);                                                      \
    }
#define LOWBIT_SBVR_NS(NS, NAME, TYPE)                                                                             \
    LOWBIT_SBVR_GEMV(NS, NAME, TYPE, 1)                                                                             \
    LOWBIT_SBVR_GEMV(NS, NAME, TYPE, 2)                                                                             \
    LOWBIT_SBVR_GEMV(NS, NAME, TYPE, 3)                                                                             \
    LOWBIT_SBVR_GEMV(NS, NAME, TYPE, 4)                                                                             \
    LOWBIT_SBVR_GEMV(NS, NAME, TYPE, 5)                                                                             \
    LOWBIT_SBVR_GEMV(NS, NAME, TYPE, 6)                                                                             \
    LOWBIT_SBVR_GEMV(NS, NAME, TYPE, 7)                                                                             \
    LOWBIT_SBVR_GEMV(NS, NAME, TYPE, 8)                                                                             \
    extern "C" int lowbit_sbvr_grouped_gemv_b##NS##_##NAME(                                                        \
        const uint32_t* qbits, const uint32_t* qidx, const void* cache8, const int* cache_offsets,                  \
        const int64_t* offsets, const uint32_t* xq, const float* xs, void* y, int rows, int n_experts, int n, int k, \
        int group, int warps, void* stream) {                                                                       \
        return lowbit::sbvr::launch_grouped<NS, TYPE>(qbits, qidx, cache8, cache_offsets, offsets, xq, xs, y, rows,  \
                                                      n_experts, n, k, group, warps, stream);                       \
    }                                                                                                               \
    extern "C" int lowbit_sbvr_dequant_b##NS##_##NAME(const uint32_t* qbits, const uint32_t* qidx,                 \
                                                       const void* cache8, void* out, int n, int k, int group,      \
                                                       void* stream) {                                              \
        return lowbit::sbvr::launch_dequant<NS, TYPE>(qbits, qidx, cache8, out, n, k, group, stream);               \
    }
#define LOWBIT_SBVR_DTYPES(NS)            \
    LOWBIT_SBVR_NS(NS, fp16, __half)      \
    LOWBIT_SBVR_NS(NS, bf16, __nv_bfloat16)
LOWBIT_SBVR_DTYPES(2)
LOWBIT_SBVR_DTYPES(3)
LOWBIT_SBVR_DTYPES(4)
LOWBIT_SBVR_DTYPES(5)
LOWBIT_SBVR_DTYPES(6)

#define LOWBIT_SBVR_ENCODE(NAME, TYPE)                                                                          \
    extern "C" int lowbit_sbvr_encode_x_##NAME(const void* x, uint32_t* xq, float* xs, int m, int k, int group, \
                                               void* stream) {                                                  \
        return lowbit::sbvr::launch_encode_x<TYPE>(x, xq, xs, m, k, group, stream);                             \
    }
LOWBIT_SBVR_ENCODE(fp16, __half)
LOWBIT_SBVR_ENCODE(bf16, __nv_bfloat16)
