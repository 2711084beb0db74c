"""Command line: ``python -m kdtree_numba <command>`` (also installed as ``kdtree-numba``).

    demo      the main job: a held-out HumanEval prompt completed by the embedded trained pair, plain decoding vs
              the DFlash chain vs DDTree: text, identical-output check, stats, figures, HTML viewer
    generate  generate from the default pair or a checkpoint directory; text in and out through its tokenizer
    trees     tree figures and the HTML viewer from a saved trace (``generate --trace out.json``)
    sweep     budget sweep figure (acceptance length and target forwards per token vs budget, DDTree vs chain)
    figures   regenerate every figure in figures/ from real runs of the trained pair
    tour      run every stage kernel on the active backend and print its max error against the reference
    bench     run the GPU benchmarks of a source checkout (benchmarks/bench_*.py)
Errors print one line and exit with status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .argtypes import out_dir_problem, out_file_problem, real, whole, whole_list
from .decode.generate import DEFAULT_BUDGET

DEMO_TASK = "HumanEval/18"          # its greedy completion reads as code (a small class), see cmd_demo
BYTE_PROMPT = "DDTree drafts a whole tree of continuations, then the target checks them all at once. "
EOS = "<|endoftext|>"


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


# ------------------------------------------------------------------------------------------------ helpers
def _progress(label: str):
    """A one-line progress bar on stderr (only when stderr is a terminal)."""
    tty = sys.stderr.isatty()
    t0 = time.perf_counter()

    def update(done: int, total: int):
        if not tty:
            return
        width = 30
        fill = int(width * done / max(total, 1))
        sys.stderr.write(f"\r{label} [{'#' * fill}{'.' * (width - fill)}] {done}/{total} "
                         f"{time.perf_counter() - t0:5.1f}s")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return update


_positive_int, _budget, _temperature = whole(1), whole(0, 1024), real(0.0)
_int_list, _budget_list = whole_list(0), whole_list(0, 1024)
_sweep_budgets = whole_list(1, 1024)       # a log-scale axis; budget 0 (plain decoding) is its dotted line


def _check_out_file(path: str, flag: str, exts=None) -> None:
    """Refuse an output file we could not write, before any work is done (``argtypes.out_file_problem``)."""
    problem = out_file_problem(path, exts)
    if problem:
        raise CliError(f"{flag}: {problem}")


def _check_out_dir(path: str, flag: str) -> None:
    """The output folder exists and can be written, or can be created (``argtypes.out_dir_problem``)."""
    problem = out_dir_problem(path)
    if problem:
        raise CliError(f"{flag}: {problem}")


# ------------------------------------------------------------------------------------------------ models
_DEFAULT = {}


def _default_pair():
    """The embedded trained pair, loaded once per process."""
    if not _DEFAULT:
        from . import load_default

        _DEFAULT["pair"] = load_default()
    return _DEFAULT["pair"]


def _load(path: str | None):
    if path is None:
        return _default_pair()[0]
    from . import load_target

    if not os.path.isdir(path):
        raise CliError(f"--model: {path} is not a directory (expected an HF checkpoint directory)")
    try:
        return load_target(path)
    except ValueError as e:                          # CheckpointError, ConfigError, TokenizerError
        raise _for_flag(e, "--model") from None


def _for_flag(e: ValueError, flag: str) -> CliError:
    """A loader's error, which names its own parameter (``path: DIR has no config.json``), worded for the command
    line's flag (``--model: DIR has no config.json``)."""
    msg = str(e)
    return CliError(flag + msg[len("path"):] if msg.startswith("path:") else f"{flag}: {msg}")


def _heldout() -> dict[str, str]:
    """The 164 held-out HumanEval prompts shipped with the default model: task id -> prompt."""
    from .model.presets import DEFAULT_DIR

    with open(os.path.join(DEFAULT_DIR, "humaneval_prompts.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {r["task_id"]: r["prompt"] for r in rows}


def task_prompt(task: str) -> str:
    """A held-out HumanEval prompt, its final newline removed: the tokenizer joins a newline with the next line's
    indentation (one token), so a prompt that ends in a bare newline reads to the model as the end of a file."""
    prompts = _heldout()
    if task not in prompts:
        if task.isdigit() and f"HumanEval/{task}" in prompts:
            task = f"HumanEval/{task}"
        else:
            raise CliError(f"--task: unknown task {task!r}, expected HumanEval/0 .. HumanEval/{len(prompts) - 1}")
    return prompts[task].rstrip("\n")


def _prompt_ids(target, text: str | None, ids: list[int] | None, task: str | None = None) -> list[int]:
    """Prompt token ids from --ids, --task or --prompt (default: the demo task's prompt)."""
    V = target.config.vocab_size
    if ids is not None:
        if not ids:
            raise CliError("--ids: expected at least one token id")
        bad = [i for i in ids if not 0 <= i < V]
        if bad:
            raise CliError(f"--ids: token id {bad[0]} is outside the vocabulary [0, {V})")
        return ids
    flag = "--task" if task is not None else "--prompt"
    if text is None:
        text = task_prompt(task or DEMO_TASK)
    if not text:
        raise CliError("--prompt: expected a non-empty prompt")
    tok = getattr(target, "tokenizer", None)
    if tok is not None:
        out = tok.encode(text)
        if not out:
            raise CliError(f"{flag}: the prompt encodes to no tokens")
        return out
    if V != 256:
        raise CliError(f"{flag}: this model has no tokenizer.json and a {V}-token vocabulary, so text cannot be "
                       f"encoded; pass token ids with --ids")
    return list(text.encode())


def _check_drafter_args(args) -> None:
    """Refuse drafter options (and a --seed) that the run would ignore, before anything is loaded."""
    kind = args.drafter
    if args.noise is not None and kind != "oracle":
        raise CliError(f"--noise {args.noise:g}: applies to --drafter oracle only, not --drafter {kind}")
    if args.depth is not None and kind not in ("oracle", "random"):
        raise CliError(f"--depth {args.depth}: applies to --drafter oracle or random only, not --drafter {kind} "
                       f"(a DFlash drafter's depth is its block size - 1)")
    if args.drafter_dir is not None and kind != "dflash":
        raise CliError(f"--drafter-dir {args.drafter_dir}: applies to --drafter dflash only, not --drafter {kind}")
    sampled = getattr(args, "temperature", 0.0) > 0
    if args.seed is not None and not sampled and kind not in ("oracle", "random"):
        raise CliError(f"--seed {args.seed}: nothing draws random numbers here (it seeds "
                       + ("sampling at --temperature > 0 and " if hasattr(args, "temperature") else "")
                       + f"the oracle and random drafters, not --drafter {kind})")
    if args.drafter_dir is not None and not os.path.isdir(args.drafter_dir):
        raise CliError(f"--drafter-dir {args.drafter_dir}: not a directory (expected a DFlash drafter directory)")
    if kind == "dflash" and args.drafter_dir is None and args.model is not None and os.path.isdir(args.model) \
            and not os.path.isdir(os.path.join(args.model, "drafter")):
        raise CliError(f"--drafter dflash: {args.model} has no drafter/ folder; pass --drafter-dir DIR "
                       f"(or --drafter oracle, random or none)")


def _seed(args) -> int:
    """--seed, 0 when not given."""
    return 0 if args.seed is None else args.seed


def _drafter(target, args):
    """The drafter --drafter asks for (None for plain decoding); ``_check_drafter_args`` has run."""
    from . import OracleDrafter, RandomDrafter

    kind = args.drafter
    depth = 8 if args.depth is None else args.depth
    if kind == "none":
        return None
    if kind == "random":
        return RandomDrafter(target.config.vocab_size, depth, _seed(args))
    if kind == "oracle":
        return OracleDrafter(target, noise=0.3 if args.noise is None else args.noise, seed=_seed(args), depth=depth)
    from . import load_drafter

    folder, flag = args.drafter_dir, "--drafter-dir"
    if folder is None:
        if args.model is None:
            return _default_pair()[1]
        folder, flag = os.path.join(args.model, "drafter"), "--model (its drafter/)"
    try:
        return load_drafter(folder, target)
    except ValueError as e:
        raise _for_flag(e, flag) from None


def _text(target, tokens) -> str:
    from .viz import text_of

    return text_of(tokens, target.config.vocab_size, getattr(target, "tokenizer", None))


def _tag_trace(gen, args, target) -> None:
    """Record which model made a trace, so ``trees`` can label its tokens."""
    gen.settings["vocab_size"] = int(target.config.vocab_size)
    gen.settings["model"] = "default" if args.model is None else os.path.abspath(args.model)


# ------------------------------------------------------------------------------------------------ commands
def _rule(title: str = "") -> str:
    return f"\u2500\u2500\u2500\u2500 {title} ".ljust(78, "\u2500") if title else "\u2500" * 78


def _drafter_summary(drafter) -> str:
    c = getattr(drafter, "config", None)
    if c is None:
        return getattr(drafter, "name", "drafter")
    return (f"DFlash block diffusion, {c.num_hidden_layers} layers, hidden {c.hidden_size}, block {c.block_size} "
            f"(depth {drafter.depth}), reads target layers {','.join(str(k) for k in c.target_layer_ids)}")


def cmd_demo(args) -> int:
    import kdtree_numba as kd

    from . import viz
    from .model import presets

    _check_out_dir(args.out, "--out")
    target, drafter = _default_pair()
    tok = target.tokenizer
    if args.prompt is not None:
        where = "your --prompt"
        prompt = _prompt_ids(target, args.prompt, None)
    else:
        task = args.task or DEMO_TASK
        prompt = _prompt_ids(target, None, None, task=task)
        where = f"{task if task.startswith('HumanEval/') else 'HumanEval/' + task}, held out from training " \
                f"(its final newline is left for the model to write)"
    n, B = args.max_new_tokens, args.budget
    print(f"kdtree_numba demo: backend {kd.backend.name}, greedy, {n} new tokens")
    print(f"  target   {presets.describe(target)}")
    print(f"  drafter  {_drafter_summary(drafter)}")
    print(f"  prompt   {where}, {len(prompt)} tokens")
    ar = kd.generate(target, prompt, n)
    chain = kd.generate(target, prompt, n, drafter=drafter, chain=True, progress=_progress("DFlash chain"))
    dd = kd.generate(target, prompt, n, drafter=drafter, budget=B, progress=_progress("DDTree"))
    print(_rule("prompt"))
    print(tok.decode(prompt))
    print(_rule(f"completion ({len(ar.tokens)} tokens, greedy)"))
    print(tok.decode(ar.tokens))
    print(_rule())
    same_chain, same_dd = chain.tokens == ar.tokens, dd.tokens == ar.tokens
    yes = lambda ok: "yes" if ok else "NO"                                  # noqa: E731
    print(f"outputs identical to plain decoding:  DFlash chain {yes(same_chain)}   DDTree {yes(same_dd)}\n")

    def target_side(g):
        if not g.rounds:
            return g.tokens_per_second
        ms = sum(v for k, v in g.stage_totals().items() if k != "draft")
        return len(g.tokens) / max(ms / 1e3, 1e-9)

    runs = (ar, chain, dd)
    rows = [("", "autoregressive", "DFlash chain", f"DDTree (budget {B})"),
            ("new tokens", *(f"{len(g.tokens)}" for g in runs)),
            ("target forwards", *(f"{g.target_forwards}" for g in runs)),
            ("target forwards / token", *(f"{g.forwards_per_token:.3f}" for g in runs)),
            ("acceptance length \u03c4", "1 (no draft)", *(f"{g.acceptance_length:.2f}" for g in runs[1:])),
            ("tokens/s, wall clock", *(f"{g.tokens_per_second:.0f}" for g in runs)),
            ("tokens/s, target side", *(f"{target_side(g):.0f}" for g in runs))]
    for r in rows:
        print(f"  {r[0]:<26}{r[1]:>15}{r[2]:>15}{r[3]:>20}")
    print(f"\ntarget forwards: DDTree {ar.target_forwards / dd.target_forwards:.2f}x fewer than plain decoding, "
          f"the chain {ar.target_forwards / chain.target_forwards:.2f}x fewer.")
    if kd.backend.name != "cuda":
        print(f"On the {kd.backend.name} backend (CPU) the rounds are host-bound: verifying {B + 1} tokens at once "
              f"({drafter.depth + 1} for the chain)\ncosts far more than a one-token step, so wall-clock tokens/s "
              f"can be below plain decoding's. The target\nforwards per token are the point here; GPU measurements "
              f"are in docs/PERFORMANCE.md. 'target side' leaves out\nthe draft stage.")
    else:
        print("'target side' leaves out the draft stage; benchmarks: docs/PERFORMANCE.md.")
    print("DDTree stage time (ms): " + "  ".join(f"{k} {v:.0f}" for k, v in dd.stage_totals().items()))
    os.makedirs(args.out, exist_ok=True)
    picks = viz.showcase_rounds(dd) or None
    viz.plot_rounds(dd, tokenizer=tok, picks=picks, path=os.path.join(args.out, "rounds.png"))
    viz.acceptance_histogram([chain, dd], labels=["DFlash chain", f"DDTree, budget {B}"],
                             path=os.path.join(args.out, "acceptance.png"))
    viz.write_html(dd, os.path.join(args.out, "viewer.html"), tokenizer=tok)
    _tag_trace(dd, argparse.Namespace(model=None), target)
    dd.to_json(os.path.join(args.out, "trace.json"))
    print(f"\nwrote {args.out}/rounds.png (a typical round and the longest), acceptance.png, viewer.html "
          f"(open in a browser), trace.json")
    return 0 if same_chain and same_dd else 1


def cmd_generate(args) -> int:
    import kdtree_numba as kd

    if args.trace is not None:
        _check_out_file(args.trace, "--trace")
    if args.chain and args.drafter == "none":
        raise CliError("--chain: needs a drafter, not --drafter none")
    if args.budget is not None and (args.chain or args.drafter == "none"):
        raise CliError(f"--budget {args.budget}: does not apply with {'--chain' if args.chain else '--drafter none'} "
                       f"(no tree is built)")
    _check_drafter_args(args)
    if args.task is not None:
        task_prompt(args.task)                       # an unknown task fails before the model loads
    if args.model is not None and not os.path.isdir(args.model):
        raise CliError(f"--model: {args.model} is not a directory (expected an HF checkpoint directory)")
    target = _load(args.model)
    prompt = _prompt_ids(target, args.prompt, args.ids, args.task)
    drafter = _drafter(target, args)
    tok = getattr(target, "tokenizer", None)
    stop = ()
    if args.stop_at_eos:
        eos = tok.token_id(EOS) if tok is not None else None
        if eos is None:
            raise CliError(f"--stop-at-eos: this model has no tokenizer with an {EOS} token")
        stop = (eos,)
    res = kd.generate(target, prompt, args.max_new_tokens, drafter=drafter,
                      budget=args.budget, temperature=args.temperature,
                      seed=_seed(args), stop_tokens=stop, chain=args.chain, replay=args.replay,
                      progress=_progress("generate") if drafter is not None else None)
    shown = res.tokens[:-1] if stop and res.tokens and res.tokens[-1] in stop else res.tokens
    if args.ids is None and (tok is not None or target.config.vocab_size == 256):
        print(_text(target, shown))
    else:
        print(" ".join(str(t) for t in shown))
    tau = f", tau {res.acceptance_length:.2f}" if res.rounds else ""
    ended = f", stopped at {EOS}" if len(shown) < len(res.tokens) else ""
    print(f"[{res.settings.get('method', 'autoregressive')}: {len(res.tokens)} tokens{ended}, "
          f"{res.target_forwards} target forwards ({res.forwards_per_token:.2f} per token){tau}, "
          f"{res.tokens_per_second:.1f} tokens/s]", file=sys.stderr)
    if args.trace:
        _tag_trace(res, args, target)
        res.to_json(args.trace)
        print(f"[trace written to {args.trace}]", file=sys.stderr)
    return 0


def _trace_labels(args, gen):
    """(vocab_size, tokenizer) to label a trace's tokens with (see the ``trees`` help)."""
    from .model import tokenizer as _tok
    from .model.presets import DEFAULT_DIR

    if args.model is not None:
        if not os.path.isdir(args.model):
            raise CliError(f"--model: {args.model} is not a directory")
        tok = _tok.load(args.model)
        if tok is None:
            raise CliError(f"--model: {args.model} has no tokenizer.json (for a byte-level trace use "
                           f"--vocab-size 256)")
        return tok.vocab_size, tok
    if args.vocab_size is not None:
        return args.vocab_size, None
    ids = [int(t) for t in gen.prompt + gen.tokens] + [int(t) for r in gen.rounds for t in r.tree.tokens]
    top = max(ids, default=0)
    s = gen.settings or {}
    where = s.get("model")
    if where and where != "default" and os.path.isfile(os.path.join(where, "tokenizer.json")):
        return int(s.get("vocab_size", top + 1)), _tok.load(where)
    V = s.get("vocab_size")
    if V == 256 or (V is None and top < 256):
        return 256, None
    default = _tok.load(os.path.join(DEFAULT_DIR, "target"))
    if (where == "default" or V is None) and default is not None and top < default.vocab_size:
        return default.vocab_size, default
    return int(V or top + 1), None


def cmd_trees(args) -> int:
    from . import Generation, viz

    if not os.path.isfile(args.trace):
        raise CliError(f"trace: {args.trace} does not exist")
    _check_out_dir(args.out, "--out")
    try:
        gen = Generation.from_json(args.trace)
    except (ValueError, OSError) as e:
        raise CliError(str(e)) from None
    if not gen.rounds:
        raise CliError(f"trace: {args.trace} has no DDTree rounds (an autoregressive run?)")
    rounds = list(dict.fromkeys(args.rounds)) if args.rounds is not None else list(range(min(3, len(gen.rounds))))
    if not rounds:
        raise CliError("--rounds: expected at least one round index")
    bad = [r for r in rounds if not 0 <= r < len(gen.rounds)]
    if bad:
        raise CliError(f"--rounds: round {bad[0]} outside [0, {len(gen.rounds)})")
    V, tok = _trace_labels(args, gen)
    too_big = [t for r in gen.rounds for t in r.tree.tokens if t >= V]
    if tok is None and too_big:
        if args.vocab_size is not None:
            raise CliError(f"--vocab-size {V}: too small for this trace (it holds token {int(max(too_big))})")
        raise CliError(f"trace: {args.trace} holds token {int(max(too_big))}, outside its settings' vocab_size "
                       f"{V}; label it with --vocab-size or --model")
    os.makedirs(args.out, exist_ok=True)
    for r in rounds:
        viz.plot_tree(gen.rounds[r], vocab_size=V, tokenizer=tok, path=os.path.join(args.out, f"round{r:03d}.png"))
    viz.plot_rounds(gen, vocab_size=V, tokenizer=tok, picks=rounds, path=os.path.join(args.out, "rounds.png"))
    viz.acceptance_histogram(gen, path=os.path.join(args.out, "acceptance.png"))
    viz.tree_shape(gen, path=os.path.join(args.out, "tree_shape.png"))
    viz.stage_times(gen, path=os.path.join(args.out, "stage_times.png"))
    viz.write_html(gen, os.path.join(args.out, "viewer.html"), vocab_size=V, tokenizer=tok)
    labels = "decoded tokens" if tok is not None else ("bytes" if V == 256 else "token ids")
    plural = "s" if len(rounds) != 1 else ""
    print(f"wrote {len(rounds)} round figure{plural}, rounds/acceptance/tree_shape/stage_times.png and viewer.html "
          f"to {args.out} (labels: {labels})")
    return 0


def cmd_sweep(args) -> int:
    from . import viz
    from .decode.sweep import sweep_rows

    _check_out_file(args.out, "--out", (".png", ".svg"))
    _check_drafter_args(args)
    if args.task is not None:
        task_prompt(args.task)
    target = _load(args.model)
    prompt = _prompt_ids(target, args.prompt, args.ids, args.task)
    drafter = _drafter(target, args)
    rows = sweep_rows(target, lambda: drafter, prompt, args.budgets, args.max_new_tokens, seed=_seed(args),
                          progress=_progress("sweep"))
    name = {"dflash": "DFlash chain"}.get(args.drafter, f"{args.drafter} chain")
    viz.budget_sweep(rows, path=args.out, chain_label=f"{name} (top-1 per depth, depth {drafter.depth})")
    for r in rows:
        print(f"budget {r['budget']:>5}: tau {r['tree_tau']:.2f}  forwards/token {r['tree_fpt']:.3f}")
    print(f"{name}: tau {rows[0]['chain_tau']:.2f}  forwards/token {rows[0]['chain_fpt']:.3f}")
    print(f"wrote {args.out}")
    return 0


def cmd_figures(args) -> int:
    from .figures import make_all

    _check_out_dir(args.out, "--out")
    paths = make_all(args.out, progress=_progress("figures"))
    print("\n".join(f"wrote {p}" for p in paths))
    return 0


def cmd_tour(args) -> int:
    from .tour import run_tour

    failures = run_tour(print)
    return 1 if failures else 0


def cmd_bench(args) -> int:
    import runpy

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = os.path.join(here, "benchmarks")
    if not os.path.isdir(folder):
        raise CliError("bench: no benchmarks/ folder next to the package (run from a source checkout)")
    names = sorted(f[6:-3] for f in os.listdir(folder) if f.startswith("bench_") and f.endswith(".py"))
    which = names if args.which == "all" else [args.which]
    unknown = [w for w in which if w not in names]
    if unknown:
        raise CliError(f"bench: unknown benchmark {unknown[0]!r}, expected one of {', '.join(names)} or all")
    import kdtree_numba as kd

    if kd.backend.name != "cuda" and not args.quick:
        raise CliError(f"bench: the benchmarks need a GPU (this process runs the {kd.backend.name} backend); "
                       f"--quick runs them as a smoke test at tiny sizes")
    if folder not in sys.path:
        sys.path.insert(0, folder)                  # the scripts import their shared helpers (_common.py)
    for name in which:
        print(f"== bench_{name}.py")
        sys.argv = [f"bench_{name}.py"] + (["--quick"] if args.quick else [])
        runpy.run_path(os.path.join(folder, f"bench_{name}.py"), run_name="__main__")
    return 0


# ------------------------------------------------------------------------------------------------ parser
class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``error: <what>`` (``--help`` shows the usage)."""

    def error(self, message):
        self.exit(2, f"error: {self.prog.split()[-1]}: {message}\n")


def _source_args(p, max_new_tokens: int, none_ok: bool = True, sampled: bool = True) -> None:
    """Options shared by the commands that generate: model, prompt, length, drafter, seed."""
    p.add_argument("--model", metavar="DIR",
                   help="HF checkpoint directory (default: the embedded trained code model)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", metavar="TEXT",
                     help="prompt text, encoded with the model's tokenizer (byte-level models: as UTF-8 bytes); "
                          "to the default model a final newline reads as the end of a file (--task drops it)")
    src.add_argument("--task", metavar="HumanEval/N",
                     help=f"a held-out HumanEval prompt (default: {DEMO_TASK}; its final newline is dropped)")
    src.add_argument("--ids", type=_int_list, metavar="1,2,3", help="prompt token ids, comma-separated")
    p.add_argument("--max-new-tokens", type=_positive_int, default=max_new_tokens,
                   help=f"default {max_new_tokens}")
    kinds = ["dflash", "oracle", "random"] + (["none"] if none_ok else [])
    p.add_argument("--drafter", choices=kinds, default="dflash",
                   help="dflash (the trained DFlash drafter; default), oracle (derived from the target, a test "
                        "stand-in), random" + (", or none (plain decoding)" if none_ok else ""))
    p.add_argument("--drafter-dir", metavar="DIR",
                   help="DFlash drafter directory (default: the embedded drafter; with --model DIR: DIR/drafter)")
    p.add_argument("--noise", type=real(0.0, hi=1e6),
                   help="oracle drafter noise, 0 .. 1e6 (--drafter oracle only; default 0.3)")
    p.add_argument("--depth", type=_positive_int,
                   help="draft depth (--drafter oracle or random only; default 8)")
    p.add_argument("--seed", type=whole(0, 2 ** 64 - 1), default=None,
                   help=("the seed of sampling (--temperature > 0) and " if sampled else "the seed of ")
                   + "the oracle and random drafters (default 0)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kdtree-numba", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog="Backend: set KDTREE_BACKEND=cuda|sim|numpy (default: cuda if a GPU is visible, else numpy).")
    sub = p.add_subparsers(dest="command", metavar="command")

    d = sub.add_parser("demo", help="plain decoding vs the DFlash chain vs DDTree on the embedded trained pair")
    src = d.add_mutually_exclusive_group()
    src.add_argument("--task", metavar="HumanEval/N",
                     help=f"held-out HumanEval prompt to complete (default {DEMO_TASK})")
    src.add_argument("--prompt", metavar="TEXT", help="complete this text instead")
    d.add_argument("--max-new-tokens", type=_positive_int, default=128, help="default 128")
    d.add_argument("--budget", type=_budget, default=DEFAULT_BUDGET,
                   help=f"DDTree tree nodes per round, 0..1024 (default {DEFAULT_BUDGET})")
    d.add_argument("--out", default="kdtree_demo", help="folder for figures, viewer and trace (default kdtree_demo)")
    d.set_defaults(func=cmd_demo)

    g = sub.add_parser("generate", help="generate from the default pair or a checkpoint directory")
    _source_args(g, max_new_tokens=64)
    g.add_argument("--budget", type=_budget,
                   help=f"tree nodes per round, 0..1024 (default {DEFAULT_BUDGET}; not with --chain or --drafter none)")
    g.add_argument("--chain", action="store_true", help="draft a single chain (top-1 per depth) instead of a tree")
    g.add_argument("--temperature", type=_temperature, default=0.0, help="0 = greedy (default)")
    g.add_argument("--stop-at-eos", action="store_true", help=f"stop after the tokenizer's {EOS} token")
    g.add_argument("--trace", metavar="FILE", help="write the generation trace (JSON) here")
    g.add_argument("--replay", action="store_true", help="keep the step / round state on the device and replay it "
                   "from CUDA graphs on a GPU (same tokens; --drafter dflash or none)")
    g.set_defaults(func=cmd_generate)

    t = sub.add_parser("trees", help="tree figures and the HTML viewer from a saved trace",
                       description="Tree figures and the HTML viewer from a saved trace. Tokens are labelled with "
                                   "--model's tokenizer; else with the tokenizer of the model the trace records; "
                                   "else as bytes (--vocab-size 256, or a trace whose ids are all < 256); else "
                                   "with the default model's tokenizer when the ids fit its vocabulary; else as ids.")
    t.add_argument("trace", help="a trace written by `generate --trace` (or the demo's trace.json)")
    t.add_argument("--out", default="kdtree_trees", help="output folder (default kdtree_trees)")
    t.add_argument("--rounds", type=_int_list, help="round indices to draw, 0-based (default: the first 3)")
    lab = t.add_mutually_exclusive_group()
    lab.add_argument("--model", metavar="DIR", help="label tokens with this checkpoint's tokenizer.json")
    lab.add_argument("--vocab-size", type=_positive_int,
                     help="label without a tokenizer: 256 shows bytes as text, other sizes show ids")
    t.set_defaults(func=cmd_trees)

    s = sub.add_parser("sweep", help="budget sweep figure: DDTree vs the chain of the same drafter")
    _source_args(s, max_new_tokens=96, none_ok=False, sampled=False)
    s.add_argument("--budgets", type=_sweep_budgets, default=[1, 2, 4, 8, 16, 32, 64, 128, 256],
                   help="comma-separated (default 1,2,4,8,16,32,64,128,256)")
    s.add_argument("--out", default="budget_sweep.png", help="figure file, .png or .svg (default budget_sweep.png)")
    s.set_defaults(func=cmd_sweep)

    f = sub.add_parser("figures", help="regenerate every figure in figures/ from real runs of the trained pair")
    f.add_argument("--out", default="figures", help="default figures")
    f.set_defaults(func=cmd_figures)

    u = sub.add_parser("tour", help="every stage kernel vs its reference on the active backend")
    u.set_defaults(func=cmd_tour)

    b = sub.add_parser("bench", help="GPU benchmarks (source checkout)")
    b.add_argument("which", nargs="?", default="all",
                   help="a benchmark (benchmarks/bench_<name>.py: kernels, tree, verify, model, e2e, moe, replay, "
                        "round, pair_attention, mma) or all")
    b.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    b.set_defaults(func=cmd_bench)
    return p


def _as_flags(parser, args, message: str) -> str:
    """A library error that opens with an argument's name (``max_new_tokens: ...``) opens with the command's flag
    for it instead (``--max-new-tokens: ...``), when the command has one of that destination."""
    name, sep, rest = message.partition(": ")
    if not sep or not name.isidentifier():
        return message
    for action in parser._actions:                   # the subcommands' parsers
        command = getattr(action, "choices", None)
        if isinstance(command, dict) and args.command in command:
            for option in command[args.command]._actions:
                if option.dest == name and option.option_strings:
                    return f"{max(option.option_strings, key=len)}: {rest}"
    return message


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:          # argparse already printed its one-line usage error (status 2) or --help (0)
        return int(e.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (CliError, ValueError, OSError) as e:
        print("error: " + _as_flags(parser, args, " ".join(str(e).split("\n"))), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
