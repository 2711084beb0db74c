"""``python -m kdtree_numba.parallel --world N``: a greedy DDTree generation with the MoE experts split over N
ranks, checked token for token against a 1-rank run of the same model.

    --comm nccl (default)  one process per GPU: this launcher starts N copies of itself, rank r with
                           CUDA_VISIBLE_DEVICES = the r-th visible GPU, KDTREE_BACKEND=cuda, KDTREE_RANK=r,
                           KDTREE_WORLD=N and KDTREE_NCCL_ID_FILE=<a fresh temp dir>/nccl_id.json (rank 0 writes
                           the NCCL unique id there, the others wait for it; communicator.py). Every rank runs the
                           sharded generation; rank 0 then runs the unsharded 1-rank reference on its GPU; each
                           writes its tokens to a JSON file the launcher compares.
    --comm fake            the N ranks as threads of this process (FakeCommunicator) on the current backend: the
                           same per-rank code path without GPUs (CI runs it).
Models: ``--model tiny`` (kd.tiny_target(--seed)), ``default`` (the embedded trained pair's target) or an HF
directory. Drafter: ``oracle`` (OracleDrafter of the sharded target), ``default`` (the embedded DFlash drafter) or
a DFlash directory. Exit status: 0 tokens equal on every rank and to the 1-rank run, 1 they differ or a rank
failed, 2 bad arguments (one line, checked before anything is loaded: --world must divide the model's routed
experts and, for nccl, not exceed the visible GPUs).
Times printed are wall-clock seconds of one run each, not a benchmark (see docs/SCALE_UP.md).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from . import communicator
from ..argtypes import real, whole
from ..atomic_file import write_text_atomic

PROMPT_TEXT = "def fibonacci(n):"
ORACLE_NOISE, ORACLE_DEPTH = 0.5, 6      # --drafter oracle's defaults


class LaunchError(Exception):
    """A user error: one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"error: {message}\n")


_budget, _noise = whole(0, 1024), real(0.0)


def _ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("expected at least one token id")
    return ids


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m kdtree_numba.parallel", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=whole(1), required=True, help="number of ranks (GPUs for nccl)")
    p.add_argument("--comm", choices=("nccl", "fake"), default="nccl",
                   help="nccl: one process per GPU; fake: ranks as threads in this process (no GPU needed)")
    p.add_argument("--model", default="tiny", help="tiny | default | an HF checkpoint directory (default tiny)")
    p.add_argument("--seed", type=whole(0), default=None,
                   help="seed of --model tiny's weights and of the oracle drafter (default 0)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--ids", type=_ids, metavar="1,2,3", help="prompt token ids")
    src.add_argument("--prompt", metavar="TEXT", help=f"prompt text (default {PROMPT_TEXT!r})")
    p.add_argument("--max-new-tokens", type=whole(1), default=32)
    p.add_argument("--budget", type=_budget, default=16, help="DDTree tree budget, 0..1024 (default 16)")
    p.add_argument("--drafter", default="oracle", help="oracle | default | a DFlash directory (default oracle)")
    p.add_argument("--noise", type=_noise, default=None,
                   help=f"oracle drafter noise (--drafter oracle only; default {ORACLE_NOISE})")
    p.add_argument("--depth", type=whole(1), default=None,
                   help=f"oracle drafter depth (--drafter oracle only; default {ORACLE_DEPTH})")
    p.add_argument("--reduce", choices=("tokens", "assignments"), default="tokens",
                   help="what the all-reduce sums: per-token outputs (k times less data) or per-assignment rows "
                        "(bitwise equal to one rank)")
    p.add_argument("--timeout", type=whole(1), default=900, help="seconds to wait for the ranks (nccl)")
    p.add_argument("--worker-result", help=argparse.SUPPRESS)      # internal: set for the per-GPU processes
    return p


# ------------------------------------------------------------------------------------------------ checks
def _model_config(model: str):
    import kdtree_numba as kd
    from ..model import checkpoint, presets

    if model == "tiny":
        return kd.tiny_config()
    path = os.path.join(presets.DEFAULT_DIR, "target") if model == "default" else model
    if not os.path.isdir(path):
        raise LaunchError(f"--model: {model} is not tiny, default or a checkpoint directory")
    return checkpoint.read_config(path)[0]


def _visible_gpus() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def check_args(args) -> None:
    """Everything that can be refused before a model is loaded (LaunchError: one line, exit 2)."""
    cfg = _model_config(args.model)
    E = cfg.n_routed_experts or 0
    if not E or not any(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers)):
        raise LaunchError(f"--model: {args.model} has no MoE layer, nothing to split over ranks")
    if E % args.world:
        raise LaunchError(f"--world {args.world}: does not divide the model's {E} routed experts")
    if args.drafter not in ("oracle", "default") and not os.path.isdir(args.drafter):
        raise LaunchError(f"--drafter: {args.drafter} is not oracle, default or a DFlash directory")
    for flag, value in (("--noise", args.noise), ("--depth", args.depth)):
        if value is not None and args.drafter != "oracle":
            raise LaunchError(f"{flag} {value:g}: applies to --drafter oracle only, not --drafter {args.drafter}")
    if args.seed is not None and args.model != "tiny" and args.drafter != "oracle":
        raise LaunchError(f"--seed {args.seed}: seeds --model tiny's weights and the oracle drafter, neither of "
                          f"which runs here")
    if args.comm == "nccl" and args.worker_result is None:
        n = _visible_gpus()
        if n < args.world:
            raise LaunchError(f"--world {args.world}: --comm nccl runs one process per GPU and {n} GPU(s) are "
                              f"visible (--comm fake runs the ranks as threads without a GPU)")


# ------------------------------------------------------------------------------------------------ one run
def _target(args):
    import kdtree_numba as kd
    from ..model import presets

    if args.model == "tiny":
        return kd.tiny_target(args.seed or 0)
    if args.model == "default":
        return kd.load_target(os.path.join(presets.DEFAULT_DIR, "target"))
    return kd.load_target(args.model)


def _prompt(target, args) -> list[int]:
    if args.ids is not None:
        return args.ids
    text = args.prompt if args.prompt is not None else PROMPT_TEXT
    if not text:
        raise LaunchError("--prompt: expected a non-empty prompt")
    if target.tokenizer is not None:
        return target.tokenizer.encode(text)
    if target.config.vocab_size < 256:
        raise LaunchError(f"--prompt: this model has no tokenizer and {target.config.vocab_size} tokens; pass --ids")
    return list(text.encode())


def _generate(target, prompt, args) -> tuple[list[int], float]:
    import kdtree_numba as kd
    from ..model import presets

    if args.drafter == "oracle":
        drafter = kd.OracleDrafter(target, noise=ORACLE_NOISE if args.noise is None else args.noise,
                                   seed=args.seed or 0, depth=ORACLE_DEPTH if args.depth is None else args.depth)
    else:
        path = os.path.join(presets.DEFAULT_DIR, "drafter") if args.drafter == "default" else args.drafter
        drafter = kd.load_drafter(path, target)
    t0 = time.perf_counter()
    res = kd.generate(target, prompt, args.max_new_tokens, drafter=drafter, budget=args.budget)
    kd.backend.synchronize()
    return res.tokens, time.perf_counter() - t0


def _report(per_rank: list, reference: list, t_ranks: list, t_ref: float, args) -> int:
    same = all(toks == reference for toks in per_rank)
    for r, (toks, t) in enumerate(zip(per_rank, t_ranks)):
        print(f"rank {r}: {len(toks)} tokens in {t:.2f} s{'' if toks == reference else '  DIFFERENT'}")
    print(f"1 rank: {len(reference)} tokens in {t_ref:.2f} s")
    if args.comm == "fake":
        print("(fake ranks take turns in one process: their times add up and say nothing about speed)")
    if same:
        print(f"OK: {args.world} ranks ({args.comm}, reduce={args.reduce}) generated the 1-rank tokens")
        return 0
    print("MISMATCH: the sharded generation differs from the 1-rank run", file=sys.stderr)
    return 1


def run_fake(args) -> int:
    """The ranks as threads of this process on the current backend."""
    from .expert_parallel import shard_target

    target = _target(args)
    prompt = _prompt(target, args)

    def rank(comm):
        return _generate(shard_target(target, comm.rank, comm.world_size, comm, reduce=args.reduce), prompt, args)

    outs = communicator.run_ranks(args.world, rank)
    reference, t_ref = _generate(target, prompt, args)
    return _report([o[0] for o in outs], reference, [o[1] for o in outs], t_ref, args)


def run_worker(args) -> int:
    """One rank of the nccl launch (environment set by ``launch_nccl``)."""
    from .. import backend
    from .expert_parallel import shard_target

    if backend.process_name != "cuda":
        raise LaunchError(f"--comm nccl: this rank runs on {backend.process_name!r}, expected KDTREE_BACKEND=cuda")
    comm = communicator.NcclCommunicator.from_env()
    target = _target(args)
    prompt = _prompt(target, args)
    tokens, secs = _generate(shard_target(target, comm.rank, comm.world_size, comm, reduce=args.reduce), prompt,
                             args)
    comm.barrier()
    result = {"rank": comm.rank, "tokens": tokens, "seconds": secs}
    if comm.rank == 0:                        # the 1-rank reference, after every rank has finished its collectives
        result["reference"], result["reference_seconds"] = _generate(target, prompt, args)
    write_text_atomic(args.worker_result, json.dumps(result))      # a rank that dies mid-write leaves no half file
    comm.close()
    return 0


def launch_nccl(args, argv: list[str]) -> int:
    """Start one process per GPU (module docstring), wait, compare their tokens."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = [g for g in visible.split(",") if g.strip()] if visible else [str(i) for i in range(args.world)]
    with tempfile.TemporaryDirectory(prefix="kdtree_ep_") as tmp:
        procs, files = [], []
        for r in range(args.world):
            files.append(os.path.join(tmp, f"rank{r}.json"))
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus[r], "KDTREE_BACKEND": "cuda",
                   communicator.ENV_RANK: str(r), communicator.ENV_WORLD: str(args.world),
                   communicator.ENV_ID_FILE: os.path.join(tmp, "nccl_id.json")}
            procs.append(subprocess.Popen([sys.executable, "-m", "kdtree_numba.parallel", *argv,
                                           "--worker-result", files[-1]], env=env))
        deadline = time.monotonic() + args.timeout
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        for p, c in zip(procs, codes):
            if c is None:                     # a rank stuck in a collective: stop the ones we started
                p.kill()
                p.wait()
        if any(c != 0 for c in codes):
            print(f"ranks failed: exit codes {codes} (None: killed after --timeout {args.timeout} s)",
                  file=sys.stderr)
            return 1
        results = []
        for path in files:
            with open(path) as f:
                results.append(json.load(f))
    ref = results[0]
    return _report([r["tokens"] for r in results], ref["reference"], [r["seconds"] for r in results],
                   ref["reference_seconds"], args)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:                   # a one-line usage error (2) or --help (0)
        return int(e.code or 0)
    try:
        check_args(args)
        if args.worker_result is not None:
            return run_worker(args)
        if args.comm == "fake":
            return run_fake(args)
        return launch_nccl(args, argv)
    except (LaunchError, ValueError, OSError) as e:
        print("error: " + " ".join(str(e).split("\n")), file=sys.stderr)
        return 2
