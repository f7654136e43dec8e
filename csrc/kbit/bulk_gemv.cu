// kbit's instances of the bulk-copy GEMV for up to 8 tokens (tiled/bulk_gemv.cuh), K = 2..5:
// lowbit_kbit_bulk_gemv_b<BITS>_<dtype> and lowbit_kbit_bulk_gemv_ring_b<BITS> (its ring's stages for a shape, its
// SwiGLU flag and the tokens, 0: it does not fit). A translation unit of its own: it compiles beside kbit/gemv.cu.
#include "tiled/bulk_gemv.cuh"

#define LOWBIT_DEFINE_BULK(BITS, NAME, TYPE)                                                                       \
    extern "C" int lowbit_kbit_bulk_gemv_b##BITS##_##NAME(const void* x, const void* qweight, const void* qabsmax, \
                                                          const float* codebook, const float* scale, void* y,      \
                                                          const void* bias, int m, int n, int k_in, int ctas,      \
                                                          int flags, const lowbit_epilogue* epi, void* stream) {   \
        return lowbit::gemv::launch_bulk_gemv<BITS, TYPE>(x, qweight, qabsmax, codebook, scale, y, bias, m, n,     \
                                                          k_in, ctas, flags, epi, stream);                         \
    }
#define LOWBIT_DEFINE_BULK_BITS(BITS)                                                 \
    LOWBIT_DEFINE_BULK(BITS, fp16, __half)                                            \
    LOWBIT_DEFINE_BULK(BITS, bf16, __nv_bfloat16)                                     \
    extern "C" int lowbit_kbit_bulk_gemv_ring_b##BITS(int n, int ctas, int swi, int m) { \
        return lowbit::gemv::bulk_gemv_ring<BITS>(n, ctas, swi, m);                      \
    }
LOWBIT_DEFINE_BULK_BITS(2)
LOWBIT_DEFINE_BULK_BITS(3)
LOWBIT_DEFINE_BULK_BITS(4)
LOWBIT_DEFINE_BULK_BITS(5)
