// lowbit C interface: every exported symbol is plain C, so the library never depends on
// torch's C++ ABI. Each entry returns a cudaError_t value (0 = success) and launches on the
// caller's stream. Symbol names encode the template instance: lowbit_<op>_b<bits>_<dtype>.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Library ABI version; the Python loader refuses a library with another value.
int lowbit_abi_version(void);
const char* lowbit_error_string(int err);

// kbit dequantize: out[n_blocks * 32] = codebook[code] * (e4m4(absmax) * (*scale)).
// planes: n_blocks * bits uint32 words, absmax: n_blocks bytes, codebook: 2^bits floats,
// scale: one float in device memory (read on the device, so capture in CUDA graphs is safe).
#define LOWBIT_DECLARE_KBIT_DEQUANT(BITS, NAME)                                              \
    int lowbit_kbit_dequant_b##BITS##_##NAME(const uint32_t* planes, const uint8_t* absmax,  \
                                             const float* codebook, const float* scale,       \
                                             void* out, int64_t n_blocks, void* stream);
#define LOWBIT_DECLARE_KBIT_DEQUANT_ALL_DTYPES(BITS) \
    LOWBIT_DECLARE_KBIT_DEQUANT(BITS, fp32)          \
    LOWBIT_DECLARE_KBIT_DEQUANT(BITS, fp16)          \
    LOWBIT_DECLARE_KBIT_DEQUANT(BITS, bf16)
LOWBIT_DECLARE_KBIT_DEQUANT_ALL_DTYPES(2)
LOWBIT_DECLARE_KBIT_DEQUANT_ALL_DTYPES(3)
LOWBIT_DECLARE_KBIT_DEQUANT_ALL_DTYPES(4)
LOWBIT_DECLARE_KBIT_DEQUANT_ALL_DTYPES(5)

// kbit dequantize from the tiled GPU layout (lowbit/formats/kbit/tiled.py) to a dense row-major
// out[n, k_in] (fp16/bf16); k_in % 32 == 0; qweight and qabsmax 16-byte aligned.
#define LOWBIT_DECLARE_KBIT_TILED_DEQUANT(BITS, NAME)                                                     \
    int lowbit_kbit_tiled_dequant_b##BITS##_##NAME(const void* qweight, const void* qabsmax,            \
                                                   const float* codebook, const float* scale, void* out, \
                                                   int n, int k_in, void* stream);
#define LOWBIT_DECLARE_KBIT_TILED_DEQUANT_BITS(BITS) \
    LOWBIT_DECLARE_KBIT_TILED_DEQUANT(BITS, fp16)     \
    LOWBIT_DECLARE_KBIT_TILED_DEQUANT(BITS, bf16)
LOWBIT_DECLARE_KBIT_TILED_DEQUANT_BITS(2)
LOWBIT_DECLARE_KBIT_TILED_DEQUANT_BITS(3)
LOWBIT_DECLARE_KBIT_TILED_DEQUANT_BITS(4)
LOWBIT_DECLARE_KBIT_TILED_DEQUANT_BITS(5)

// SBVR (csrc/sbvr/; layouts: lowbit/formats/sbvr/tiled.py), fp16/bf16 (NAME), num_sums NS = 2..6, M = 1..8:
//   lowbit_sbvr_encode_x_<NAME>(x, xq, xs, m, k, group, stream): activations -> 8 bit-planes + (s, m) per group
//   lowbit_sbvr_gemv_b<NS>_<NAME>_m<M>(qbits, qidx, cache8, xq, xs, bias, y, n, k, group, warps, stream): the
//       popcount GEMV (warps per CTA, 0: the kernel's rule)
//   lowbit_sbvr_dequant_b<NS>_<NAME>(qbits, qidx, cache8, out, n, k, group, stream): the weight [n, k]
//   lowbit_sbvr_lookup_gemv_<NAME>_m<M>(qcodes, qidx, cache8, x, bias, y, n, k, group, warps, stream): the
//       weight-only lookup GEMV (num_sums <= 4, group a multiple of 128)
// (declared where they are defined; the Python loader's signatures: lowbit/kernels/sbvr.py)

// The decode step's glue fused into where a tiled GEMV writes y (the kbit and NVFP4 GEMV and split-GEMV entries take a
// pointer to one, null: none; every field may be null). With y = x W^T (+ bias), per token row r and output row j:
//   rms_x [m, k_in]: y *= rsqrt(mean(rms_x[r]^2) + eps) before the bias -- the RMSNorm factor of the row the
//     caller's x was made from (x = rms_x * norm weight, the norm's division left to this kernel);
//   residual [m, n]: y += residual[r, j] before the one rounding (a residual add);
//   yw [m, n], norm_weight [n]: also write yw[r, j] = round(y[r, j] * norm_weight[j]) (the next norm's weight
//     applied to the new residual, the x of the GEMV that takes rms_x = y). All of x's dtype.
//   swiglu (non-zero; the stream-K GEMV's CTA-local mode, n % 32 == 0, no residual or yw): the weight's rows are
//     [gate; up] and y is [m, n / 2]: y[r, j] = silu(g) * u, g and u rounded to x's dtype first (gated MLPs).
struct lowbit_epilogue {
    const void* rms_x;
    const void* residual;
    const void* norm_weight;
    void* yw;
    float eps;
    int swiglu;
};

// Read-bandwidth probe: streams n_bytes (a multiple of 16, 16-byte aligned) once; XORs into *sink.
int lowbit_read_bw(const void* src, int64_t n_bytes, void* sink, int grid, int mode, void* stream);
// Copy probe: dst = src, n_bytes a multiple of 16, both 16-byte aligned.
int lowbit_copy_bw(const void* src, void* dst, int64_t n_bytes, int grid, void* stream);

#ifdef __cplusplus
}
#endif
