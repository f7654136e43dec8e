// kbit's instances of the tiled decode GEMV (tiled/gemv.cuh): lowbit_kbit_gemv_b<BITS>_<dtype>_m<M>,
// lowbit_kbit_split_gemv_b<BITS>_<dtype>, their occupancy queries and the shared-memory limits, for K = 2..5.
#include "tiled/gemv.cuh"

#define LOWBIT_DEFINE_GEMV(BITS, NAME, TYPE, M)                                                               \
    extern "C" int lowbit_kbit_gemv_b##BITS##_##NAME##_m##M(                                                  \
        const void* x, const void* qweight, const void* qabsmax, const float* codebook, const float* scale,   \
        void* y, const void* bias, float* workspace, int* counters, int m, int n, int k_in, int n_warps,      \
        int flags, const lowbit_epilogue* epi, void* stream) {                                                                              \
        return lowbit::gemv::launch_gemv<BITS, TYPE, M>(x, qweight, qabsmax, codebook, scale, y, bias,        \
                                                        workspace, counters, m, n, k_in, n_warps, flags, epi, stream);\
    }                                                                                                         \
    /* resident warps per SM (one-wave grid of the stream-K kernel) */                                       \
    extern "C" int lowbit_kbit_gemv_occupancy_b##BITS##_##NAME##_m##M(void) {                                 \
        return lowbit::gemv::gemv_occupancy<BITS, TYPE, M>();                                                 \
    }
#define LOWBIT_DEFINE_SPLIT(BITS, NAME, TYPE)                                                                  \
    extern "C" int lowbit_kbit_split_gemv_b##BITS##_##NAME(                                                    \
        const void* x, const int64_t* offsets, int m_dense, const void* qweight, const void* qabsmax,          \
        const float* codebook, const float* scales, void* y, const void* bias, int n_experts, int n, int k_in, \
        int max_ctas, int flags, const lowbit_epilogue* epi, void* stream) {                                     \
        return lowbit::gemv::launch_split<BITS, TYPE>(x, offsets, m_dense, qweight, qabsmax, codebook, scales, \
                                                      y, bias, n_experts, n, k_in, max_ctas, flags, epi, stream);\
    }                                                                                                          \
    /* routed MoE rows: route r = expert ids[r] times x row r / x_div into y row r (gemv.cuh: Routes) */   \
    extern "C" int lowbit_kbit_routed_gemv_b##BITS##_##NAME(                                                   \
        const void* x, const int64_t* ids, int count, int x_div, const void* qweight, const void* qabsmax,     \
        const float* codebook, const float* scales, void* y, int n_experts, int n, int k_in, int max_ctas,     \
        int flags, void* stream) {                                                                               \
        return lowbit::gemv::launch_split<BITS, TYPE>(x, nullptr, 0, qweight, qabsmax, codebook, scales, y,    \
                                                      nullptr, n_experts, n, k_in, max_ctas, flags, nullptr,    \
                                                      stream,                                                   \
                                                      lowbit::gemv::Routes{ids, count, x_div});                 \
    }                                                                                                          \
    extern "C" int lowbit_kbit_split_gemv_occupancy_b##BITS##_##NAME(int n_experts) {                          \
        return lowbit::gemv::occupancy(lowbit::gemv::kbit_split_gemv_kernel<BITS, TYPE, true>,            \
                                       lowbit::gemv::split_smem<BITS>(n_experts), lowbit::gemv::kWarps);                            \
    }
#define LOWBIT_DEFINE_GEMV_DTYPE(BITS, NAME, TYPE) \
    LOWBIT_DEFINE_GEMV(BITS, NAME, TYPE, 1)        \
    LOWBIT_DEFINE_GEMV(BITS, NAME, TYPE, 2)        \
    LOWBIT_DEFINE_GEMV(BITS, NAME, TYPE, 3)        \
    LOWBIT_DEFINE_GEMV(BITS, NAME, TYPE, 4)        \
    LOWBIT_DEFINE_GEMV(BITS, NAME, TYPE, 8)        \
    LOWBIT_DEFINE_SPLIT(BITS, NAME, TYPE)
// per K, whatever the dtype, too: the SwiGLU epilogue's tile pairs per CTA on this device, and whether the routed
// down GEMV's own activation fits it (gemv.cuh: swi_max_pairs, routed_act_fits)
#define LOWBIT_DEFINE_GEMV_BITS(BITS)                                                             \
    LOWBIT_DEFINE_GEMV_DTYPE(BITS, fp16, __half)                                                  \
    LOWBIT_DEFINE_GEMV_DTYPE(BITS, bf16, __nv_bfloat16)                                           \
    extern "C" int lowbit_kbit_gemv_swiglu_pairs_b##BITS(void) {                                  \
        return lowbit::gemv::swi_max_pairs<BITS>(false);                                          \
    }                                                                                             \
    extern "C" int lowbit_kbit_routed_act_fits_b##BITS(int n_experts, int routes, int k_in) {     \
        return lowbit::gemv::routed_act_fits<BITS>(n_experts, routes, k_in);                      \
    }
LOWBIT_DEFINE_GEMV_BITS(2)
LOWBIT_DEFINE_GEMV_BITS(3)
LOWBIT_DEFINE_GEMV_BITS(4)
LOWBIT_DEFINE_GEMV_BITS(5)
