// The kbit decode shared by the GEMV (tiled/gemv.cuh) and the GEMM (tiled/gemm.cuh): lookup tables,
// the per-lane group loads of the tiled layout (lowbit/formats/kbit/tiled.py) and the per-block
// decode into mma.m16n8k16 A fragments (weights as A, tokens as B: "swap AB").
#pragma once
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "common.cuh"

namespace lowbit {
namespace gemv {

constexpr int kGroupBlocks = 8;   // 32-element blocks per group (one load round)

// The lookup tables live at the start of dynamic shared memory.
extern __shared__ __align__(16) char g_table[];

__device__ __forceinline__ uint32_t lds_u32(uint32_t addr) {
    uint32_t v;  // volatile: must not be hoisted above the __syncthreads that publishes the table
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return v;
}
// A constant (codebook) value; volatile, so that it stays ahead of the weight loads issued after it.
__device__ __forceinline__ float ld_const(const float* p) {
    float v;
    asm volatile("ld.global.nc.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ void lds_u32x2(uint32_t addr, uint32_t& a, uint32_t& b) {
    asm volatile("ld.shared.v2.b32 {%0,%1}, [%2];\n" : "=r"(a), "=r"(b) : "r"(addr));
}

// E4M4 byte (in bits 19..26 of `shifted`) -> float * 2^-112: the byte placed in an fp32's
// exponent and top mantissa bits is exactly e4m4 * 2^-112 (subnormals included). The 2^112 is
// applied once per output (kScaleFix), not once per block.
__device__ __forceinline__ float e4m4_scaled_down(uint32_t shifted) {
    return __uint_as_float(shifted & 0x07F80000u);
}
constexpr float kScaleFix = 5.192296858534828e33f;  // 2^112

// Shift `word` left by S (right if S < 0); constant-folded to one SHF.
template <int S>
__device__ __forceinline__ uint32_t shift(uint32_t word) {
    if constexpr (S >= 0) return word << S; else return word >> (-S);
}

// (word & MASK) shifted by S, plus `base`. The mask is applied first (in PTX, so the compiler
// cannot turn it back into shift-then-mask), letting ptxas fuse shift + add into one LEA /
// LEA.HI: two instructions per lookup address instead of three.
template <uint32_t MASK, int S>
__device__ __forceinline__ uint32_t mask_shift_add(uint32_t word, uint32_t base) {
    uint32_t masked;
    asm("and.b32 %0, %1, %2;\n" : "=r"(masked) : "r"(word), "n"(MASK));
    return shift<S>(masked) + base;
}

// K = 3's spare fields (lowbit/formats/kbit/tiled.py): fields 12..15 of a word triple, 2 bits in each of bits 6..7 of
// every byte of the three words, gathered into bits 0..5 of the bytes of one word (bits 6..7: whatever falls there,
// so a reader masks them or a table ignores them). 3 shifts and 2 bitwise selects for four fields; the other twelve
// sit in bytes already.
__device__ __forceinline__ uint32_t k3_spare(uint32_t w0, uint32_t w1, uint32_t w2) {
    const uint32_t lo = ((w0 >> 6) & 0x03030303u) | ((w1 >> 4) & ~0x03030303u);  // field bits 0..1, 2..3 (+ junk)
    return (lo & 0x0F0F0F0Fu) | ((w2 >> 2) & ~0x0F0F0F0Fu);                       // 4..5 (+ junk in 6..7)
}

// The word that holds field F of a lane's K = 3 words in bits 0..5 of its byte F % 4.
template <int F>
__device__ __forceinline__ uint32_t k3_word(const uint32_t (&w)[12]) {
    constexpr int r = F / 16, i = F % 16;
    if constexpr (i < 12) return w[3 * r + i / 4];
    else return k3_spare(w[3 * r], w[3 * r + 1], w[3 * r + 2]);
}

// The value (2K bits: code0 | code1 << K) of field f of a lane's words, for readers without a table (f a constant
// once the caller's loops unroll).
template <int BITS>
__device__ __forceinline__ uint32_t pair_field(const uint32_t (&w)[4 * BITS], int f) {
    if constexpr (BITS == 3) {
        const int r = f / 16, i = f % 16;
        const uint32_t word = i < 12 ? w[3 * r + i / 4] : k3_spare(w[3 * r], w[3 * r + 1], w[3 * r + 2]);
        return (word >> (8 * (i % 4))) & 0x3Fu;
    } else {
        const int bit = 2 * BITS * f, lo = bit >> 5, sh = bit & 31;
        uint32_t field = w[lo] >> sh;
        if (sh + 2 * BITS > 32) field |= w[lo + 1] << (32 - sh);  // straddles two words (K = 5)
        return field & ((1u << (2 * BITS)) - 1u);
    }
}

// The lookup table: one entry per value of a lookup field of the lane's code stream, holding
// the field's decoded fp16/bf16 values, replicated so that a warp's 32 lookups never conflict
// whatever the indices (lane l reads replica l % R).
//   pair fields (2K bits: code0 | code1 << K): 4-byte entries (one A-fragment register);
//   QUAD (K=2 only, the stream-K kernel): 8-bit fields = two consecutive pairs, 8-byte entries
//     = two consecutive A-fragment registers: one 64-bit load decodes 4 codes. (A warp's 64-bit
//     loads are served a half-warp at a time; 32 replicas fill both halves' banks.)
// K=3's 6-bit pairs lie in bytes (k3_word), with two other bits above them: the table has 256 entries, 4 copies of
// each pair's, and is looked up as K=4's (COMPACT: 64 entries, the byte masked). Against the plain 6-bit stream
// (mask + LEA per field, a funnel shift where one straddled), H100, cold, us: the bulk-copy GEMV 8192x29568 41.9 ->
// 39.0, 4096x28672 23.8 -> 22.0; the stream-K kernel tied on large shapes and lost ~0.2 us on small ones to the
// larger table (4096x6144 8.10 -> 8.28), and lost more with the byte layout and the 8 KB table (8.70; 8192x29568
// 38.3 -> 41.9); Llama-3-8B b1 kbit3 475.7 -> 487.9 tok/s (benchmarks/journal/2026-11-27_k3_byte_layout.md).
// Byte-wide fields (K=4 pairs, K=3 pairs in bytes, K=2 quads) get 256-byte entry rows, so a lookup's offset is
// (field << 8) | (lane * entry bytes): one byte permute (PRMT) of the code word, plus the table
// base as a uniform register in the load. Other fields: mask + shift-add (LEA), 2 instructions.
// K=5 (1024 entries) keeps 16 replicas so its table is 64 KB, not 128 KB: lanes l and l+16 share
// a bank, at most a 2-way conflict, affordable at K=5's lower weights-per-byte rate.
// COMPACT: no 256-byte rows (K=4 32 KB instead of 64 KB, addresses by mask + LEA) -- for the GEMM,
// which reuses each lookup for several token tiles and needs the shared memory for x.
template <int BITS, bool QUAD, bool COMPACT = false>
struct Lut {
    static_assert(!QUAD || BITS == 2, "quad lookups are for K=2");
    static constexpr int kFieldBits = QUAD ? 8 : 2 * BITS;
    static constexpr int kIndexBits = BITS == 3 && !COMPACT ? 8 : kFieldBits;  // bits of a lookup's index
    static constexpr int kEntries = 1 << kIndexBits;
    static constexpr int kEntryBytes = QUAD ? 8 : 4;
    static constexpr int kReplicas = BITS == 5 ? 16 : 32;
    static constexpr bool kBytePerm = kIndexBits == 8 && !COMPACT;
    static constexpr int kRowShift = kBytePerm ? 8 : BITS == 5 ? 6 : 7;  // log2(bytes per entry row)
    static constexpr size_t kBytes = size_t(kEntries) << kRowShift;
    static_assert(kReplicas * kEntryBytes <= (1 << kRowShift), "entry row");

    // The per-lane operand of addr(): lane * entry bytes (byte-perm) or table + replica offset.
    static __device__ __forceinline__ uint32_t lane_operand(uint32_t table, int lane) {
        if constexpr (kBytePerm) return uint32_t(lane * kEntryBytes);
        else return table + uint32_t(lane % kReplicas) * kEntryBytes;
    }

    // Shared address of the entry for field F of the lane's stream (bits [F * kFieldBits, ...); K=3: k3_word).
    // K=5 fields that straddle two words are joined by one funnel shift first.
    template <int F>
    static __device__ __forceinline__ uint32_t addr(const uint32_t (&w)[4 * BITS], uint32_t lane_op, uint32_t table) {
        constexpr int bit = kFieldBits * F, wi = bit / 32, s = bit % 32;
        if constexpr (BITS == 3) {
            constexpr int b = F % 4;  // the field's byte in k3_word
            if constexpr (kBytePerm) return table + __byte_perm(k3_word<F>(w), lane_op, 0x5504u | (b << 4));
            else return mask_shift_add<0x3Fu << (8 * b), kRowShift - 8 * b>(k3_word<F>(w), lane_op);
        } else if constexpr (kBytePerm) {
            // byte s/8 of the word to bits 8..15, the lane offset (byte 0 of lane_op) to bits 0..7,
            // zeros (byte 1 of lane_op) above
            return table + __byte_perm(w[wi], lane_op, 0x5504u | ((s / 8) << 4));
        } else {
            constexpr uint32_t kFieldMask = (1u << kFieldBits) - 1;
            if constexpr (s + kFieldBits <= 32) {
                return mask_shift_add<kFieldMask << s, kRowShift - s>(w[wi], lane_op);
            } else {
                return mask_shift_add<kFieldMask, kRowShift>(__funnelshift_r(w[wi], w[wi + 1], s), lane_op);
            }
        }
    }

    // Build it with THREADS threads: 16-byte stores (4 replicas of a 4-byte entry, or 2 of an
    // 8-byte one), consecutive threads on consecutive chunks (no bank conflicts), no staging barrier.
    // In two steps: fetch() loads one codebook value per lane (lane l: value l mod 2^K), store() gets
    // each chunk's values by warp shuffles and writes the chunks. The GEMVs fetch before they request any
    // weights. One load per thread instead of two per chunk: the split kernel lost its spills, and
    // Llama-3-8B's GEMVs ran ~1% faster (H100, M = 1; benchmarks/journal/2026-11-26_gemv_startup.md).
    // K=3 in bytes: the entries e, e + 64, e + 128, e + 192 are one value, computed once and stored kCopies times.
    static constexpr int kChunksPerEntry = kReplicas * kEntryBytes / 16;
    static constexpr int kValues = 1 << kFieldBits;  // <= kEntries: kIndexBits >= kFieldBits
    static constexpr int kCopies = kEntries / kValues;
    static constexpr int kChunks = kValues * kChunksPerEntry;
    static_assert((1 << BITS) <= 32, "one codebook value per lane");

    static __device__ __forceinline__ float fetch(const float* __restrict__ codebook) {
        return ld_const(codebook + (threadIdx.x & ((1 << BITS) - 1)));
    }

    template <int THREADS, typename T>
    static __device__ __forceinline__ void store(float cb) {
        constexpr int kMask = (1 << BITS) - 1;
        auto value = [cb](int code) { return __shfl_sync(kFullMask, cb, code); };
#pragma unroll
        for (int i = 0; i < (kChunks + THREADS - 1) / THREADS; ++i) {
            const int c = i * THREADS + threadIdx.x;
            const int e = c / kChunksPerEntry, part = c % kChunksPerEntry;
            uint4 chunk;
            if constexpr (QUAD) {  // e = pair0 | pair1 << 4, each pair = code0 | code1 << 2
                const uint32_t v0 = Pack2<T>::pack(value(e & 3), value((e >> 2) & 3));
                const uint32_t v1 = Pack2<T>::pack(value((e >> 4) & 3), value((e >> 6) & 3));
                chunk = make_uint4(v0, v1, v0, v1);
            } else {  // e = code0 | code1 << K (K = 3 in bytes: bits 6, 7 ignored)
                const uint32_t v = Pack2<T>::pack(value(e & kMask), value((e >> BITS) & kMask));
                chunk = make_uint4(v, v, v, v);
            }
            if (kChunks % THREADS == 0 || c < kChunks) {  // after the shuffles: every lane takes part in them
#pragma unroll
                for (int k = 0; k < kCopies; ++k)
                    reinterpret_cast<uint4*>(g_table + (size_t(e + k * kValues) << kRowShift))[part] = chunk;
            }
        }
    }

    template <int THREADS, typename T>
    static __device__ __forceinline__ void build(const float* __restrict__ codebook) {
        store<THREADS, T>(fetch(codebook));
    }
};

// ---- K=2 in registers, no table. The four codebook values' low bytes sit in one register and their high
// bytes in another, so one byte permute (PRMT) looks up two codes: selector nibbles (a, a + 4, b, b + 4) give
// the pair (cb[a], cb[b]). The table's quad lookups move 8 bytes through the shared-memory data path per
// 4 codes (with x, ~11x the code bytes), which bound K=2 there (ncu: MIO throttle the first stall); this way
// moves none, for ~3 ALU instructions per pair instead of 1.
// The codebook's bytes in registers, for K=2 (cb2_regs) and K=3 (cb3_regs).
struct CbRegs {
    uint32_t lo, hi;    // byte c: low / high byte of codebook value c (as T)
    uint32_t lo2, hi2;  // K=3 only: the same for values 4 + c
};

// Every lane of the warp: cb is the lane's Lut::fetch value (code lane % 4).
template <typename T>
__device__ __forceinline__ CbRegs cb2_regs(float cb) {
    const uint32_t p01 = Pack2<T>::pack(__shfl_sync(kFullMask, cb, 0), __shfl_sync(kFullMask, cb, 1));
    const uint32_t p23 = Pack2<T>::pack(__shfl_sync(kFullMask, cb, 2), __shfl_sync(kFullMask, cb, 3));
    return {__byte_perm(p01, p23, 0x6420u), __byte_perm(p01, p23, 0x7531u)};
}

// ---- K=3 in registers, the same way: the eight values' low bytes in lo (0..3) and lo2 (4..7), their high bytes in
// hi and hi2, so a 3-bit code is the byte index of one PRMT over a register pair. Every lane of the warp: cb is the
// lane's Lut::fetch value (code lane % 8).
template <typename T>
__device__ __forceinline__ CbRegs cb3_regs(float cb) {
    uint32_t p[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        p[i] = Pack2<T>::pack(__shfl_sync(kFullMask, cb, 2 * i), __shfl_sync(kFullMask, cb, 2 * i + 1));
    return {__byte_perm(p[0], p[1], 0x6420u), __byte_perm(p[0], p[1], 0x7531u), __byte_perm(p[2], p[3], 0x6420u),
            __byte_perm(p[2], p[3], 0x7531u)};
}

// prmt with a computed selector: __byte_perm would mask it with 0x7777 first (one more instruction).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

// Codes 4k + S (k = 0..3) of a block's word (code n at bits 2n) as two pairs: lo = (cb[c_S], cb[c_4+S]),
// hi = (cb[c_8+S], cb[c_12+S]). The mask leaves code 4k + S in byte k; times 0x11 it fills nibbles 2k and
// 2k + 1; + 0x4040 points the odd nibbles at the high bytes. mad.hi does the same for bytes 2, 3 shifted down.
template <int S>
__device__ __forceinline__ void cb2_decode(uint32_t w, const CbRegs& cb, uint32_t& lo, uint32_t& hi) {
    const uint32_t c = shift<-2 * S>(w) & 0x03030303u;
    uint32_t sel_hi;
    asm("mad.hi.u32 %0, %1, %2, %3;\n" : "=r"(sel_hi) : "r"(c), "n"(0x110000), "n"(0x4040));
    lo = prmt(cb.lo, cb.hi, c * 0x11u + 0x4040u);
    hi = prmt(cb.lo, cb.hi, sel_hi);
}

// A block's A fragments from registers. Code 4k + S is column 2k + S % 2 of row g + 8 (S / 2) (the tiled
// layout's pairs: lowbit/formats/kbit/tiled.py), so the pairs above hold columns of one parity: MMA e takes
// the columns e, e + 2, e + 4, e + 6 of the lane's 8, and x must come in that order (cb2_x).
__device__ __forceinline__ void cb2_block(uint32_t (&frag)[2][4], uint32_t w, const CbRegs& cb) {
    cb2_decode<0>(w, cb, frag[0][0], frag[0][2]);  // row g: columns 0, 2 | 4, 6
    cb2_decode<2>(w, cb, frag[0][1], frag[0][3]);  // row g + 8
    cb2_decode<1>(w, cb, frag[1][0], frag[1][2]);  // row g: columns 1, 3 | 5, 7
    cb2_decode<3>(w, cb, frag[1][1], frag[1][3]);  // row g + 8
}

// K=3: the four pair fields in bits 0..5 of the bytes of `word` (k3_word) as four A-fragment registers, each the
// table's entry for that field: (cb[code0], cb[code1]). Each field's two 3-bit codes are spread to a nibble each
// (bits 3..5 up by one), so the word's fields are the PRMT selectors of their codes' low and high bytes; two more
// PRMTs interleave the bytes into values. 12 instructions for 4 fields.
__device__ __forceinline__ void cb3_word(uint32_t (&f)[4], uint32_t word, const CbRegs& cb) {
    uint32_t hi_codes;
    asm("and.b32 %0, %1, 0x38383838;\n" : "=r"(hi_codes) : "r"(word));
    const uint32_t sel = (word & 0x07070707u) | (hi_codes << 1);  // nibble 2k: code0 of byte k, 2k + 1: code1
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // bytes 2h, 2h + 1: selector bits 16h..16h + 15
        const uint32_t s = h ? sel >> 16 : sel;
        const uint32_t lo = prmt(cb.lo, cb.lo2, s), hi = prmt(cb.hi, cb.hi2, s);
        f[2 * h] = __byte_perm(lo, hi, 0x5140u);      // field 2h: (low, high) of code0, then of code1
        f[2 * h + 1] = __byte_perm(lo, hi, 0x7362u);  // field 2h + 1
    }
}

// Block J of K=3 from registers: the same two A fragments as lookup_block (pair p = 4m + R, field 8J + p).
template <int J>
__device__ __forceinline__ void cb3_block(uint32_t (&frag)[2][4], const uint32_t (&w)[12], const CbRegs& cb) {
    cb3_word(frag[0], k3_word<8 * J>(w), cb);      // fields 8J .. 8J + 3: bytes 0..3 of one word
    cb3_word(frag[1], k3_word<8 * J + 4>(w), cb);  // 8J + 4 .. 8J + 7
}

// x's 8 columns (pairs 01 23 45 67) as cb2_block's B operands: 02 46 | 13 57.
__device__ __forceinline__ uint4 cb2_x(const uint4& x) {
    return make_uint4(__byte_perm(x.x, x.y, 0x5410u), __byte_perm(x.z, x.w, 0x5410u),
                      __byte_perm(x.x, x.y, 0x7632u), __byte_perm(x.z, x.w, 0x7632u));
}

template <int BITS> struct GroupData {
    uint4 w[BITS];  // this lane's code words for 8 blocks
    uint4 a;        // absmax bytes of rows g (bytes 0..7) and g+8 (8..15), blocks 0..7
};

// Unit u = tile * n_groups + group is contiguous in both arrays, so a warp streams its units
// with one running index whatever tiles they belong to. qw_lane / qa_lane: this lane's offset;
// A_STRIDE: 16-byte chunks of scales per unit (kbit absmax: 8; NVFP4 scales: 16, nvfp4/tiled.py).
template <int BITS, int A_STRIDE = 8>
__device__ __forceinline__ void load_group(GroupData<BITS>& d, const uint4* qw_lane, const uint4* qa_lane, int64_t u) {
#pragma unroll
    for (int c = 0; c < BITS; ++c) d.w[c] = ld_stream(qw_lane + (u * BITS + c) * 32);
    d.a = ld_stream(qa_lane + u * A_STRIDE);
}

// Block J of a group: the lane's two A fragments (16 codes; register R of MMA m holds pair
// p = 4m + R, stream pair field 8J + p).
template <int BITS, bool QUAD, int J, bool COMPACT = false>
__device__ __forceinline__ void lookup_block(uint32_t (&frag)[2][4], const uint32_t (&w)[4 * BITS], uint32_t lane_op,
                                             uint32_t table) {
    using L = Lut<BITS, QUAD, COMPACT>;
    if constexpr (QUAD) {  // quad field 4J + i holds pairs 2i, 2i + 1
        lds_u32x2(L::template addr<4 * J + 0>(w, lane_op, table), frag[0][0], frag[0][1]);
        lds_u32x2(L::template addr<4 * J + 1>(w, lane_op, table), frag[0][2], frag[0][3]);
        lds_u32x2(L::template addr<4 * J + 2>(w, lane_op, table), frag[1][0], frag[1][1]);
        lds_u32x2(L::template addr<4 * J + 3>(w, lane_op, table), frag[1][2], frag[1][3]);
    } else {
        frag[0][0] = lds_u32(L::template addr<8 * J + 0>(w, lane_op, table));
        frag[0][1] = lds_u32(L::template addr<8 * J + 1>(w, lane_op, table));
        frag[0][2] = lds_u32(L::template addr<8 * J + 2>(w, lane_op, table));
        frag[0][3] = lds_u32(L::template addr<8 * J + 3>(w, lane_op, table));
        frag[1][0] = lds_u32(L::template addr<8 * J + 4>(w, lane_op, table));
        frag[1][1] = lds_u32(L::template addr<8 * J + 5>(w, lane_op, table));
        frag[1][2] = lds_u32(L::template addr<8 * J + 6>(w, lane_op, table));
        frag[1][3] = lds_u32(L::template addr<8 * J + 7>(w, lane_op, table));
    }
}

// Block J's scales (times 2^-112) of the lane's rows g and g + 8, from its 16 absmax bytes
// (row g at byte J, row g + 8 at byte 8 + J).
template <int J>
__device__ __forceinline__ void block_scales(const uint32_t (&a)[4], float& s_lo, float& s_hi) {
    constexpr int q = 8 * (J % 4);
    s_lo = e4m4_scaled_down(shift<19 - q>(a[J / 4]));
    s_hi = e4m4_scaled_down(shift<19 - q>(a[2 + J / 4]));
}

// Block J's scale of rows g (low half) and g + 8 (high) as a pair of T, to scale A fragments.
// kbit (E4M4 absmax): fp16: an E4M4 byte shifted left by 6 *is* the fp16 of its value (same exponent
// bias, subnormals included); bf16: through fp32 (exact: E4M4 values have 5 significant bits).
// NVFP4 (E4M3 scale): a byte shifted left by 7 is the fp16 of value / 256 (exponent bias 15 vs 7,
// subnormals included; the 256 is applied to the output); bf16: that fp16 converted (exact).
template <typename T, int J, bool FP4 = false>
__device__ __forceinline__ void scale_pairs(const uint32_t (&a)[4], uint32_t& lo, uint32_t& hi) {
    constexpr uint32_t kSel = (J % 4) | 0x40u | ((J % 4) << 8) | 0x4000u;  // byte J%4 to bytes 0 and 2
    if constexpr (FP4) {
        lo = __byte_perm(a[J / 4], 0u, kSel) << 7;
        hi = __byte_perm(a[2 + J / 4], 0u, kSel) << 7;
        if constexpr (!std::is_same_v<T, __half>) {
            const float2 fl = __half22float2(*reinterpret_cast<const __half2*>(&lo));
            const float2 fh = __half22float2(*reinterpret_cast<const __half2*>(&hi));
            lo = Pack2<T>::pack(fl.x, fl.y);
            hi = Pack2<T>::pack(fh.x, fh.y);
        }
    } else if constexpr (std::is_same_v<T, __half>) {
        lo = __byte_perm(a[J / 4], 0u, kSel) << 6;
        hi = __byte_perm(a[2 + J / 4], 0u, kSel) << 6;
    } else {
        float s_lo, s_hi;
        block_scales<J>(a, s_lo, s_hi);
        lo = Pack2<T>::pack(s_lo * kScaleFix, s_lo * kScaleFix);
        hi = Pack2<T>::pack(s_hi * kScaleFix, s_hi * kScaleFix);
    }
}

// The factor the GEMM's output takes besides the tensor scale (what scale_pairs left out).
template <bool FP4>
constexpr float kOutFix = FP4 ? 256.f : 1.f;

template <typename T>
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
    uint32_t d;
    if constexpr (std::is_same_v<T, __half>) asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    else asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));  // + (-0): exact a*b; sm_80 has no mul.bf16x2
    return d;
}

// Optional bias, added in fp32 before the one rounding to T (as cuBLAS's epilogue does).
template <typename T>
__device__ __forceinline__ float bias_of(const T* __restrict__ bias, int row) {
    return bias == nullptr ? 0.f : to_float(bias[row]);
}

// Allow `smem` bytes of dynamic shared memory (needed above 48 KB); a cudaError_t as int.
template <typename K>
int configure(K kernel, size_t smem) {
    return static_cast<int>(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
}

// An integer from the environment, 0 when unset (the launchers' knobs: LOWBIT_SMEM_LIMIT, LOWBIT_BULK_RING, ...).
inline int env_int(const char* name) {
    const char* s = std::getenv(name);
    return s != nullptr && *s != '\0' ? int(std::strtol(s, nullptr, 10)) : 0;
}

// The dynamic shared memory a CTA may have on the current device: the opt-in maximum, less 1 KB for the kernels'
// static shared memory (the stream-K kernel's is <= 1 KB, the bulk-copy kernel's barriers less).
// LOWBIT_SMEM_LIMIT (bytes, read once) lowers the opt-in maximum: an H100 then sizes the tiled kernels as a part
// with less shared memory would (101376 = sm_86 / sm_89's 99 KB; tests/gpu/test_smem_limit_gpu.py), and occupancy()
// refuses an instance whose request passes it.
inline int dynamic_smem_limit() {
    static const int cap = env_int("LOWBIT_SMEM_LIMIT");
    int device = 0, v = 0;
    cudaGetDevice(&device);
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (cap > 0 && cap < v) v = cap;
    return v > 1024 ? v - 1024 : 0;
}

// CTAs of this kernel (of `warps` warps) that fit on one SM (registers, shared memory): sizes
// one-wave grids; 0 when it cannot be configured (its shared memory passes dynamic_smem_limit()).
template <typename K>
int occupancy(K kernel, size_t smem, int warps) {
    int blocks = 0;
    if (smem > size_t(dynamic_smem_limit())) return 0;
    if (configure(kernel, smem) ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, warps * 32, smem) != cudaSuccess) {
        cudaGetLastError();  // the caller reports 0; the refusal must not stay behind as the runtime's last error
        return 0;
    }
    return blocks;
}

}  // namespace gemv
}  // namespace lowbit
