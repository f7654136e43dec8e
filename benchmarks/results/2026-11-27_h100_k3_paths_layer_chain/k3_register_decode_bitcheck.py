# Host check of cb3_word's bit logic (PRMT default mode emulated) against the table entries it replaces.
import random, struct
def prmt(a, b, sel):
    by = [(a >> (8*i)) & 0xff for i in range(4)] + [(b >> (8*i)) & 0xff for i in range(4)]
    out = 0
    for n in range(4):
        nib = (sel >> (4*n)) & 0xf
        v = by[nib & 7]
        if nib & 8: v = 0xff if (v & 0x80) else 0
        out |= v << (8*n)
    return out
def byte_perm(a, b, sel): return prmt(a, b, sel & 0x7777)
def f16(x): return struct.unpack('<H', struct.pack('<e', x))[0]
random.seed(1)
bad = 0
for trial in range(200):
    cb = [random.uniform(-2, 2) for _ in range(8)]
    vals = [f16(c) for c in cb]
    p = [vals[2*i] | vals[2*i+1] << 16 for i in range(4)]
    lo, hi = byte_perm(p[0], p[1], 0x6420), byte_perm(p[0], p[1], 0x7531)
    lo2, hi2 = byte_perm(p[2], p[3], 0x6420), byte_perm(p[2], p[3], 0x7531)
    for _ in range(64):
        word = random.getrandbits(32)  # fields in bits 0..5 of each byte, junk in 6..7
        hic = word & 0x38383838
        sel = ((word & 0x07070707) | (hic << 1)) & 0xffffffff
        f = [0]*4
        for h in range(2):
            s = sel >> 16 if h else sel
            l, g = prmt(lo, lo2, s), prmt(hi, hi2, s)
            f[2*h] = byte_perm(l, g, 0x5140)
            f[2*h+1] = byte_perm(l, g, 0x7362)
        for k in range(4):
            e = (word >> (8*k)) & 0x3f
            want = vals[e & 7] | vals[(e >> 3) & 7] << 16  # the table's entry: Pack2(cb[code0], cb[code1])
            bad += f[k] != want
print("mismatches:", bad, "of", 200*64*4)
