// Device-side check of MoE expert offsets (rows sorted by expert): offsets[0] == 0, non-decreasing,
// offsets[E] == rows. The grouped kernels trust the offsets they are given (reading them back to the
// host would cost a synchronization and break CUDA-graph capture), so the functional API runs this
// one-CTA kernel before them when the offsets live on the GPU and were not built by lowbit itself. A
// violation stops the kernel with a device-side assertion (the CUDA context is then unusable, as
// after any device-side assert): a wrong answer is never returned.
#include <assert.h>
#include <stdio.h>

#include <cuda_runtime.h>
#include <stdint.h>

namespace lowbit {

__global__ void check_expert_offsets_kernel(const int64_t* __restrict__ offsets, int n_experts, int64_t rows) {
    for (int i = threadIdx.x; i <= n_experts; i += blockDim.x) {
        const int64_t v = offsets[i];
        const bool bad = (i == 0 && v != 0) || (i == n_experts && v != rows) || (i > 0 && v < offsets[i - 1]);
        if (bad) {
            printf("lowbit: expert_offsets must rise from 0 to the row count %lld (non-decreasing); "
                   "offsets[%d] = %lld\n", static_cast<long long>(rows), i, static_cast<long long>(v));
            assert(false && "lowbit: invalid expert_offsets");
        }
    }
}

}  // namespace lowbit

// offsets: int64 [n_experts + 1] on the device; rows: the row count of x.
extern "C" int lowbit_check_expert_offsets(const int64_t* offsets, int n_experts, int64_t rows, void* stream) {
    if (n_experts < 1) return static_cast<int>(cudaErrorInvalidValue);
    lowbit::check_expert_offsets_kernel<<<1, 256, 0, static_cast<cudaStream_t>(stream)>>>(offsets, n_experts, rows);
    return static_cast<int>(cudaGetLastError());
}
