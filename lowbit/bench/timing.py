"""GPU timing: CUDA-graph replay over rotating weight copies (cold L2) or one copy (hot L2).

A decode step streams every weight from DRAM once. To reproduce that, a "cold" measurement
captures one CUDA graph that calls the kernel once per weight copy, with the copies together
several times larger than L2, so each call finds its weights evicted by the calls between.
"Hot" runs the same number of calls on one copy (weights L2-resident when they fit).
The per-call time is the median over replays of (replay time / calls), warm-up excluded.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

COLD_FACTOR = 4  # weight copies together cover at least this many L2s
MIN_CALLS = 16  # calls per replay, so one replay is long enough for event timing


@dataclass
class Timing:
    median_us: float
    min_us: float
    max_us: float
    calls_per_replay: int
    replays: int


def l2_bytes(device: torch.device | None = None) -> int:
    return torch.cuda.get_device_properties(device or torch.cuda.current_device()).L2_cache_size


def copies_for_cold(weight_bytes: int, l2: int, factor: int = COLD_FACTOR) -> int:
    """Number of weight copies so that together they exceed ``factor`` L2 sizes (at least 2)."""
    if weight_bytes <= 0:
        raise ValueError(f"weight_bytes must be positive, got {weight_bytes}")
    return max(2, -(-factor * l2 // weight_bytes))


def graph_time(calls: Sequence[Callable[[], object]], *, replays: int = 20, warmup: int = 3) -> Timing:
    """Capture ``calls`` (run in order) into one CUDA graph; median per-call time over replays."""
    if not calls:
        raise ValueError("calls must not be empty")
    reps = max(1, -(-MIN_CALLS // len(calls)))
    seq = list(calls) * reps
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls:  # eager warm-up: library loads, allocator pools, lazy init stay out of capture
            c()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for c in seq:
            c()
    for _ in range(warmup):
        graph.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    per_call = [s.elapsed_time(e) * 1000.0 / len(seq) for s, e in events]
    del graph
    return Timing(statistics.median(per_call), min(per_call), max(per_call), len(seq), replays)


PROBE_MODES = {0: "grid-stride, evict-first", 1: "grid-stride, L2 256B", 2: "slice per CTA, evict-first",
               3: "slice per CTA, L2 256B"}


def read_bandwidth_sweep(n_bytes: int = 2 << 30, replays: int = 10) -> dict[tuple[int, int], float]:
    """Read bandwidth in bytes/s of lowbit's streaming-read kernel for every (mode, CTAs per SM).

    Modes (:data:`PROBE_MODES`): two load flavours (evict-first, and the GEMVs' L2 256-byte
    prefetch) x two walks (grid-stride, and one contiguous slice per CTA); 512 threads per CTA,
    1 to 2048 CTAs per SM (many short CTAs, each reading a few KB, is how the GEMVs stream and
    on H100 the fastest).
    """
    from ..kernels.library import get_library, ptr, stream_of

    lib = get_library()
    dev = torch.device("cuda", torch.cuda.current_device())
    buf = torch.empty(n_bytes // 16 * 16, dtype=torch.uint8, device=dev).random_()
    sink = torch.zeros(1, dtype=torch.int32, device=dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    out = {}
    for mode in PROBE_MODES:
        for per_sm in (1, 2, 4, 8, 16, 32, 128, 512, 2048):  # many short CTAs: how the GEMVs stream
            def call(grid=sms * per_sm, mode=mode):  # the stream is read inside: graph capture swaps it
                lib.call("read_bw", [ptr(buf), buf.numel(), ptr(sink), grid, mode, stream_of(dev)])

            out[(mode, per_sm)] = buf.numel() / (graph_time([call], replays=replays, warmup=2).median_us * 1e-6)
    return out


def measure_read_bandwidth(n_bytes: int = 2 << 30, replays: int = 10) -> float:
    """Achievable DRAM read bandwidth in bytes/s: the best of :func:`read_bandwidth_sweep` (which
    setting streams fastest varies by GPU, and a probe slower than the kernels it judges would
    flatter them)."""
    return max(read_bandwidth_sweep(n_bytes, replays).values())


def measure_copy_bandwidth(n_bytes: int = 1 << 30, replays: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written.

    The better of lowbit's streaming copy kernel (16-byte loads/stores) and ``torch.Tensor.copy_``:
    the stricter denominator for kernels that write (dequantize).
    """
    from ..kernels.library import get_library, ptr, stream_of

    dev = torch.device("cuda", torch.cuda.current_device())
    src = torch.empty(n_bytes // 16 * 4, dtype=torch.float32, device=dev).uniform_()
    dst = torch.empty_like(src)
    nbytes = src.numel() * 4
    best = graph_time([lambda: dst.copy_(src)], replays=replays, warmup=2).median_us
    lib = get_library()
    grid = torch.cuda.get_device_properties(dev).multi_processor_count * 4

    def call():
        lib.call("copy_bw", [ptr(src), ptr(dst), nbytes, grid, stream_of(dev)])

    best = min(best, graph_time([call], replays=replays, warmup=2).median_us)
    return 2 * nbytes / (best * 1e-6)
