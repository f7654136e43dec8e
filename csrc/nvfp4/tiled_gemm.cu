// NVFP4's instances of the tiled tensor-core GEMM and grouped GEMM (tiled/gemm.cuh).
#include "tiled/gemm.cuh"

// lowbit_nvfp4_gemm_<dtype>_t<NT>_r<R>: the same GEMM on NVFP4 weights (K = 4 code layout + E4M3
// scales; codebook = the 16 E2M1 values, scale = the tensor's scale_2).
#define LOWBIT_DEFINE_NVFP4_GEMM(NAME, TYPE, NT, R)                                                          \
    extern "C" int lowbit_nvfp4_gemm_##NAME##_t##NT##_r##R(                                                  \
        const void* x, const void* qweight, const void* qscales, const float* codebook, const float* scale,  \
        void* y, const void* bias, float* workspace, int* counters, int m, int n, int k_in, int splits,      \
        void* stream) {                                                                                      \
        return lowbit::gemm::launch<4, TYPE, NT, R, true>(x, qweight, qscales, codebook, scale, y, bias,     \
                                                          workspace, counters, m, n, k_in, splits, stream);  \
    }                                                                                                        \
    extern "C" int lowbit_nvfp4_gemm_occupancy_##NAME##_t##NT##_r##R(void) {                                 \
        return lowbit::gemv::occupancy(lowbit::gemm::kbit_gemm_kernel<4, TYPE, NT, R, true>,                 \
                                       lowbit::gemm::gemm_smem<4, NT>(), lowbit::gemm::kWarps);              \
    }
// lowbit_nvfp4_grouped_gemm_<dtype>_t<NT>: the grouped (MoE) GEMM on NVFP4 expert stacks, experts' tokens in
// chunks of 8 NT (scales = the experts' scale_2).
#define LOWBIT_DEFINE_NVFP4_GROUPED_GEMM(NAME, TYPE, NT)                                                          \
    extern "C" int lowbit_nvfp4_grouped_gemm_##NAME##_t##NT(                                                     \
        const void* x, const int64_t* offsets, const void* qweight, const void* qscales, const float* codebook,  \
        const float* scales, void* y, const void* bias, int n_experts, int n, int k_in, int ctas, void* stream) { \
        return lowbit::gemm::launch_grouped<4, TYPE, NT, true>(x, offsets, qweight, qscales, codebook, scales, y, \
                                                                bias, n_experts, n, k_in, ctas, stream);          \
    }                                                                                                             \
    extern "C" int lowbit_nvfp4_grouped_gemm_occupancy_##NAME##_t##NT(int n_experts) {                           \
        if (lowbit::gemm::grouped_smem<4, NT>(n_experts) > 227 * 1024) return 0;                                  \
        return lowbit::gemv::occupancy(lowbit::gemm::kbit_grouped_gemm_kernel<4, TYPE, NT, true>,                 \
                                       lowbit::gemm::grouped_smem<4, NT>(n_experts), lowbit::gemm::kWarps);       \
    }
#define LOWBIT_DEFINE_NVFP4_GEMM_DTYPE(NAME, TYPE)  \
    LOWBIT_DEFINE_NVFP4_GEMM(NAME, TYPE, 2, 1)      \
    LOWBIT_DEFINE_NVFP4_GEMM(NAME, TYPE, 4, 1)      \
    LOWBIT_DEFINE_NVFP4_GEMM(NAME, TYPE, 8, 1)      \
    LOWBIT_DEFINE_NVFP4_GEMM(NAME, TYPE, 4, 2)      \
    LOWBIT_DEFINE_NVFP4_GEMM(NAME, TYPE, 8, 2)      \
    LOWBIT_DEFINE_NVFP4_GROUPED_GEMM(NAME, TYPE, 2) \
    LOWBIT_DEFINE_NVFP4_GROUPED_GEMM(NAME, TYPE, 4) \
    LOWBIT_DEFINE_NVFP4_GROUPED_GEMM(NAME, TYPE, 8)
LOWBIT_DEFINE_NVFP4_GEMM_DTYPE(fp16, __half)
LOWBIT_DEFINE_NVFP4_GEMM_DTYPE(bf16, __nv_bfloat16)
