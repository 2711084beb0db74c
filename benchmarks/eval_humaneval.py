"""Held-out evaluation of the shipped default pair (``kd.load_default()``) on the 164 HumanEval prompts.

Every number is measured by this script; nothing is copied from a log. Three parts, in this order (the speed part
never runs while the worker processes of the acceptance part are alive):

1. **bits per byte** (current backend, main process). For each prompt, ``ids = tokenizer.encode(prompt)`` (T
   tokens) and ONE prefill ``target.logits(ids)`` -> [T, V]. The negative log-likelihood of tokens 1 .. T-1 (each
   given the tokens before it; token 0 has no prediction and is excluded) is summed in bits over all prompts and
   divided by the UTF-8 bytes those tokens decode to, ``len(decode(ids[1:]).encode("utf-8"))`` summed over
   prompts:  ``bpb = sum_p sum_{t=1}^{T_p-1} -log2 p(ids_t | ids_<t) / sum_p bytes(decode(ids_p[1:]))``.
   Also reported: the same NLL in nats per token (comparable with the training log's validation loss), the
   per-prompt mean bpb, and how many prompts fail ``decode(ids[:1]) + decode(ids[1:]) == prompt`` (must be 0).
2. **acceptance length tau and target forwards per token** (numpy worker processes, or the main process with
   ``--workers 0``). Per prompt: greedy autoregressive decoding of ``--max-new-tokens`` (128) tokens, the DFlash
   chain (``chain=True``: the drafter's top-1 token per depth, 15 deep) and DDTree at each ``--budgets`` value,
   no stop tokens (every run generates exactly 128 tokens). tau of a run = the tokens its rounds added to the
   output / its rounds (accepted draft tokens + the target's bonus token per round; the first token, which comes
   from the prefill, belongs to no round; the last round counts only the tokens up to the 128th - the rest of its
   path was verified, not emitted: ``Generation.acceptance_length``). Aggregates: ``tau = committed tokens of all
   prompts / total rounds`` and ``forwards/token = total target forwards (prefill included) / total generated tokens``;
   the per-prompt means of both are given too. Every chain / DDTree output is compared with the autoregressive
   output token by token; the number of mismatching runs is reported (must be 0). ``--temperature T`` samples
   instead, here and in the speed part (prompt i with seed ``--seed`` + i, every method alike): the outputs must
   still be plain decoding's, token for token (draws keyed by position: kernels/sampling.py); with --skip-bpb.
3. **tokens/s** (current backend, main process). Autoregressive, chain and DDTree at each ``--speed-budget`` (64;
   comma-separated for several) on the first ``--speed-subset`` (8) prompts (task ids named in the output). Per
   method one untimed warm-up generation per subset prompt (compiles; with ``replay=True`` captures the program of
   every cache capacity the prompts need, as a server captures its graphs at start-up), then ``--repeats`` (1)
   passes of one generation per prompt timed by wall clock around ``kd.generate`` (prefill included); tokens/s =
   total new tokens / total wall seconds of the median pass (every pass's rate is kept: the table shows their
   range). The passes are interleaved - pass r of every method, then pass r + 1 - so the machine's drift (other
   tenants, clocks: 12 % between two processes of the same code on the H200) falls on every method alike, and the
   speedup is the median of the per-pass ratios to autoregressive; when the model objects keep fewer replay
   programs (``decode/replay.py``'s KEEP per object) than the methods need, a pass would capture again, so the
   methods then run one after another, each right after its own warm-up. The backend and device name are
   reported. ``--replay`` adds the same methods with ``replay=True`` (graph-replayed steps and rounds), timed in
   the same run; ``--replay-only`` times only those (then the speedups are all against replayed autoregressive
   decoding) - the way to time all 164 prompts (``--speed-subset 164``) on a GPU, where direct launches run
   ~100 tokens/s. ``tokens_per_second_after_prefill`` is total new tokens / total seconds after each prefill (a
   ratio of totals, like tokens/s); ``ms_before_clock_mean`` the mean ms a generation's wall clock holds before its
   own clock starts (``Generation.seconds``): the checks and the prefill's launch, for DDTree also the prefill's
   device time and the first token's read. Besides the speedup against (direct) autoregressive decoding, each
   method's speedup against autoregressive decoding and the chain of its own launch mode (direct or replayed) - the
   ratios issue 13's goals name.

``--drafter DIR`` evaluates another DFlash drafter (a ``python -m kdtree_numba.train drafter --out`` directory) with
the shipped target, e.g. a candidate before it replaces the shipped one; the output names it. ``--replay-tau`` runs
the acceptance part's generations with ``replay=True`` (on cuda graph-replayed: the same tokens and rounds, 14-24x
the direct launches' tokens/s in the speed part); in the main process (``--workers 0``, the default on cuda) it
runs method by method over all prompts, so each method's replay programs are captured once (not yet timed on all
164 prompts).

Usage::

    KDTREE_BACKEND=numpy python benchmarks/eval_humaneval.py --out kdtree_numba/default_model/eval_humaneval.json
    KDTREE_BACKEND=numpy python benchmarks/eval_humaneval.py --prompts 4            # smoke run
    KDTREE_BACKEND=cuda python3 benchmarks/eval_humaneval.py --skip-tau --skip-bpb --speed-subset 164 --replay-only \\
        --repeats 3 --speed-budget 32,64 --out gpu_eval.json                        # the model card's H200 numbers

BLAS threads (``--blas-threads``, default 1) are fixed before NumPy is imported, in this process and the workers:
on a shared 2-core machine OpenBLAS's default thread pool made the small GEMMs of this 9 M model 4-5x slower.
Imports only kdtree_numba, NumPy and the standard library. Exit status 1 if any output mismatched.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROMPTS_FILE = os.path.join(ROOT, "kdtree_numba", "default_model", "humaneval_prompts.jsonl")
BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
LN2 = math.log(2.0)


def _int_list(s: str) -> list:
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 8,16,32, got {s!r}") from None
    if not v or any(x < 1 for x in v):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {s!r}")
    return v


def _nonneg(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {s!r}")
    return v


def _positive(s: str) -> int:
    v = _nonneg(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return v


def _temperature(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {s!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {s!r}")
    return v


def _drafter_dir(s: str) -> str:
    if not os.path.isfile(os.path.join(s, "config.json")):
        raise argparse.ArgumentTypeError(f"{s!r} holds no config.json, expected a DFlash drafter directory (the "
                                         f"--out of `python -m kdtree_numba.train drafter`)")
    return os.path.abspath(s)


def drafter_sha256(drafter_dir: str | None) -> str:
    """sha256 of the evaluated drafter's weights (the shipped one's when ``drafter_dir`` is None): the model card
    takes a ``--drafter`` eval for the shipped pair only when this matches the shipped weights."""
    from kdtree_numba.train.card import DEFAULT_DIR, sha256_file
    return sha256_file(os.path.join(drafter_dir or os.path.join(DEFAULT_DIR, "drafter"), "model.safetensors"))


def load_pair(kd, drafter_dir: str | None = None):
    """The shipped target and the shipped drafter, or the drafter in ``drafter_dir``."""
    target, drafter = kd.load_default()
    return (target, drafter) if drafter_dir is None else (target, kd.load_drafter(drafter_dir, target))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Held-out HumanEval evaluation of the default target + DFlash drafter: "
                                            "bits per byte, acceptance length, forwards per token, tokens/s.")
    p.add_argument("--prompts", type=_positive, default=None, help="evaluate the first N prompts (default: all 164)")
    p.add_argument("--budgets", type=_int_list, default=[8, 16, 32, 64, 128, 256],
                   help="DDTree node budgets (default 8,16,32,64,128,256)")
    p.add_argument("--max-new-tokens", type=_positive, default=128)
    p.add_argument("--temperature", type=_temperature, default=0.0,
                   help="sample the acceptance and speed parts' generations at this temperature (default 0: greedy; "
                        "with --skip-bpb); prompt i with seed --seed + i; every chain / DDTree output must still "
                        "equal plain decoding's")
    p.add_argument("--seed", type=_nonneg, default=0, help="the first prompt's sampling seed (default 0)")
    p.add_argument("--speed-subset", type=_positive, default=8, help="tokens/s on the first K prompts (default 8)")
    p.add_argument("--speed-budget", type=_int_list, default=[64],
                   help="DDTree budgets of the speed part, comma-separated (default 64)")
    p.add_argument("--repeats", type=_positive, default=1,
                   help="timed passes per method over the speed prompts; tokens/s is the median pass's (default 1)")
    p.add_argument("--workers", type=_nonneg, default=None,
                   help="numpy worker processes for the tau part (0: the main process on the current backend; "
                        "default 2 on CPU backends, 0 on cuda)")
    p.add_argument("--blas-threads", type=_positive, default=1, help="BLAS threads per process (default 1)")
    p.add_argument("--skip-bpb", action="store_true")
    p.add_argument("--skip-tau", action="store_true")
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--replay", action="store_true", help="speed part: also time each method with replay=True "
                   "(decode step / DDTree round captured as CUDA graphs on cuda), in the same run")
    p.add_argument("--replay-only", action="store_true",
                   help="speed part: time only the replay=True methods (direct launches run ~100 tokens/s on a GPU: "
                        "all 164 prompts would take an hour)")
    p.add_argument("--drafter", type=_drafter_dir, default=None,
                   help="a DFlash drafter directory to evaluate with the shipped target instead of the shipped drafter")
    p.add_argument("--replay-tau", action="store_true",
                   help="acceptance part: generate with replay=True (graph-replayed on cuda: same tokens, faster)")
    p.add_argument("--prompts-file", default=PROMPTS_FILE, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="write everything as JSON to this file")
    return p


def _set_blas_threads(n: int) -> None:
    for var in BLAS_VARS:
        os.environ[var] = str(n)


def load_prompts(path: str, n: int | None) -> list:
    with open(path, encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.strip()]
    return items[:n] if n else items


def _log(msg: str) -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------------------------------------ 1. bits per byte
def prompt_nll(target, prompt: str) -> dict:
    """NLL of tokens 1..T-1 of one prompt under one prefill, and the UTF-8 bytes those tokens decode to."""
    import numpy as np

    tok = target.tokenizer
    ids = tok.encode(prompt)
    logits = np.asarray(target.logits(np.asarray(ids, np.int32)), np.float64)       # [T, V]
    z = logits[:-1]                                                                 # predictions of tokens 1..T-1
    m = z.max(axis=1, keepdims=True)
    logz = (m[:, 0] + np.log(np.exp(z - m).sum(axis=1)))                            # [T-1]
    nats = float(np.sum(logz - z[np.arange(len(ids) - 1), ids[1:]]))
    tail = tok.decode(ids[1:])
    return {"tokens": len(ids), "predicted": len(ids) - 1, "nats": nats, "bits": nats / LN2,
            "bytes": len(tail.encode("utf-8")), "roundtrip": tok.decode(ids[:1]) + tail == prompt}


def run_bpb(target, prompts: list) -> dict:
    per = []
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        r = prompt_nll(target, p["prompt"])
        r["task_id"] = p["task_id"]
        per.append(r)
        if (i + 1) % 20 == 0 or i + 1 == len(prompts):
            _log(f"[bpb] {i + 1}/{len(prompts)} prompts, {time.perf_counter() - t0:.1f}s")
    bits = sum(r["bits"] for r in per)
    nbytes = sum(r["bytes"] for r in per)
    ntok = sum(r["predicted"] for r in per)
    return {
        "definition": "sum over prompts of the NLL (bits) of tokens 1..T-1 of each prompt under one target prefill "
                      "(token 0 excluded), divided by the summed UTF-8 byte length of decode(ids[1:]) of each prompt",
        "bits_per_byte": bits / nbytes,
        "bits_per_byte_prompt_mean": sum(r["bits"] / r["bytes"] for r in per) / len(per),
        "nats_per_token": sum(r["nats"] for r in per) / ntok,
        "bits_per_token": bits / ntok,
        "predicted_tokens": ntok, "bytes": nbytes, "bytes_per_token": nbytes / ntok, "prompts": len(per),
        "roundtrip_failures": sum(not r["roundtrip"] for r in per),
        "seconds": time.perf_counter() - t0,
        "per_prompt": [{"task_id": r["task_id"], "tokens": r["tokens"], "bits": round(r["bits"], 4),
                        "bytes": r["bytes"]} for r in per],
    }


# ------------------------------------------------------------------------------------------------ 2. tau
_W: dict = {}          # per-process state: the loaded pair and the settings


def _worker_init(blas_threads: int, settings: dict, numpy_backend: bool) -> None:
    """Pool initializer: pin BLAS threads and the numpy backend BEFORE kdtree_numba (and NumPy) are imported."""
    if numpy_backend:
        _set_blas_threads(blas_threads)
        os.environ["KDTREE_BACKEND"] = "numpy"
    import kdtree_numba as kd

    if numpy_backend and kd.backend.process_name != "numpy":
        raise RuntimeError(f"worker backend is {kd.backend.process_name}, expected numpy")
    target, drafter = load_pair(kd, settings.get("drafter_dir"))
    _W.update(kd=kd, target=target, drafter=drafter, **settings)


def _methods(budgets) -> list:
    return ["chain"] + [f"ddtree@{b}" for b in budgets]


def _sampling(index: int) -> dict:
    """The sampling arguments of prompt ``index``'s generations (every method alike: draws keyed by position make
    their outputs plain decoding's, sampled too)."""
    return {"temperature": _W.get("temperature", 0.0), "seed": _W.get("seed", 0) + index}


def _run_method(name: str, ids, ar_tokens: list, index: int = 0) -> dict:
    """One chain / DDTree generation of a prompt: its counts, and whether its output equals AR's."""
    kd, target, drafter, n, replay = _W["kd"], _W["target"], _W["drafter"], _W["max_new_tokens"], bool(_W.get("replay"))
    if name == "chain":
        g = kd.generate(target, ids, n, drafter=drafter, chain=True, replay=replay, **_sampling(index))
    else:
        g = kd.generate(target, ids, n, drafter=drafter, budget=int(name.split("@")[1]), replay=replay,
                        **_sampling(index))
    lens = g.round_tokens                                   # tokens per round, the last round's cut to its output
    first_diff = next((i for i, (a, b) in enumerate(zip(g.tokens, ar_tokens)) if a != b),
                      None if len(g.tokens) == len(ar_tokens) else min(len(g.tokens), len(ar_tokens)))
    return {"tokens": len(g.tokens), "rounds": len(lens), "committed": int(sum(lens)),
            "forwards": int(g.target_forwards), "accept_lengths": lens, "match": first_diff is None,
            "first_mismatch": first_diff}


def _encode(prompt: str):
    import numpy as np

    return np.asarray(_W["target"].tokenizer.encode(prompt), np.int32)


def eval_prompt(job, methods=None) -> dict:
    """AR, then ``methods`` (default: the chain and DDTree at every budget) on one prompt: counts, and whether each
    output equals AR."""
    index, task_id, prompt = job
    ids = _encode(prompt)
    t0 = time.perf_counter()
    ar = _W["kd"].generate(_W["target"], ids, _W["max_new_tokens"], replay=bool(_W.get("replay")), **_sampling(index))
    rec = {"index": index, "task_id": task_id, "prompt_tokens": int(len(ids)), "ar_tokens": [int(t) for t in ar.tokens],
           "ar_forwards": int(ar.target_forwards), "runs": {}}
    for name in _methods(_W["budgets"]) if methods is None else methods:
        rec["runs"][name] = _run_method(name, ids, rec["ar_tokens"], index)
    rec["seconds"] = time.perf_counter() - t0
    return rec


def eval_method_major(jobs) -> list:
    """The records of ``eval_prompt`` for every job, generated method by method over all prompts (AR first): with
    ``replay=True`` each method's replay programs are captured once and stay, where prompt by prompt more methods
    than a model object keeps (decode/replay.py's KEEP) would capture again for every generation."""
    recs = [eval_prompt(job, methods=()) for job in jobs]
    for name in _methods(_W["budgets"]):
        for (index, _, prompt), rec in zip(jobs, recs):
            t0 = time.perf_counter()
            rec["runs"][name] = _run_method(name, _encode(prompt), rec["ar_tokens"], index)
            rec["seconds"] += time.perf_counter() - t0
    return recs


def _aggregate(records: list, budgets) -> dict:
    out = {}
    for name in _methods(budgets):
        runs = [r["runs"][name] for r in records]
        rounds = sum(x["rounds"] for x in runs)
        committed = sum(x["committed"] for x in runs)
        fw = sum(x["forwards"] for x in runs)
        toks = sum(x["tokens"] for x in runs)
        hist: dict = {}
        for x in runs:
            for a in x["accept_lengths"]:
                hist[a] = hist.get(a, 0) + 1
        out[name] = {
            "tau": committed / rounds if rounds else float("nan"),
            "tau_prompt_mean": sum(x["committed"] / x["rounds"] for x in runs if x["rounds"])
            / max(1, sum(1 for x in runs if x["rounds"])),
            "forwards_per_token": fw / toks,
            "forwards_per_token_prompt_mean": sum(x["forwards"] / x["tokens"] for x in runs) / len(runs),
            "rounds": rounds, "committed_tokens": committed, "target_forwards": fw, "generated_tokens": toks,
            "mismatches": sum(not x["match"] for x in runs),
            "accept_length_histogram": {str(k): hist[k] for k in sorted(hist)},
        }
    ar_fw = sum(r["ar_forwards"] for r in records)
    ar_tok = sum(len(r["ar_tokens"]) for r in records)
    out["autoregressive"] = {"forwards_per_token": ar_fw / ar_tok, "target_forwards": ar_fw,
                             "generated_tokens": ar_tok}
    return out


def run_tau(prompts: list, budgets, max_new_tokens: int, workers: int, blas_threads: int, drafter_dir=None,
            replay: bool = False, temperature: float = 0.0, seed: int = 0) -> dict:
    settings = {"budgets": list(budgets), "max_new_tokens": max_new_tokens, "drafter_dir": drafter_dir,
                "replay": replay, "temperature": temperature, "seed": seed}
    jobs = [(i, p["task_id"], p["prompt"]) for i, p in enumerate(prompts)]
    records, t0 = [], time.perf_counter()

    def progress(rec):
        records.append(rec)
        done = len(records)
        el = time.perf_counter() - t0
        bad = [m for m, x in rec["runs"].items() if not x["match"]]
        chain = rec["runs"]["chain"]
        _log(f"[tau] {done}/{len(jobs)} {rec['task_id']} ({rec['prompt_tokens']} prompt tokens, "
             f"{rec['seconds']:.1f}s) chain tau {chain['committed'] / max(1, chain['rounds']):.2f}"
             f"{' MISMATCH ' + ','.join(bad) if bad else ''}; elapsed {el:.0f}s, eta "
             f"{el / done * (len(jobs) - done):.0f}s")

    if workers == 0:
        _worker_init(blas_threads, settings, numpy_backend=False)
        for rec in eval_method_major(jobs) if replay else map(eval_prompt, jobs):
            progress(rec)
        backend = _W["kd"].backend.name
    else:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")        # never fork a process that may hold a CUDA context
        with ctx.Pool(workers, initializer=_worker_init, initargs=(blas_threads, settings, True)) as pool:
            for rec in pool.imap_unordered(eval_prompt, jobs, chunksize=1):
                progress(rec)
            pool.close()
            pool.join()
        backend = "numpy"
    records.sort(key=lambda r: r["index"])
    agg = _aggregate(records, budgets)
    return {
        "definition": "tau = the tokens the rounds of all prompts added to the output (accepted draft tokens + 1 "
                      "bonus a round; the prefill's first token is in no round; the last round's only up to "
                      "max_new_tokens) / total rounds; "
                      "forwards_per_token = total target forwards (prefill included) / total generated tokens; "
                      "*_prompt_mean: the mean over prompts of the per-prompt ratio",
        "backend": backend, "workers": workers, "replay": replay, "max_new_tokens": max_new_tokens,
        "budgets": list(budgets), "temperature": temperature, "seed": seed,
        "stop_tokens": [], "prompts": len(records), "seconds": time.perf_counter() - t0,
        "mismatches_total": sum(v.get("mismatches", 0) for v in agg.values()),
        "methods": agg,
        "per_prompt": [{"task_id": r["task_id"], "prompt_tokens": r["prompt_tokens"], "ar_tokens": r["ar_tokens"],
                        **{m: {k: r["runs"][m][k] for k in ("rounds", "committed", "forwards", "match")}
                           for m in _methods(budgets)}} for r in records],
    }


# ------------------------------------------------------------------------------------------------ 3. speed
def device_name(kd) -> str:
    if kd.backend.name == "cuda":
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU: {cpu} ({os.cpu_count()} logical cores)"


def _loadavg():
    """The 1-minute load average (other processes on a shared machine slow the wall clock), or None."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def _timed_pass(kd, target, ids: list, max_new_tokens: int, kw: dict, sampling: list) -> tuple:
    """One timed generation per prompt (``sampling[j]``: prompt j's temperature and seed): (seconds, new tokens,
    seconds after prefill, tokens) lists."""
    secs, toks, post, texts = [], [], [], []
    for x, smp in zip(ids, sampling):
        kd.backend.synchronize()
        t = time.perf_counter()
        g = kd.generate(target, x, max_new_tokens, **kw, **smp)
        kd.backend.synchronize()
        secs.append(time.perf_counter() - t)
        toks.append(len(g.tokens))
        post.append(g.seconds)                 # the generation's own clock starts after the prefill
        texts.append(g.tokens)
    return secs, toks, post, texts


def _kept_programs(*owners) -> set:
    """ids of the replay programs the model objects keep now (decode/replay.py: the last KEEP per object)."""
    return {id(p) for o in owners for p in vars(o).get("_programs", {}).values()}


def _speedup(v: dict, base: dict, interleaved: bool) -> tuple:
    """(speedup, per-pass ratios) of method ``v`` against ``base``: interleaved, the median of the per-pass ratios
    (pass r against the base's pass r); else the ratio of the two medians. Example: passes [2, 3, 4] against
    [1, 2, 2], interleaved -> ratios [2.0, 1.5, 2.0], speedup 2.0."""
    import numpy as np

    ratios = [x / y for x, y in zip(v["tokens_per_second_passes"], base["tokens_per_second_passes"])] \
        if interleaved else [v["tokens_per_second"] / base["tokens_per_second"]]
    return float(np.median(ratios)), ratios


SPEED_KEEP = 32        # replay programs a model object keeps during the speed part (decode/replay.py: KEEP = 4)


def _speed_passes(kd, target, drafter, ids, max_new_tokens, methods: dict, repeats: int, warm, sampling) -> tuple:
    """``({method: [pass, ...]}, interleaved)``: every method warmed up once, then ``repeats`` timed passes.
    Interleaved passes (pass r of every method, then pass r + 1) share the machine's drift between methods -
    unless a model object keeps fewer programs than the methods built, when a pass would capture again: then
    method by method, each warmed up again first."""
    built = set()
    for kw in methods.values():
        before = _kept_programs(target, drafter)
        warm(kw)
        built |= _kept_programs(target, drafter) - before
    interleaved = built <= _kept_programs(target, drafter)
    passes = {name: [] for name in methods}
    if interleaved:
        for _ in range(repeats):
            for name, kw in methods.items():
                passes[name].append(_timed_pass(kd, target, ids, max_new_tokens, kw, sampling))
    else:
        for name, kw in methods.items():
            warm(kw)             # its programs again: a later method's warm-up pushed them out
            passes[name] = [_timed_pass(kd, target, ids, max_new_tokens, kw, sampling) for _ in range(repeats)]
    return passes, interleaved


def run_speed(kd, target, drafter, prompts: list, max_new_tokens: int, budgets: list, replay: bool = False,
              repeats: int = 1, replay_only: bool = False, temperature: float = 0.0, seed: int = 0) -> dict:
    """The speed part (module docstring, 3.): ``replay`` adds every method with replay=True, ``replay_only``
    times only those; the first method timed (autoregressive decoding) is the ``speedup_vs_autoregressive``
    baseline. ``temperature`` > 0: prompt j sampled with seed ``seed`` + j, as in the acceptance part."""
    import numpy as np

    direct = {"autoregressive": dict(), "chain": dict(drafter=drafter, chain=True),
              **{f"ddtree@{b}": dict(drafter=drafter, budget=b) for b in budgets}}
    methods = {} if replay_only else dict(direct)
    if replay or replay_only:    # the same methods with their step / round replayed from CUDA graphs (same tokens)
        methods.update({f"{name} (replay)": dict(kw, replay=True) for name, kw in direct.items()})
    ids = [np.asarray(target.tokenizer.encode(p["prompt"]), np.int32) for p in prompts]
    sampling = [{"temperature": temperature, "seed": seed + j} for j in range(len(ids))]
    load_before = _loadavg()

    def warm(kw):                # untimed: compiles, and (replay) captures every cache capacity used, longest
        for j in sorted(range(len(ids)), key=lambda j: len(ids[j]), reverse=True):   # first (bench_round.py)
            kd.generate(target, ids[j], max_new_tokens, **kw, **sampling[j])

    from kdtree_numba.decode import replay as programs

    keep, programs.KEEP = programs.KEEP, max(programs.KEEP, SPEED_KEEP)   # every method's programs, for this run
    try:
        passes, interleaved = _speed_passes(kd, target, drafter, ids, max_new_tokens, methods, repeats, warm,
                                            sampling)
    finally:
        programs.KEEP = keep
    out = {}
    for name in methods:
        rates = [sum(p[1]) / sum(p[0]) for p in passes[name]]
        secs, toks, post, texts = passes[name][sorted(range(repeats), key=rates.__getitem__)[(repeats - 1) // 2]]
        same = next(iter(out.values()))["outputs"] if out else texts             # autoregressive decoding's
        out[name] = {"tokens_per_second": sum(toks) / sum(secs), "tokens_per_second_passes": rates,
                     "seconds": secs, "tokens": toks, "outputs": texts,
                     "mismatches_vs_autoregressive": sum(u != v for p in passes[name] for u, v in zip(p[3], same)),
                     "median_generation_seconds": float(np.median(secs)),
                     "tokens_per_second_after_prefill": sum(toks) / sum(post),     # a ratio of totals too
                     "ms_before_clock_mean": 1e3 * (sum(secs) - sum(post)) / len(secs)}
        spread = f"; passes {min(rates):.1f} .. {max(rates):.1f}" if repeats > 1 else ""
        _log(f"[speed] {name}: {out[name]['tokens_per_second']:.1f} tokens/s "
             f"({sum(toks)} tokens in {sum(secs):.2f}s{spread})")
    base = next(iter(out.values()))
    for name, v in out.items():
        v["speedup_vs_autoregressive"], v["speedup_vs_autoregressive_passes"] = _speedup(v, base, interleaved)
        mode = " (replay)" if name.endswith(" (replay)") else ""      # the same launch mode's baselines
        v["speedup_vs_autoregressive_same_mode"] = _speedup(v, out["autoregressive" + mode], interleaved)[0]
        v["speedup_vs_chain_same_mode"] = _speedup(v, out["chain" + mode], interleaved)[0]
    for v in out.values():
        del v["outputs"]
    order = "interleaved: pass r of every method, then pass r + 1" if interleaved else \
        "method by method (the model objects keep fewer replay programs than the methods need)"
    median = "" if repeats == 1 else " of the median pass" + (
        "; speedup = the median of the per-pass ratios to AR" if interleaved else "")
    return {"definition": "per method: one untimed warm-up generation per subset prompt, then "
                          f"{'one pass' if repeats == 1 else f'{repeats} passes'} of one generation per subset "
                          f"prompt ({order}) timed by wall clock around kd.generate (prefill included); "
                          f"tokens_per_second = total new tokens / total seconds{median}",
            "interleaved": interleaved,
            "task_ids": [p["task_id"] for p in prompts], "max_new_tokens": max_new_tokens, "budget": budgets[0],
            "budgets": budgets, "repeats": repeats, "temperature": temperature, "seed": seed,
            "backend": kd.backend.name, "device": device_name(kd), "cpu_count": os.cpu_count(),
            "load_average_1min": {"before": load_before, "after": _loadavg()}, "methods": out}


# ------------------------------------------------------------------------------------------------ report
def _order(speed: dict) -> str:
    """How the timed passes were ordered (results from before the interleaving say nothing)."""
    if "interleaved" not in speed:
        return ""
    return "; passes interleaved across methods" if speed["interleaved"] else "; methods timed one after another"


def markdown(res: dict) -> str:
    lines = []
    drafter = res.get("settings", {}).get("drafter", "shipped")
    if drafter != "shipped":
        lines += [f"**Drafter**: {drafter} (not the shipped one)", ""]
    b = res.get("bpb")
    if b:
        lines += [f"**Target on {b['prompts']} held-out HumanEval prompts**: {b['bits_per_byte']:.4f} bits/byte "
                  f"({b['nats_per_token']:.4f} nats/token, {b['bytes_per_token']:.2f} bytes/token)", ""]
    t = res.get("tau")
    if t:
        mode = (f"tokens sampled at T = {t['temperature']:g} (seeds {t.get('seed', 0)} + prompt index)"
                if t.get("temperature", 0) > 0 else "greedy tokens")
        lines += [f"**Acceptance** ({t['prompts']} prompts x {t['max_new_tokens']} {mode}"
                  f"{', replayed' if t.get('replay') else ''}; tau = total committed tokens / total rounds):", "",
                  "| method | tau (aggregate) | tau (prompt mean) | target forwards / token | mismatches vs AR |",
                  "|---|---|---|---|---|",
                  f"| autoregressive | 1 | 1 | {t['methods']['autoregressive']['forwards_per_token']:.4f} | - |"]
        for name in _methods(t["budgets"]):
            m = t["methods"][name]
            label = "DFlash chain (depth 15)" if name == "chain" else f"DDTree, budget {name.split('@')[1]}"
            lines.append(f"| {label} | {m['tau']:.3f} | {m['tau_prompt_mean']:.3f} | {m['forwards_per_token']:.4f} "
                         f"| {m['mismatches']} |")
        lines.append("")
    s = res.get("speed")
    if s:
        ids = s["task_ids"]
        named = f"{ids[0]} .. {ids[-1]}" if len(ids) > 1 else ids[0]
        sampled = (f" sampled at T = {s['temperature']:g} (seeds {s.get('seed', 0)} + prompt index)"
                   if s.get("temperature", 0) > 0 else "")
        lines += [f"**Speed** ({s['backend']} backend, {s['device']}; {len(ids)} prompts {named} x "
                  f"{s['max_new_tokens']} tokens{sampled}, wall clock incl. prefill, after one warm-up per prompt"
                  f"{_order(s)}):", "",
                  "| method | tokens/s | speedup vs AR | vs AR, same launches | vs chain, same launches | "
                  "passes (min .. max) |", "|---|---|---|---|---|---|"]
        for name, v in s["methods"].items():
            r = v.get("tokens_per_second_passes") or [v["tokens_per_second"]]
            same = [f"{v[k]:.2f}x" if k in v else "-"
                    for k in ("speedup_vs_autoregressive_same_mode", "speedup_vs_chain_same_mode")]
            lines.append(f"| {name} | {v['tokens_per_second']:.1f} | {v['speedup_vs_autoregressive']:.2f}x | "
                         f"{same[0]} | {same[1]} | {len(r)} ({min(r):.1f} .. {max(r):.1f}) |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    _set_blas_threads(a.blas_threads)          # before NumPy (imported by kdtree_numba) loads OpenBLAS
    sys.path.insert(0, ROOT)
    import kdtree_numba as kd
    from kdtree_numba.argtypes import out_dir_problem
    from kdtree_numba.atomic_file import write_text_atomic

    problem = a.out and out_dir_problem(os.path.dirname(os.path.abspath(a.out)))
    if problem:                                       # before the work, not after it
        print(f"eval_humaneval.py: error: --out {a.out}: {problem}", file=sys.stderr)
        return 2
    workers = a.workers if a.workers is not None else (0 if kd.backend.process_name == "cuda" else 2)
    if a.temperature > 0 and not a.skip_bpb:          # bits per byte do not sample: a sampled eval skips them
        print(f"eval_humaneval.py: error: --temperature {a.temperature}: bits per byte do not depend on it; add "
              f"--skip-bpb (a sampled eval times and counts sampled generations only)", file=sys.stderr)
        return 2
    prompts = load_prompts(a.prompts_file, a.prompts)
    if not a.skip_speed and a.speed_subset > len(prompts):      # prompts[:K] would quietly time fewer
        print(f"eval_humaneval.py: error: --speed-subset {a.speed_subset}: only {len(prompts)} prompts are evaluated "
              f"(--prompts / the prompts file)", file=sys.stderr)
        return 2
    env = f"KDTREE_BACKEND={os.environ['KDTREE_BACKEND']} " if "KDTREE_BACKEND" in os.environ else ""
    args = sys.argv[1:] if argv is None else list(argv)
    res = {"command": env + "python " + " ".join([os.path.relpath(os.path.abspath(__file__), ROOT)] + args),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "package_version": kd.__version__, "backend": kd.backend.process_name, "device": device_name(kd),
           "python": platform.python_version(), "blas_threads": a.blas_threads,
           "prompts_file": os.path.relpath(a.prompts_file, ROOT), "prompts": len(prompts),
           "task_ids": [prompts[0]["task_id"], prompts[-1]["task_id"]], "settings": {
               "max_new_tokens": a.max_new_tokens, "budgets": a.budgets, "temperature": a.temperature,
               "seed": a.seed,
               "speed_subset": a.speed_subset, "speed_budget": a.speed_budget, "repeats": a.repeats,
               "replay_only": a.replay_only,
               "workers": workers, "drafter": a.drafter or "shipped", "replay_tau": a.replay_tau,
               "drafter_sha256": drafter_sha256(a.drafter)}}
    _log(f"[eval] {len(prompts)} prompts, backend {kd.backend.process_name}, {res['device']}, "
         f"workers {workers}, BLAS threads {a.blas_threads}")
    t_all = time.perf_counter()
    target = drafter = None
    if not (a.skip_bpb and a.skip_speed):
        target, drafter = load_pair(kd, a.drafter)
    if not a.skip_bpb:
        res["bpb"] = run_bpb(target, prompts)
        _log(f"[bpb] {res['bpb']['bits_per_byte']:.4f} bits/byte, {res['bpb']['nats_per_token']:.4f} nats/token "
             f"({res['bpb']['roundtrip_failures']} round-trip failures)")
    if not a.skip_tau:
        res["tau"] = run_tau(prompts, a.budgets, a.max_new_tokens, workers, a.blas_threads, a.drafter, a.replay_tau,
                             a.temperature, a.seed)
    if not a.skip_speed:
        res["speed"] = run_speed(kd, target, drafter, prompts[:a.speed_subset], a.max_new_tokens, a.speed_budget,
                                 a.replay, a.repeats, a.replay_only, a.temperature, a.seed)
    res["seconds"] = time.perf_counter() - t_all
    res["markdown"] = markdown(res)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        write_text_atomic(a.out, json.dumps(res, indent=1) + "\n")
        _log(f"[eval] wrote {a.out}")
    print("\n" + res["markdown"], flush=True)
    bad = res.get("tau", {}).get("mismatches_total", 0)
    if bad:
        _log(f"[eval] ERROR: {bad} chain/DDTree runs differ from autoregressive decoding")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
