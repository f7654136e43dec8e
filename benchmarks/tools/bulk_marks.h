// The timeline probes' marks (bulk_timeline.cu, bulk_chain_timeline.cu): the global timer, and one mark stored by
// lane 0 of each warp into its slots of a marks buffer (kMarks per warp; entry also records the warp's SM).
#pragma once

constexpr int kMarks = 10;  // per warp: marks 0..7, 8 = waited ns, 9 = SM
__device__ __forceinline__ unsigned long long bt_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void bt_store(unsigned long long* b, int ev, unsigned long long v) {
    const int w = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    b[w * kMarks + ev] = v;
    if (ev == 0) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        b[w * kMarks + 9] = sm;
    }
}
