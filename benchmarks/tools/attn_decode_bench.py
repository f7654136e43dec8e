"""Decode attention (one query token, GQA 32/8 heads x 128, static cache) the ways transformers' SDPA path can run it,
and lowbit's decode attention kernels (lowbit.ops.decode_attention: as planned, and each kernel forced).

    python3 benchmarks/tools/attn_decode_bench.py [--cache 590] [--batch 4] [--kv-heads 8] [--head-dim 128] [--dtype bf16]
        [--splits 1,2,4] [--chunks 64,128]
        [--warps 4,8]   (the tensor-core kernel at each warp count: one chunk per sequence, then each --chunks)

CUDA-graph timed (100 replays of 32 calls, one per Llama-3-8B layer), H100 numbers in BENCHMARKS.md (issue 12).
"""
import argparse

import torch
import torch.nn.functional as F

import lowbit


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cache", type=int, default=590)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--kv-heads", type=int, default=8, help="KV heads (32 query heads); Qwen3-30B-A3B: 4")
    p.add_argument("--head-dim", type=int, default=128, help="64: Llama-3.2-1B-like heads")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--splits", default="", help="also time lowbit's kernel with these head splits, e.g. 1,2,4")
    p.add_argument("--chunks", default="", help="and with these positions per CTA (multiples of 64), each split count")
    p.add_argument("--warps", default="", help="time the tensor-core kernel with these warps per CTA, each --chunks")
    p.add_argument("--no-sdpa", action="store_true", help="skip torch's SDPA rows (the first one stays: the reference)")
    p.add_argument("--reduce-each", action="store_true",
                   help="also time lowbit's kernels with each score reduced on its own (as before warp_sum8)")
    a = p.parse_args()
    dev, dt = "cuda", {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    b, hq, hkv, d, L = a.batch, 32, a.kv_heads, a.head_dim, a.cache
    layers = 32
    q = [torch.randn(b, hq, 1, d, device=dev, dtype=dt) for _ in range(layers)]
    k = [torch.randn(b, hkv, L, d, device=dev, dtype=dt) for _ in range(layers)]
    v = [torch.randn(b, hkv, L, d, device=dev, dtype=dt) for _ in range(layers)]
    mask = torch.ones(b, 1, 1, L, device=dev, dtype=torch.bool)
    mask[..., L - 60:] = False  # the unfilled tail of the static cache

    kn = [torch.randn(b, hkv, d, device=dev, dtype=dt) for _ in range(layers)]
    vn = [torch.randn(b, hkv, d, device=dev, dtype=dt) for _ in range(layers)]
    ang = torch.rand(b, d // 2, device=dev) * 50
    cos, sin = torch.cat((ang, ang), -1).cos().to(dt), torch.cat((ang, ang), -1).sin().to(dt)
    # the last visible slot; the op advances it with every call (as a decode step does), so after 60 calls
    # it points past the visible rows and then past the cache, where the kernel skips only its two row stores
    pos = torch.tensor([L - 61], device=dev)

    def rep(t):  # transformers' repeat_kv
        return t[:, :, None].expand(b, hkv, hq // hkv, L, d).reshape(b, hq, L, d)

    ways = {
        "repeat_kv + sdpa(mask) [transformers today]": lambda i: F.scaled_dot_product_attention(q[i], rep(k[i]), rep(v[i]), attn_mask=mask),
        "sdpa(mask, enable_gqa=True)": lambda i: F.scaled_dot_product_attention(q[i], k[i], v[i], attn_mask=mask, enable_gqa=True),
        "sdpa(no mask, enable_gqa=True), cache sliced": lambda i: F.scaled_dot_product_attention(q[i], k[i][:, :, :L - 60], v[i][:, :, :L - 60], enable_gqa=True),
        "lowbit decode_attention(mask)": lambda i: lowbit.ops.decode_attention(
            q[i].view(b, hq, d), k[i], v[i], mask[:, 0, 0, :].expand(b, L), d ** -0.5).view(b, hq, 1, d),
        # (this one also rotates q and the new k and writes the new row: its |diff| column is not comparable)
        "lowbit decode_attention_append(mask)": lambda i: lowbit.ops.decode_attention_append(
            q[i].view(b, hq, d), kn[i], vn[i], cos, sin, k[i], v[i], pos, mask, d ** -0.5).view(b, hq, 1, d),
    }
    from lowbit.kernels import attention as kattn

    def forced(fn, **switches):
        def run(i):
            old = {n: getattr(kattn, n) for n in switches}
            for n, val in switches.items():
                setattr(kattn, n, val)
            try:
                return fn(i)
            finally:
                for n, val in old.items():
                    setattr(kattn, n, val)
        return run

    if a.no_sdpa:
        for name in ("sdpa(mask, enable_gqa=True)", "sdpa(no mask, enable_gqa=True), cache sliced"):
            del ways[name]
    for name in ("lowbit decode_attention(mask)", "lowbit decode_attention_append(mask)"):
        ways[name.replace("lowbit ", "lowbit simt ")] = forced(ways[name], KERNEL="simt")
        ways[name.replace("lowbit ", "lowbit mma ")] = forced(ways[name], KERNEL="mma")
    for w in map(int, filter(None, a.warps.split(","))):
        for c in sorted({0, *map(int, filter(None, a.chunks.split(",")))}):
            ways[f"lowbit mma decode_attention(mask), {w} warps, chunk {c or L}"] = forced(
                ways["lowbit decode_attention(mask)"], KERNEL="mma", MMA_WARPS=w, CHUNK=c or -(-L // 64) * 64)

    if a.reduce_each:
        for name in [n for n in ways if n.startswith("lowbit")]:
            def each_fn(i, fn=ways[name]):
                kattn.REDUCE_EACH = True
                try:
                    return fn(i)
                finally:
                    kattn.REDUCE_EACH = False
            ways[name + ", scores reduced one by one"] = each_fn
    for c in [None, *[c for c in map(int, filter(None, a.chunks.split(","))) if c]]:
        for n in [None, *map(int, filter(None, a.splits.split(",")))]:
            if c is None and n is None:
                continue

            def split_fn(i, n=n, c=c):
                kattn.HEAD_SPLITS, kattn.CHUNK, kattn.KERNEL = n, c, "simt"
                try:
                    return ways["lowbit decode_attention(mask)"](i)
                finally:
                    kattn.HEAD_SPLITS = kattn.CHUNK = kattn.KERNEL = None
            ways["lowbit simt decode_attention(mask)" + (f", chunk {c}" if c else "") + (f", {n} head splits" if n else "")] = split_fn
    # the append rows write the new row into the caches: they go last, so that every other row's |diff| is against
    # the caches the reference saw
    ways = dict(sorted(ways.items(), key=lambda kv: "append" in kv[0]))
    ref = ways["repeat_kv + sdpa(mask) [transformers today]"](0)
    for name, fn in ways.items():
        try:
            pos.fill_(L - 61)  # each variant appends from the same slot
            out = fn(0)
            err = float((out.float() - ref.float()).abs().max())
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for i in range(layers):
                    fn(i)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(layers):
                    fn(i)
            g.replay()
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(100):
                g.replay()
            e1.record()
            torch.cuda.synchronize()
            us = e0.elapsed_time(e1) / 100 / layers * 1e3
            print(f"{name:56s} {us:7.2f} us per layer  (max |diff| {err:.2e})", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:56s} failed: {str(e).splitlines()[0][:120]}", flush=True)


if __name__ == "__main__":
    main()
