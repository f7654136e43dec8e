// NVFP4 dequantize from the checkpoint layout (lowbit/formats/nvfp4.py): out[n, k] = e2m1 * scale *
// scale_2 in fp32, rounded once to fp16/bf16 -- the reference's arithmetic, so the result is
// bit-identical to lowbit.formats.nvfp4.dequantize_reference. For large M (dequantize + cuBLAS).
// One thread per 8 values: a 4-byte load of codes, a 1-byte load of their block's scale, one
// 16-byte store; a warp's loads and stores are contiguous (128 and 512 bytes).
#include "common.cuh"

namespace lowbit {
namespace nvfp4 {

// E2M1 code -> its value / 2^14, exactly: the code's exponent and mantissa bits placed in an fp16's
// low exponent and top mantissa bits *are* that value (code 1, the subnormal 0.5, included), so no
// table is read. (A __constant__ table, read with 16 different indices per warp, serialized and
// made this kernel 3-4x slower than its bytes.)
__device__ __forceinline__ float e2m1_scaled_down(uint32_t code) {
    const uint32_t bits = ((code & 7u) << 9) | ((code & 8u) << 12);
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

template <typename T>
__global__ void nvfp4_dequant_kernel(const uint8_t* __restrict__ w, int64_t w_row, const uint8_t* __restrict__ ws,
                                     int64_t ws_row, const float* __restrict__ scale_2, T* __restrict__ out, int n,
                                     int k) {
    const int words = k / 8;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= int64_t(n) * words) return;
    const int row = int(i / words), c = int(i % words);
    const uint32_t q = __ldcs(reinterpret_cast<const unsigned int*>(w + row * w_row) + c);
    // the reference: scale (fp32) * scale_2 first, then e2m1 * that; the 2^14 is exact
    const float f = __uint_as_float(uint32_t(ws[row * ws_row + c / 2]) << 20) * 0x1p120f * *scale_2;
    T v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = from_float<T>(e2m1_scaled_down(q >> (4 * j)) * 16384.f * f);
    *reinterpret_cast<uint4*>(out + int64_t(row) * k + 8 * c) = *reinterpret_cast<const uint4*>(v);
}

}  // namespace nvfp4
}  // namespace lowbit

// packed [n, k/2] (rows w_row bytes apart, 16-byte aligned), scales [n, k/16] (rows ws_row bytes apart,
// 2-byte aligned), scale_2 device scalar -> out [n, k] contiguous; k % 32 == 0.
#define LOWBIT_DEFINE_NVFP4_DEQUANT(NAME, TYPE)                                                                   \
    extern "C" int lowbit_nvfp4_dequant_##NAME(const void* w, int64_t w_row, const void* ws, int64_t ws_row,      \
                                               const float* scale_2, void* out, int n, int k, void* stream) {     \
        if (n < 0 || k < 32 || k % 32) return static_cast<int>(cudaErrorInvalidValue);                            \
        const int64_t threads = int64_t(n) * (k / 8);                                                            \
        if (threads == 0) return 0;                                                                               \
        lowbit::nvfp4::nvfp4_dequant_kernel<TYPE><<<lowbit::ceil_div(threads, 256), 256, 0,                      \
                                                    static_cast<cudaStream_t>(stream)>>>(                         \
            static_cast<const uint8_t*>(w), w_row, static_cast<const uint8_t*>(ws), ws_row, scale_2,              \
            static_cast<TYPE*>(out), n, k);                                                                       \
        return static_cast<int>(cudaGetLastError());                                                              \
    }
LOWBIT_DEFINE_NVFP4_DEQUANT(fp16, __half)
LOWBIT_DEFINE_NVFP4_DEQUANT(bf16, __nv_bfloat16)
