"""``python -m kdtree_numba.train {corpus,target,drafter,all,card}``: build the corpus, train the target and the drafter.

    corpus  --out DIR [--cache DIR] [--vocab 4096]                 kdtree_numba.train.corpus.build
    target  --data DIR --out DIR [--steps --batch --seq --lr --seed --config-json '{...}' --device auto|cuda|cpu]
    drafter --data DIR --target DIR --out DIR [--steps --batch --anchors --block --layers --target-layers 1,2,3
            --regen N --regen-docstring F --regen-mix M --regen-anchors all|generated --regen-sampled F
            --init DIR --seed ...]
    all     --data DIR --out DIR [...]                             target -> OUT/target, then drafter -> OUT/drafter
    card    [--model-dir DIR --eval FILE --gpu-eval FILE --sampled-eval FILE --sampled-gpu-eval FILE --out FILE]
                                                                   the model card (kdtree_numba.train.card)

Defaults are sized for one H200 inside one 9-minute command (target ~4 min, regeneration <= 1.5 min, drafter
~2.5 min); every run logs its ms/step so the step counts can be adjusted. Runs offline (HF_HUB_OFFLINE=1) and
never prompts. A bad flag prints one line and exits 2; a failure during training raises (exit 1, traceback).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from ..argtypes import OneLineParser, out_dir_problem, real, whole, whole_list

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# defaults mirrored here so that `--help` and flag parsing need no torch import
TARGET = dict(steps=4000, batch=32, seq=512, lr=2e-3, seed=0, val_every=500)
DRAFTER = dict(seq=512, seed=0, steps=3000, batch=32, anchors=64, block=16, layers=2, target_layers="1,2,3", lr=6e-4,
               regen=2048, regen_prompt=64, regen_batch=1024, regen_max_seconds=90.0, regen_docstring=0.0,
               regen_mix=0.5, regen_anchors="all", regen_sampled=0.0, val_every=1000)
TARGET_LAYERS = 5        # DEFAULT_TARGET_CONFIG["num_hidden_layers"]


_positive_int, _nonneg_int = whole(1), whole(0)
_positive_float, _nonneg_float = real(0.0, strict=True), real(0.0)


def _fraction(s: str) -> float:
    """A finite number in [0, 1] (``--regen-docstring``, ``--regen-mix``)."""
    try:
        value = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {s!r}") from None
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {s!r}")
    return value


def _int_list(s: str) -> tuple:
    return tuple(whole_list(0)(s))


def _config_json(s: str) -> dict:
    text = s.strip()
    if not text.startswith("{") and os.path.exists(text):
        with open(text) as f:
            text = f.read()
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not a JSON object nor a readable JSON file ({e.msg})") from None
    if not isinstance(d, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return d


def _common(p):
    p.add_argument("--seq", type=_positive_int, default=TARGET["seq"], help=f"sequence length S (default "
                                                                             f"{TARGET['seq']})")
    p.add_argument("--seed", type=_nonneg_int, default=TARGET["seed"])
    p.add_argument("--device", choices=["cuda", "cpu", "auto"], default="auto")
    p.add_argument("--attn", choices=["auto", "sdpa", "eager"], default="auto",
                   help="transformers attention for the target (auto: A/B on the first batch)")
    p.add_argument("--experts", choices=["auto", "grouped_mm", "batched_mm", "eager"], default="auto",
                   help="transformers MoE experts implementation for the target (auto: A/B on the first batch)")
    p.add_argument("--log-every", type=_positive_int, default=50)
    p.add_argument("--print-every", type=_positive_int, default=200)
    p.add_argument("--val-windows", type=_positive_int, default=64, help="validation windows (default 64)")


def _target_flags(p, prefix=""):
    p.add_argument(f"--{prefix}steps", type=_positive_int, default=TARGET["steps"],
                   help=f"target AdamW steps (default {TARGET['steps']})")
    p.add_argument(f"--{prefix}batch", type=_positive_int, default=TARGET["batch"])
    p.add_argument(f"--{prefix}lr", type=_positive_float, default=TARGET["lr"])
    p.add_argument(f"--{prefix}val-every", type=_positive_int, default=TARGET["val_every"])
    p.add_argument("--config-json", type=_config_json, default=None,
                   help="target config overrides: a JSON object or a file holding one")


def _drafter_flags(p, prefix=""):
    p.add_argument(f"--{prefix}steps", type=_positive_int, default=DRAFTER["steps"],
                   help=f"drafter AdamW steps (default {DRAFTER['steps']})")
    p.add_argument(f"--{prefix}batch", type=_positive_int, default=DRAFTER["batch"])
    p.add_argument(f"--{prefix}lr", type=_positive_float, default=DRAFTER["lr"])
    p.add_argument(f"--{prefix}val-every", type=_positive_int, default=DRAFTER["val_every"])
    p.add_argument("--anchors", type=_positive_int, default=DRAFTER["anchors"], help="anchors per sequence")
    p.add_argument("--block", type=_positive_int, default=DRAFTER["block"], help="block size (default 16)")
    p.add_argument("--layers", type=_positive_int, default=DRAFTER["layers"], help="drafter layers")
    p.add_argument("--target-layers", type=_int_list, default=_int_list(DRAFTER["target_layers"]),
                   help="target layers whose outputs feed the drafter (default 1,2,3)")
    p.add_argument("--gamma", type=_positive_float, default=None, help="loss decay (default 7 for block 16)")
    p.add_argument("--heads", type=_positive_int, default=8)
    p.add_argument("--kv-heads", type=_positive_int, default=4)
    p.add_argument("--head-dim", type=_positive_int, default=32)
    p.add_argument("--intermediate", type=_positive_int, default=768)
    p.add_argument("--regen", type=_nonneg_int, default=DRAFTER["regen"],
                   help=f"prompts the target continues greedily for training text (default {DRAFTER['regen']})")
    p.add_argument("--regen-prompt", type=_positive_int, default=None,
                   help=f"tokens of each regeneration prompt (default {DRAFTER['regen_prompt']})")
    p.add_argument("--regen-batch", type=_positive_int, default=None,
                   help=f"prompts per generate call (default {DRAFTER['regen_batch']})")
    p.add_argument("--regen-max-seconds", type=_nonneg_float, default=None,
                   help=f"start no regeneration batch past this projected time (0: no cap; default "
                        f"{DRAFTER['regen_max_seconds']:g})")
    p.add_argument("--regen-docstring", type=_fraction, default=DRAFTER["regen_docstring"], metavar="F",
                   help="fraction of the regeneration prompts (train and held-out alike) that end like a HumanEval "
                        "prompt: right after a def's docstring, closing quotes + one '\\n' token (default 0: all "
                        "random windows)")
    p.add_argument("--regen-mix", type=_fraction, default=None, metavar="M",
                   help=f"fraction of each training batch drawn from the regenerated text, the rest corpus windows "
                        f"(default {DRAFTER['regen_mix']})")
    p.add_argument("--regen-anchors", choices=("all", "generated"), default=None,
                   help="where a regenerated sequence's blocks may start: all positions, its prompt included "
                        "(default), or the generated part only (every label the target's own greedy text, as at "
                        "decode time)")
    p.add_argument("--regen-sampled", type=_fraction, default=DRAFTER["regen_sampled"], metavar="F",
                   help="fraction of the regeneration prompts (train and held-out alike) continued by sampling from "
                        "the target (temperature 1) instead of greedily: text like decoding at T > 0 writes "
                        "(default 0: all greedy)")


def build_parser() -> OneLineParser:
    ap = OneLineParser(prog="python -m kdtree_numba.train",
                       description="Build the corpus, train the DeepSeek-V3 target and the DFlash drafter.")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{corpus,target,drafter,all,card}")

    p = sub.add_parser("corpus", help="build the corpus (tokens.npy, tokenizer.json, heldout.jsonl, manifest)")
    p.add_argument("--out", required=True)
    p.add_argument("--cache", default=None, help="wheel cache directory")
    p.add_argument("--vocab", type=whole(259, 65536), default=4096,
                   help="BPE vocabulary: 256 bytes + 3 special tokens at least, 65536 at most (default 4096)")

    p = sub.add_parser("target", help="train the target (DeepseekV3ForCausalLM)")
    p.add_argument("--data", required=True, help="corpus directory (tokens.npy)")
    p.add_argument("--out", required=True)
    _target_flags(p)
    _common(p)

    p = sub.add_parser("drafter", help="train the DFlash drafter on a trained target")
    p.add_argument("--data", required=True, help="corpus directory (tokens.npy)")
    p.add_argument("--target", required=True, help="trained target directory")
    p.add_argument("--out", required=True)
    p.add_argument("--init", default=None, metavar="DIR",
                   help="start from this drafter's weights (a directory an earlier run wrote, same architecture) "
                        "instead of random ones")
    _drafter_flags(p)
    _common(p)

    p = sub.add_parser("all", help="target into OUT/target, then drafter into OUT/drafter")
    p.add_argument("--data", required=True, help="corpus directory (tokens.npy)")
    p.add_argument("--out", required=True)
    _target_flags(p, "target-")
    _drafter_flags(p, "drafter-")
    _common(p)

    from . import card
    card.add_arguments(sub.add_parser("card", help="write default_model/MODEL_CARD.md from the logs, eval and files"))
    return ap


def _check_data(ap, path):
    if not os.path.isfile(os.path.join(path, "tokens.npy")):
        ap.error(f"--data {path}: no tokens.npy there (build it with the corpus subcommand)")


def _check_target_config(ap, a):
    """The target the run would train, before any training: --config-json's fields known to DeepseekV3Config,
    its values as the engine reads them (TargetConfig), positions for --seq tokens and a vocabulary that holds the
    corpus's ids. One line and exit 2 for each - they used to train (a -1-layer model, a typo'd field written into
    config.json) or raise tracebacks minutes in."""
    import inspect

    import transformers

    from ..config import TargetConfig
    from .target_train import DEFAULT_TARGET_CONFIG, TokenData, target_config_dict

    over = a.config_json or {}
    known = set(inspect.signature(transformers.DeepseekV3Config.__init__).parameters) | set(DEFAULT_TARGET_CONFIG)
    unknown = sorted(set(over) - known - {"self", "kwargs"})
    if unknown:
        ap.error(f"--config-json: unknown field {unknown[0]!r} (not a DeepseekV3Config field)")
    try:
        cfg = TargetConfig.from_dict({"model_type": "deepseek_v3", **target_config_dict(over)}, source="--config-json")
        if cfg.max_position_embeddings < a.seq:
            raise ValueError(f"--config-json: max_position_embeddings {cfg.max_position_embeddings} < --seq {a.seq} "
                             f"(a training window needs a position per token)")
    except ValueError as e:
        ap.error(str(e))
    try:
        TokenData(a.data).check_vocab(cfg.vocab_size)
    except ValueError as e:
        ap.error(f"--config-json: vocab_size {cfg.vocab_size} does not hold the corpus ({e})")


def _common_kw(a) -> dict:
    return dict(seed=a.seed, device=a.device, attn=a.attn, experts=a.experts, log_every=a.log_every,
                print_every=a.print_every, val_windows=a.val_windows, seq=a.seq)


def _target_kw(a, prefix="") -> dict:
    g = lambda k: getattr(a, prefix + k)  # noqa: E731
    return dict(steps=g("steps"), batch=g("batch"), lr=g("lr"), val_every=g("val_every"),
                config_overrides=a.config_json, **_common_kw(a))


def _drafter_kw(a, prefix="") -> dict:
    g = lambda k: getattr(a, prefix + k)  # noqa: E731
    return dict(steps=g("steps"), batch=g("batch"), lr=g("lr"), val_every=g("val_every"), anchors=a.anchors,
                block=a.block, layers=a.layers, target_layers=a.target_layers, gamma=a.gamma, heads=a.heads,
                kv_heads=a.kv_heads, head_dim=a.head_dim, intermediate=a.intermediate, regen=a.regen,
                regen_prompt=a.regen_prompt, regen_batch=a.regen_batch, regen_max_seconds=a.regen_max_seconds,
                regen_docstring=a.regen_docstring,
                regen_mix=DRAFTER["regen_mix"] if a.regen_mix is None else a.regen_mix,
                regen_anchors=a.regen_anchors or DRAFTER["regen_anchors"], regen_sampled=a.regen_sampled,
                init=getattr(a, "init", None), **_common_kw(a))


def _check_drafter(ap, a):
    shaping = [(k, getattr(a, k)) for k in ("regen_prompt", "regen_batch", "regen_max_seconds")
               if getattr(a, k) is not None] + ([("regen_docstring", a.regen_docstring)] if a.regen_docstring else [])
    if shaping and not a.regen:                          # flags that shape regenerated text, without any
        key, value = shaping[0]
        ap.error(f"--{key.replace('_', '-')} {value:g}: there is no regenerated text (--regen 0)")
    for key in ("regen_prompt", "regen_batch", "regen_max_seconds"):
        if getattr(a, key) is None:
            setattr(a, key, DRAFTER[key])
    if a.block < 2:
        ap.error(f"--block {a.block}: must be at least 2")
    if a.anchors > a.seq - a.block:
        ap.error(f"--anchors {a.anchors}: at most --seq - --block = {a.seq - a.block}")
    if a.regen and a.regen_prompt >= a.seq:
        ap.error(f"--regen-prompt {a.regen_prompt}: must be shorter than --seq {a.seq}")
    if a.regen_mix is not None and not a.regen:
        ap.error(f"--regen-mix {a.regen_mix:g}: there is no regenerated text to mix in (--regen 0)")
    if a.regen_anchors is not None and not a.regen:
        ap.error(f"--regen-anchors {a.regen_anchors}: there is no regenerated text (--regen 0)")
    if a.regen_sampled and not a.regen:
        ap.error(f"--regen-sampled {a.regen_sampled:g}: there is no regenerated text to sample (--regen 0)")
    if a.regen_mix is not None or a.regen_anchors is not None:
        from .drafter_train import check_regen_anchors, check_regen_mix

        try:
            if a.regen_mix is not None:
                check_regen_mix(a.regen, a.regen_mix)
            if a.regen_anchors is not None:
                check_regen_anchors(a.regen_anchors, a.regen, a.regen_prompt, a.seq, a.block, a.anchors)
        except ValueError as e:
            ap.error(str(e))
    if a.heads % a.kv_heads:
        ap.error(f"--heads {a.heads} is not a multiple of --kv-heads {a.kv_heads}")
    if a.head_dim % 2:
        ap.error(f"--head-dim {a.head_dim}: must be even (rope)")
    if a.cmd == "all":
        n_layers = (a.config_json or {}).get("num_hidden_layers", TARGET_LAYERS)
    else:
        try:
            with open(os.path.join(a.target, "config.json")) as f:
                n_layers = json.load(f)["num_hidden_layers"]
        except (OSError, ValueError, KeyError):
            ap.error(f"--target {a.target}: no readable config.json with num_hidden_layers (train the target first)")
        if a.init is not None:
            _check_init(ap, a)
    bad = [k for k in a.target_layers if k > n_layers - 2]
    if bad:
        ap.error(f"--target-layers {','.join(map(str, a.target_layers))}: layer {bad[0]} outside [0, {n_layers - 2}] "
                 f"(a {n_layers}-layer target; its last layer's HF hidden state is post-norm)")
    _check_docstring_sites(ap, a)


def _check_init(ap, a):
    """--init DIR: a drafter directory of exactly the architecture the flags ask for on --target, checked before the
    target loads (a mismatch found after the regeneration would cost minutes)."""
    from types import SimpleNamespace

    from .drafter_train import drafter_config, load_init

    try:
        with open(os.path.join(a.target, "config.json")) as f:
            tc = json.load(f)
        cfg = drafter_config(SimpleNamespace(**tc), a.layers, a.heads, a.kv_heads, a.head_dim, a.intermediate,
                             a.block, a.target_layers)
        load_init(a.init, cfg, weights=False)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        ap.error(str(e) if isinstance(e, ValueError) else f"--init {a.init}: {e}")


def _check_docstring_sites(ap, a):
    """--regen-docstring F: enough docstring sites in both splits, checked before any training (``all`` trains the
    target first). The same sampled search as train_drafter's, on a throwaway Generator (so ~0.3 s, not a scan)."""
    if not (a.regen and a.regen_docstring):
        return
    import numpy as np

    from . import docstring_prompts as dsp
    from .drafter_train import val_regen_count
    from .target_train import TokenData

    F = a.regen_docstring
    try:
        data = TokenData(a.data)
        tok = dsp.load_tokenizer(a.data, getattr(a, "target", None))
        dsp.docstring_prompts(data.train, data.val, tok, np.random.default_rng(a.seed), dsp.count_for(F, a.regen),
                              dsp.count_for(F, val_regen_count(a.regen)), a.regen_prompt, F)
    except (ValueError, FileNotFoundError) as e:
        ap.error(str(e))


def main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    if a.cmd == "card":
        from . import card

        return card.run(a)
    problem = out_dir_problem(a.out) if a.cmd in ("corpus", "target", "drafter", "all") else None
    if problem:                                          # before any work (training runs take minutes)
        ap.error(f"--out: {problem}")
    if a.cmd == "corpus":
        from . import corpus

        manifest = corpus.build(a.out, cache_dir=a.cache, vocab_size=a.vocab)
        print(json.dumps({k: v for k, v in manifest.items() if not isinstance(v, (list, dict))}, indent=1),
              flush=True)
        return 0
    _check_data(ap, a.data)
    if a.cmd in ("target", "all"):
        _check_target_config(ap, a)
    if a.cmd in ("drafter", "all"):
        _check_drafter(ap, a)
    if a.cmd == "target":
        from .target_train import train_target

        train_target(a.data, a.out, **_target_kw(a))
    elif a.cmd == "drafter":
        from .drafter_train import train_drafter

        train_drafter(a.data, a.target, a.out, **_drafter_kw(a))
    else:
        from .drafter_train import train_drafter
        from .target_train import train_target, write_json

        tdir, ddir = os.path.join(a.out, "target"), os.path.join(a.out, "drafter")
        trec = train_target(a.data, tdir, **_target_kw(a, "target_"))
        t_target = time.perf_counter() - t0
        drec = train_drafter(a.data, tdir, ddir, **_drafter_kw(a, "drafter_"))
        total = time.perf_counter() - t0
        summary = {"total_seconds": total, "target_seconds": t_target, "drafter_seconds": total - t_target,
                   "target": {"ms_per_step": trec["ms_per_step"], "val": trec["val"][-1],
                              "implementation": {k: trec["implementation"][k] for k in ("attn", "experts")}},
                   "drafter": {"ms_per_step": drec["ms_per_step"], "val": drec["val"][-1],
                               "regen_seconds": drec["regen"].get("seconds")}}
        write_json(os.path.join(a.out, "run_summary.json"), summary)
        print(f"[all] done in {total:.1f}s (target {t_target:.1f}s, drafter {total - t_target:.1f}s) -> {a.out}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
