// fp16 / bf16 decode GEMV: y[M, N] = x[M, K] @ W^T, W row-major [N, K], M = 1..4, fp32 accumulation.
//
// Memory-bound: every weight byte is read once, so the kernel is a streaming read with a dot
// product attached. A CTA holds `groups` = threads / tpr row groups; each group's tpr threads
// walk ROWS rows together, 16-byte vectors strided by tpr, UNROLL vectors per row in flight
// (ROWS * UNROLL independent loads per thread), and reuse each x vector across the ROWS rows.
// The reduction is a fixed-order butterfly inside each warp, then (tpr > 32) a fixed-order sum
// of the group's warps through shared memory: deterministic, no atomics, no split across CTAs.
// ROWS = 16 or 32 selects the tensor-core variant (dense_gemv_mma_kernel): at M = 3..4 the
// CUDA-core dot product (converts + M FMAs per weight) is enough work to fall off the bandwidth
// line, an MMA costs the same for any M <= 8.
// Which (ROWS, UNROLL, tpr, threads, L2 prefetch) is fastest depends on the shape: lowbit/tuning.py picks.
//
// The vector kernel needs K % 8 == 0 and 16-byte aligned x / W; anything else runs the scalar
// kernel (one warp per row, element loads), correct for any K.
#include "common.cuh"
#include "lowbit.h"

namespace lowbit {
namespace dense {

constexpr int kMaxWarps = 16;  // threads per CTA <= 512

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

// acc += dot(w[0..8), x[0..8)) in fp32, pairwise in a fixed order.
template <typename T>
__device__ __forceinline__ void dot8(float& acc, const uint4& w, const float2 (&xf)[4]) {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 wf = to_float2<T>(ws[i]);
        acc = fmaf(wf.x, xf[i].x, acc);
        acc = fmaf(wf.y, xf[i].y, acc);
    }
}

// Fixed-order reduction of v over the tpr threads of a row group; the result is valid in the
// group's first thread. `red` is this CTA's shared scratch [kMaxWarps][R].
template <int R>
__device__ __forceinline__ void group_reduce(float (&v)[R], float (*red)[R], int tpr) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int i = 0; i < R; ++i) v[i] += __shfl_xor_sync(kFullMask, v[i], off);
    }
    if (tpr <= 32) return;  // block-uniform
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < R; ++i) red[warp][i] = v[i];
    }
    __syncthreads();
    const int warps_per_group = tpr >> 5;
    if ((threadIdx.x % tpr) == 0) {
#pragma unroll
        for (int i = 0; i < R; ++i) {
            float s = 0.f;
            for (int j = 0; j < warps_per_group; ++j) s += red[warp + j][i];
            v[i] = s;
        }
    }
}

template <typename T, int M, int ROWS, int UNROLL, bool PF, bool PDL>
__global__ void __launch_bounds__(512) dense_gemv_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                          T* __restrict__ y, int n, int k, int tpr) {
    __shared__ float red[kMaxWarps][ROWS * M];
    const int groups = blockDim.x / tpr;
    const int grp = threadIdx.x / tpr, t = threadIdx.x % tpr;
    const int row0 = (blockIdx.x * groups + grp) * ROWS;
    const int kv = k >> 3;  // 16-byte vectors per row
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    const uint4* wrow[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {  // rows past n re-read row n-1; their results are dropped
        const int row = row0 + r < n ? row0 + r : n - 1;
        wrow[r] = reinterpret_cast<const uint4*>(w) + int64_t(row) * kv;
    }
    float acc[ROWS * M];
#pragma unroll
    for (int i = 0; i < ROWS * M; ++i) acc[i] = 0.f;

    for (int c0 = t; c0 < kv; c0 += tpr * UNROLL) {
        uint4 wr[UNROLL][ROWS];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int c = c0 + u * tpr;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) wr[u][r] = c < kv ? ld_stream<PF>(wrow[r] + c) : make_uint4(0, 0, 0, 0);
        }
        if constexpr (PDL) {
            if (c0 == t) pdl_wait();  // first pass: weights are in flight, x may now be read
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int c = c0 + u * tpr;
            if (c < kv) {
#pragma unroll
                for (int m = 0; m < M; ++m) {
                    const uint4* px = xv + int64_t(m) * kv + c;
                    uint4 xr;
                    if constexpr (PDL) xr = ld_x(px); else xr = __ldg(px);
                    const float2 xf[4] = {to_float2<T>(xr.x), to_float2<T>(xr.y), to_float2<T>(xr.z),
                                          to_float2<T>(xr.w)};
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) dot8<T>(acc[r * M + m], wr[u][r], xf);
                }
            }
        }
    }
    if constexpr (PDL) {
        pdl_wait();  // threads without a pass must not write y early either
        pdl_launch_dependents();
    }
    group_reduce<ROWS * M>(acc, red, tpr);
    if (t == 0) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (row0 + r < n) {
#pragma unroll
                for (int m = 0; m < M; ++m) y[int64_t(m) * n + row0 + r] = from_float<T>(acc[r * M + m]);
            }
        }
    }
}

// Tensor-core variant: one mma.m16n8k16 does 16 x 16 x 8 multiply-adds, whatever M <= 4 is, so
// M = 4 costs what M = 1 does. A naive "swap AB" (16 rows of W as A, tokens as B's columns)
// leaves 8 - M columns idle and makes each load instruction touch 16 rows 64 bytes at a time,
// which HBM serves ~6% slower than long runs. Instead the idle columns hold other *segments of
// K*: with P = M rounded up to a power of two and S = 8 / P segments, B's column j is token
// j % P over segment j / P, and A's row i is W row i / S over segment i % S (rows 8..15: the
// next 8 / S W rows). C[i][j] is a useful partial dot product when segment(i) == segment(j);
// the S of them per (row, token) are summed at the end. A tile is 2P W rows, and the 4S lanes
// of a W row read 64 * S contiguous bytes per instruction (512 at M = 1).
// Within a 32-element segment chunk, lane (g, t) loads 16 bytes at element 8t; registers {0,1}
// feed the first MMA and {2,3} the second, for A and B alike (a dot product doesn't care about
// the order of K). A group of tpr threads (tpr / 32 warps) owns TILES tiles and splits K by
// chunks; partial sums meet in shared memory and are added in (warp, segment) order.
template <int M> struct MmaShape {
    static constexpr int P = M == 1 ? 1 : M == 2 ? 2 : 4;  // token columns per segment
    static constexpr int S = 8 / P;                       // K segments side by side
    static constexpr int ROWS = 2 * P;                    // W rows per 16-row MMA tile
};

template <typename T, int M, int TILES, int UNROLL, bool PF, bool PDL>
__global__ void __launch_bounds__(512) dense_gemv_mma_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                              T* __restrict__ y, int n, int k, int tpr) {
    static_assert(M >= 1 && M <= 4, "M = 1..4");
    constexpr int P = MmaShape<M>::P, S = MmaShape<M>::S, ROWS = TILES * MmaShape<M>::ROWS;
    __shared__ float red[kMaxWarps][ROWS * M * S];
    const int groups = blockDim.x / tpr, wpg = tpr >> 5;
    const int grp = threadIdx.x / tpr, wg = (threadIdx.x % tpr) >> 5;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = (blockIdx.x * groups + grp) * ROWS;
    const int kv = k >> 3;                       // 16-byte vectors per row
    const int step = 4 * S;                      // vectors per chunk (S segments of 4)
    const int chunks = (kv + step - 1) / step;
    const int wcol = (g % S) * 4 + t;            // this lane's A vector within a chunk
    const int xcol = (g / P) * 4 + t;            // ... and its B vector (segment g / P)
    const int xm = g % P;                        // B column's token (>= M: zero padding)
    const uint4* xv = reinterpret_cast<const uint4*>(x) + int64_t(xm < M ? xm : 0) * kv;
    const uint4* wrow[TILES][2];
#pragma unroll
    for (int i = 0; i < TILES; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // rows past n re-read row n-1; their results are dropped
            const int row = min(row0 + i * 2 * P + h * P + g / S, n - 1);
            wrow[i][h] = reinterpret_cast<const uint4*>(w) + int64_t(row) * kv;
        }
    }
    float acc[TILES][4];
#pragma unroll
    for (int i = 0; i < TILES; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

    // A warp takes UNROLL adjacent chunks per step.
    for (int ch0 = wg * UNROLL; ch0 < chunks; ch0 += wpg * UNROLL) {
        uint4 wr[UNROLL][TILES][2];
        uint4 xr[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int cw = (ch0 + u) * step + wcol;
#pragma unroll
            for (int i = 0; i < TILES; ++i) {
#pragma unroll
                for (int h = 0; h < 2; ++h) wr[u][i][h] = cw < kv ? ld_stream<PF>(wrow[i][h] + cw) : make_uint4(0, 0, 0, 0);
            }
            const int cx = (ch0 + u) * step + xcol;
            if constexpr (!PDL) xr[u] = cx < kv && xm < M ? __ldg(xv + cx) : make_uint4(0, 0, 0, 0);  // tail/pad: 0
        }
        if constexpr (PDL) {
            if (ch0 == wg * UNROLL) pdl_wait();  // first step: weights are in flight, x may now be read
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int cx = (ch0 + u) * step + xcol;
                xr[u] = cx < kv && xm < M ? ld_x(xv + cx) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
            for (int i = 0; i < TILES; ++i) {
                const uint4 lo = wr[u][i][0], hi = wr[u][i][1];
                const uint32_t a0[4] = {lo.x, hi.x, lo.y, hi.y}, a1[4] = {lo.z, hi.z, lo.w, hi.w};
                mma16816<T>(acc[i], a0, xr[u].x, xr[u].y);
                mma16816<T>(acc[i], a1, xr[u].z, xr[u].w);
            }
        }
    }
    if constexpr (PDL) {
        pdl_wait();  // warps without a step must not write y early either
        pdl_launch_dependents();
    }
    // acc[i][q] = C[g + 8 (q >> 1)][2t + (q & 1)]; keep entries whose row and column segments match.
#pragma unroll
    for (int i = 0; i < TILES; ++i) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int col = 2 * t + (q & 1), seg = col / P, m = col % P;
            const int r = i * 2 * P + (q >> 1) * P + g / S;  // W row within the group
            if (g % S == seg && m < M) red[warp][(r * M + m) * S + seg] = acc[i][q];
        }
    }
    __syncthreads();
    const int first = grp * wpg;  // the group's first warp
    for (int o = threadIdx.x % tpr; o < ROWS * M; o += tpr) {
        float s = 0.f;
        for (int j = 0; j < wpg; ++j) {
#pragma unroll
            for (int sg = 0; sg < S; ++sg) s += red[first + j][o * S + sg];
        }
        const int row = row0 + o / M, m = o % M;
        if (row < n) y[int64_t(m) * n + row] = from_float<T>(s);
    }
}

// Any K, any alignment: one warp per row, element loads, same fixed-order reduction.
template <typename T, int M>
__global__ void __launch_bounds__(256) dense_gemv_scalar_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                                T* __restrict__ y, int n, int k) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n) return;  // warp-uniform
    const T* wr = w + int64_t(row) * k;
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.f;
    for (int c = lane; c < k; c += 32) {
        const float wv = to_float<T>(wr[c]);
#pragma unroll
        for (int m = 0; m < M; ++m) acc[m] = fmaf(wv, to_float<T>(x[int64_t(m) * k + c]), acc[m]);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int m = 0; m < M; ++m) acc[m] += __shfl_xor_sync(kFullMask, acc[m], off);
    }
    if (lane == 0) {
#pragma unroll
        for (int m = 0; m < M; ++m) y[int64_t(m) * n + row] = from_float<T>(acc[m]);
    }
}

template <typename T, int M, int ROWS, int UNROLL, bool PF>
int launch(const void* x, const void* w, void* y, int n, int k, int tpr, int threads, int pdl, void* stream) {
    const bool ok_shape = n >= 1 && k >= 8 && k % 8 == 0;
    const bool ok_cfg = tpr >= 32 && tpr % 32 == 0 && threads % tpr == 0 && threads >= 32 && threads <= 512;
    const bool aligned = (reinterpret_cast<uintptr_t>(x) % 16 == 0) && (reinterpret_cast<uintptr_t>(w) % 16 == 0);
    if (!ok_shape || !ok_cfg || !aligned) return static_cast<int>(cudaErrorInvalidValue);
    // ROWS >= 16 selects the tensor-core kernel with ROWS / 16 MMA tiles per warp.
    const int group_rows = ROWS >= 16 ? ROWS / 16 * MmaShape<M>::ROWS : ROWS;
    Launch l(ceil_div(n, threads / tpr * group_rows), threads, 0, stream, pdl);
    const cudaLaunchConfig_t& cfg = l.cfg;
    const T* xt = static_cast<const T*>(x);
    const T* wt = static_cast<const T*>(w);
    T* yt = static_cast<T*>(y);
    cudaError_t err;
    if constexpr (ROWS >= 16) {
        constexpr int TILES = ROWS / 16;
        err = pdl ? cudaLaunchKernelEx(&cfg, dense_gemv_mma_kernel<T, M, TILES, UNROLL, PF, true>, xt, wt, yt, n, k, tpr)
                  : cudaLaunchKernelEx(&cfg, dense_gemv_mma_kernel<T, M, TILES, UNROLL, PF, false>, xt, wt, yt, n, k, tpr);
    } else {
        err = pdl ? cudaLaunchKernelEx(&cfg, dense_gemv_kernel<T, M, ROWS, UNROLL, PF, true>, xt, wt, yt, n, k, tpr)
                  : cudaLaunchKernelEx(&cfg, dense_gemv_kernel<T, M, ROWS, UNROLL, PF, false>, xt, wt, yt, n, k, tpr);
    }
    if (err != cudaSuccess) return static_cast<int>(err);
    return static_cast<int>(cudaGetLastError());
}

template <typename T, int M>
int launch_scalar(const void* x, const void* w, void* y, int n, int k, void* stream) {
    if (n < 1 || k < 1) return static_cast<int>(cudaErrorInvalidValue);
    dense_gemv_scalar_kernel<T, M><<<ceil_div(n, 8), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y), n, k);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace dense
}  // namespace lowbit

// Symbols: lowbit_dense_gemv_<dtype>_m<M>_r<ROWS>_u<UNROLL>_p<0|1> (ROWS 16/32: tensor cores),
// lowbit_dense_gemv_scalar_<dtype>_m<M>.
#define LOWBIT_DEFINE_DENSE_PF(NAME, TYPE, M, R, U, P)                                                        \
    extern "C" int lowbit_dense_gemv_##NAME##_m##M##_r##R##_u##U##_p##P(                                     \
        const void* x, const void* w, void* y, int n, int k, int tpr, int threads, int pdl, void* stream) {  \
        return lowbit::dense::launch<TYPE, M, R, U, P != 0>(x, w, y, n, k, tpr, threads, pdl, stream);       \
    }
#define LOWBIT_DEFINE_DENSE(NAME, TYPE, M, R, U) \
    LOWBIT_DEFINE_DENSE_PF(NAME, TYPE, M, R, U, 0) LOWBIT_DEFINE_DENSE_PF(NAME, TYPE, M, R, U, 1)
// The (ROWS, UNROLL) grid tuning searches. CUDA cores: ROWS * UNROLL <= 8 independent loads per
// thread; tensor cores (ROWS = 16 * tiles): 2 * tiles * UNROLL <= 8.
#define LOWBIT_DEFINE_DENSE_M(NAME, TYPE, M)                                                  \
    LOWBIT_DEFINE_DENSE(NAME, TYPE, M, 1, 1) LOWBIT_DEFINE_DENSE(NAME, TYPE, M, 1, 2)         \
    LOWBIT_DEFINE_DENSE(NAME, TYPE, M, 1, 4) LOWBIT_DEFINE_DENSE(NAME, TYPE, M, 1, 8)         \
    LOWBIT_DEFINE_DENSE(NAME, TYPE, M, 2, 1) LOWBIT_DEFINE_DENSE(NAME, TYPE, M, 2, 2)         \
    LOWBIT_DEFINE_DENSE(NAME, TYPE, M, 2, 4) LOWBIT_DEFINE_DENSE(NAME, TYPE, M, 4, 1)         \
    LOWBIT_DEFINE_DENSE(NAME, TYPE, M, 4, 2) LOWBIT_DEFINE_DENSE(NAME, TYPE, M, 16, 1)        \
    LOWBIT_DEFINE_DENSE(NAME, TYPE, M, 16, 2) LOWBIT_DEFINE_DENSE(NAME, TYPE, M, 16, 4)       \
    LOWBIT_DEFINE_DENSE(NAME, TYPE, M, 32, 1) LOWBIT_DEFINE_DENSE(NAME, TYPE, M, 32, 2)       \
    extern "C" int lowbit_dense_gemv_scalar_##NAME##_m##M(const void* x, const void* w, void* y, int n, \
                                                          int k, void* stream) {              \
        return lowbit::dense::launch_scalar<TYPE, M>(x, w, y, n, k, stream);                  \
    }
#define LOWBIT_DEFINE_DENSE_DTYPE(NAME, TYPE) \
    LOWBIT_DEFINE_DENSE_M(NAME, TYPE, 1)      \
    LOWBIT_DEFINE_DENSE_M(NAME, TYPE, 2)      \
    LOWBIT_DEFINE_DENSE_M(NAME, TYPE, 3)      \
    LOWBIT_DEFINE_DENSE_M(NAME, TYPE, 4)
LOWBIT_DEFINE_DENSE_DTYPE(fp16, __half)
LOWBIT_DEFINE_DENSE_DTYPE(bf16, __nv_bfloat16)
