"""SBVR's kernels under compute-sanitizer (memcheck): odd N, partial 128-chunks, every group kind, M = 1 and 8,
the encoder, the popcount GEMV, the lookup GEMV, the grouped GEMV (empty and multi-block experts) and the
dequantize. Run:
    compute-sanitizer --tool memcheck --error-exitcode 1 python3 benchmarks/tools/sbvr_memcheck.py"""

import torch

import lowbit

torch.manual_seed(0)
for n, k, group, ns in ((37, 96, 32, 3), (1001, 192, 64, 4), (300, 512, 128, 5), (17, 1024, 256, 2), (5, 4096, 128, 6)):
    q = lowbit.quantize_sbvr(torch.randn(n, k, device="cuda") * 0.05, num_sums=ns, group=group)
    t = q.tiled()
    for m in (1, 8):
        for dtype in (torch.float16, torch.bfloat16):
            x = torch.randn(m, k, device="cuda").to(dtype)
            y = lowbit.ops.sbvr_gemv(x, *t, n, k, group, torch.randn(n, device="cuda").to(dtype))
            assert torch.isfinite(y).all()
            if q.codes() is not None:
                qbits, qcodes, qidx, cache8 = q.layouts()
                assert torch.isfinite(lowbit.ops.sbvr_lookup_gemv(x, qcodes, qidx, cache8, n, k, group)).all()
    w = lowbit.ops.sbvr_tiled_dequantize(*t, n, k, group, torch.float16)
    assert torch.equal(w, q.dequantize(torch.float16))
    if ns <= 5:
        ex = lowbit.quantize_sbvr_experts(torch.randn(4, n, k, device="cuda") * 0.05, num_sums=ns, group=group)
        counts = torch.tensor([0, 5, 1, 0])
        off = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).cuda()
        xg = torch.randn(int(counts.sum()), k, device="cuda", dtype=torch.float16)
        assert torch.isfinite(lowbit.sbvr_grouped_linear(xg, off, ex)).all()
torch.cuda.synchronize()
print("sbvr memcheck script: done")
