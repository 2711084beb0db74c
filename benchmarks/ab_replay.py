"""A/B of graph-replayed generation: configurations of module constants timed on the held-out HumanEval prompts in
one process - plain decoding, the DFlash chain and DDTree at each budget, tokens/s and the ratios issue 13 asks
about, with every output compared against plain decoding's.

    PYTHONPATH=$PWD KDTREE_BACKEND=cuda python3 benchmarks/ab_replay.py \\
        --config as-is --config v3:kdtree_numba.kernels.tree_verify.V3_MIN_HEADS=0 --rounds 2

A configuration is ``NAME`` or ``NAME:MODULE.ATTR=VALUE[,MODULE.ATTR=VALUE..]`` (VALUE a Python literal); the
attributes are set before the configuration runs and restored after it. Configurations run in the order given,
``--rounds`` times over (A B A B: drift between them shows as a difference between rounds). Each run forgets the
kept replay programs (``decode.replay.drop_programs``) so the constants take effect in a fresh capture, warms up
(one untimed generation per prompt and method: compiles, captures), then times ``--passes`` passes, each one
generation per prompt of every method in turn (interleaved), by wall clock around ``kd.generate`` (prefill
included). Reported: tokens/s of the median pass, ratios as the median of the per-pass ratios, and how many
generations differed from plain decoding's tokens (expected 0: greedy).
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

from _common import RESULTS, args, fail_args, kd, save, table

from kdtree_numba.argtypes import whole, whole_list  # noqa: E402

PROMPTS = os.path.join(os.path.dirname(kd.__file__), "default_model", "humaneval_prompts.jsonl")


def parse_config(text: str) -> tuple:
    """``(name, [(module, attribute, value), ..])`` from ``NAME[:MODULE.ATTR=VALUE,..]``; a one-line exit 2 for a
    module that does not import, an attribute it lacks or a value that is not a literal. Example:
    parse_config("v3:kdtree_numba.kernels.tree_verify.V3_MIN_HEADS=0") -> ("v3", [(<module>, "V3_MIN_HEADS", 0)])."""
    name, _, spec = text.partition(":")
    if not name:
        fail_args(f"--config: expected NAME[:MODULE.ATTR=VALUE,..], got {text!r}")
    sets = []
    for item in filter(None, spec.split(",")):
        path, eq, value = item.partition("=")
        module, _, attr = path.rpartition(".")
        if not eq or not module or not attr:
            fail_args(f"--config {name}: expected MODULE.ATTR=VALUE, got {item!r}")
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            fail_args(f"--config {name}: cannot import {module!r} ({e})")
        if not hasattr(mod, attr):
            fail_args(f"--config {name}: {module} has no attribute {attr!r}")
        try:
            sets.append((mod, attr, ast.literal_eval(value)))
        except (ValueError, SyntaxError):
            fail_args(f"--config {name}: {attr}={value!r} is not a Python literal")
    return name, sets


def extra(p):
    p.add_argument("--config", action="append", default=None, metavar="NAME[:MODULE.ATTR=VALUE,..]",
                   help="a configuration (repeat for several; default: one, the code as it is)")
    p.add_argument("--rounds", type=whole(1), default=2, help="times the list of configurations runs (default 2)")
    p.add_argument("--passes", type=whole(1), default=3, help="timed passes per configuration run (default 3)")
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


def run(sets) -> dict:
    """One configuration: attributes set, programs dropped, warm-up, interleaved passes; attributes restored."""
    from kdtree_numba.decode import replay

    old = [(mod, attr, getattr(mod, attr)) for mod, attr, _ in sets]
    keep, replay.KEEP = replay.KEEP, max(replay.KEEP, 8 * len(methods))     # every method's programs stay
    try:
        for mod, attr, value in sets:
            setattr(mod, attr, value)
        replay.drop_programs(target, drafter)
        ref = [kd.generate(target, x, n_tokens, replay=True).tokens for x in ids]
        for kw in methods.values():
            for x in ids:
                kd.generate(target, x, n_tokens, replay=True, **kw)
        rates = {m: [] for m in methods}
        mismatches = 0
        for _ in range(a.passes):
            for m, kw in methods.items():
                t0, n = time.perf_counter(), 0
                for x, want in zip(ids, ref):
                    g = kd.generate(target, x, n_tokens, replay=True, **kw)
                    n += len(g.tokens)
                    mismatches += g.tokens != want
                rates[m].append(n / (time.perf_counter() - t0))
        return {"rates": rates, "mismatches": mismatches}
    finally:
        for mod, attr, value in old:
            setattr(mod, attr, value)
        replay.KEEP = keep
        replay.drop_programs(target, drafter)


def ratio(r: dict, x: str, y: str) -> float:
    return float(np.median([u / v for u, v in zip(r[x], r[y])]))


rows = []
RESULTS["runs"] = []
for rnd in range(a.rounds):
    for name, sets in configs:
        try:
            res = run(sets)
        except Exception as e:              # one configuration that fails (e.g. a capture) does not lose the others
            print(f"[{name}, round {rnd + 1}] failed: {type(e).__name__}: {e}", flush=True)
            rows.append([name, rnd + 1] + ["failed"] * (len(methods) + len(budgets) + 1) + ["-"])
            continue
        r = res["rates"]
        print(f"[{name}, round {rnd + 1}] " + ", ".join(f"{m} {np.median(r[m]):.1f}" for m in methods) +
              f" tokens/s, {res['mismatches']} mismatches", flush=True)
        tree = [m for m in methods if m.startswith("DDTree")]
        rows.append([name, rnd + 1] + [f"{np.median(r[m]):.1f}" for m in methods] +
                    [f"{ratio(r, m, 'AR'):.3f} / {ratio(r, m, 'chain'):.3f}" for m in tree] +
                    [f"{ratio(r, 'chain', 'AR'):.3f}", res["mismatches"]])
        RESULTS["runs"].append({"config": name, "round": rnd + 1, **res})
table(f"Graph-replayed generation ({kd.backend.name}), HumanEval/0-{n_prompts - 1} x {n_tokens} greedy tokens, "
      f"{a.passes} interleaved passes per run, tokens/s of the median pass",
      ["config", "round"] + [f"{m} tokens/s" for m in methods] +
      [f"{m} / AR / chain" for m in methods if m.startswith("DDTree")] + ["chain / AR", "mismatches vs AR"], rows)
save("ab_replay")
