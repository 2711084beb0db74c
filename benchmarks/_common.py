"""Shared benchmark helpers: device-event timing (median of reps after warm-up), the measured copy and GEMM
ceilings, a table printer, and a JSON dump under $OUT (the device machine's result folder) or ./bench_results."""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("KDTREE_BACKEND", "auto")          # the GPU if CuPy sees one; else args() says what runs

try:
    import kdtree_numba as kd  # noqa: E402
    from kdtree_numba.argtypes import OneLineParser  # noqa: E402
except (RuntimeError, ValueError) as e:                     # KDTREE_BACKEND asked for what this machine lacks
    print(e, file=sys.stderr)
    sys.exit(2)

RESULTS: dict = {}


def args(description: str, extra=None):
    p = OneLineParser(description=description)            # a bad value: one line, exit 2
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run, numbers meaningless")
    p.add_argument("--reps", type=int, default=20)
    if extra:
        extra(p)
    a = p.parse_args()
    if kd.backend.name != "cuda" and not a.quick:
        print(f"benchmarks need a GPU (this process runs the {kd.backend.name} backend); use --quick for a CPU "
              "smoke run", file=sys.stderr)
        sys.exit(2)
    return a


def fail_args(message: str) -> None:
    """A bad command-line value: one line on stderr naming it, exit status 2 (as the project's CLI does)."""
    print(message, file=sys.stderr)
    sys.exit(2)


def sync():
    kd.backend.synchronize()


def median_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median device time of ``fn()`` in ms (CUDA events on the backend stream; host clock elsewhere)."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        with kd.backend.timer() as t:
            fn()
        times.append(t.ms)
    return float(np.median(times))


def graph_median_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median device time of ``fn()`` replayed from a CUDA graph: launch overhead (numba's ~30 us of host work per
    launch, allocations, argument checks) is left out, so small kernels show their device time. ``fn`` must not
    allocate new pool memory after warm-up or synchronise (its launches are captured on the backend stream)."""
    return graph_per_call_us(fn, 1, reps, warmup) / 1e3


def graph_per_call_us(fn, calls: int = 20, reps: int = 15, warmup: int = 3) -> float:
    """Device time of one ``fn()`` in us inside a graph of ``calls`` back-to-back calls (median over ``reps``
    replays / calls): the gaps between kernels of a captured round are in it, the graph's own launch is spread
    over the calls. Host backends: ``calls`` direct calls timed by ``median_ms``. Same rules for ``fn`` as
    ``graph_median_ms`` (which is this with one call)."""
    def all_calls():
        for _ in range(calls):
            fn()

    if kd.backend.name != "cuda":
        return 1e3 * median_ms(all_calls, reps, warmup) / calls
    for _ in range(warmup):
        fn()
    sync()
    stream = kd.backend.stream
    stream.begin_capture()
    try:
        all_calls()
    finally:
        graph = stream.end_capture()
    return 1e3 * median_ms(lambda: graph.launch(stream), reps, 2) / calls


def set_tf32(on: bool) -> None:
    """Let torch's fp32 matmuls and convolutions use TF32 tensor cores (or not): the new ``fp32_precision`` switch
    where torch has it, ``allow_tf32`` before (torch refuses a mix of the two)."""
    import torch

    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "tf32" if on else "ieee"
        torch.backends.cudnn.fp32_precision = "tf32" if on else "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


def torch_median_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median device time of torch work ``fn()`` on torch's current stream (torch CUDA events)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def torch_graph_median_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median device time of torch work ``fn()`` replayed from a torch CUDA graph (the torch twin of
    ``graph_median_ms``: host launch cost left out on both sides of a comparison). Falls back to
    ``torch_median_ms`` (events around direct calls), saying so, when torch cannot capture ``fn``."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                        # warm-up off the capture stream, as torch's docs ask
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception as e:                               # report, do not hide
        print(f"torch could not capture the baseline ({type(e).__name__}: {str(e)[:100]}); timing direct calls",
              flush=True)
        return torch_median_ms(fn, reps, warmup)
    return torch_median_ms(graph.replay, reps, 2)


def steady_pair(generate, n: int, reps: int = 3):
    """(g1, g2): generations of n and 2n tokens (``generate(m)`` -> a Generation), timed after both lengths ran once
    untimed, longest first - each length may need a cache capacity, i.e. a replay program, of its own, and a
    program that grows the drafter's shared cache invalidates the ones captured before it (they capture again).
    Their difference is steady state: prefill and the first step or round cancel out. Each length is the fastest
    of ``reps`` runs (noise only ever adds time: one slow n-token run once made a direct DDTree round's difference
    negative on the H200). g1 must be g2's prefix."""
    for m in (2 * n, n):
        generate(m)
    g1 = min((generate(n) for _ in range(reps)), key=lambda g: g.seconds)
    g2 = min((generate(2 * n) for _ in range(reps)), key=lambda g: g.seconds)
    assert g2.tokens[:n] == g1.tokens, "the n- and 2n-token generations disagree"
    return g1, g2


def host_times_ms(fn, reps: int = 5, warmup: int = 1) -> list:
    """Wall times of ``fn()`` (which must synchronize itself), ms."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def host_best_ms(fn, reps: int = 5, warmup: int = 1) -> float:
    """Best wall time of ``fn()``: for a baseline whose run-to-run noise (other host work) only ever adds time,
    the minimum is the fair, conservative figure to divide by."""
    return float(min(host_times_ms(fn, reps, warmup)))


def copy_bandwidth_gbs(nbytes: int = 2 << 30, reps: int = 10) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second (GB/s), measured now."""
    xp = kd.backend.xp
    a = xp.ones(nbytes // 4, np.float32)
    b = xp.empty_like(a)
    ms = median_ms(lambda: b.__setitem__(slice(None), a), reps)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def gemm_tflops(n: int = 8192, reps: int = 5) -> float:
    xp = kd.backend.xp
    a = xp.random.standard_normal((n, n), dtype=np.float32)
    b = xp.random.standard_normal((n, n), dtype=np.float32)
    ms = median_ms(lambda: xp.matmul(a, b), reps, 2)
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def table(title: str, header: list[str], rows: list[list]) -> str:
    cells = [[str(c) for c in r] for r in [header] + rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [f"### {title}", "| " + " | ".join(h.ljust(w) for h, w in zip(cells[0], widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells[1:]]
    text = "\n".join(lines)
    print(text, flush=True)
    RESULTS.setdefault("tables", []).append({"title": title, "header": header, "rows": rows})
    return text


def gemm_choice_table() -> None:
    """The kernel ``kernels/gemm_choice.py`` kept for each tree-verify GEMM shape this process timed (us per
    candidate), as a table; nothing where no shape was timed (host backends, TUNE = False)."""
    from kdtree_numba.kernels import gemm_choice

    rows = [[e["M"], e["K"], e["N"], "+=" if e["accumulate"] else "=", e["chosen"]]
            + [f"{e['us'][c]:.2f}" if c in e["us"] else "-" for c in gemm_choice.CANDIDATES]
            for e in gemm_choice.choices()]
    if rows:
        table("GEMM kernels kept by kernels/gemm_choice.py (us per call, graph replays)",
              ["M", "K", "N", "out", "kept"] + list(gemm_choice.CANDIDATES), rows)


def save(name: str) -> None:
    out = os.environ.get("OUT") or os.path.join(os.getcwd(), "bench_results")
    os.makedirs(out, exist_ok=True)
    RESULTS["device"] = device_name()
    RESULTS["date"] = time.strftime("%Y-%m-%d")
    from kdtree_numba.atomic_file import write_text_atomic

    write_text_atomic(os.path.join(out, f"{name}.json"), json.dumps(RESULTS, indent=1, default=float))


def device_name() -> str:
    if kd.backend.name != "cuda":
        return f"{kd.backend.name} (no GPU)"
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    return props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
