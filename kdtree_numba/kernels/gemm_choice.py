"""Which kernel runs a draft's or a verify's GEMM: each candidate timed once per shape on the GPU, the fastest kept.

    out[i, j] (+)= sum_k a[i, k] * b[k, j]          a [M, K], b [K, N] (b = w.T of an HF weight), 16 <= M <= 80

A DDTree verify multiplies budget + 1 rows (17-80 rows: budgets 16-79), the drafter and the chain's verify 16
rows, by weights that L2 holds. Such a product costs latency, not arithmetic. Which kernel is fastest depends on
the shape in ways no simple rule caught. cuBLAS runs a strided batch of row blocks with its GEMV-like gemmSN
kernel for some shapes and with a 32 x 32-tile kernel of a few dozen blocks (about 2x slower) for others. Graph
replays of one product, H100, us (forty-third session, docs/PERFORMANCE.md; "blocks 16" is the strided batch of
<= 16-row blocks, at 16 rows cuBLAS's one call; "rows" one-row blocks, cuBLAS's batched GEMV):

    product (K -> N)                 33 rows: skinny  blocks 16  blocks 8  rows   wide   16 rows: blocks 16  rows
    q_a + kv_a        256 -> 240                3.61       6.87      3.39  3.31   7.18               3.04  2.75
    q_b               128 -> 384                3.52       4.76      3.20  3.62   5.85               2.60  4.09
    o_proj +=         256 -> 256                3.83       3.27        -   3.41   7.74               3.21  2.89
    dense down +=     768 -> 256                  -        5.36     10.00  7.16  16.63               5.71  4.41
    LM head           256 -> 4096              17.92      11.16     18.26 24.13   8.45               7.47 12.90

Candidates (``CANDIDATES``): ``skinny`` (kernels/skinny_gemm.py; K <= skinny_gemm.MAX_K, unit strides along k and
along out's columns), cuBLAS strided batches over row blocks of at most 16, 8 and 1 rows (``_cublas._row_blocks``
with ``limit``; blocks overlap where equal ones leave rows over, or with ``accumulate`` one call takes those rows;
at 16 rows "blocks 16" is cuBLAS's one call), ``wide`` (kernels/wide_gemm.py: the weight read once per 36-row
panel; unit strides along k and out's columns). (A sixth, the fewest and widest blocks of <= 16 rows - 33 rows
as 15-row blocks at rows 0, 9 and 18 - was kept only for q_b, 0.04 us faster, and the round did not gain: dropped,
forty-second session.) The first product of each shape, layout and ``accumulate`` that runs outside a graph
capture times every candidate (``_time_all``): CALLS back-to-back calls into a scratch output captured as a CUDA
graph per candidate, then REPS rounds replaying each graph once in turn, each candidate's median (interleaved, so
drift hits all alike; timed one after another, four re-timings in one process kept the same kernels, H100). The
fastest is kept unless the default is within MARGIN of it (a choice that flipped between processes on noise would
change the last bits of the logits). The default is the fixed rule that ran before this module: skinny where
``skinny_gemm.pays``, else 16-row blocks (cuBLAS's one call at 16 rows). From then on the shape always runs its
choice, directly and in captured graphs, so a captured round replays exactly what the direct round ran. A capture
that meets an untimed shape runs the default, and keeps it. ``TUNE = False``: always the default - an A/B switch,
and what an expert-parallel target of 2+ ranks sets (parallel/expert_parallel.py: ranks that replicate a layer
must run the same kernels, which a timing per process does not promise). ``MIN_ROWS``: the fewest rows timed
(16; at 17, the fortieth to forty-second sessions' rule, the draft and the chain's verify ran cuBLAS's one call,
and the chain was 4.6 % slower: forty-third session). ``choices()``: what was timed and kept. ``save(path)`` /
``load(path)``: the table as JSON, so a process that must not time - one under NVIDIA Nsight Compute, whose
interception made gemm_choice keep other kernels than a normal process (forty-first and forty-fourth sessions,
docs/PERFORMANCE.md) - runs the kernels a normal process timed (benchmarks/profile_kernels.py ``--save-picks`` /
``--picks``).
Example (the trained pair, H100): the first 33-row o_proj product (+=) of a DDTree-32 verify times skinny 3.83,
blocks 16 3.27, blocks 8 10.04 (four 7-row blocks and a call for the 5 rows left), rows 3.41, wide 7.74 us and
keeps blocks 16 for every later one; at 33 rows q_a + kv_a keeps rows, q_b blocks 8, the shared expert's down
rows, the LM head wide; at 16 rows (the draft, the chain) o_proj, q_a + kv_a and the dense down keep rows.
"""
from __future__ import annotations

import json

import numpy as np

from .. import backend
from ..atomic_file import write_text_atomic
from . import _cublas, skinny_gemm, wide_gemm

TUNE = True                 # time the candidates of each new shape (False: the default rule always)
MIN_ROWS = _cublas.ROW_BLOCKS      # from the draft's and the chain's 16 rows; fewer (a step's 1) run cuBLAS
MARGIN = 0.05               # a candidate replaces the default only when the default is this much slower
CALLS = 20                  # back-to-back calls in the timed graph
REPS = 9                    # rounds of graph replays, each candidate's graph once a round; its median is its time
CANDIDATES = ("skinny", "blocks 16", "blocks 8", "rows", "wide")
_LIMITS = {"blocks 16": 0, "blocks 8": 8, "rows": 1}   # _cublas._row_blocks' limit
_chosen: dict = {}          # key -> (name, {candidate: us})


def applies(M: int, K: int, N: int, out) -> bool:
    """Whether ``gemm.linear`` asks this module (cuda backend): MIN_ROWS-80 rows (16: the draft and the chain's
    verify; 17-80: a tree verify), a weight L2 holds (K N <= ROW_BLOCKS_WEIGHT), ``out`` C-contiguous (what the
    row blocks write)."""
    return (MIN_ROWS <= M <= 5 * _cublas.ROW_BLOCKS and K * N <= _cublas.ROW_BLOCKS_WEIGHT
            and out.flags.c_contiguous)


def _default(a, b, out) -> str:
    M, K = a.shape
    return "skinny" if skinny_gemm.pays(M, K, b.shape[1]) and skinny_gemm.reads(a, b, out) else "blocks 16"


def candidates(a, b, out) -> list:
    """The candidates that can run ``out (+)= a @ b``: all but the skinny and wide kernels where they cannot read
    this layout (``skinny_gemm.reads``, ``wide_gemm.reads``)."""
    reads = {"skinny": skinny_gemm.reads, "wide": wide_gemm.reads}
    return [name for name in CANDIDATES if name not in reads or reads[name](a, b, out)]


def _run(name: str, a, b, out, accumulate: bool):
    if name == "skinny":
        return skinny_gemm.run(a, b.T, out, accumulate)
    if name == "wide":
        return wide_gemm.run(a, b.T, out, accumulate)
    if name == "blocks 16" and a.shape[0] <= _cublas.ROW_BLOCKS:   # one block (MIN_ROWS lowered): the plain call
        return _cublas.gemm(a, b, out, accumulate)
    return _cublas._row_blocks(a, b, out, accumulate, _LIMITS[name])


def pick(times: dict, default: str, margin: float = MARGIN) -> str:
    """The fastest candidate of ``times`` (us), or ``default`` when it is within ``margin`` of that one.
    Example: pick({"skinny": 3.6, "blocks 16": 3.0}, "skinny") -> "blocks 16"; with 3.1 for skinny -> "skinny"."""
    best = min(times, key=times.get)
    return default if times.get(default, np.inf) <= times[best] * (1 + margin) else best


def _time_all(fns: dict) -> dict:
    """Device time of one call of each candidate (name -> ``fn``), in us: each one's CALLS calls captured as a CUDA
    graph on the backend stream (two direct calls first: compiles, cuBLAS handles and workspaces outside the
    capture), then REPS rounds that replay every graph once, in turn; each candidate's median. Interleaved, a
    change of clock or of what L2 holds during the timing hits every candidate alike - timed one after another, it
    fell on whichever ran then."""
    cp = backend.cp
    stream = backend.stream
    graphs = {}
    for name, fn in fns.items():
        fn()
        fn()
        stream.begin_capture()
        try:
            for _ in range(CALLS):
                fn()
        finally:
            graphs[name] = stream.end_capture()
        graphs[name].launch(stream)
    times = {name: [] for name in graphs}
    for _ in range(REPS):
        for name, graph in graphs.items():
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times[name].append(1e3 * cp.cuda.get_elapsed_time(start, end) / CALLS)
    return {name: float(np.median(t)) for name, t in times.items()}


def run(a, b, out, accumulate: bool = False):
    """``out (+)= a @ b`` with this shape's chosen kernel (module docstring), timing the candidates first when the
    shape is new and no capture is running. Arguments as ``_cublas.gemm``'s (checked by the caller)."""
    if not TUNE:
        return _run(_default(a, b, out), a, b, out, accumulate)
    key = (a.shape, b.shape, a.strides, b.strides, bool(accumulate))
    if key not in _chosen:
        default = _default(a, b, out)
        if backend.stream.is_capturing():          # untimed in a capture: the default, from now on too (a later
            _chosen[key] = (default, {})           # direct call must run what the graph replays)
            return _run(default, a, b, out, accumulate)
        scratch = backend.cp.zeros_like(out)
        times = _time_all({name: (lambda name=name: _run(name, a, b, scratch, accumulate))
                           for name in candidates(a, b, out)})
        _chosen[key] = (pick(times, default), times)
    return _run(_chosen[key][0], a, b, out, accumulate)


def choices() -> list[dict]:
    """What was timed so far: per shape (M, K, N, accumulate) the candidates' us and the kept one."""
    return [dict(M=k[0][0], K=k[0][1], N=k[1][1], accumulate=k[4], chosen=name, us=times)
            for k, (name, times) in _chosen.items()]


_KEY_FIELDS = ("a_shape", "b_shape", "a_strides", "b_strides")


def save(path) -> int:
    """The table timed so far (every shape's key, kept kernel and candidates' us) as JSON at ``path``, written
    atomically; returns the number of shapes. ``load`` reads it back."""
    entries = [dict(zip(_KEY_FIELDS, map(list, k[:4])), accumulate=k[4], chosen=name, us=times)
               for k, (name, times) in _chosen.items()]
    write_text_atomic(path, json.dumps({"gemm_choice": entries}, indent=1) + "\n")
    return len(entries)


def load(path) -> int:
    """Add the shapes of a ``save``d table to this process's, replacing any it timed: those shapes run the saved
    kernels from now on, untimed. Returns the number of shapes. A file that is not such a table, or names a kernel
    that is not in ``CANDIDATES``, raises ValueError naming the path and the entry; nothing is added then."""
    try:
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)["gemm_choice"]
        if not isinstance(entries, list):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: expected a gemm_choice table written by gemm_choice.save ({e!r:.80})") from None
    table = {}
    for i, e in enumerate(entries):
        try:
            key = tuple(tuple(int(v) for v in e[f]) for f in _KEY_FIELDS) + (bool(e["accumulate"]),)
            if len(key[0]) != 2 or len(key[1]) != 2 or e["chosen"] not in CANDIDATES:
                raise ValueError
            table[key] = (e["chosen"], {str(c): float(us) for c, us in e["us"].items()})
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ValueError(f"{path}: entry {i} is not a gemm_choice shape with one of {CANDIDATES} kept: "
                             f"{str(e)[:120]}") from None
    _chosen.update(table)
    return len(table)
