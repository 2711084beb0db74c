"""A/B of graph-replayed generation: configurations of module constants timed on the held-out HumanEval prompts in
one process - plain decoding, the DFlash chain and DDTree at each budget, tokens/s and the ratios issue 13 asks
about, with every output compared against plain decoding's.

    PYTHONPATH=$PWD KDTREE_BACKEND=cuda python3 benchmarks/ab_replay.py \\
        --config as-is --config v3:kdtree_numba.kernels.tree_verify.V3_MIN_HEADS=0 --rounds 2

A configuration is ``NAME`` or ``NAME:MODULE.ATTR=VALUE[,MODULE.ATTR=VALUE..]`` (VALUE a Python literal, commas
inside its brackets or quotes its own: ``..gemm_choice.CANDIDATES=("skinny","rows")``; or ``@MODULE.NAME``, an
object imported from a module on the path - e.g. an older version of a function, kept in a file of your own, in
place of the package's: ``old:kdtree_numba.kernels.moe_routing.gather_rows=@my_old_kernels.gather_rows``); the
attributes are set while the configuration runs and restored at the end. Each configuration first warms up under
its constants (one untimed generation per prompt and method: compiles, captures) into replay programs of its own
(``Config``: the model objects' kept programs are swapped per configuration, so each replays what was captured
under its constants). Then ``--rounds`` x ``--passes`` passes, **each pass through every configuration in turn**
(A B C, A B C, ..) and, within one, one generation per prompt of every method in turn, timed by wall clock around
``kd.generate`` (prefill included): a process drifts (one H200 process went 9 % slower over ten minutes,
2026-12-05), and alternating pass by pass puts the drift on every configuration alike, where running each
configuration's passes in a block put it on the later ones. Reported: tokens/s of the median pass, ratios as the
median of the per-pass ratios - between methods, and each method against the first configuration in the same pass
- and how many generations differed from plain decoding's tokens (expected 0: greedy). On cuda a last table lists
the kernel kernels/gemm_choice.py kept for each tree-verify GEMM shape (timed under the configurations that tune).
To compare two checkouts instead, run this script from each: it imports the package beside its own folder.
Example (2026-12-04, H200, the default pair): tree verifies on v3 against v2 gave DDTree-32 4641 / 4923 and
4752 / 4760 tokens/s in two rounds (docs/PERFORMANCE.md, eighteenth session).
"""
import ast
import importlib
import json
import os
import time

import numpy as np

from _common import RESULTS, args, fail_args, gemm_choice_table, kd, save, table

from kdtree_numba.argtypes import whole, whole_list  # noqa: E402

PROMPTS = os.path.join(os.path.dirname(kd.__file__), "default_model", "humaneval_prompts.jsonl")


def _top_level_items(spec: str) -> list:
    """``spec`` split at the commas outside brackets and quotes, so a value may be a tuple, list, dict or string
    with commas of its own. Example: "m.A=(1, 2),m.B='x,y'" -> ["m.A=(1, 2)", "m.B='x,y'"]."""
    items, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(spec):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(spec[start:i])
            start = i + 1
    return items + [spec[start:]]


def parse_config(text: str) -> tuple:
    """``(name, [(module, attribute, value), ..])`` from ``NAME[:MODULE.ATTR=VALUE,..]`` (VALUE a literal or
    ``@MODULE.NAME``: ``_imported``); a one-line exit 2 for a module that does not import, an attribute it lacks or
    a value that is neither. Example:
    parse_config("v3:kdtree_numba.kernels.tree_verify.V3_MIN_HEADS=0") -> ("v3", [(<module>, "V3_MIN_HEADS", 0)])."""
    name, _, spec = text.partition(":")
    if not name:
        fail_args(f"--config: expected NAME[:MODULE.ATTR=VALUE,..], got {text!r}")
    sets = []
    for item in filter(None, _top_level_items(spec)):
        path, eq, value = item.partition("=")
        module, _, attr = path.rpartition(".")
        if not eq or not module or not attr:
            fail_args(f"--config {name}: expected MODULE.ATTR=VALUE, got {item!r}")
        mod = _imported(name, module, attr)
        if value.startswith("@"):
            obj_module, _, obj = value[1:].rpartition(".")
            if not obj_module or not obj:
                fail_args(f"--config {name}: {attr}={value!r}: expected @MODULE.NAME")
            sets.append((mod, attr, getattr(_imported(name, obj_module, obj), obj)))
            continue
        try:
            sets.append((mod, attr, ast.literal_eval(value)))
        except (ValueError, SyntaxError):
            fail_args(f"--config {name}: {attr}={value!r} is not a Python literal (nor @MODULE.NAME)")
    return name, sets


def _imported(config: str, module: str, attr: str):
    """``module`` imported, with ``attr`` checked to exist in it; a one-line exit 2 otherwise."""
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        fail_args(f"--config {config}: cannot import {module!r} ({e})")
    if not hasattr(mod, attr):
        fail_args(f"--config {config}: {module} has no attribute {attr!r}")
    return mod


def extra(p):
    p.add_argument("--config", action="append", default=None, metavar="NAME[:MODULE.ATTR=VALUE,..]",
                   help="a configuration (repeat for several; default: one, the code as it is)")
    p.add_argument("--rounds", type=whole(1), default=2, help="multiplies --passes (default 2)")
    p.add_argument("--passes", type=whole(1), default=3, help="timed passes, each through every configuration "
                   "(default 3; rounds x passes in all)")
    p.add_argument("--prompts", type=whole(1, 164), default=8, help="first N held-out prompts (default 8)")
    p.add_argument("--tokens", type=whole(1), default=128, help="new tokens per generation (default 128)")
    p.add_argument("--budgets", type=whole_list(1, 1024), default=[32, 64],
                   help="DDTree budgets, comma-separated (default 32,64)")


a = args(__doc__, extra)
budgets = a.budgets
configs = [parse_config(c) for c in (a.config or ["as-is"])]
n_prompts, n_tokens = (a.prompts, a.tokens) if not a.quick else (2, 8)

target, drafter = kd.load_default()
with open(PROMPTS) as f:
    prompts = [json.loads(line)["prompt"] for line in f][:n_prompts]
ids = [np.asarray(target.tokenizer.encode(p), np.int32) for p in prompts]
methods = {"AR": {}, "chain": dict(drafter=drafter, chain=True),
           **{f"DDTree-{b}": dict(drafter=drafter, budget=b) for b in budgets}}


class Config:
    """One configuration's constants and its own replay programs (captured under those constants): switching to it
    sets the constants and hands the model objects its kept programs, so configurations can alternate pass by pass
    without capturing again."""

    def __init__(self, name, sets):
        self.name, self.sets, self.programs, self.failed = name, sets, {}, None
        self.rates = {m: [] for m in methods}
        self.mismatches = 0

    def activate(self):
        for mod, attr in DEFAULTS:
            setattr(mod, attr, DEFAULTS[mod, attr])
        for mod, attr, value in self.sets:
            setattr(mod, attr, value)
        for owner in (target, drafter):
            vars(owner)["_programs"] = self.programs.setdefault(id(owner), {})


def timed_pass(c: Config, ref) -> None:
    """One generation per prompt of every method in turn, under configuration ``c``: its tokens/s per method."""
    c.activate()
    for m, kw in methods.items():
        t0, n = time.perf_counter(), 0
        for x, want in zip(ids, ref):
            g = kd.generate(target, x, n_tokens, replay=True, **kw)
            n += len(g.tokens)
            c.mismatches += g.tokens != want
        c.rates[m].append(n / (time.perf_counter() - t0))


def per_pass(xs, ys) -> float:
    """The median of the per-pass ratios xs[p] / ys[p]."""
    return float(np.median([u / v for u, v in zip(xs, ys)]))


def ratio(r: dict, x: str, y: str) -> float:
    return per_pass(r[x], r[y])


from kdtree_numba.decode import replay  # noqa: E402

DEFAULTS = {(mod, attr): getattr(mod, attr) for _, sets in configs for mod, attr, _ in sets}
replay.KEEP = max(replay.KEEP, 8 * len(methods))                         # every method's programs stay
runs = [Config(name, sets) for name, sets in configs]
ref = None
for c in runs:                                                          # warm-up: compiles, captures, reference
    try:
        c.activate()
        if ref is None:
            ref = [kd.generate(target, x, n_tokens, replay=True).tokens for x in ids]
        for kw in methods.values():
            for x in ids:
                kd.generate(target, x, n_tokens, replay=True, **kw)
    except Exception as e:              # one configuration that fails (e.g. a capture) does not lose the others
        c.failed = f"{type(e).__name__}: {e}"
        print(f"[{c.name}] failed: {c.failed}", flush=True)
live = [c for c in runs if c.failed is None]
for p in range(a.rounds * a.passes):                                    # A B C, A B C, ..: drift hits all alike
    for c in live:
        timed_pass(c, ref)
    print(f"[pass {p + 1}] " + "; ".join(f"{c.name}: " + ", ".join(f"{m} {c.rates[m][-1]:.1f}" for m in methods)
                                         for c in live), flush=True)
for mod, attr in DEFAULTS:
    setattr(mod, attr, DEFAULTS[mod, attr])

tree = [m for m in methods if m.startswith("DDTree")]
first = live[0] if live else None
rows = []
RESULTS["runs"] = []
for c in runs:
    if c.failed is not None:
        rows.append([c.name] + ["failed"] * (len(methods) + len(tree) + 2) + ["-"])
        continue
    r = c.rates
    vs = [f"{per_pass(r[m], first.rates[m]):.3f}" for m in methods]
    rows.append([c.name] + [f"{np.median(r[m]):.1f}" for m in methods] +
                [f"{ratio(r, m, 'AR'):.3f} / {ratio(r, m, 'chain'):.3f}" for m in tree] +
                [f"{ratio(r, 'chain', 'AR'):.3f}", " / ".join(vs), c.mismatches])
    RESULTS["runs"].append({"config": c.name, "rates": r, "mismatches": c.mismatches})
table(f"Graph-replayed generation ({kd.backend.name}), HumanEval/0-{n_prompts - 1} x {n_tokens} greedy tokens, "
      f"{a.rounds * a.passes} passes, each through every configuration in turn; tokens/s of the median pass",
      ["config"] + [f"{m} tokens/s" for m in methods] + [f"{m} / AR / chain" for m in tree] +
      ["chain / AR", f"vs {first.name if first else '-'} ({' / '.join(methods)}, per pass)", "mismatches vs AR"],
      rows)
gemm_choice_table()
save("ab_replay")
