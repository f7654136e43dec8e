// NVFP4 dequantize from the checkpoint layout (lowbit/formats/nvfp4.py): out[n, k] = e2m1 * scale *
// scale_2 in fp32, rounded once to fp16/bf16 -- the reference's arithmetic, so the result is
// bit-identical to lowbit.formats.nvfp4.dequantize_reference. For large M (dequantize + cuBLAS).
// One thread per 32 values: one 16-byte load of codes, one 2-byte load of scales, four 16-byte stores.
#include "common.cuh"

namespace lowbit {
namespace nvfp4 {

__constant__ float kDequantE2M1[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                       -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

template <typename T>
__global__ void nvfp4_dequant_kernel(const uint8_t* __restrict__ w, int64_t w_row, const uint8_t* __restrict__ ws,
                                     int64_t ws_row, const float* __restrict__ scale_2, T* __restrict__ out, int n,
                                     int k) {
    const int chunks = k / 32;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= int64_t(n) * chunks) return;
    const int row = int(i / chunks), c = int(i % chunks);
    const uint4 q = ld_stream(reinterpret_cast<const uint4*>(w + row * w_row + c * 16));
    const uint32_t sc = *reinterpret_cast<const uint16_t*>(ws + row * ws_row + c * 2);
    const float s2 = *scale_2;
    // the reference: scale (fp32) * scale_2 first, then e2m1 * that
    const float f[2] = {__uint_as_float((sc & 0xffu) << 20) * 0x1p120f * s2, __uint_as_float((sc >> 8) << 20) * 0x1p120f * s2};
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
    uint4* dst = reinterpret_cast<uint4*>(out + int64_t(row) * k + c * 32);
#pragma unroll
    for (int wi = 0; wi < 4; ++wi) {
        T v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = from_float<T>(kDequantE2M1[(words[wi] >> (4 * j)) & 15u] * f[wi >> 1]);
        dst[wi] = *reinterpret_cast<const uint4*>(v);
    }
}

}  // namespace nvfp4
}  // namespace lowbit

// packed [n, k/2] (rows w_row bytes apart, 16-byte aligned), scales [n, k/16] (rows ws_row bytes apart,
// 2-byte aligned), scale_2 device scalar -> out [n, k] contiguous; k % 32 == 0.
#define LOWBIT_DEFINE_NVFP4_DEQUANT(NAME, TYPE)                                                                   \
    extern "C" int lowbit_nvfp4_dequant_##NAME(const void* w, int64_t w_row, const void* ws, int64_t ws_row,      \
                                               const float* scale_2, void* out, int n, int k, void* stream) {     \
        if (n < 0 || k < 32 || k % 32) return static_cast<int>(cudaErrorInvalidValue);                            \
        const int64_t threads = int64_t(n) * (k / 32);                                                            \
        if (threads == 0) return 0;                                                                               \
        lowbit::nvfp4::nvfp4_dequant_kernel<TYPE><<<lowbit::ceil_div(threads, 256), 256, 0,                      \
                                                    static_cast<cudaStream_t>(stream)>>>(                         \
            static_cast<const uint8_t*>(w), w_row, static_cast<const uint8_t*>(ws), ws_row, scale_2,              \
            static_cast<TYPE*>(out), n, k);                                                                       \
        return static_cast<int>(cudaGetLastError());                                                              \
    }
LOWBIT_DEFINE_NVFP4_DEQUANT(fp16, __half)
LOWBIT_DEFINE_NVFP4_DEQUANT(bf16, __nv_bfloat16)
