"""Helpers shared by the tutorials: command line, checks with a PASS/FAIL line each, figures, the final verdict.

Every tutorial starts with ``from _common import ...``. Importing this module imports ``kdtree_numba`` first, which
picks the process backend from ``KDTREE_BACKEND`` (and, for ``sim``, sets NUMBA_ENABLE_CUDASIM=1 before numba is
imported), so a tutorial may ``from numba import cuda`` right after it.

    args = parse_args(__doc__)            # --size small|large, --out DIR (figures), --seed N
    check("rmsnorm kernel vs ref", got, want, atol=1e-5, rtol=1e-5)
    check_true("trees identical", tree_a == tree_b, "12 nodes")
    save_figure(fig, args, "rmsnorm.png")
    finish()                              # exit status 1 if any check failed

The tutorials that show whole-model behaviour (07-11) use the shipped trained pair:
    target, drafter = load_pair()         # kd.load_default() on model_backend(): NumPy when the process is sim
    prompts = heldout_prompts()           # the 164 held-out HumanEval prompts ({"task_id", "prompt"})
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import tempfile
import time

import numpy as np

import kdtree_numba as kd  # noqa: E402  (first: it chooses the backend before numba is imported)

import matplotlib  # noqa: E402

matplotlib.use("Agg")                   # never a window: figures go to files

_RESULTS: list[tuple[str, bool]] = []


# ------------------------------------------------------------------------------------------------ command line
def parse_args(description: str | None = None, argv=None) -> argparse.Namespace:
    """``--size small|large`` (large: GPU-sized shapes, for KDTREE_BACKEND=cuda), ``--out DIR`` (figures; default a
    fresh temporary directory), ``--seed N``. Unknown arguments are ignored (so the cells also run in Jupyter)."""
    first = (description or "").strip().splitlines()
    p = argparse.ArgumentParser(description=first[0] if first else None)
    p.add_argument("--size", choices=("small", "large"), default="small",
                   help="small: simulator-sized shapes (default); large: GPU-sized shapes")
    p.add_argument("--out", default=None, help="directory for figures (default: a new temporary directory)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    args, _ = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.out is None:
        args.out = tempfile.mkdtemp(prefix="kdtree_tutorial_")
    os.makedirs(args.out, exist_ok=True)
    return args


def banner(title: str, args: argparse.Namespace | None = None) -> None:
    """Print the tutorial's title, the backend it runs on and what that means for the comparisons."""
    print("=" * 100)
    print(title)
    print("=" * 100)
    name = kd.backend.process_name
    what = {"cuda": "numba.cuda kernels on a real GPU (arrays are CuPy)",
            "sim": "the same numba.cuda kernels on numba's CUDA simulator (arrays are NumPy)",
            "numpy": "NumPy references only"}[name]
    print(f"backend: {name} -- {what}")
    if name == "numpy":
        print("note: on the numpy backend every stage runs its NumPy reference, so 'kernel vs reference' compares "
              "the reference with itself\n      (trivially equal). Run with KDTREE_BACKEND=sim (or cuda) to "
              "exercise the kernels.")
    if args is not None:
        print(f"size: {args.size}   figures: {args.out}")
        if args.size == "large" and name != "cuda":
            print("note: --size large is meant for KDTREE_BACKEND=cuda; on this backend it will be slow.")
    print()


def section(title: str) -> None:
    print()
    print(f"--- {title} " + "-" * max(0, 95 - len(title)))


# ------------------------------------------------------------------------------------------------ checks
def host(a) -> np.ndarray:
    """A NumPy copy of a backend array (CuPy on the GPU), or the array itself."""
    return kd.backend.to_host(a)


def _record(name: str, ok: bool, detail: str) -> bool:
    _RESULTS.append((name, ok))
    print(f"{'PASS' if ok else 'FAIL'}  {name:<58s} {detail}")
    return ok


def check(name: str, got, want, atol: float = 1e-5, rtol: float = 1e-5, exact: bool = False) -> bool:
    """Compare two arrays (any backend) and print one PASS/FAIL line with the max abs / rel error.

    Floats pass when ``|got - want| <= atol + rtol * |want|`` everywhere (NaN only where ``want`` is NaN); the
    printed relative error skips entries where ``|want|`` is below 1e-3 of its largest value (near-zero references);
    integer arrays, or ``exact=True``, must be equal element for element. Shapes must match."""
    g = np.asarray(host(got))
    w = np.asarray(host(want))
    if g.shape != w.shape:
        return _record(name, False, f"shape {g.shape} != expected {w.shape}")
    if g.size == 0:
        return _record(name, True, "(empty)")
    integer = g.dtype.kind in "iub" and w.dtype.kind in "iub"
    if exact or integer:
        eq = (g == w) | (np.isnan(g) & np.isnan(w)) if g.dtype.kind == "f" else (g == w)
        bad = int(np.count_nonzero(~eq))
        if g.dtype.kind in "iub" or w.dtype.kind in "iub":
            diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
            err = float(np.max(diff)) if diff.size else 0.0
        else:
            err = float(np.nanmax(np.abs(g.astype(np.float64) - w.astype(np.float64)))) if bad < g.size else 0.0
        return _record(name, bad == 0, f"exact: {g.size - bad}/{g.size} equal, max|err| {err:.3g}")
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    nan_ok = np.array_equal(np.isnan(g64), np.isnan(w64))
    fin = ~np.isnan(w64) & ~np.isnan(g64)
    diff = np.abs(g64[fin] - w64[fin])
    abs_err = float(diff.max()) if diff.size else 0.0
    mag = np.abs(w64[fin])
    big = mag >= 1e-3 * mag.max() if mag.size else mag > 0     # relative error where the reference is not ~0
    rel_err = float((diff[big] / mag[big]).max()) if np.any(big) else 0.0
    ok = nan_ok and bool(np.all(diff <= atol + rtol * np.abs(w64[fin])))
    detail = f"max|err| {abs_err:.3g}  max rel {rel_err:.3g}  (atol {atol:g}, rtol {rtol:g})"
    if not nan_ok:
        detail += "  NaN pattern differs"
    return _record(name, ok, detail)


def check_true(name: str, ok: bool, detail: str = "") -> bool:
    """Record a yes/no property (an invariant, an exact object equality) with a PASS/FAIL line."""
    return _record(name, bool(ok), detail)


def check_raises(name: str, fn, exc=ValueError) -> bool:
    """PASS when ``fn()`` raises ``exc``; the message is printed (the package's errors name the argument)."""
    try:
        fn()
    except exc as e:
        return _record(name, True, f"raised {type(e).__name__}: {e}")
    return _record(name, False, f"did not raise {exc.__name__}")


def finish() -> None:
    """Print the verdict; exit with status 1 when any check failed."""
    failed = [n for n, ok in _RESULTS if not ok]
    print()
    if not _RESULTS:
        print("no checks were run")
        sys.exit(1)
    if failed:
        print(f"{len(failed)} of {len(_RESULTS)} checks FAILED: " + "; ".join(failed))
        sys.exit(1)
    print(f"all {len(_RESULTS)} checks passed (backend {kd.backend.process_name})")


# ------------------------------------------------------------------------------------------------ misc
def save_figure(fig, args: argparse.Namespace, filename: str) -> str:
    """Save a matplotlib figure under ``--out`` and close it; returns the path."""
    import matplotlib.pyplot as plt

    path = os.path.join(args.out, filename)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"saved figure: {path}")
    return path


class stopwatch:
    """``with stopwatch() as t: ...`` then ``t.ms`` (host wall clock; device work is synchronised first)."""

    def __enter__(self):
        kd.backend.synchronize()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        kd.backend.synchronize()
        self.ms = (time.perf_counter() - self._t0) * 1e3
        return False


class spy:
    """``with spy() as s: ...`` records the kernel launches (name, grid, block) made inside the block."""

    def __enter__(self):
        self.launches = []
        self._launch = kd.backend.launch

        def launch(kernel, grid, block, *a, **kw):
            fn = getattr(kernel, "py_func", None) or getattr(kernel, "fn", None) or kernel
            self.launches.append((fn.__name__, grid, block))
            return self._launch(kernel, grid, block, *a, **kw)
        kd.backend.launch = launch
        return self

    def __exit__(self, *exc):
        kd.backend.launch = self._launch
        return False


def table(rows, header) -> None:
    """Print a small fixed-width table (``rows``: sequences of printable cells)."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for j, r in enumerate(cells):
        print("  " + "  ".join(c.rjust(w) for c, w in zip(r, widths)))
        if j == 0:
            print("  " + "  ".join("-" * w for w in widths))


def rng(args: argparse.Namespace, salt: int = 0) -> np.random.Generator:
    """Fresh random inputs every tutorial, reproducible from ``--seed``."""
    return np.random.default_rng([args.seed, salt])


# ------------------------------------------------------------------------------------------------ the trained pair
PROMPTS_FILE = os.path.join(os.path.dirname(os.path.abspath(kd.__file__)), "default_model",
                            "humaneval_prompts.jsonl")


def model_backend() -> str:
    """Where whole-model runs go: the process backend, except on the simulator, where they run on the NumPy
    references (one forward of the trained 5-layer target on simulated kernels would take minutes); the
    simulator is kept for single kernels at tiny shapes."""
    return "numpy" if kd.backend.process_name == "sim" else kd.backend.process_name


def load_pair():
    """``kd.load_default()`` on ``model_backend()``: the trained 9.1 M-parameter DeepSeek-V3-architecture code
    model (``target.tokenizer``: byte-level BPE, vocab 4096) and its DFlash drafter. Every call of the target
    and the drafter (and ``kd.generate`` with them) then runs on that backend."""
    with kd.backend.use(model_backend()):
        target, drafter = kd.load_default()
    return target, drafter


def heldout_prompts() -> list[dict]:
    """The 164 HumanEval prompts held out of the pair's training corpus: ``[{"task_id", "prompt"}, ...]``."""
    with open(PROMPTS_FILE) as f:
        return [json.loads(line) for line in f if line.strip()]


def show_text(text: str, width: int = 96, last_lines: int | None = None) -> str:
    """``text`` indented for printing (optionally only its last lines), with a visible end marker."""
    lines = text.splitlines() or [""]
    if last_lines is not None and len(lines) > last_lines:
        lines = ["    ..."] + lines[-last_lines:]
    return "\n".join("    | " + ln[:width] for ln in lines)


def token_texts(tokenizer, ids) -> list[str]:
    """Each id's own text with whitespace made visible (``tokenizer.token_text``), or the id without one."""
    return [tokenizer.token_text(int(i)) if tokenizer is not None else str(int(i)) for i in ids]


def plot_round(round_trace, target, path: str, **kw):
    """``kd.viz.plot_tree`` of one round, its nodes labelled with the target's tokenizer when ``plot_tree`` takes a
    ``tokenizer=`` argument (else by token ids); saved to ``path``. Returns the Figure."""
    from kdtree_numba import viz

    params = inspect.signature(viz.plot_tree).parameters
    if "tokenizer" in params and getattr(target, "tokenizer", None) is not None:
        kw["tokenizer"] = target.tokenizer
    fig = viz.plot_tree(round_trace, vocab_size=target.config.vocab_size, path=path, **kw)
    print(f"saved figure: {path}" + ("" if "tokenizer" in kw else "  (nodes labelled by token id)"))
    return fig


def show_kernel(kernel, first: int = 0, last: int | None = None) -> str:
    """Print a kernel's source - the kernel on the page - from the package itself (it cannot drift from the code).
    ``first`` / ``last`` pick a line range of the function (0-based, end exclusive). Returns the text printed."""
    fn = getattr(kernel, "py_func", None) or getattr(kernel, "fn", None) or kernel   # GPU dispatcher / simulator
    lines = inspect.getsource(fn).splitlines()
    file = os.path.relpath(inspect.getsourcefile(fn), os.path.dirname(os.path.dirname(kd.__file__)))
    text = "\n".join(lines[first:last])
    print(f"---- {file}: {fn.__name__} ----\n{text}\n----")
    return text


def draw_owners(owner, title: str, xlabel: str, ylabel: str, row_names=None):
    """A thread-to-data drawing: cell (r, c) of ``owner [R, C]`` shows which thread touches it (colour and number);
    -1 = nobody. Returns the figure (``save_figure`` it)."""
    import matplotlib.pyplot as plt

    owner = np.asarray(owner)
    R, C = owner.shape
    fig, ax = plt.subplots(figsize=(min(0.32 * C + 1.5, 16), 0.45 * R + 1.2))
    shown = np.ma.masked_less(owner, 0)
    ax.imshow(shown % 20, cmap="tab20", vmin=0, vmax=19, aspect="auto")
    for r in range(R):
        for c in range(C):
            if owner[r, c] >= 0:
                ax.text(c, r, str(owner[r, c]), ha="center", va="center", fontsize=7)
    ax.set_xticks(range(C))
    ax.set_xticklabels([str(c) for c in range(C)], fontsize=6)
    ax.set_yticks(range(R))
    ax.set_yticklabels(row_names if row_names is not None else [str(r) for r in range(R)], fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
