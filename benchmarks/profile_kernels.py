"""Per-kernel device time of one graph-replayed generation of the default pair, from NVIDIA Nsight Compute: which
kernels a plain decode step or a DDTree round spends its time in.

    python3 benchmarks/profile_kernels.py --save-picks picks.json --budget 64     # on the GPU machine, no ncu
    ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --page raw \\
        python3 benchmarks/profile_kernels.py --method ddtree --picks picks.json > ddtree.csv
    python3 benchmarks/profile_kernels.py --summarize ddtree.csv                    # anywhere
    python3 benchmarks/profile_kernels.py --summarize ar.csv chain.csv ddtree.csv   # side by side, per kernel
    python3 benchmarks/profile_kernels.py --summarize chain.csv ddtree.csv --aligned  # launch by launch

The first command generates twice untimed (compile, capture), then profiles a third generation (``--tokens``,
default 20) between cudaProfilerStart / Stop, so ncu sees only replayed steps or rounds (their graph nodes are
profiled one by one) plus the generation's prefill; on stderr it names the kernel kernels/gemm_choice.py kept for
each few-row GEMM shape. Under ncu that timing is skewed (the forty-first and forty-fourth sessions saw other picks
than a normal process's, e.g. the draft's 16-row fc on a kernel 2x slower: docs/PERFORMANCE.md), so first
``--save-picks FILE`` times every shape in a normal process - one generation of plain decoding, the chain and
DDTree at ``--budget`` - and saves gemm_choice's table, and ``--picks FILE`` loads it into the profiled process,
whose GEMMs then run those kernels (an H100, 2026-12-06: 27 shapes kept; the chain's round 781.9 us, DDTree-32's
818.9). ``--method``: ``ar`` (plain decoding), ``ddtree``
(budget ``--budget``, default 64) or ``chain`` (the DFlash chain: DDTree's round with one draft per depth). ncu
serialises the kernels and by default flushes the caches before each one, so its times run above the CUDA-event
stage times of bench_round.py (a DDTree round ~10 %, a plain step, whose weights a warm L2 holds, ~1.6x): use
them for shares, not totals; add ``--cache-control none`` to keep the L2 warm, as a replayed round has it. ncu
lists kernels only: a graph's memcpy nodes (CuPy's contiguous copies) cost time too and are not in its CSV.
The second reads ncu's CSV: per kernel name (template and ABI suffixes cut), the calls per step / round, the mean
and the total, largest first; a step or round is delimited by the kernel that runs once in each (the sampler for
``ar``, the top-K for ``ddtree``), and the prefill before the first one is left out. ``--aligned`` lines up two
CSVs whose units run the same kernels in the same order (a chain round and a DDTree round) launch by launch.
Example (2026-12-02, H200, before that day's fixes): the v2 MLA attention 54 us x 5 per plain step (30 %); a
cuBLAS 32x128 sgemm, the drafter's 16-row projections cut into 132-264 K slices, 46 us x 12 per DDTree round
(24 %) - docs/PERFORMANCE.md has what was done about them.
"""
import argparse
import csv
import os
import re
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the package beside this folder


def fail(message: str) -> None:
    """One line on stderr, exit status 2 (bad input, like the project's CLI)."""
    print(message, file=sys.stderr)
    sys.exit(2)


# the kernel that delimits a round (DDTree: its first, the top-K; checked first, as a round samples too) or a step
# (plain decoding: its last, the sampler - the one-block kernel, or the pick among chunk winners for rows of more
# than sampling.CHUNK columns, e.g. a Kimi-sized vocabulary)
MARKERS = {"ddtree": ("topk_block::_topk_kernel",),
           "chain": ("topk_block::_topk_kernel",),                 # the same round program, top-1 per depth
           "ar": ("sampling::_choose_kernel", "sampling::_choose_parts_kernel")}


def short(name: str, width: int = 48) -> str:
    """A kernel name cut to ``width`` characters for a table (its head and tail kept). Example: cuBLAS's
    sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_.._execute_kernel__5x_cublas (117 characters) ->
    'sm80_xmma_gemm_f32f32_f32f32.._kernel__5x_cublas'."""
    return name if len(name) <= width else name[:width - 20] + ".." + name[-18:]


def kernel_name(raw: str) -> str:
    """ncu's demangled name without numba's ABI tag, template arguments or parameter list."""
    return re.sub(r"\[abi:.*|<.*|\(.*", "", raw).strip()


def units_of(path: str) -> tuple:
    """``("round" | "step", [unit, ..])`` of an ncu CSV: each complete step / round as its launches in order,
    ``(kernel name, grid, us)`` (grid: ncu's "Grid Size" column, "" when the CSV has none); the prefill before
    the first unit is left out."""
    try:
        with open(path, newline="") as f:
            rows = [r for r in csv.reader(f)]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        fail(f"{path}: cannot read it as a CSV ({type(e).__name__}: {e})")
    head = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if head is None:
        fail(f"{path}: no ncu raw CSV header (a row starting with \"ID\"); was it written with --csv --page raw?")
    h = rows[head]
    try:
        ki, ti = h.index("Kernel Name"), h.index("gpu__time_duration.sum")
    except ValueError as e:
        fail(f"{path}: {e} (profile with --metrics gpu__time_duration.sum)")
    gi = h.index("Grid Size") if "Grid Size" in h else None
    unit = rows[head + 1][ti] if head + 1 < len(rows) else "ns"
    scale = {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
    launches = [(kernel_name(r[ki]), r[gi] if gi is not None else "", float(r[ti].replace(",", "")) * scale)
                for r in rows[head + 2:] if len(r) > ti]
    marker = next((m for m in MARKERS.values() if any(n.startswith(m) for n, _, _ in launches)), None)
    if marker is None:
        fail(f"{path}: none of the step markers {sorted(sum(MARKERS.values(), ()))} was profiled")
    at = [i for i, (n, _, _) in enumerate(launches) if n.startswith(marker)]
    if marker != MARKERS["ddtree"]:
        at = [i + 1 for i in at]                                          # a step ends with its sampler
    units = [launches[a:b] for a, b in zip(at, at[1:]) if b > a]
    if not units:
        fail(f"{path}: fewer than two steps / rounds profiled")
    return ("round" if marker == MARKERS["ddtree"] else "step"), units


def per_unit(path: str) -> tuple:
    """``(units, "round" | "step", kernels per unit, {kernel: (calls per unit, us per unit)})`` of an ncu CSV."""
    what, units = units_of(path)
    calls, total = defaultdict(int), defaultdict(float)
    for n, _, us in (x for u in units for x in u):
        calls[n] += 1
        total[n] += us
    k = len(units)
    return k, what, sum(len(u) for u in units) / k, {n: (calls[n] / k, total[n] / k) for n in total}


def summarize(path: str, top: int) -> None:
    units, what, kernels, k = per_unit(path)
    whole = sum(us for _, us in k.values())
    print(f"{units} {what}s, {kernels:.0f} kernels and {whole:.1f} us per {what} (ncu times)\n")
    print(f"| kernel | calls / {what} | mean us | us / {what} | share |")
    print("|---|---|---|---|---|")
    for n in sorted(k, key=lambda n: k[n][1], reverse=True)[:top]:
        c, us = k[n]
        print(f"| {n} | {c:.1f} | {us / c:.2f} | {us:.1f} | {100 * us / whole:.1f} % |")


def compare(paths: list, top: int) -> None:
    """Side by side: us per step / round of each kernel in each CSV (e.g. a plain step, a chain round and a DDTree
    round), and the last CSV's minus the first's; largest difference first. Which kernels grow with the rows?"""
    runs = [per_unit(p) for p in paths]
    names = [os.path.basename(p) for p in paths]
    k0, kn = runs[0][3], runs[-1][3]
    diff = {n: kn.get(n, (0, 0.0))[1] - k0.get(n, (0, 0.0))[1] for n in {n for r in runs for n in r[3]}}
    for name, (units, what, kernels, k) in zip(names, runs):
        print(f"{name}: {units} {what}s, {kernels:.0f} kernels and {sum(us for _, us in k.values()):.1f} us per "
              f"{what}")
    print(f"\n| kernel | {' | '.join(f'{n}: calls, us' for n in names)} | {names[-1]} - {names[0]} us |")
    print("|---|" + "---|" * (len(names) + 1))
    for n in sorted(diff, key=lambda n: abs(diff[n]), reverse=True)[:top]:
        cells = [f"{r[3][n][0]:.1f}, {r[3][n][1]:.1f}" if n in r[3] else "-" for r in runs]
        print(f"| {n} | {' | '.join(cells)} | {diff[n]:+.1f} |")
    totals = [sum(us for _, us in r[3].values()) for r in runs]
    print(f"| **all kernels** | {' | '.join(f'{r[2]:.0f}, {t:.1f}' for r, t in zip(runs, totals))} | "
          f"{totals[-1] - totals[0]:+.1f} |")


def aligned(paths: list, top: int) -> None:
    """Two CSVs whose steps / rounds run the same number of kernels (a chain round and a DDTree round: the same
    program, other shapes), position by position: the median us of each launch over the units of each, the second
    minus the first, and the running sum of the differences - where the second's extra time goes, kernel by kernel,
    even where the two run different kernels at a position (cuBLAS against the skinny kernel). The ``top``
    positions of largest difference are listed, in launch order."""
    if len(paths) != 2:
        fail(f"--aligned: expected two CSVs, got {len(paths)}")
    runs = [units_of(p) for p in paths]
    names = [os.path.basename(p) for p in paths]
    meds = []
    for name, (what, units) in zip(names, runs):
        n = max(set(map(len, units)), key=[len(u) for u in units].count)            # the usual kernel count
        same = [u for u in units if len(u) == n]
        meds.append([(same[0][i][0], same[0][i][1], statistics.median(u[i][2] for u in same)) for i in range(n)])
        print(f"{name}: {len(same)} {what}s of {n} kernels, {sum(m[2] for m in meds[-1]):.1f} us per {what} "
              f"(medians by position)")
    a, b = meds
    if len(a) != len(b):
        fail(f"--aligned: {names[0]} runs {len(a)} kernels a unit and {names[1]} {len(b)}: they do not line up")
    diff = [y[2] - x[2] for x, y in zip(a, b)]
    keep = sorted(sorted(range(len(a)), key=lambda i: abs(diff[i]), reverse=True)[:top])
    cum = [sum(diff[:i + 1]) for i in range(len(a))]
    print(f"\n| # | {names[0]}: kernel (grid) | us | {names[1]}: kernel (grid) | us | difference | running sum |")
    print("|---|---|---|---|---|---|---|")
    for i in keep:
        ka, kb = (f"{short(x[i][0])} {x[i][1]}".strip() for x in (a, b))          # name (grid)
        print(f"| {i} | {ka} | {a[i][2]:.2f} | {kb} | {b[i][2]:.2f} | {diff[i]:+.2f} | {cum[i]:+.1f} |")
    print(f"| **all** | | {sum(x[2] for x in a):.1f} | | {sum(x[2] for x in b):.1f} | {sum(diff):+.1f} | |")


PROMPT = 'def running_mean(xs):\n    """Return the running mean of a list of numbers."""\n'


def _method_kwargs(method: str, drafter, budget: int) -> dict:
    return {"ar": dict(replay=True), "chain": dict(replay=True, drafter=drafter, chain=True),
            "ddtree": dict(replay=True, drafter=drafter, budget=budget)}[method]


def _on_gpu():
    import kdtree_numba as kd
    if kd.backend.name != "cuda":
        fail("profiling needs a GPU (KDTREE_BACKEND=cuda)")
    return kd


def save_picks(path: str, tokens: int, budget: int) -> None:
    """gemm_choice's table after one generation of every method (every few-row GEMM shape timed), saved to path."""
    kd = _on_gpu()
    from kdtree_numba.kernels import gemm_choice
    target, drafter = kd.load_default()
    prompt = target.tokenizer.encode(PROMPT)
    for method in sorted(MARKERS):
        kd.generate(target, prompt, tokens, **_method_kwargs(method, drafter, budget))
    print(f"saved the kernels kept for {gemm_choice.save(path)} GEMM shapes to {path}", file=sys.stderr)


def profile(method: str, tokens: int, budget: int, picks: str | None = None) -> None:
    from kdtree_numba.kernels import gemm_choice
    if picks:                                                   # checked before the GPU is: a bad file is named
        try:
            n = gemm_choice.load(picks)
        except ValueError as e:
            fail(f"--picks: {e}")
    kd = _on_gpu()
    import cupy
    if picks:
        print(f"loaded the kernels kept for {n} GEMM shapes from {picks}", file=sys.stderr)
    target, drafter = kd.load_default()
    prompt = target.tokenizer.encode(PROMPT)
    kw = _method_kwargs(method, drafter, budget)
    for _ in range(2):                                          # compile, capture; then the programs are kept
        kd.generate(target, prompt, tokens, **kw)
    kd.backend.synchronize()
    cupy.cuda.runtime.profilerStart()
    g = kd.generate(target, prompt, tokens, **kw)
    kd.backend.synchronize()
    cupy.cuda.runtime.profilerStop()
    print(f"profiled: {method}, {len(g.tokens)} tokens, {len(g.rounds)} rounds", file=sys.stderr)
    for e in gemm_choice.choices():     # the verify GEMMs' kernels this process timed and kept: they can differ
        times = ", ".join(f"{c} {us:.2f}" for c, us in e["us"].items())          # between processes
        print(f"gemm_choice: {e['M']} x {e['K']} -> {e['N']}{' +=' if e['accumulate'] else ''}: {e['chosen']}"
              f" ({times} us)", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", choices=sorted(MARKERS), default="ddtree")
    p.add_argument("--tokens", type=int, default=20, help="new tokens of the profiled generation (default 20)")
    p.add_argument("--budget", type=int, default=64, help="DDTree budget (default 64)")
    p.add_argument("--summarize", metavar="CSV", nargs="+",
                   help="summarise an ncu CSV instead of profiling; several: compare them kernel by kernel")
    p.add_argument("--top", type=int, default=25, help="kernels listed by --summarize (default 25)")
    p.add_argument("--aligned", action="store_true",
                   help="with two CSVs of the same kernels a unit: compare them launch by launch")
    p.add_argument("--save-picks", metavar="FILE",
                   help="time every few-row GEMM shape in this (normal) process and save gemm_choice's table")
    p.add_argument("--picks", metavar="FILE", help="run the GEMM kernels a --save-picks table kept (under ncu)")
    a = p.parse_args()
    for name in ("tokens", "budget", "top"):
        if getattr(a, name) < 1:
            p.error(f"--{name}: {getattr(a, name)} is not a positive integer")
    if a.aligned and not a.summarize:
        p.error("--aligned: compares two --summarize CSVs")
    if (a.picks or a.save_picks) and a.summarize:
        p.error("--picks / --save-picks: for a profiling run, not with --summarize")
    if a.picks and a.save_picks:
        p.error("--picks / --save-picks: one or the other (save in a normal process, load in the profiled one)")
    if a.picks and not os.path.isfile(a.picks):
        p.error(f"--picks: {a.picks!r} is not a file")
    if a.save_picks:
        save_picks(a.save_picks, a.tokens, a.budget)
    elif a.aligned:
        aligned(a.summarize, a.top)
    elif a.summarize and len(a.summarize) == 1:
        summarize(a.summarize[0], a.top)
    elif a.summarize:
        compare(a.summarize, a.top)
    else:
        profile(a.method, a.tokens, a.budget, a.picks)


if __name__ == "__main__":
    main()
