// NVFP4's instances of the tiled decode GEMV (tiled/gemv.cuh).
#include "tiled/gemv.cuh"

// NVFP4 weights (K = 4 code layout + E4M3 scales, lowbit/formats/nvfp4/tiled.py; codebook = the 16
// E2M1 values, scale = the tensor's scale_2): lowbit_nvfp4_gemv_<dtype>_m<M>, lowbit_nvfp4_split_gemv_<dtype>,
// lowbit_nvfp4_routed_gemv_<dtype>.
#define LOWBIT_DEFINE_NVFP4_GEMV(NAME, TYPE, M)                                                              \
    extern "C" int lowbit_nvfp4_gemv_##NAME##_m##M(                                                          \
        const void* x, const void* qweight, const void* qscales, const float* codebook, const float* scale,  \
        void* y, const void* bias, float* workspace, int* counters, int m, int n, int k_in, int n_warps,     \
        int flags, const lowbit_epilogue* epi, void* stream) {                                                                             \
        return lowbit::gemv::launch_gemv<4, TYPE, M, true>(x, qweight, qscales, codebook, scale, y, bias,    \
                                                           workspace, counters, m, n, k_in, n_warps, flags, epi, stream);\
    }                                                                                                        \
    extern "C" int lowbit_nvfp4_gemv_occupancy_##NAME##_m##M(void) {                                         \
        return lowbit::gemv::gemv_occupancy<4, TYPE, M, true>();                                             \
    }
#define LOWBIT_DEFINE_NVFP4_DTYPE(NAME, TYPE)                                                                \
    LOWBIT_DEFINE_NVFP4_GEMV(NAME, TYPE, 1)                                                                  \
    LOWBIT_DEFINE_NVFP4_GEMV(NAME, TYPE, 2)                                                                  \
    LOWBIT_DEFINE_NVFP4_GEMV(NAME, TYPE, 3)                                                                  \
    LOWBIT_DEFINE_NVFP4_GEMV(NAME, TYPE, 4)                                                                  \
    LOWBIT_DEFINE_NVFP4_GEMV(NAME, TYPE, 8)                                                                  \
    extern "C" int lowbit_nvfp4_split_gemv_##NAME(                                                           \
        const void* x, const int64_t* offsets, int m_dense, const void* qweight, const void* qscales,        \
        const float* codebook, const float* scales, void* y, const void* bias, int n_experts, int n, int k_in, \
        int max_ctas, int flags, const lowbit_epilogue* epi, void* stream) {                                   \
        return lowbit::gemv::launch_split<4, TYPE, true>(x, offsets, m_dense, qweight, qscales, codebook,    \
                                                         scales, y, bias, n_experts, n, k_in, max_ctas, flags, epi, \
                                                         stream);                                              \
    }                                                                                                        \
    /* routed MoE rows: route r = expert ids[r] times x row r / x_div into y row r (gemv.cuh: Routes) */    \
    extern "C" int lowbit_nvfp4_routed_gemv_##NAME(                                                          \
        const void* x, const int64_t* ids, int count, int x_div, const void* qweight, const void* qscales,   \
        const float* codebook, const float* scales, void* y, int n_experts, int n, int k_in, int max_ctas,   \
        int flags, void* stream) {                                                                             \
        return lowbit::gemv::launch_split<4, TYPE, true>(x, nullptr, 0, qweight, qscales, codebook, scales, y, \
                                                         nullptr, n_experts, n, k_in, max_ctas, flags, nullptr, \
                                                         stream, lowbit::gemv::Routes{ids, count, x_div});     \
    }                                                                                                        \
    extern "C" int lowbit_nvfp4_split_gemv_occupancy_##NAME(int n_experts) {                                 \
        return lowbit::gemv::occupancy(lowbit::gemv::kbit_split_gemv_kernel<4, TYPE, true, false, true>,     \
                                       lowbit::gemv::split_smem<4>(n_experts), lowbit::gemv::kWarps);        \
    }
// the SwiGLU epilogue's tile pairs per CTA on this device (gemv.cuh: swi_max_pairs)
extern "C" int lowbit_nvfp4_gemv_swiglu_pairs(void) { return lowbit::gemv::swi_max_pairs<4>(false); }
// whether the routed down GEMV's own activation fits this device (gemv.cuh: routed_act_fits)
extern "C" int lowbit_nvfp4_routed_act_fits(int n_experts, int routes, int k_in) {
    return lowbit::gemv::routed_act_fits<4>(n_experts, routes, k_in);
}
LOWBIT_DEFINE_NVFP4_DTYPE(fp16, __half)
LOWBIT_DEFINE_NVFP4_DTYPE(bf16, __nv_bfloat16)
