"""The fragment bookkeeping of csrc/attention/decode_mma.cu (the tensor-core decode attention), checked on the CPU:
one warp's step of 16 positions (S^T = Q K^T, then out^T += V^T P^T) through the PTX m16n8k16 fragment layouts and
movmatrix.trans, against the plain product. Run it after changing the kernel's layouts, before spending device time:

    python3 benchmarks/tools/attn_mma_fragments.py      # prints the max error (~1e-13) and the 128 dims covered

Layouts (PTX ISA, mma.m16n8k16 .bf16): A reg 0..3 = (row g, k 2t..2t+1), (g + 8, 2t..), (g, 2t + 8..), (g + 8,
2t + 8..); B reg 0, 1 = (k 2t.., n g), (k 2t + 8.., n g); C = (g, 2t + i), (g + 8, 2t + i); lane = 4 g + t.
"""
import numpy as np

D, G = 128, 4
LANES = [(lane >> 2, lane & 3) for lane in range(32)]  # (g, t)


def piece(row, cc, t, w):
    """Word w (two values) of the 16-byte piece a lane loads from a row: dims [32 cc + 8 t, + 8)."""
    return row[32 * cc + 8 * t + 2 * w:32 * cc + 8 * t + 2 * w + 2]


def mma(c, a, b):
    """c[lane] += the m16n8k16 product of the lanes' A fragments a[lane] (4 pairs) and B fragments b[lane] (2)."""
    am, bm = np.zeros((16, 16)), np.zeros((16, 8))
    for lane, (g, t) in enumerate(LANES):
        am[g, 2 * t:2 * t + 2], am[g + 8, 2 * t:2 * t + 2] = a[lane][0], a[lane][1]
        am[g, 2 * t + 8:2 * t + 10], am[g + 8, 2 * t + 8:2 * t + 10] = a[lane][2], a[lane][3]
        bm[2 * t:2 * t + 2, g], bm[2 * t + 8:2 * t + 10, g] = b[lane][0], b[lane][1]
    cm = am @ bm
    for lane, (g, t) in enumerate(LANES):
        c[lane] += [cm[g, 2 * t], cm[g, 2 * t + 1], cm[g + 8, 2 * t], cm[g + 8, 2 * t + 1]]


def movt(x):
    """movmatrix.m8n8.trans.b16: x[lane] holds (row g, cols 2t, 2t + 1) of an 8x8 matrix; returns its transpose's."""
    m = np.zeros((8, 8))
    for lane, (g, t) in enumerate(LANES):
        m[g, 2 * t:2 * t + 2] = x[lane]
    return [m.T[g, 2 * t:2 * t + 2] for g, t in LANES]


def out_dim(cc, jp, r):
    """The dim of out^T row r of PV MMA (cc, jp), as decode_mma.cu's out_dim."""
    g, j = r & 7, 2 * jp + (r >> 3)
    return 32 * cc + 8 * (g >> 1) + 2 * j + (g & 1)


def main():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((8, D))
    q[G:] = 0  # heads past G: zero rows
    k, v = rng.standard_normal((16, D)), rng.standard_normal((16, D))
    # S^T [heads x positions]: A = q (head g), B = K rows (position g, then 8 + g), the same pieces on both sides
    s0, s1 = [np.zeros(4) for _ in LANES], [np.zeros(4) for _ in LANES]
    for cc in range(4):
        for h in range(2):
            a = [[piece(q[g], cc, t, 2 * h), np.zeros(2), piece(q[g], cc, t, 2 * h + 1), np.zeros(2)] for g, t in LANES]
            mma(s0, a, [[piece(k[g], cc, t, 2 * h), piece(k[g], cc, t, 2 * h + 1)] for g, t in LANES])
            mma(s1, a, [[piece(k[8 + g], cc, t, 2 * h), piece(k[8 + g], cc, t, 2 * h + 1)] for g, t in LANES])
    s = q @ k.T
    for lane, (g, t) in enumerate(LANES):
        want = [s[g, 2 * t], s[g, 2 * t + 1], s[g, 8 + 2 * t], s[g, 9 + 2 * t]]
        assert np.allclose([s0[lane][0], s0[lane][1], s1[lane][0], s1[lane][1]], want)
    # out^T += V^T P^T with P = S (the softmax is elementwise): B = S^T's accumulators, A = V pieces through movmatrix
    p = [[s0[lane][:2], s1[lane][:2]] for lane in range(32)]
    acc = [[np.zeros(4) for _ in LANES] for _ in range(8)]
    for cc in range(4):
        for jp in range(2):
            tiles = [movt([piece(v[base + g], cc, t, 2 * jp + odd) for g, t in LANES])
                     for base in (0, 8) for odd in (0, 1)]  # a0..a3: positions 0-7 / 8-15, pieces 2 jp / 2 jp + 1
            mma(acc[2 * cc + jp], [[tiles[0][i], tiles[1][i], tiles[2][i], tiles[3][i]] for i in range(32)], p)
    got = np.full((8, D), np.nan)
    for cc in range(4):
        for jp in range(2):
            for lane, (g, t) in enumerate(LANES):
                for i in range(4):
                    got[2 * t + (i & 1), out_dim(cc, jp, g + 8 * (i >> 1))] = acc[2 * cc + jp][lane][i]
    assert not np.isnan(got).any()
    dims = {out_dim(cc, jp, r) for cc in range(4) for jp in range(2) for r in range(16)}
    print("max err", np.abs(got[:G] - (s @ v)[:G]).max(), "dims covered", len(dims))


if __name__ == "__main__":
    main()
