// NVFP4 quantization of activations on the fly (the A side of W4A4): x [rows, K] fp16/bf16 ->
// packed E2M1 [rows, K/2] (element 2i in the low nibble) + E4M3 block scales [rows, K/16], with a
// given tensor scale scale_2 (multiplier). Bit-identical to lowbit.formats.nvfp4.quantize_blocks,
// which defines the rules: block scale = e4m3((amax / 6) / scale_2) (nearest even, saturating at
// 448), values divided by (scale * scale_2) in fp32 and rounded to the nearest E2M1 value, ties to
// the even code, saturating at +-6, the sign kept (a negative that rounds to 0 is -0); a block with
// a zero scale gets +0 codes. One thread per 16-value block. Non-finite inputs give unspecified codes.
#include "common.cuh"

namespace lowbit {
namespace nvfp4 {

// fp32 s >= 0 (finite) -> E4M3 code, nearest even, saturating at 448.
__device__ __forceinline__ uint32_t encode_e4m3(float s) {
    s = fminf(s, 448.f);
    if (s < 0x1p-6f) return __float2uint_rn(s * 512.f);  // subnormals: multiples of 2^-9 (8 = 2^-6, the first normal)
    uint32_t b = __float_as_uint(s);
    b += 0x7ffffu + ((b >> 20) & 1u);  // round the mantissa to 3 bits, nearest even (carries into the exponent)
    return (b >> 20) - (120u << 3);    // rebias 127 -> 7
}

__device__ __forceinline__ float decode_e4m3(uint32_t code) {
    return __uint_as_float(code << 20) * 0x1p120f;  // exact, subnormals included
}

// fp32 v (already divided by its scale) -> E2M1 code: the number of midpoints below |v|, ties at the
// midpoints 0.75, 1.75, 3.5 going up (to the even code), plus the sign bit.
__device__ __forceinline__ uint32_t encode_e2m1(float v) {
    const float a = fabsf(v);
    const uint32_t code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.f);
    return code | (__float_as_uint(v) >> 31 << 3);
}

template <typename T>
__global__ void nvfp4_quantize_kernel(const T* __restrict__ x, int64_t x_row, uint8_t* __restrict__ codes,
                                      int64_t codes_row, uint8_t* __restrict__ scales, int64_t scales_row,
                                      const float* __restrict__ scale_2, int rows, int k) {
    const int blocks_per_row = k / 16;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= int64_t(rows) * blocks_per_row) return;
    const int row = int(i / blocks_per_row), blk = int(i % blocks_per_row);
    const uint4* src = reinterpret_cast<const uint4*>(x + row * x_row + blk * 16);
    const uint4 v0 = src[0], v1 = src[1];
    const T* e = reinterpret_cast<const T*>(&v0);
    const T* f = reinterpret_cast<const T*>(&v1);
    float vals[16];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        vals[j] = to_float(e[j]);
        vals[8 + j] = to_float(f[j]);
    }
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j) amax = fmaxf(amax, fabsf(vals[j]));
    const float s2 = scale_2 != nullptr ? *scale_2 : 1.f;
    const uint32_t sc = encode_e4m3((amax / 6.f) / s2);
    const float step = decode_e4m3(sc) * s2;
    uint32_t packed[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const float q = step > 0.f ? vals[j] / step : 0.f;
        packed[j / 8] |= encode_e2m1(q) << (4 * (j % 8));
    }
    *reinterpret_cast<uint2*>(codes + row * codes_row + blk * 8) = make_uint2(packed[0], packed[1]);
    scales[row * scales_row + blk] = static_cast<uint8_t>(sc);
}

}  // namespace nvfp4
}  // namespace lowbit

// x [rows, k] (k % 16 == 0, rows x_row elements apart, 16-byte aligned) -> codes [rows, k/2] (rows
// codes_row bytes apart, 8-byte aligned), scales [rows, k/16]; scale_2: device scalar or null (1).
#define LOWBIT_DEFINE_NVFP4_QUANTIZE(NAME, TYPE)                                                                \
    extern "C" int lowbit_nvfp4_quantize_##NAME(const void* x, int64_t x_row, void* codes, int64_t codes_row,   \
                                                void* scales, int64_t scales_row, const float* scale_2, int rows, \
                                                int k, void* stream) {                                          \
        if (rows < 0 || k < 16 || k % 16) return static_cast<int>(cudaErrorInvalidValue);                       \
        const int64_t blocks = int64_t(rows) * (k / 16);                                                        \
        if (blocks == 0) return 0;                                                                              \
        lowbit::nvfp4::nvfp4_quantize_kernel<TYPE><<<lowbit::ceil_div(blocks, 256), 256, 0,                    \
                                                     static_cast<cudaStream_t>(stream)>>>(                      \
            static_cast<const TYPE*>(x), x_row, static_cast<uint8_t*>(codes), codes_row,                        \
            static_cast<uint8_t*>(scales), scales_row, scale_2, rows, k);                                       \
        return static_cast<int>(cudaGetLastError());                                                            \
    }
LOWBIT_DEFINE_NVFP4_QUANTIZE(fp16, __half)
LOWBIT_DEFINE_NVFP4_QUANTIZE(bf16, __nv_bfloat16)
