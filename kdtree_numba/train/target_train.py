"""Train the small DeepSeek-V3 target with transformers' ``DeepseekV3ForCausalLM`` (the `train` extra; torch).

What: a ~9.4 M-parameter MLA + MoE model (defaults in ``DEFAULT_TARGET_CONFIG``: hidden 256, 5 layers, the first
dense, then 8 routed experts top-2 + 1 shared, q_lora 128, kv_lora 96, plain rope) trained next-token on the
corpus's ``tokens.npy`` (uint16 token stream, files separated by ``<|endoftext|>`` = 0).

Recipe (all fixed by flags, no wall-clock stopping, so a run is reproducible):
    data      windows of S+1 tokens at random offsets of the TRAIN split (numpy Generator(seed)); the LAST 1 % of
              tokens.npy is the validation split, never trained on (val = its first non-overlapping windows)
    loss      mean next-token CE over the S predictions of each window              logits [B, S, V]
    optimiser AdamW(betas 0.9/0.95, weight decay 0.1 on matrices; none on norms / embeddings / router bias),
              peak lr 2e-3, linear warmup 4 % of the steps, cosine decay to 10 % of peak, grad clip 1.0
    numerics  bf16 autocast on CUDA (fp32 master weights), fp32 on CPU; torch.manual_seed(seed)
    kernels   ``--attn`` / ``--experts`` auto: a short A/B on the first batch picks the fastest transformers
              attention (sdpa / eager) and MoE experts implementation (grouped_mm / eager) whose loss and grad
              norm agree with eager/eager (the choice is logged)
    logging   train loss (mean of the last 50 steps), lr, grad norm, elapsed seconds every 50 steps; validation
              loss every 500 steps and at the end -> ``OUT/train_log.json``; a progress line every 200 steps
    saving    ``save_pretrained(OUT, max_shard_size="12MB")`` in bfloat16 + ``tokenizer.json`` copied next to it
              (the router's e_score_correction_bias stays at HF's zeros: it is a buffer and never trained)

Reproduce::

    python -m kdtree_numba.train target --data CORPUS_DIR --out OUT/target            # H200: about 4 minutes
    python -m kdtree_numba.train target --data D --out O --steps 5 --batch 2 --seq 64 --device cpu \\
        --config-json '{"hidden_size": 64, "num_hidden_layers": 3}'                    # smoke test

Timing reference (H200, bf16 autocast): a 21.7 M-param DeepseekV3 (hidden 320, 16 experts) took ~59 ms per 32x512
step; the per-step time of each run is in its log (``ms_per_step``) to size ``--steps``.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEFAULT_TARGET_CONFIG = dict(
    vocab_size=4096, hidden_size=256, intermediate_size=768, moe_intermediate_size=192, num_hidden_layers=5,
    first_k_dense_replace=1, num_attention_heads=8, num_key_value_heads=8, q_lora_rank=128, kv_lora_rank=96,
    qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2,
    n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
    max_position_embeddings=2048, rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
    pad_token_id=2, initializer_range=0.02, rms_norm_eps=1e-6,
)

DEFAULTS = dict(steps=4000, batch=32, seq=512, lr=2e-3, seed=0, weight_decay=0.1, warmup_frac=0.04,
                final_lr_frac=0.1, grad_clip=1.0, log_every=50, val_every=500, print_every=200, val_windows=64)
VAL_FRACTION = 0.01


def log(msg: str) -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------------------------------------ config
def target_config_dict(overrides: dict | None = None) -> dict:
    """DEFAULT_TARGET_CONFIG with ``overrides`` applied (unknown keys are passed to DeepseekV3Config as is)."""
    d = dict(DEFAULT_TARGET_CONFIG)
    d.update(overrides or {})
    return d


def make_target_config(overrides: dict | None = None):
    """transformers.DeepseekV3Config for the defaults + overrides; plain rope via ``rope_parameters``."""
    import transformers

    d = target_config_dict(overrides)
    theta = float(d.pop("rope_theta", 10000.0))
    d.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": theta})
    return transformers.DeepseekV3Config(**d)


# ------------------------------------------------------------------------------------------------ data
class TokenData:
    """tokens.npy split into train (first 99 %) and validation (LAST 1 %)."""

    def __init__(self, data_dir: str, vocab_size: int | None = None, val_fraction: float = VAL_FRACTION):
        path = os.path.join(data_dir, "tokens.npy")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no tokens.npy (build it with `python -m kdtree_numba.train corpus`)")
        tokens = np.load(path, mmap_mode="r")
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ValueError(f"{path}: expected a 1-d integer token stream, got {tokens.dtype} {tokens.shape}")
        self.tokens = tokens
        n = len(tokens)
        self.n_val = int(n * val_fraction)
        self.train = tokens[: n - self.n_val]                                           # [N_train]
        self.val = tokens[n - self.n_val:]                                              # [N_val]
        self.path = path
        if vocab_size is not None:
            self.check_vocab(vocab_size)

    def check_vocab(self, vocab_size: int) -> None:
        """ValueError when a token id is >= ``vocab_size`` (the model's vocabulary)."""
        if len(self.tokens):
            top = int(np.max(self.tokens))
            if top >= vocab_size:
                raise ValueError(f"{self.path}: token id {top} >= vocab_size {vocab_size}")

    def sample(self, rng: np.random.Generator, batch: int, length: int, split: str = "train") -> np.ndarray:
        """``batch`` windows of ``length`` tokens at uniform random offsets of a split    -> [batch, length] int64"""
        src = self.train if split == "train" else self.val
        hi = len(src) - length
        if hi < 0:
            raise ValueError(f"{split} split has {len(src)} tokens, fewer than one window of {length}")
        off = rng.integers(0, hi + 1, size=batch)                                       # [batch]
        return np.asarray(src[off[:, None] + np.arange(length)[None, :]], dtype=np.int64)

    def val_windows(self, length: int, max_windows: int) -> np.ndarray:
        """The first non-overlapping ``length``-token windows of the validation split  -> [W, length] int64"""
        w = min(len(self.val) // length, max_windows)
        if w < 1:
            raise ValueError(f"validation split (last 1 % of tokens.npy = {len(self.val)} tokens) is shorter than "
                             f"one window of {length} tokens: corpus too small for --seq {length - 1}")
        return np.asarray(self.val[: w * length], dtype=np.int64).reshape(w, length)


# ------------------------------------------------------------------------------------------------ torch helpers
def pick_device(device: str | None) -> torch.device:
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA device visible")
    return dev


def autocast(device: torch.device):
    """bf16 autocast on CUDA, nothing (fp32) elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def lr_at(step: int, steps: int, peak: float, warmup_frac: float = 0.04, final_frac: float = 0.1) -> float:
    """Linear warmup over ``warmup_frac`` of the steps, then cosine from ``peak`` to ``final_frac * peak``."""
    warm = max(1, int(round(warmup_frac * steps)))
    if step < warm:
        return peak * (step + 1) / warm
    prog = min(1.0, (step - warm) / max(1, steps - warm))
    return peak * (final_frac + (1.0 - final_frac) * 0.5 * (1.0 + math.cos(math.pi * prog)))


def make_adamw(named_params, lr: float, weight_decay: float, device: torch.device, betas=(0.9, 0.95)):
    """AdamW with decay on matrices only (no decay on 1-d params and on input embeddings)."""
    decay, no_decay = [], []
    for name, p in named_params:
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "embed_tokens" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kw = dict(lr=lr, betas=betas, eps=1e-8)
    if device.type == "cuda":
        try:
            return torch.optim.AdamW(groups, fused=True, **kw)
        except (TypeError, RuntimeError):
            pass
    return torch.optim.AdamW(groups, **kw)


def write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def versions() -> dict:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__,
            "python": sys.version.split()[0],
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


# ------------------------------------------------------------------------------------------------ implementations
def get_implementations(model) -> dict:
    cfg = model.config
    return {"attn": getattr(cfg, "_attn_implementation", None),
            "experts": getattr(cfg, "_experts_implementation", None)}


def set_implementations(model, attn: str | None = None, experts: str | None = None) -> None:
    """Switch transformers' attention / MoE-experts implementation in place (guarded across 5.x versions)."""
    if attn:
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(attn)
        else:
            model.config._attn_implementation = attn
    if experts:
        if hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation(experts)
        elif hasattr(model.config, "_experts_implementation"):
            model.config._experts_implementation = experts
        elif experts != "eager":
            raise RuntimeError(f"this transformers has no experts_implementation switch (asked for {experts!r})")


def _supports_experts_switch(model) -> bool:
    return hasattr(model, "set_experts_implementation") or hasattr(model.config, "_experts_implementation")


def lm_loss(model, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token CE of windows ids [B, S+1] (inputs ids[:, :-1], labels ids[:, 1:])."""
    logits = model(input_ids=ids[:, :-1], use_cache=False).logits                       # [B, S, V]
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def choose_implementations(model, ids: torch.Tensor, device: torch.device, attn: str = "auto",
                           experts: str = "auto", train: bool = True, reps: int = 3) -> dict:
    """Pick transformers' attention and MoE-experts implementations for ``model`` on a real batch ``ids``.

    Explicit choices are just set. ``auto``: every candidate runs a forward (+ backward when ``train``) on ``ids``;
    one whose loss (and grad norm) disagrees with eager/eager beyond bf16 noise, or that raises, is dropped; on
    CUDA the fastest of the rest (mean of ``reps`` timed runs after one warm-up) wins; on CPU the first valid one
    in preference order (sdpa before eager, grouped_mm before eager), run on a 1 x 64 slice only.
    Returns {"attn", "experts", "trials": [...]}.
    """
    can_switch = _supports_experts_switch(model)
    attn_c = ["sdpa", "eager"] if attn == "auto" else [attn]
    exp_c = (["grouped_mm", "eager"] if can_switch else [None]) if experts == "auto" else [experts]
    if len(attn_c) == 1 and len(exp_c) == 1:
        set_implementations(model, attn_c[0], exp_c[0])
        return {**get_implementations(model), "trials": []}
    cuda = device.type == "cuda"
    if not cuda:
        ids = ids[:1, :65]
        reps = 0
    rtol_loss, rtol_grad = (2e-2, 5e-2) if cuda else (1e-4, 1e-3)
    params = [p for p in model.parameters() if p.requires_grad]

    def run_once():
        with autocast(device):
            if train:
                loss = lm_loss(model, ids)
            else:
                with torch.no_grad():
                    loss = lm_loss(model, ids)
        gn = 0.0
        if train:
            loss.backward()
            gn = float(torch.sqrt(sum((p.grad.float() ** 2).sum() for p in params if p.grad is not None)))
            model.zero_grad(set_to_none=True)
        return float(loss.detach()), gn

    trials = []
    ref = None
    combos = [("eager", "eager" if can_switch else None)] + [(a, e) for a in attn_c for e in exp_c]
    seen = set()
    for a, e in combos:
        if (a, e) in seen:
            continue
        seen.add((a, e))
        rec = {"attn": a, "experts": e}
        try:
            set_implementations(model, a, e)
            loss, gn = run_once()
            if ref is None:
                ref = (loss, gn)
            rec.update(loss=loss, grad_norm=gn)
            ok = abs(loss - ref[0]) <= rtol_loss * abs(ref[0]) and (
                not train or abs(gn - ref[1]) <= rtol_grad * max(abs(ref[1]), 1e-12))
            rec["ok"] = bool(ok and math.isfinite(loss))
            if rec["ok"] and reps:
                run_once()
                sync(device)
                t0 = time.perf_counter()
                for _ in range(reps):
                    run_once()
                sync(device)
                rec["ms"] = 1e3 * (time.perf_counter() - t0) / reps
        except Exception as exc:  # noqa: BLE001 - any failure disqualifies the candidate
            rec.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:200]}")
            model.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.empty_cache()
        trials.append(rec)
    wanted = [r for r in trials if r["ok"] and r["attn"] in attn_c and r["experts"] in exp_c]
    if not wanted:
        raise RuntimeError(f"no working attention/experts implementation: {trials}")
    if cuda:
        best = min(wanted, key=lambda r: r["ms"])
    else:
        rank = {(a, e): i for i, (a, e) in enumerate((a, e) for a in attn_c for e in exp_c)}
        best = min(wanted, key=lambda r: rank[(r["attn"], r["experts"])])
    set_implementations(model, best["attn"], best["experts"])
    return {**get_implementations(model), "trials": trials}


# ------------------------------------------------------------------------------------------------ training
@torch.no_grad()
def evaluate(model, windows: np.ndarray, batch: int, device: torch.device) -> float:
    """Mean next-token CE over validation windows [W, S+1] (token-weighted; every window has S predictions)."""
    was = model.training
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, len(windows), batch):
        ids = torch.from_numpy(windows[i:i + batch]).to(device)                         # [b, S+1]
        with autocast(device):
            tot += float(lm_loss(model, ids)) * len(ids)
        n += len(ids)
    model.train(was)
    return tot / n


def save_target(model, out_dir: str, data_dir: str | None = None, max_shard_size: str = "12MB") -> None:
    """bfloat16 HF checkpoint (sharded safetensors) + tokenizer.json from ``data_dir`` when it has one.

    Converts ``model`` itself to bfloat16 (call it last)."""
    import inspect

    os.makedirs(out_dir, exist_ok=True)
    model.to(torch.bfloat16)
    try:
        model.config.dtype = torch.bfloat16
    except Exception:  # noqa: BLE001 - older configs name it torch_dtype
        model.config.torch_dtype = torch.bfloat16
    kw = {"max_shard_size": max_shard_size}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kw["safe_serialization"] = True
    model.save_pretrained(out_dir, **kw)
    if data_dir:
        tok = os.path.join(data_dir, "tokenizer.json")
        if os.path.exists(tok):
            shutil.copyfile(tok, os.path.join(out_dir, "tokenizer.json"))


def train_target(data_dir: str, out_dir: str, *, steps: int = DEFAULTS["steps"], batch: int = DEFAULTS["batch"],
                 seq: int = DEFAULTS["seq"], lr: float = DEFAULTS["lr"], seed: int = DEFAULTS["seed"],
                 config_overrides: dict | None = None, device: str | None = None,
                 weight_decay: float = DEFAULTS["weight_decay"], warmup_frac: float = DEFAULTS["warmup_frac"],
                 final_lr_frac: float = DEFAULTS["final_lr_frac"], grad_clip: float = DEFAULTS["grad_clip"],
                 log_every: int = DEFAULTS["log_every"], val_every: int = DEFAULTS["val_every"],
                 print_every: int = DEFAULTS["print_every"], val_windows: int = DEFAULTS["val_windows"],
                 attn: str = "auto", experts: str = "auto") -> dict:
    """Train the target for exactly ``steps`` AdamW steps and save it (bf16) + ``train_log.json`` in ``out_dir``.

    Returns the log dict ({"config", "args", "steps": [{step, loss, lr, grad_norm, t}], "val": [{step, loss, t}],
    ...}). See the module docstring for the recipe.
    """
    import transformers

    args = {k: v for k, v in locals().items() if k != "transformers"}
    t_start = time.perf_counter()
    dev = pick_device(device)
    if dev.type == "cuda":
        torch.set_float32_matmul_precision("high")                                      # TF32 for fp32 matmuls
    cfg = make_target_config(config_overrides)
    data = TokenData(data_dir, cfg.vocab_size)
    val = data.val_windows(seq + 1, val_windows)                                        # [W, S+1]
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    model = transformers.DeepseekV3ForCausalLM(cfg).to(dev)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    os.makedirs(out_dir, exist_ok=True)
    log(f"[target] {n_params / 1e6:.2f} M params, {cfg.num_hidden_layers} layers, device {dev}, "
        f"train {len(data.train)} tokens, val {len(data.val)} tokens ({len(val)} windows), "
        f"{steps} steps x {batch} x {seq}")

    probe = torch.from_numpy(data.sample(np.random.default_rng(seed + 7919), batch, seq + 1)).to(dev)
    impl = choose_implementations(model, probe, dev, attn, experts, train=True)
    del probe
    log(f"[target] attention {impl['attn']}, experts {impl['experts']}"
        + "".join(f"\n[target]   trial {t}" for t in impl["trials"]))

    opt = make_adamw(model.named_parameters(), lr, weight_decay, dev)
    params = [p for p in model.parameters() if p.requires_grad]
    record = {"config": cfg.to_dict(), "args": args, "params": n_params, "device": str(dev),
              "versions": versions(), "implementation": impl, "steps": [], "val": []}
    log_path = os.path.join(out_dir, "train_log.json")
    loss_acc = torch.zeros((), device=dev)
    gn_acc = torch.zeros((), device=dev)
    n_acc = 0
    sync(dev)
    t0 = time.perf_counter()
    t_mark, s_mark = t0, 0
    for step in range(steps):
        cur_lr = lr_at(step, steps, lr, warmup_frac, final_lr_frac)
        for g in opt.param_groups:
            g["lr"] = cur_lr
        ids = torch.from_numpy(data.sample(rng, batch, seq + 1)).to(dev, non_blocking=True)   # [B, S+1]
        with autocast(dev):
            loss = lm_loss(model, ids)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_acc += loss.detach()
        gn_acc += gn.detach()
        n_acc += 1
        done = step + 1
        if done % log_every == 0 or done == steps:
            mean_loss = float(loss_acc) / n_acc
            if not math.isfinite(mean_loss):
                write_json(log_path, record)
                raise FloatingPointError(f"[target] loss is {mean_loss} at step {done}")
            record["steps"].append({"step": done, "loss": mean_loss, "lr": cur_lr,
                                    "grad_norm": float(gn_acc) / n_acc, "t": time.perf_counter() - t0})
            loss_acc.zero_()
            gn_acc.zero_()
            n_acc = 0
        if done % print_every == 0 or done == steps:
            sync(dev)
            now = time.perf_counter()
            ms = 1e3 * (now - t_mark) / max(1, done - s_mark)
            t_mark, s_mark = now, done
            last = record["steps"][-1]["loss"] if record["steps"] else float("nan")
            log(f"[target] step {done}/{steps} loss {last:.4f} lr {cur_lr:.2e} t {now - t0:.1f}s "
                f"({ms:.1f} ms/step, eta {ms * (steps - done) / 1e3:.0f}s)")
        if done % val_every == 0 or done == steps:
            vl = evaluate(model, val, batch, dev)
            record["val"].append({"step": done, "loss": vl, "t": time.perf_counter() - t0})
            log(f"[target] step {done} val loss {vl:.4f}")
            write_json(log_path, record)
    sync(dev)
    train_s = time.perf_counter() - t0
    record["train_seconds"] = train_s
    record["ms_per_step"] = 1e3 * train_s / max(1, steps)
    if dev.type == "cuda":
        record["peak_mem_gb"] = torch.cuda.max_memory_allocated(dev) / 2**30
    save_target(model, out_dir, data_dir)
    record["total_seconds"] = time.perf_counter() - t_start
    write_json(log_path, record)
    log(f"[target] saved {out_dir} (bf16); train {train_s:.1f}s ({record['ms_per_step']:.1f} ms/step), "
        f"final val loss {record['val'][-1]['loss']:.4f}, total {record['total_seconds']:.1f}s")
    return record


__all__ = ["DEFAULT_TARGET_CONFIG", "DEFAULTS", "TokenData", "make_target_config", "train_target", "save_target",
           "evaluate", "lr_at", "choose_implementations", "set_implementations", "pick_device", "autocast",
           "make_adamw"]
