// The gated MLP's activation on a fused gate|up output, as transformers computes act_fn(gate) * up:
//   y[r, i] = T(T(silu(x[r, i])) * x[r, n + i])      (silu in fp32, rounded to T, the product rounded again)
// Why lowbit has it: the kernel between the gate|up and the down GEMVs of a decode step. Inductor's
// Triton version triggers its dependents after its last load, so the down GEMV started only when it
// ended; this one triggers right after its wait (see rms_norm.cu).
#include "step.cuh"

namespace lowbit {
namespace step {

constexpr int kSiluThreads = 128;

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// VEC: n a multiple of 8 and 16-byte aligned rows: 8 outputs per thread.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kSiluThreads) silu_mul_kernel(const T* __restrict__ x, T* __restrict__ y, int rows,
                                                                int n, bool early) {
    if (early) pdl_launch_dependents();  // step.cuh: only where the next kernel waits for this one
    pdl_wait();  // x is the previous kernel's output
    if (!early) pdl_launch_dependents();
    constexpr int E = VEC ? 8 : 1;
    const int per_row = n / E;
    const int64_t total = int64_t(rows) * per_row;
    for (int64_t v = blockIdx.x * int64_t(kSiluThreads) + threadIdx.x; v < total; v += int64_t(gridDim.x) * kSiluThreads) {
        const int64_t r = v / per_row, c = (v - r * per_row) * E;
        const T* gate = x + r * 2 * n + c;
        T* out = y + r * n + c;
        if constexpr (VEC) {
            const uint4 g = ld_x(reinterpret_cast<const uint4*>(gate));
            const uint4 u = ld_x(reinterpret_cast<const uint4*>(gate + n));
            const uint32_t gs[4] = {g.x, g.y, g.z, g.w}, us[4] = {u.x, u.y, u.z, u.w};
            uint32_t o[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float2 gf = to_float2<T>(gs[j]), uf = to_float2<T>(us[j]);
                o[j] = pack2<T>(from_float<T>(to_float(from_float<T>(silu(gf.x))) * uf.x),
                                from_float<T>(to_float(from_float<T>(silu(gf.y))) * uf.y));
            }
            *reinterpret_cast<uint4*>(out) = make_uint4(o[0], o[1], o[2], o[3]);
        } else {
            *out = from_float<T>(to_float(from_float<T>(silu(to_float(gate[0])))) * to_float(gate[n]));
        }
    }
}

template <typename T>
int launch_silu_mul(const void* x, void* y, int rows, int n, int flags, void* stream) {
    if (rows < 1 || n < 1) return static_cast<int>(cudaErrorInvalidValue);
    const bool vec = n % 8 == 0 && aligned16(x, y, y);
    const int64_t work = int64_t(rows) * (vec ? n / 8 : n);
    const unsigned grid = static_cast<unsigned>(work / kSiluThreads + 1 < 4096 ? work / kSiluThreads + 1 : 4096);
    Launch1 l(grid, kSiluThreads, stream, flags & 1);
    const cudaError_t err = vec ? cudaLaunchKernelEx(&l.cfg, silu_mul_kernel<T, true>, static_cast<const T*>(x),
                                                     static_cast<T*>(y), rows, n, (flags & 2) != 0)
                                : cudaLaunchKernelEx(&l.cfg, silu_mul_kernel<T, false>, static_cast<const T*>(x),
                                                     static_cast<T*>(y), rows, n, (flags & 2) != 0);
    if (err != cudaSuccess) return static_cast<int>(err);
    return static_cast<int>(cudaGetLastError());
}

}  // namespace step
}  // namespace lowbit

// x: [rows, 2 n] (gate | up, rows back to back), y: [rows, n]; fp16/bf16; flags bit 0: launch with PDL, bit 1:
// trigger the next kernel at entry (step.cuh).
#define LOWBIT_DEFINE_SILU_MUL(NAME, TYPE)                                                                      \
    extern "C" int lowbit_silu_mul_##NAME(const void* x, void* y, int rows, int n, int flags, void* stream) {   \
        return lowbit::step::launch_silu_mul<TYPE>(x, y, rows, n, flags, stream);                               \
    }
LOWBIT_DEFINE_SILU_MUL(fp16, __half)
LOWBIT_DEFINE_SILU_MUL(bf16, __nv_bfloat16)
