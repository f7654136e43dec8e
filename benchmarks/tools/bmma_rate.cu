// The issue rate of the binary MMA (mma.m16n8k128.b1.and.popc) beside the fp16 one, 8 independent chains per
// warp. Build and run on the GPU:  nvcc -O3 -arch=sm_90a -o bmma_rate benchmarks/tools/bmma_rate.cu && ./bmma_rate

#include <cstdio>
#include <cstdint>
#include <cuda_fp16.h>
__global__ void bmma(uint32_t* out, int iters) {
  uint32_t a0 = threadIdx.x, a1 = threadIdx.x * 3, b = threadIdx.x * 7;
  int d[8][4] = {};
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < 8; ++c)
      asm volatile("mma.sync.aligned.m16n8k128.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+r"(d[c][0]),"+r"(d[c][1]),"+r"(d[c][2]),"+r"(d[c][3]) : "r"(a0 + c),"r"(a1),"r"(b));
  }
  int s = 0; for (int c = 0; c < 8; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
__global__ void hmma(uint32_t* out, int iters) {
  uint32_t a0 = threadIdx.x, b = threadIdx.x * 7;
  float d[8][4] = {};
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < 8; ++c)
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[c][0]),"+f"(d[c][1]),"+f"(d[c][2]),"+f"(d[c][3]) : "r"(a0 + c),"r"(a0),"r"(a0),"r"(a0),"r"(b),"r"(b));
  }
  float s = 0; for (int c = 0; c < 8; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = (uint32_t)s;
}
int main() {
  uint32_t* out; cudaMalloc(&out, 132 * 8 * 1024 * 4);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int clk; cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  const int iters = 4096;
  for (int kind = 0; kind < 2; ++kind) {
    for (int rep = 0; rep < 2; ++rep) {
      cudaEventRecord(e0);
      if (kind == 0) bmma<<<sms * 4, 256>>>(out, iters); else hmma<<<sms * 4, 256>>>(out, iters);
      cudaEventRecord(e1); cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1);
      double mmas_per_smsp = double(iters) * 8 * 4 * 8 / 4;  // per SM: 4 CTAs x 8 warps x iters x 8, over 4 SMSPs
      double clks = ms * 1e-3 * clk * 1e3;
      if (rep) printf("%s: %.2f clk per MMA per SMSP (%.3f ms, clock %d MHz)\n", kind ? "mma.m16n8k16.f16" : "mma.m16n8k128.b1", clks / mmas_per_smsp, ms, clk / 1000);
    }
  }
  return 0;
}
