// L2 prefetch of constant data another kernel reads soon: used by kernels that leave DRAM idle.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

namespace lowbit {

// L2 prefetch of constant data a later kernel reads (the next projections' weights), issued by a kernel
// that leaves DRAM idle -- decode attention reads ~2 MB in ~9 us. Up to kMaxPrefetch ranges, each cut into
// 2 KB chunks of which a fraction f is fetched, spread evenly (chunk c iff floor((c + 1) f) > floor(c f),
// f in 32-bit fixed point: no 64-bit division in the kernel): every CTA of the consumer finds the same
// share of its weights in L2, none is left alone on DRAM at the end. A hint: sm_90's bulk prefetch (one
// instruction per chunk, nothing to wait for); nothing on older GPUs.
constexpr int kMaxPrefetch = 4;
constexpr uint32_t kPrefetchChunk = 2048;
constexpr uint32_t kPrefetchAll = 0xffffffffu;  // f = 1
struct L2Prefetch {
    const char* ptr[kMaxPrefetch];  // 16-byte aligned
    int64_t bytes[kMaxPrefetch];    // multiple of 16
    uint32_t frac[kMaxPrefetch];    // f * 2^32 (kPrefetchAll: every chunk)
    int n;
};

// Worker `w` of `workers` (every thread of the grid) issues its share.
__device__ __forceinline__ void l2_prefetch(const L2Prefetch& pf, uint32_t w, uint32_t workers) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#pragma unroll
    for (int r = 0; r < kMaxPrefetch; ++r) {  // unrolled: the ranges stay in parameter space
        if (r >= pf.n) break;
        const uint32_t chunks = static_cast<uint32_t>((pf.bytes[r] + kPrefetchChunk - 1) / kPrefetchChunk);
        const uint32_t f = pf.frac[r];
        for (uint32_t c = w; c < chunks; c += workers) {
            // frac(c f) + f >= 1: the running sum crosses an integer at this chunk
            if (f != kPrefetchAll && (f == 0 || c * f < 0u - f)) continue;
            const int64_t off = int64_t(c) * kPrefetchChunk;
            const uint32_t size = static_cast<uint32_t>(min(int64_t(kPrefetchChunk), pf.bytes[r] - off));
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(pf.ptr[r] + off), "r"(size) : "memory");
        }
    }
#endif
}

// Host: `ranges` triples (address, bytes, bytes to fetch) -> L2Prefetch; false if a range is misaligned,
// past 2^32 chunks, or there are more than kMaxPrefetch (the launch then refuses).
inline bool make_l2_prefetch(const int64_t* ranges, int n, L2Prefetch& pf) {
    pf = {};
    if (n < 0 || n > kMaxPrefetch || (n > 0 && ranges == nullptr)) return false;
    for (int r = 0; r < n; ++r) {
        const int64_t addr = ranges[3 * r], bytes = ranges[3 * r + 1], want = ranges[3 * r + 2];
        const int64_t chunks = (bytes + kPrefetchChunk - 1) / kPrefetchChunk;
        if (addr % 16 || bytes < 0 || bytes % 16 || want < 0 || chunks >= (int64_t(1) << 32)) return false;
        pf.ptr[r] = reinterpret_cast<const char*>(addr);
        pf.bytes[r] = bytes;
        pf.frac[r] = want >= bytes ? kPrefetchAll
                                   : static_cast<uint32_t>(((unsigned __int128)want << 32) / uint64_t(bytes));
    }
    pf.n = n;
    return true;
}

}  // namespace lowbit
