// kbit's instances of the tiled tensor-core GEMM and grouped GEMM (tiled/gemm.cuh), K = 2..5.
#include "tiled/gemm.cuh"

// lowbit_kbit_gemm_b<BITS>_<dtype>_t<NT>_r<R>: NT token tiles of 8 per CTA (M rows in chunks of
// 8 NT), R 16-row tiles per warp.
#define LOWBIT_DEFINE_GEMM(BITS, NAME, TYPE, NT, R)                                                           \
    extern "C" int lowbit_kbit_gemm_b##BITS##_##NAME##_t##NT##_r##R(                                           \
        const void* x, const void* qweight, const void* qabsmax, const float* codebook, const float* scale,   \
        void* y, const void* bias, float* workspace, int* counters, int m, int n, int k_in, int splits,       \
        void* stream) {                                                                                       \
        return lowbit::gemm::launch<BITS, TYPE, NT, R>(x, qweight, qabsmax, codebook, scale, y, bias,         \
                                                       workspace, counters, m, n, k_in, splits, stream);      \
    }                                                                                                         \
    extern "C" int lowbit_kbit_gemm_occupancy_b##BITS##_##NAME##_t##NT##_r##R(void) {                         \
        return lowbit::gemv::occupancy(lowbit::gemm::kbit_gemm_kernel<BITS, TYPE, NT, R>,                     \
                                       lowbit::gemm::gemm_smem<BITS, NT>(), lowbit::gemm::kWarps);            \
    }
// lowbit_kbit_grouped_gemm_b<BITS>_<dtype>_t<NT>: experts' tokens in chunks of 8 NT.
#define LOWBIT_DEFINE_GROUPED_GEMM(BITS, NAME, TYPE, NT)                                                       \
    extern "C" int lowbit_kbit_grouped_gemm_b##BITS##_##NAME##_t##NT(                                          \
        const void* x, const int64_t* offsets, const void* qweight, const void* qabsmax, const float* codebook, \
        const float* scales, void* y, const void* bias, int n_experts, int n, int k_in, int ctas,              \
        void* stream) {                                                                                        \
        return lowbit::gemm::launch_grouped<BITS, TYPE, NT>(x, offsets, qweight, qabsmax, codebook, scales, y,  \
                                                            bias, n_experts, n, k_in, ctas, stream);            \
    }                                                                                                          \
    extern "C" int lowbit_kbit_grouped_gemm_occupancy_b##BITS##_##NAME##_t##NT(int n_experts) {                \
        if (lowbit::gemm::grouped_smem<BITS, NT>(n_experts) > 227 * 1024) return 0;                            \
        return lowbit::gemv::occupancy(lowbit::gemm::kbit_grouped_gemm_kernel<BITS, TYPE, NT>,                 \
                                       lowbit::gemm::grouped_smem<BITS, NT>(n_experts), lowbit::gemm::kWarps); \
    }
#define LOWBIT_DEFINE_GEMM_DTYPE(BITS, NAME, TYPE) \
    LOWBIT_DEFINE_GEMM(BITS, NAME, TYPE, 2, 1)     \
    LOWBIT_DEFINE_GEMM(BITS, NAME, TYPE, 4, 1)     \
    LOWBIT_DEFINE_GEMM(BITS, NAME, TYPE, 8, 1)     \
    LOWBIT_DEFINE_GEMM(BITS, NAME, TYPE, 4, 2)     \
    LOWBIT_DEFINE_GEMM(BITS, NAME, TYPE, 8, 2)     \
    LOWBIT_DEFINE_GROUPED_GEMM(BITS, NAME, TYPE, 2) \
    LOWBIT_DEFINE_GROUPED_GEMM(BITS, NAME, TYPE, 4) \
    LOWBIT_DEFINE_GROUPED_GEMM(BITS, NAME, TYPE, 8)
#define LOWBIT_DEFINE_GEMM_BITS(BITS)                  \
    LOWBIT_DEFINE_GEMM_DTYPE(BITS, fp16, __half)       \
    LOWBIT_DEFINE_GEMM_DTYPE(BITS, bf16, __nv_bfloat16)
LOWBIT_DEFINE_GEMM_BITS(2)
LOWBIT_DEFINE_GEMM_BITS(3)
LOWBIT_DEFINE_GEMM_BITS(4)
LOWBIT_DEFINE_GEMM_BITS(5)
