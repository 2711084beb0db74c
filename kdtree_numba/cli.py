"""Command line: ``python -m kdtree_numba <command>`` (also installed as ``kdtree-numba``).

    demo      the main job: DDTree vs plain decoding on the embedded default model, stats, figures, HTML viewer
    generate  generate from a checkpoint directory (or the default model); text (byte-level vocab) or ids
    trees     tree figures and the HTML viewer from a saved trace (``generate --trace out.json``)
    sweep     budget sweep figure (mean accepted length and target forwards per token vs budget)
    figures   regenerate every figure in figures/ from real runs
    tour      run every stage kernel on the active backend and print its max error against the reference
    bench     run the GPU benchmarks of a source checkout (benchmarks/bench_*.py)
Errors print one line and exit with status 2.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

DEFAULT_PROMPT = "DDTree drafts a whole tree of continuations, then the target checks them all at once. "


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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None


def _load(path: str | None):
    from .model import presets

    if path is None:
        return presets.default_target()
    from . import load_target

    if not os.path.isdir(path):
        raise CliError(f"--model: {path} is not a directory (expected an HF checkpoint directory)")
    return load_target(path)


def _prompt_ids(target, text: str | None, ids: list[int] | None) -> list[int]:
    if ids is not None:
        if not ids:
            raise CliError("--ids: expected at least one token id")
        bad = [i for i in ids if not 0 <= i < target.config.vocab_size]
        if bad:
            raise CliError(f"--ids: token id {bad[0]} is outside the vocabulary [0, {target.config.vocab_size})")
        return ids
    if target.config.vocab_size != 256:
        raise CliError(f"--prompt: text prompts need a byte-level (256-token) vocabulary; this model has "
                       f"{target.config.vocab_size} tokens, pass --ids instead")
    data = (text if text is not None else DEFAULT_PROMPT).encode()
    if not data:
        raise CliError("--prompt: expected a non-empty prompt")
    return list(data)


def _drafter(target, kind: str, noise: float, depth: int, seed: int):
    from . import OracleDrafter, RandomDrafter

    if kind == "none":
        return None
    if kind == "random":
        return RandomDrafter(target.config.vocab_size, depth, seed)
    return OracleDrafter(target, noise=noise, seed=seed, depth=depth)


def _show_text(target, tokens) -> str:
    from .viz import text_of

    return text_of(tokens, target.config.vocab_size)


# ------------------------------------------------------------------------------------------------ commands
def cmd_demo(args) -> int:
    import kdtree_numba as kd
    from . import viz
    from .model import presets

    target = presets.default_target()
    prompt = _prompt_ids(target, args.prompt, None)
    print(f"kdtree_numba demo  backend={kd.backend.name}  model: {presets.describe(target)}")
    print(f"prompt: {args.prompt or DEFAULT_PROMPT!r}")
    ar = kd.generate(target, prompt, args.max_new_tokens)
    drafter = presets.default_drafter(target, noise=args.noise, depth=args.depth)
    dd = kd.generate(target, prompt, args.max_new_tokens, drafter=drafter, budget=args.budget,
                     progress=_progress("DDTree"))
    same = ar.tokens == dd.tokens
    print(f"\noutput: {_show_text(target, dd.tokens)!r}")
    print(f"DDTree output == plain greedy decoding: {'yes' if same else 'NO'}\n")
    target_ms = sum(v for k, v in dd.stage_totals().items() if k != "draft")
    rows = [("", "autoregressive", f"DDTree (budget {args.budget})"),
            ("new tokens", f"{len(ar.tokens)}", f"{len(dd.tokens)}"),
            ("target forwards", f"{ar.target_forwards}", f"{dd.target_forwards}"),
            ("target forwards / token", f"{ar.forwards_per_token:.3f}", f"{dd.forwards_per_token:.3f}"),
            ("acceptance length tau", "1.00", f"{dd.acceptance_length:.2f}"),
            ("tokens/s (all stages)", f"{ar.tokens_per_second:.0f}", f"{dd.tokens_per_second:.0f}"),
            ("tokens/s (target side)", f"{ar.tokens_per_second:.0f}",
             f"{len(dd.tokens) / max(target_ms / 1e3, 1e-9):.0f}")]
    for r in rows:
        print(f"  {r[0]:<26}{r[1]:>16}{r[2]:>22}")
    print(f"\nspeedup in target forwards: {ar.target_forwards / dd.target_forwards:.2f}x")
    print("(the oracle drafter runs the target itself, so wall-clock numbers here say little about DDTree;\n"
          " GPU measurements are in docs/PERFORMANCE.md)")
    totals = dd.stage_totals()
    print("stage time (ms): " + "  ".join(f"{k} {v:.1f}" for k, v in totals.items()))
    os.makedirs(args.out, exist_ok=True)
    viz.plot_rounds(dd, vocab_size=target.config.vocab_size, n=3, path=os.path.join(args.out, "rounds.png"))
    viz.acceptance_histogram(dd, path=os.path.join(args.out, "acceptance.png"))
    viz.write_html(dd, os.path.join(args.out, "viewer.html"), vocab_size=target.config.vocab_size)
    dd.to_json(os.path.join(args.out, "trace.json"))
    print(f"\nwrote {args.out}/rounds.png, acceptance.png, viewer.html (open in a browser), trace.json")
    return 0 if same else 1


def cmd_generate(args) -> int:
    import kdtree_numba as kd

    target = _load(args.model)
    prompt = _prompt_ids(target, args.prompt, args.ids)
    drafter = _drafter(target, args.drafter, args.noise, args.depth, args.seed)
    res = kd.generate(target, prompt, args.max_new_tokens, drafter=drafter, budget=args.budget,
                      temperature=args.temperature, seed=args.seed,
                      progress=_progress("generate") if drafter is not None else None)
    if target.config.vocab_size == 256 and args.ids is None:
        print(_show_text(target, res.tokens))
    else:
        print(" ".join(str(t) for t in res.tokens))
    tau = f"  tau {res.acceptance_length:.2f}" if res.rounds else ""
    print(f"[{len(res.tokens)} tokens, {res.target_forwards} target forwards, "
          f"{res.tokens_per_second:.1f} tokens/s{tau}]", file=sys.stderr)
    if args.trace:
        res.to_json(args.trace)
        print(f"[trace written to {args.trace}]", file=sys.stderr)
    return 0


def cmd_trees(args) -> int:
    from . import Generation, viz

    if not os.path.isfile(args.trace):
        raise CliError(f"trace: {args.trace} does not exist")
    try:
        gen = Generation.from_json(args.trace)
    except (ValueError, OSError) as e:
        raise CliError(str(e)) from None
    if not gen.rounds:
        raise CliError(f"trace: {args.trace} has no DDTree rounds (an autoregressive run?)")
    rounds = args.rounds if args.rounds is not None else list(range(min(3, len(gen.rounds))))
    bad = [r for r in rounds if not 0 <= r < len(gen.rounds)]
    if bad:
        raise CliError(f"--rounds: round {bad[0]} outside [0, {len(gen.rounds)})")
    os.makedirs(args.out, exist_ok=True)
    V = args.vocab_size
    for r in rounds:
        viz.plot_tree(gen.rounds[r], vocab_size=V, path=os.path.join(args.out, f"round{r:03d}.png"))
    viz.plot_rounds([gen.rounds[r] for r in rounds], vocab_size=V, n=len(rounds),
                    path=os.path.join(args.out, "rounds.png"))
    viz.acceptance_histogram(gen, path=os.path.join(args.out, "acceptance.png"))
    viz.tree_shape(gen, path=os.path.join(args.out, "tree_shape.png"))
    viz.stage_times(gen, path=os.path.join(args.out, "stage_times.png"))
    viz.write_html(gen, os.path.join(args.out, "viewer.html"), vocab_size=V)
    print(f"wrote {len(rounds)} round figures, rounds/acceptance/tree_shape/stage_times.png and viewer.html "
          f"to {args.out}")
    return 0


def cmd_sweep(args) -> int:
    from . import viz

    target = _load(args.model)
    prompt = _prompt_ids(target, args.prompt, args.ids)
    rows = viz.sweep_rows(target, lambda: _drafter(target, "oracle", args.noise, args.depth, args.seed), prompt,
                          args.budgets, args.max_new_tokens)
    viz.budget_sweep(rows, path=args.out)
    for r in rows:
        print(f"budget {r['budget']:>5}: tau {r['tree_tau']:.2f}  forwards/token {r['tree_fpt']:.3f}   "
              f"(chain: tau {r['chain_tau']:.2f})")
    print(f"wrote {args.out}")
    return 0


def cmd_figures(args) -> int:
    from .figures import make_all

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


def _source_args(p, max_new_tokens: int) -> None:
    """Options shared by the commands that generate: model, prompt, length, oracle drafter settings, seed."""
    p.add_argument("--model", help="HF checkpoint directory (default: the embedded default model)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text (byte-level vocabularies)")
    src.add_argument("--ids", type=_int_list, help="prompt token ids, comma-separated")
    p.add_argument("--max-new-tokens", type=_positive_int, default=max_new_tokens)
    p.add_argument("--noise", type=float, default=0.3, help="oracle drafter noise (default 0.3)")
    p.add_argument("--depth", type=_positive_int, default=8, help="draft depth L (default 8)")
    p.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kdtree-numba", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Backend: set KDTREE_BACKEND=cuda|sim|numpy (default: cuda if a GPU is "
                                       "visible, else numpy).")
    sub = p.add_subparsers(dest="command", metavar="command")

    d = sub.add_parser("demo", help="DDTree vs plain decoding on the embedded default model")
    d.add_argument("--prompt", help="prompt text (default: a sentence about DDTree)")
    d.add_argument("--max-new-tokens", type=_positive_int, default=128)
    d.add_argument("--budget", type=int, default=64, help="tree nodes per round (default 64)")
    d.add_argument("--depth", type=_positive_int, default=8, help="draft depth L (default 8)")
    d.add_argument("--noise", type=float, default=0.3, help="oracle drafter noise (default 0.3)")
    d.add_argument("--out", default="kdtree_demo", help="folder for figures and the viewer (default kdtree_demo)")
    d.set_defaults(func=cmd_demo)

    g = sub.add_parser("generate", help="generate from a checkpoint (or the default model)")
    _source_args(g, max_new_tokens=64)
    g.add_argument("--budget", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--drafter", choices=["oracle", "random", "none"], default="oracle",
                   help="oracle (from the target, --noise), random, or none (plain decoding)")
    g.add_argument("--trace", help="write the generation trace (JSON) here")
    g.set_defaults(func=cmd_generate)

    t = sub.add_parser("trees", help="tree figures and the HTML viewer from a saved trace")
    t.add_argument("trace", help="a trace written by `generate --trace`")
    t.add_argument("--out", default="kdtree_trees")
    t.add_argument("--rounds", type=_int_list, help="round indices to draw (default: the first 3)")
    t.add_argument("--vocab-size", type=_positive_int, default=256, help="256 shows bytes as text")
    t.set_defaults(func=cmd_trees)

    s = sub.add_parser("sweep", help="budget sweep figure")
    _source_args(s, max_new_tokens=96)
    s.add_argument("--budgets", type=_int_list, default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    s.add_argument("--out", default="budget_sweep.png")
    s.set_defaults(func=cmd_sweep)

    f = sub.add_parser("figures", help="regenerate every figure in figures/")
    f.add_argument("--out", default="figures")
    f.set_defaults(func=cmd_figures)

    u = sub.add_parser("tour", help="every stage kernel vs its reference on the active backend")
    u.set_defaults(func=cmd_tour)

    b = sub.add_parser("bench", help="GPU benchmarks (source checkout)")
    b.add_argument("which", nargs="?", default="all", help="kernels, tree, verify, model, e2e or all")
    b.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    b.set_defaults(func=cmd_bench)
    return p


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
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
