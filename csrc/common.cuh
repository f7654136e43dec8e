// Helpers shared by every lowbit kernel family.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

// Timeline probe: a kernel marks its steps with LOWBIT_TRACE(event); a no-op unless a tool defines it
// before including lowbit's headers (benchmarks/tools/gemv_timeline.cu records %globaltimer per warp).
#ifndef LOWBIT_TRACE
#define LOWBIT_TRACE(event) ((void)0)
#endif

namespace lowbit {

constexpr unsigned kFullMask = 0xffffffffu;

// E4M4 absmax byte -> float, exact (see lowbit/formats/e4m4.py: bias 15, subnormals at e=0).
// value = mant * 2^(max(e,1) - 19), mant = m + (e ? 16 : 0). Built from bits: no table,
// no branch, 5 integer ops + 1 multiply.
__device__ __forceinline__ float decode_e4m4(uint32_t code) {
    const uint32_t e = code >> 4;
    const uint32_t mant = (code & 15u) | (e ? 16u : 0u);
    const uint32_t exp = (e ? e : 1u) - 19u + 127u;  // biased fp32 exponent of 2^(e' - 19)
    return __uint_as_float(exp << 23) * static_cast<float>(mant);
}

// Output conversion, round-to-nearest-even like torch's .to(dtype).
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
// A pair of fp16 / bf16 packed in 32 bits (low element first) -> float2, exact.
template <typename T> __device__ __forceinline__ float2 to_float2(uint32_t v);
template <> __device__ __forceinline__ float2 to_float2<__half>(uint32_t v) {
    return __half22float2(*reinterpret_cast<__half2*>(&v));
}
template <> __device__ __forceinline__ float2 to_float2<__nv_bfloat16>(uint32_t v) {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

// Weights are read once: keep them out of L1. PF: also ask L2 to fetch the whole 256-byte
// block around each miss (fewer, larger DRAM requests; tuned per shape).
template <bool PF = false>
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
    if constexpr (PF) {
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    } else {
        asm volatile("ld.global.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    }
    return v;
}

// d += A (16x16, row) * B (16x8, col), fp32 accumulate; T picks the f16 or bf16 instruction.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (std::is_same_v<T, __half>) {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// Two floats -> a pair of fp16 / bf16 in 32 bits (low element first), round to nearest even.
template <typename T> struct Pack2;
template <> struct Pack2<__half> {
    static __device__ uint32_t pack(float a, float b) {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t*>(&h);
    }
};
template <> struct Pack2<__nv_bfloat16> {
    static __device__ uint32_t pack(float a, float b) {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t*>(&h);
    }
};

// The 8x8 matrix of 16-bit elements a warp holds (lane 4 r + c/2: row r, columns c, c + 1) transposed.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t v) {
    uint32_t d;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(v));
    return d;
}

// Programmatic dependent launch (sm_90+, used when an op is asked for it): a kernel waits for the
// previous one's completion (and memory) only before it touches its inputs or outputs -- weights
// are constant, so their first loads overlap the predecessor's tail -- and lets the next one start
// right after that wait, never before it: a dependent may skip its own wait when it reads nothing
// of ours (inductor's Triton kernels do), and must not overtake our predecessor. Without the
// launch attribute both are no-ops.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// 16 bytes global -> shared without registers (cp.async, L2 only); src_bytes = 0 fills them with zeros (rows past M,
// columns past K_in). commit closes this thread's group of copies; wait<N> returns once at most N groups are pending.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Under PDL x may be the output of a predecessor still running when this kernel starts: read it
// through the coherent path (ld.global.nc assumes data fixed for the kernel's lifetime) and in
// asm volatile, so the compiler can't hoist it above pdl_wait(). (Reading x with __ldg there
// failed the chained-graph test.) PDL is a template flag: the default kernels keep __ldg and
// their tuned code -- switching them to this load cost up to 20% on some tuned shapes.
__device__ __forceinline__ uint4 ld_x(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}

// cudaLaunchKernelEx's configuration: grid, block, dynamic shared memory and stream, plus the programmatic-
// serialization attribute when pdl (a no-op for a kernel without griddepcontrol).
struct Launch {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    Launch(dim3 grid, dim3 block, size_t smem, void* stream, bool pdl) {
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = static_cast<cudaStream_t>(stream);
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = pdl ? 1 : 0;
    }
};

// Grid for a grid-stride kernel: `want` CTAs, capped at one wave of resident CTAs of `kernel`.
template <typename K>
inline unsigned one_wave_grid(K kernel, int threads, int64_t want) {
    int device = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0);
    const int64_t wave = int64_t(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
    return static_cast<unsigned>(want < wave ? want : wave);
}

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace lowbit
