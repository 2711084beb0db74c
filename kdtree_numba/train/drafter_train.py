"""Train the DFlash drafter on a frozen trained target (the `train` extra; torch).

What: ``dflash_torch.DFlashDraftModel`` learns to predict the next ``block_size - 1`` tokens of the TARGET's own
text from the target's hidden features, SpecForge's "anchored block" recipe:

    text      each batch of Bt sequences (S = 512 tokens) is round(M Bt) sequences of TARGET-REGENERATED text
              and the rest corpus windows (train split, random offsets), M = ``--regen-mix`` (default 0.5; all
              corpus windows when there is no regenerated text): ``--regen N`` prompts of ``--regen-prompt`` (64)
              tokens from the corpus train split, continued greedily by the target for S - 64 tokens (HF ``generate``,
              do_sample=False, use_cache=True, eos_token_id=None, min_new_tokens = max_new_tokens, in equal
              batches of at most ``--regen-batch`` = 1024), so the drafter learns the target's own greedy
              behaviour (what DFlash does).
              ``--regen-sampled F`` (default 0) continues round(F N) of the train prompts and round(F Nv) of the
              held-out ones by SAMPLING from the target's distribution (temperature 1, no top-k / top-p) instead:
              text like what decoding at T > 0 writes, whose labels teach the drafter the target's probabilities,
              not only its argmax. One ``generate`` call serves both kinds (``RowSampler``: a greedy row's logits
              become one-hot at their argmax, so its sample is the greedy token); the rows are drawn at random
              (train) and the held-out sampled ones are also evaluated on their own ("regen_sampled"). torch's
              generator is seeded with --seed: reproducible on the same device and software.
              A further max(4, min(64, N/32)) prompts from the VALIDATION split are continued the same way and held
              out. ``--regen-max-seconds`` (90) stops starting new batches once the projected time would pass it
              (logged; 0 = never).
              ``--regen-docstring F`` (default 0: all prompts random windows) makes round(F N) of the train prompts
              and round(F Nv) of the validation ones end like a HumanEval prompt: at a uniformly sampled site of
              their split where a ``def`` signature is followed directly by its docstring, the prompt cut right
              after the docstring's closing quotes token and given one bare "\n" token
              (``docstring_prompts.py``); the train prompts are then shuffled together, and the held-out
              docstring ones are also evaluated on their own ("regen_docstring"). Too few valid sites -> ValueError
              before the target is loaded.
    features  frozen target, no grad, bf16 autocast: feat = concat_k hs[k + 1] for k in --target-layers
              (forward hooks on decoder layer k = HF output_hidden_states[k + 1])           [Bt, S, nF*H]
    anchors   A per sequence (64), without replacement, uniform in [1, S - bs]; block a = [x_a, MASK x (bs-1)]
              at positions a .. a+bs-1, seeing context features j < a and its own block only.
              ``--regen-anchors generated``: a regenerated sequence's anchors only in [P, S - bs] (P =
              --regen-prompt), so that the root and all bs-1 labels are the target's own greedy tokens, as in
              every decode round; its prompt positions (corpus text, not what the target writes) give no block
    loss      sum_k w_k CE(x_{a+k}) / sum_k w_k, w_k = exp(-(k-1)/gamma), gamma 7 (bs 16) / 4 (bs 8)
    init      random (normal, std 0.02), or ``--init DIR``: the weights of a drafter saved by an earlier run
              (config.json + model.safetensors of exactly this architecture), trained further - e.g. on new
              regenerated text (another ``--seed``); the log records the starting drafter's weights sha256 and
              its own log's arguments, so the card can give the whole chain of commands
    optimiser AdamW lr 6e-4, betas 0.9/0.95, wd 0.01 on matrices, warmup 4 %, cosine to 10 %, clip 1.0, bf16
              autocast on CUDA, exactly --steps steps (a fresh optimiser and schedule also with --init)
    metrics   per-position top-1 accuracy and the greedy-chain acceptance length 1 + sum_k prod_{j<=k} correct_j,
              on held-out corpus windows and held-out regenerated text, every --val-every steps and at the end
    output    OUT/config.json + OUT/model.safetensors (bf16), OUT/drafter_train_log.json, OUT/tokenizer.json

Reproduce::

    python -m kdtree_numba.train drafter --data CORPUS_DIR --target OUT/target --out OUT/drafter   # H200 ~4 min
    # then, e.g., on new regenerated text from that drafter's weights:
    python -m kdtree_numba.train drafter --data CORPUS_DIR --target OUT/target --out OUT/drafter2 \
        --init OUT/drafter --seed 1 --regen-mix 1.0 --regen-anchors generated
"""
from __future__ import annotations

import json
import math
import os
import shutil
import time

import numpy as np
import torch

from . import dflash_torch as dfl
from . import docstring_prompts as dsp
from . import target_train as tt
from .hashes import sha256_file

DEFAULTS = dict(steps=3000, batch=32, seq=512, anchors=64, block=16, layers=2, target_layers=(1, 2, 3), lr=6e-4,
                seed=0, weight_decay=0.01, warmup_frac=0.04, final_lr_frac=0.1, grad_clip=1.0, regen=2048,
                regen_prompt=64, regen_batch=1024, regen_max_seconds=90.0, regen_docstring=0.0, regen_mix=0.5,
                regen_anchors="all", regen_sampled=0.0, log_every=50, val_every=1000, print_every=200, val_windows=64,
                heads=8, kv_heads=4, head_dim=32, intermediate=768)
REGEN_ANCHORS = ("all", "generated")     # --regen-anchors: where a regenerated sequence's blocks may start
log = tt.log


# ------------------------------------------------------------------------------------------------ target side
def load_frozen_target(target_dir: str, device: torch.device):
    """The trained HF target in float32 on ``device``, eval mode, every parameter frozen."""
    import transformers

    if not os.path.exists(os.path.join(target_dir, "config.json")):
        raise FileNotFoundError(f"{target_dir}: no config.json (train the target first)")
    try:
        model = transformers.DeepseekV3ForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    except TypeError:
        model = transformers.DeepseekV3ForCausalLM.from_pretrained(target_dir, torch_dtype=torch.float32)
    model = model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class TargetFeatures:
    """Captures the residual stream after decoder layers ``layer_ids`` with forward hooks.

    ``__call__(ids [Bt, S])`` -> [Bt, S, nF*H] = concat_k output of model.model.layers[k] = HF
    ``output_hidden_states[k + 1]`` (pre-final-norm for every k < num_hidden_layers - 1).
    """

    def __init__(self, model, layer_ids):
        self.model = model
        self.layer_ids = tuple(int(k) for k in layer_ids)
        L = model.config.num_hidden_layers
        bad = [k for k in self.layer_ids if not 0 <= k < L - 1]
        if bad:
            raise ValueError(f"target layer ids {list(self.layer_ids)}: each must be in [0, {L - 2}]")
        self._out = {}
        self._hooks = [model.model.layers[k].register_forward_hook(self._hook(k)) for k in self.layer_ids]

    def _hook(self, k):
        def fn(module, inputs, output):
            self._out[k] = output[0] if isinstance(output, tuple) else output
        return fn

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        self._out.clear()
        self.model.model(input_ids=ids, use_cache=False)
        feat = torch.cat([self._out[k] for k in self.layer_ids], dim=-1)                # [Bt, S, nF*H]
        self._out.clear()
        return feat

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []


class RowSampler:
    """A ``generate`` logits processor for a batch of greedy and sampled rows: row i keeps its logits where
    ``sampled[i]``, else every logit but the row's argmax (torch.argmax: the first maximum, as greedy search takes)
    becomes -inf, so sampling that row returns its greedy token. ``sampled`` [b] bool on the scores' device.
    Example: scores [[1, 3, 2], [1, 3, 2]], sampled [False, True] -> [[-inf, 3, -inf], [1, 3, 2]]."""

    def __init__(self, sampled: torch.Tensor):
        self.sampled = sampled

    def __call__(self, input_ids, scores):
        top = scores.argmax(-1, keepdim=True)                                           # [b, 1]
        one_hot = torch.full_like(scores, -math.inf).scatter(-1, top, scores.gather(-1, top))
        return torch.where(self.sampled[:, None], scores, one_hot)                      # [b, V]


def regenerate(model, prompts: np.ndarray, new_tokens: int, batch: int, device: torch.device,
               max_seconds: float = 0.0, keep_first: int = 0, sampled: np.ndarray | None = None,
               seed: int = 0) -> tuple[np.ndarray, dict]:
    """Target continuations of ``prompts [N, P]``: returns ([N', P + new_tokens] int64, info).

    Greedy, or - for the rows where ``sampled [N]`` (bool) is set - sampled from the target's distribution
    (temperature 1, no top-k / top-p; ``RowSampler``; torch seeded with ``seed`` first). Equal batches of at most
    ``batch`` prompts through HF ``generate`` (use_cache=True, eos_token_id=None, min_new_tokens =
    max_new_tokens, so every row has the same length and EOS is never suppressed) under bf16 autocast on CUDA;
    without sampled rows, do_sample=False (the runs before ``sampled`` existed, exactly). With
    ``max_seconds`` > 0 no new batch starts once the projected end would pass it; the first ``keep_first`` rows
    (the validation prompts) are always generated.
    """
    import transformers

    N, P = prompts.shape
    any_sampled = sampled is not None and bool(np.any(sampled))
    extra = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if any_sampled else dict(do_sample=False)
    gen_cfg = transformers.GenerationConfig(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, use_cache=True,
        eos_token_id=None, pad_token_id=model.config.pad_token_id, bos_token_id=model.config.bos_token_id, **extra)
    if any_sampled:
        torch.manual_seed(seed)
    saved_eos = getattr(model.generation_config, "eos_token_id", None)
    model.generation_config.eos_token_id = None
    out, t0, capped = [], time.perf_counter(), False
    per_batch = 0.0
    batch = -(-N // -(-N // batch)) if N else batch       # equal chunks of at most ``batch`` rows
    try:
        for i in range(0, N, batch):
            elapsed = time.perf_counter() - t0
            if max_seconds and i >= keep_first and i > 0 and elapsed + per_batch > max_seconds:
                capped = True
                log(f"[regen] WARNING: stopping at {i} of {N} sequences after {elapsed:.1f}s "
                    f"(--regen-max-seconds {max_seconds:g})")
                break
            tb = time.perf_counter()
            x = torch.from_numpy(np.ascontiguousarray(prompts[i:i + batch])).to(device)  # [b, P]
            kw = {}
            if any_sampled:
                rows = torch.from_numpy(np.ascontiguousarray(sampled[i:i + batch], bool)).to(device)   # [b]
                kw["logits_processor"] = transformers.LogitsProcessorList([RowSampler(rows)])
            with torch.no_grad(), tt.autocast(device):
                y = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gen_cfg, **kw)
            if y.shape[1] != P + new_tokens:
                raise RuntimeError(f"generate returned {y.shape[1]} tokens per row, expected {P + new_tokens}")
            out.append(y.cpu().numpy().astype(np.int64))                                # [b, P+new]
            tt.sync(device)
            per_batch = max(per_batch, time.perf_counter() - tb)
            log(f"[regen] {min(i + batch, N)}/{N} sequences, {time.perf_counter() - t0:.1f}s")
    finally:
        model.generation_config.eos_token_id = saved_eos
    seqs = np.concatenate(out) if out else np.zeros((0, P + new_tokens), np.int64)
    secs = time.perf_counter() - t0
    info = {"sequences": int(len(seqs)), "requested": int(N), "prompt_tokens": int(P), "new_tokens": int(new_tokens),
            "batch": int(batch), "seconds": secs, "capped": capped,
            "new_tokens_per_s": float(len(seqs) * new_tokens / max(secs, 1e-9))}
    if sampled is not None:
        info["sampled_sequences"] = int(np.count_nonzero(sampled[:len(seqs)]))
    return seqs, info


# ------------------------------------------------------------------------------------------------ sampling
def val_regen_count(regen: int) -> int:
    """Held-out regeneration prompts (validation split) that go with ``regen`` training prompts."""
    return max(4, min(64, regen // 32)) if regen > 0 else 0


def sample_anchors(rng: np.random.Generator, rows: int, anchors: int, seq: int, block: int,
                   lo: int = 1) -> np.ndarray:
    """``anchors`` distinct anchors per row, uniform in [lo, seq - block], sorted              -> [rows, A] int64

    E.g. rows 2, anchors 3, seq 12, block 4, lo 5: three of 5..8 per row, such as [[5, 7, 8], [5, 6, 8]]."""
    n = seq - block - lo + 1                                                            # possible anchors
    if anchors > n:
        raise ValueError(f"--anchors {anchors} > the {n} possible anchors of a {seq}-token sequence, block {block}"
                         + (f", from position {lo}" if lo != 1 else ""))
    a = np.argsort(rng.random((rows, n)), axis=1)[:, :anchors] + lo
    return np.sort(a, axis=1).astype(np.int64)


class DraftBatches:
    """Training batches: ``regen_count(batch)`` regenerated sequences + the rest corpus windows (all corpus windows
    without regenerated text), corpus rows first; ``anchors`` draws each row's anchors, the regenerated rows' from
    ``regen_from`` on (1: anywhere, as a corpus window's; the prompt length: the generated part only)."""

    def __init__(self, data: tt.TokenData, regen: np.ndarray, seq: int, mix: float = DEFAULTS["regen_mix"],
                 regen_from: int = 1):
        self.data, self.regen, self.seq, self.mix, self.regen_from = data, regen, seq, mix, regen_from

    def regen_count(self, batch: int) -> int:
        """Regenerated sequences in a batch of ``batch``: round(mix * batch) (halves up), 0 without regenerated
        text."""
        return dsp.count_for(self.mix, batch) if len(self.regen) else 0

    def __call__(self, rng: np.random.Generator, batch: int) -> np.ndarray:
        n_regen = self.regen_count(batch)
        parts = []
        if batch - n_regen:
            parts.append(self.data.sample(rng, batch - n_regen, self.seq))              # [b1, S]
        if n_regen:
            parts.append(self.regen[rng.integers(0, len(self.regen), n_regen)])         # [b2, S]
        return np.concatenate(parts)                                                    # [Bt, S]

    def anchors(self, rng: np.random.Generator, batch: int, anchors: int, block: int) -> np.ndarray:
        """Anchors for a batch of ``batch`` rows as ``__call__`` lays them out                       -> [Bt, A]"""
        n_regen = self.regen_count(batch)
        if self.regen_from == 1 or not n_regen:                                         # one draw, as always
            return sample_anchors(rng, batch, anchors, self.seq, block)
        return np.concatenate([sample_anchors(rng, batch - n_regen, anchors, self.seq, block),
                               sample_anchors(rng, n_regen, anchors, self.seq, block, lo=self.regen_from)])


def check_regen_mix(regen: int, mix) -> float:
    """``--regen-mix`` as a fraction in [0, 1]; 0 with regenerated text asked for (``regen`` > 0) is refused, since
    minutes of regeneration would never be trained on. ValueError naming the flag otherwise."""
    mix = dsp.check_fraction(mix, "--regen-mix")
    if mix == 0 and regen:
        raise ValueError(f"--regen-mix 0 with --regen {regen}: the regenerated text would never be trained on "
                         f"(pass --regen 0 instead)")
    return mix


def check_regen_sampled(regen: int, sampled) -> float:
    """``--regen-sampled`` as a fraction in [0, 1]; above 0 without regenerated text (``regen`` 0) it would sample
    nothing, so it is refused. ValueError naming the flag otherwise."""
    sampled = dsp.check_fraction(sampled, "--regen-sampled")
    if sampled and not regen:
        raise ValueError(f"--regen-sampled {sampled:g}: there is no regenerated text to sample (--regen 0)")
    return sampled


def check_regen_anchors(regen_anchors: str, regen: int, regen_prompt: int, seq: int, block: int,
                        anchors: int) -> int:
    """``--regen-anchors`` -> the first anchor of a regenerated sequence (1, or ``regen_prompt`` for
    "generated"). ValueError naming the flag for an unknown value, for "generated" without regenerated text, and
    when the generated part has fewer than ``anchors`` possible anchors."""
    if regen_anchors not in REGEN_ANCHORS:
        raise ValueError(f"--regen-anchors {regen_anchors!r}: expected one of {', '.join(REGEN_ANCHORS)}")
    if regen_anchors == "all":
        return 1
    if not regen:
        raise ValueError("--regen-anchors generated: there is no regenerated text (--regen 0)")
    n = seq - block - regen_prompt + 1
    if anchors > n:
        raise ValueError(f"--regen-anchors generated: --anchors {anchors} > the {n} anchors of the generated part "
                         f"(--seq {seq} - --regen-prompt {regen_prompt} - --block {block} + 1)")
    return regen_prompt


def drafter_config(target_config, layers: int, heads: int, kv_heads: int, head_dim: int, intermediate: int,
                   block: int, target_layers) -> dfl.DFlashConfig:
    """The drafter architecture the flags ask for, on a target whose (HF-like) config is ``target_config``."""
    return dfl.config_for_target(target_config, num_hidden_layers=layers, num_attention_heads=heads,
                                 num_key_value_heads=kv_heads, head_dim=head_dim, intermediate_size=intermediate,
                                 block_size=block, target_layer_ids=tuple(target_layers))


def load_init(init_dir: str, cfg: dfl.DFlashConfig, weights: bool = True):
    """The drafter saved in ``init_dir`` (float32) if its config is ``cfg``'s architecture -> (model, info);
    ``weights=False`` checks the directory only and returns (None, None).

    info = {"dir", "sha256" of model.safetensors, "args", "init", "total_seconds" and "gpu" (``versions.gpu``) of
    its training log when there is one}. The log is ``init_dir/drafter_train_log.json`` (a run's output folder)
    or, in the shipped pair's layout (``default_model/drafter`` beside ``default_model/drafter_train_log.json``),
    the one beside ``init_dir``; a log that records its weights' sha256 (``weights_sha256``, since 2026-12-05)
    counts only for those weights.
    A missing file or any differing field -> ValueError naming ``--init``, the field and both values.
    """
    def need(f):
        if not os.path.isfile(os.path.join(init_dir, f)):
            raise ValueError(f"--init {init_dir}: no {f} there (a drafter directory written by this trainer)")

    need(dfl.CONFIG_NAME)
    with open(os.path.join(init_dir, dfl.CONFIG_NAME)) as f:
        have = dfl.DFlashConfig.from_dict(json.load(f)).to_dict()
    want = cfg.to_dict()
    for key in want:
        if key not in ("torch_dtype", "dtype") and have.get(key) != want[key]:
            raise ValueError(f"--init {init_dir}: its {key} is {have.get(key)!r}, this run's is {want[key]!r} "
                             f"(pass the flags it was trained with)")
    need(dfl.WEIGHTS_NAME)
    if not weights:
        return None, None
    model = dfl.DFlashDraftModel.from_pretrained(init_dir)
    info = {"dir": os.path.abspath(init_dir), "sha256": sha256_file(os.path.join(init_dir, dfl.WEIGHTS_NAME))}
    prev = _init_log(init_dir, info["sha256"])
    if prev is not None:                                      # weights without a log: the sha256 names them
        info.update(args=prev.get("args"), init=prev.get("init"), total_seconds=prev.get("total_seconds"),
                    gpu=(prev.get("versions") or {}).get("gpu"))
    return model, info


def _init_log(init_dir: str, sha256: str) -> dict | None:
    """The training log of the weights in ``init_dir`` (see load_init), or None."""
    here = os.path.join(init_dir, "drafter_train_log.json")
    beside = os.path.join(os.path.dirname(os.path.abspath(init_dir)), "drafter_train_log.json")
    for path, need_sha in ((here, False), (beside, True)):
        try:
            with open(path) as f:
                prev = json.load(f)
        except (OSError, ValueError):
            continue
        recorded = prev.get("weights_sha256")
        if recorded == sha256 or (recorded is None and not need_sha):
            return prev
    return None


# ------------------------------------------------------------------------------------------------ steps
def drafter_loss(drafter, feats: TargetFeatures, embed_w, head_w, ids, anchors, weights):
    """One anchored-block pass: (loss, correct [Bt, A, bs-1] bool). ids [Bt, S], anchors [Bt, A] on device."""
    feat = feats(ids)                                                                   # [Bt, S, nF*H]
    logits = drafter(feat, ids, anchors, embed_w, head_w)                               # [Bt, A, bs-1, V]
    labels = dfl.block_labels(ids, anchors, drafter.config.block_size)                  # [Bt, A, bs-1]
    return dfl.weighted_block_loss(logits, labels, weights)


@torch.no_grad()
def evaluate_drafter(drafter, feats, embed_w, head_w, seqs: np.ndarray, anchors: np.ndarray, weights,
                     batch: int, device: torch.device) -> dict:
    """Weighted loss, per-position top-1 accuracy and greedy-chain acceptance length over fixed (seqs, anchors)."""
    if len(seqs) == 0:
        return {}
    was = drafter.training
    drafter.eval()
    loss_sum, n_rows, acc_sum, chain_sum = 0.0, 0, None, 0.0
    for i in range(0, len(seqs), batch):
        ids = torch.from_numpy(seqs[i:i + batch]).to(device)                            # [b, S]
        anc = torch.from_numpy(anchors[i:i + batch]).to(device)                         # [b, A]
        with tt.autocast(device):
            loss, correct = drafter_loss(drafter, feats, embed_w, head_w, ids, anc, weights)
        b = correct.shape[0] * correct.shape[1]
        loss_sum += float(loss) * b
        n_rows += b
        acc = correct.float().sum(dim=(0, 1))                                            # [bs-1]
        acc_sum = acc if acc_sum is None else acc_sum + acc
        chain_sum += float(dfl.chain_accept_length(correct)) * b
    drafter.train(was)
    acc = (acc_sum / n_rows).cpu().tolist()
    return {"loss": loss_sum / n_rows, "acc": [round(a, 5) for a in acc], "mean_acc": float(np.mean(acc)),
            "chain_accept": chain_sum / n_rows, "blocks": n_rows}


def _decode_sample(tok_path: str, ids) -> str | None:
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(tok_path).decode([int(t) for t in ids], skip_special_tokens=False)[:600]
    except Exception:  # noqa: BLE001 - a sample is a nicety; no tokenizer, no sample
        return None


def train_drafter(data_dir: str, target_dir: str, out_dir: str, *, steps: int = DEFAULTS["steps"],
                  batch: int = DEFAULTS["batch"], seq: int = DEFAULTS["seq"], anchors: int = DEFAULTS["anchors"],
                  block: int = DEFAULTS["block"], layers: int = DEFAULTS["layers"],
                  target_layers=DEFAULTS["target_layers"], lr: float = DEFAULTS["lr"], seed: int = DEFAULTS["seed"],
                  gamma: float | None = None, heads: int = DEFAULTS["heads"], kv_heads: int = DEFAULTS["kv_heads"],
                  head_dim: int = DEFAULTS["head_dim"], intermediate: int = DEFAULTS["intermediate"],
                  weight_decay: float = DEFAULTS["weight_decay"], warmup_frac: float = DEFAULTS["warmup_frac"],
                  final_lr_frac: float = DEFAULTS["final_lr_frac"], grad_clip: float = DEFAULTS["grad_clip"],
                  regen: int = DEFAULTS["regen"], regen_prompt: int = DEFAULTS["regen_prompt"],
                  regen_batch: int = DEFAULTS["regen_batch"], regen_max_seconds: float = DEFAULTS["regen_max_seconds"],
                  regen_docstring: float = DEFAULTS["regen_docstring"], regen_mix: float = DEFAULTS["regen_mix"],
                  regen_anchors: str = DEFAULTS["regen_anchors"], regen_sampled: float = DEFAULTS["regen_sampled"],
                  init: str | None = None,
                  log_every: int = DEFAULTS["log_every"],
                  val_every: int = DEFAULTS["val_every"],
                  print_every: int = DEFAULTS["print_every"], val_windows: int = DEFAULTS["val_windows"],
                  device: str | None = None, attn: str = "auto", experts: str = "auto") -> dict:
    """Regenerate text with the target, train the drafter for exactly ``steps`` steps, save it (bf16) + log."""
    args = {k: (list(v) if isinstance(v, tuple) else v) for k, v in locals().items()}
    t_start = time.perf_counter()
    dev = tt.pick_device(device)
    if dev.type == "cuda":
        torch.set_float32_matmul_precision("high")                                      # TF32 for fp32 matmuls
    if regen and not 0 < regen_prompt < seq:
        raise ValueError(f"--regen-prompt {regen_prompt} must be in [1, --seq {seq})")
    regen_docstring = args["regen_docstring"] = dsp.check_fraction(regen_docstring)
    regen_mix = args["regen_mix"] = check_regen_mix(regen, regen_mix)
    regen_from = check_regen_anchors(regen_anchors, regen, regen_prompt, seq, block, anchors)
    regen_sampled = args["regen_sampled"] = check_regen_sampled(regen, regen_sampled)
    data = tt.TokenData(data_dir)                                                       # vocab checked below
    rng = np.random.default_rng(seed)
    n_val_regen = val_regen_count(regen)

    # ---- docstring-ended regeneration prompts, before the target loads (too few sites: ValueError now)
    n_doc, n_doc_val = dsp.count_for(regen_docstring, regen), dsp.count_for(regen_docstring, n_val_regen)
    doc_train = doc_val = np.zeros((0, regen_prompt), np.int64)
    doc_info = None
    if n_doc or n_doc_val:                                                              # F = 0: rng untouched
        doc_tok = dsp.load_tokenizer(data_dir, target_dir)
        doc_train, doc_val, doc_info = dsp.docstring_prompts(data.train, data.val, doc_tok, rng, n_doc, n_doc_val,
                                                             regen_prompt, regen_docstring)
        log(f"[regen] docstring prompts: {n_doc} train (of {doc_info['train']['valid']} valid sites in "
            f"{doc_info['train']['checked']} checked of {doc_info['train']['candidates']} closing-quote "
            f"candidates) + {n_doc_val} val, {doc_info['seconds']:.1f}s")
    target = load_frozen_target(target_dir, dev)
    tcfg = target.config
    cfg = drafter_config(tcfg, layers, heads, kv_heads, head_dim, intermediate, block, target_layers)
    init_model, init_info = load_init(init, cfg) if init is not None else (None, None)     # before any long work
    gamma = dfl.default_gamma(block) if gamma is None else float(gamma)
    weights = dfl.position_weights(block, gamma).to(dev)                                # [bs-1]
    data.check_vocab(tcfg.vocab_size)
    os.makedirs(out_dir, exist_ok=True)
    log(f"[drafter] target {target_dir}: {tcfg.num_hidden_layers} layers, hidden {tcfg.hidden_size}; features of "
        f"layers {list(cfg.target_layer_ids)}; device {dev}")

    # ---- kernels for the frozen target's forward (no grad)
    probe = torch.from_numpy(data.sample(np.random.default_rng(seed + 7919), batch, seq + 1)).to(dev)
    impl = tt.choose_implementations(target, probe, dev, attn, experts, train=False)
    del probe
    log(f"[drafter] target attention {impl['attn']}, experts {impl['experts']}")

    # ---- regenerate text with the target (val prompts from the validation split first)
    regen_info, regen_train, regen_val, sample = {"sequences": 0}, np.zeros((0, seq), np.int64), None, None
    smp = None
    if regen > 0:
        vp = data.sample(rng, n_val_regen - n_doc_val, regen_prompt, split="val")       # [Nv - Dv, P]
        tp = data.sample(rng, regen - n_doc, regen_prompt)                              # [N - D, P]
        if doc_info is not None:
            vp = np.concatenate([vp, doc_val])                                          # [Nv, P] docstring last
            tp = np.concatenate([tp, doc_train])[rng.permutation(regen)]                # [N, P] mixed (the cap)
        n_smp, n_smp_val = dsp.count_for(regen_sampled, regen), dsp.count_for(regen_sampled, n_val_regen)
        if n_smp or n_smp_val:                                                          # F = 0: rng untouched
            smp = np.zeros(n_val_regen + regen, bool)                                   # [Nv + N] sampled rows
            smp[rng.permutation(n_val_regen)[:n_smp_val]] = True
            smp[n_val_regen + rng.permutation(regen)[:n_smp]] = True
        log(f"[regen] {regen} + {n_val_regen} (val) prompts of {regen_prompt} tokens -> {seq} tokens, "
            f"batch {regen_batch}" + (f"; {n_doc} + {n_doc_val} of them docstring-ended" if doc_info else "")
            + (f"; {n_smp} + {n_smp_val} of them sampled (T 1)" if smp is not None else ""))
        seqs, regen_info = regenerate(target, np.concatenate([vp, tp]), seq - regen_prompt, regen_batch, dev,
                                      regen_max_seconds, keep_first=n_val_regen, sampled=smp, seed=seed)
        regen_val, regen_train = seqs[:n_val_regen], seqs[n_val_regen:]                 # [Nv, S], [N', S]
        regen_info["train_sequences"], regen_info["val_sequences"] = int(len(regen_train)), int(len(regen_val))
        log(f"[regen] {len(seqs)} sequences in {regen_info['seconds']:.1f}s "
            f"({regen_info['new_tokens_per_s']:.0f} new tokens/s)")
        tok = os.path.join(target_dir, "tokenizer.json")
        sample = _decode_sample(tok, regen_val[0]) if len(regen_val) else None
        regen_info["sample"] = sample
        if doc_info is not None:
            regen_info["docstring"] = doc_info
            if n_doc_val:
                regen_info["docstring"]["sample"] = _decode_sample(tok, regen_val[n_val_regen - n_doc_val])
    batches = DraftBatches(data, regen_train, seq, regen_mix, regen_from)

    # ---- fixed validation sets
    vrng = np.random.default_rng(seed + 104729)
    val_sets = {"corpus": data.val_windows(seq, val_windows)}                           # [W, S]
    if regen_val is not None and len(regen_val):
        val_sets["regen"] = regen_val
        if n_doc_val and len(regen_val) == n_val_regen:
            val_sets["regen_docstring"] = regen_val[n_val_regen - n_doc_val:]           # [Dv, S]
        if smp is not None and smp[:n_val_regen].any():
            val_sets["regen_sampled"] = regen_val[smp[:n_val_regen]]                    # [Sv, S]
    val_anchors = {k: sample_anchors(vrng, len(v), anchors, seq, block) for k, v in val_sets.items()}

    # ---- model, optimiser
    torch.manual_seed(seed)
    if init_model is None:
        drafter = dfl.DFlashDraftModel(cfg).to(dev)
    else:
        drafter = init_model.to(dev)
        log(f"[drafter] starting from {init} (weights sha256 {init_info['sha256'][:12]}..)")
    drafter.train()
    feats = TargetFeatures(target, cfg.target_layer_ids)
    embed_w = target.model.embed_tokens.weight                                          # [V, H] frozen
    head_w = target.lm_head.weight                                                      # [V, H] frozen
    n_params = sum(p.numel() for p in drafter.parameters())
    opt = tt.make_adamw(drafter.named_parameters(), lr, weight_decay, dev)
    params = list(drafter.parameters())
    record = {"config": cfg.to_dict(), "target": {"dir": os.path.abspath(target_dir), "config": tcfg.to_dict()},
              "args": args, "params": n_params, "gamma": gamma, "position_weights": weights.cpu().tolist(),
              "device": str(dev), "versions": tt.versions(), "target_implementation": impl, "regen": regen_info,
              "init": init_info,
              "steps": [], "val": []}
    log_path = os.path.join(out_dir, "drafter_train_log.json")
    log(f"[drafter] {n_params / 1e6:.2f} M params ({cfg.num_hidden_layers} layers, block {block}, gamma {gamma:g}); "
        f"{steps} steps x {batch} sequences ({batches.regen_count(batch)} regenerated) x {anchors} anchors; regen "
        f"train {len(regen_train)} sequences")

    def run_val(step):
        res = {"step": step}
        for k, v in val_sets.items():
            res[k] = evaluate_drafter(drafter, feats, embed_w, head_w, v, val_anchors[k], weights, batch, dev)
        res["t"] = time.perf_counter() - t0
        record["val"].append(res)
        log(f"[drafter] step {step} val " + "; ".join(
            f"{k}: loss {res[k]['loss']:.4f} acc@1 {res[k]['acc'][0]:.3f} mean acc {res[k]['mean_acc']:.3f} "
            f"chain tau {res[k]['chain_accept']:.2f}" for k in val_sets))
        tt.write_json(log_path, record)

    loss_acc = torch.zeros((), device=dev)
    pos_acc = torch.zeros(block - 1, device=dev)
    n_acc = 0
    tt.sync(dev)
    t0 = time.perf_counter()
    t_mark, s_mark = t0, 0
    for step in range(steps):
        cur_lr = tt.lr_at(step, steps, lr, warmup_frac, final_lr_frac)
        for g in opt.param_groups:
            g["lr"] = cur_lr
        ids = torch.from_numpy(batches(rng, batch)).to(dev, non_blocking=True)           # [Bt, S]
        anc = torch.from_numpy(batches.anchors(rng, batch, anchors, block)).to(dev)     # [Bt, A]
        with tt.autocast(dev):
            loss, correct = drafter_loss(drafter, feats, embed_w, head_w, ids, anc, weights)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_acc += loss.detach()
        pos_acc += correct.float().mean(dim=(0, 1))
        n_acc += 1
        done = step + 1
        if done % log_every == 0 or done == steps:
            mean_loss = float(loss_acc) / n_acc
            if not math.isfinite(mean_loss):
                tt.write_json(log_path, record)
                raise FloatingPointError(f"[drafter] loss is {mean_loss} at step {done}")
            record["steps"].append({"step": done, "loss": mean_loss, "lr": cur_lr,
                                    "acc": [round(a, 4) for a in (pos_acc / n_acc).cpu().tolist()],
                                    "t": time.perf_counter() - t0})
            loss_acc.zero_()
            pos_acc.zero_()
            n_acc = 0
        if done % print_every == 0 or done == steps:
            tt.sync(dev)
            now = time.perf_counter()
            ms = 1e3 * (now - t_mark) / max(1, done - s_mark)
            t_mark, s_mark = now, done
            last = record["steps"][-1]
            log(f"[drafter] step {done}/{steps} loss {last['loss']:.4f} acc@1 {last['acc'][0]:.3f} "
                f"acc@{block - 1} {last['acc'][-1]:.3f} lr {cur_lr:.2e} t {now - t0:.1f}s "
                f"({ms:.1f} ms/step, eta {ms * (steps - done) / 1e3:.0f}s)")
        if done % val_every == 0 and done != steps:
            run_val(done)
    tt.sync(dev)
    train_s = time.perf_counter() - t0
    record["train_seconds"] = train_s
    record["ms_per_step"] = 1e3 * train_s / max(1, steps)
    run_val(steps)
    if dev.type == "cuda":
        record["peak_mem_gb"] = torch.cuda.max_memory_allocated(dev) / 2**30
    feats.remove()
    drafter.save_pretrained(out_dir)                                                    # bf16
    record["weights_sha256"] = sha256_file(os.path.join(out_dir, dfl.WEIGHTS_NAME))   # ties this log to them
    for src in (os.path.join(target_dir, "tokenizer.json"), os.path.join(data_dir, "tokenizer.json")):
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(out_dir, "tokenizer.json"))
            break
    record["total_seconds"] = time.perf_counter() - t_start
    tt.write_json(log_path, record)
    log(f"[drafter] saved {out_dir} (bf16); train {train_s:.1f}s ({record['ms_per_step']:.1f} ms/step), "
        f"total {record['total_seconds']:.1f}s")
    return record


__all__ = ["DEFAULTS", "TargetFeatures", "load_frozen_target", "regenerate", "val_regen_count", "sample_anchors",
           "DraftBatches",
           "check_regen_mix", "REGEN_ANCHORS", "check_regen_anchors", "drafter_config", "load_init", "drafter_loss",
           "evaluate_drafter", "train_drafter"]
