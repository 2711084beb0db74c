"""The DFlash block-diffusion drafter (z-lab layout), composed from the stage kernels.

DFlash drafts a whole block in one forward: the block is ``[root, MASK, ..., MASK]`` (``block_size`` tokens at
positions start .. start + B - 1) and every MASK position is predicted at once, conditioned on the target's own
hidden features of the committed context. The layers are Qwen3-style, and the target's ``embed_tokens`` and
``lm_head`` are shared (the drafter stores neither):

    ctx = hidden_norm(fc(concat_k target_hidden[k] for k in target_layer_ids))     [C, H]  once per context row
    h   = target.embed([root, MASK, ..., MASK])                                     [B, H]
    per layer:  x = input_layernorm(h)
                q = RoPE(q_norm(q_proj(x)))                                         [B, Nq, D]  per-head RMSNorm
                k = RoPE(k_norm(k_proj([ctx ; x]))),  v = v_proj([ctx ; x])        [C + B, Nkv, D]
                      (the block's q, k, v: one GEMM over the fused [q; k; v] weight, then one launch for q and
                       the k/v cache rows: kernels/draft_kv.py; context rows: every layer's [k; v]
                       rows stacked, one GEMM for all layers - they read the same ctx)
                h = h + o_proj(block_attention(q, k, v))                            GQA, NON-causal, scale D^-0.5
                h = h + down(silu(gate(y)) * up(y)),  y = post_attention_layernorm(h)
    draft_logits = target.lm_head(norm(h)[1:])                                      [B - 1, V]: depths 1 .. L
``target_hidden[k]`` is the residual stream after target decoder layer k (HF ``hidden_states[k + 1]``).
The context rows' k/v do not depend on the block, so they live in a draft cache (per layer ``[capacity, Nkv, D]``):
``observe`` appends the rows of newly committed positions; ``draft`` writes the block's rows after them, attends,
and leaves them uncommitted (the cache length stays at the context: the official release crops the same way).
Folded norms (``FOLD_NORMS``): hidden_norm, input_layernorm and post_attention_layernorm feed one projection each,
so their weights are folded into it at load (``rmsnorm.folded_norm``: rmsnorm(x, w) @ W^T = (x @ (W diag w)^T) /
rms(x)) and the kernel after the product applies the row scale 1 / rms(x) (draft_kv's and swiglu's ``norm_rows``):
five RMSNorm launches fewer a round (two per layer of the draft, one in the observe), equal up to float rounding;
on by default (an H200 timed DDTree-32 1.3 % faster with it, docs/PERFORMANCE.md).

Config (``config.json``): ``model_type: qwen3``, ``architectures: ["DFlashDraftModel"]``, the Qwen3 fields
(``hidden_size``, ``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
``head_dim``, ``rms_norm_eps``, rope as ``rope_parameters`` or ``rope_theta`` + ``rope_scaling``, YaRN included),
``vocab_size``, ``block_size``, ``num_target_layers`` and ``dflash_config: {target_layer_ids, mask_token_id}``.
Weights: ``fc.weight [H, n_feat*H]``, ``hidden_norm.weight``, ``norm.weight``, and per layer
``layers.i.self_attn.{q,k,v,o}_proj.weight``, ``layers.i.self_attn.{q,k}_norm.weight [D]``,
``layers.i.mlp.{gate,up,down}_proj.weight``, ``layers.i.{input,post_attention}_layernorm.weight``.
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from .. import backend
from ..config import ConfigError, check_yarn, parse_rope, rope_tables
from ..kernels import _checks, block_attention, draft_kv, embedding, gemm, rmsnorm, swiglu
from . import checkpoint
from .checkpoint import CheckpointError
from .drafters import Drafter

FOLD_NORMS = True  # the drafter's RMSNorms folded into the projections after them (module docstring); False: the
#                    plain RMSNorm launches (benchmarks/ab_replay.py timed both on an H200, docs/PERFORMANCE.md)


@dataclasses.dataclass
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    block_size: int
    num_target_layers: int
    target_layer_ids: tuple
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    rope_scaling: dict | None = None
    max_position_embeddings: int = 40960

    @property
    def n_features(self) -> int:
        return len(self.target_layer_ids)

    @staticmethod
    def default_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
        """The official default when ``target_layer_ids`` is absent: one draft layer -> [L_t // 2]; else
        ``num_draft_layers`` ids evenly spaced from 1 to L_t - 3, rounded."""
        if num_draft_layers == 1:
            return [num_target_layers // 2]
        span = num_target_layers - 3 - 1
        return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]

    @classmethod
    def from_dict(cls, raw, source: str = "config") -> "DFlashConfig":
        """Parse a z-lab DFlash ``config.json`` dict; ConfigError naming the field, the value and the expectation."""
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(raw).__name__}")
        archs = raw.get("architectures") or []
        if raw.get("model_type") != "qwen3" or not isinstance(archs, list) or "DFlashDraftModel" not in archs:
            raise ConfigError(f"{source}: model_type {raw.get('model_type')!r} / architectures {archs!r}, expected "
                              f"'qwen3' / ['DFlashDraftModel'] (a DFlash drafter)")

        def need_int(field, value, lo=1):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ConfigError(f"{source}: {field}: got {value!r}, expected an integer >= {lo}")
            return value

        d = {f: need_int(f, raw.get(f)) for f in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                  "num_attention_heads", "vocab_size", "num_target_layers")}
        d["block_size"] = need_int("block_size", raw.get("block_size"), lo=2)
        d["num_key_value_heads"] = need_int("num_key_value_heads",
                                            raw.get("num_key_value_heads", d["num_attention_heads"]))
        d["head_dim"] = need_int("head_dim", raw.get("head_dim", d["hidden_size"] // d["num_attention_heads"]))
        if d["head_dim"] % 2:
            raise ConfigError(f"{source}: head_dim: got {d['head_dim']}, expected an even number (RoPE pairs)")
        if d["num_attention_heads"] % d["num_key_value_heads"]:
            raise ConfigError(f"{source}: num_key_value_heads: got {d['num_key_value_heads']}, expected a divisor "
                              f"of num_attention_heads ({d['num_attention_heads']})")
        dc = raw.get("dflash_config", {})
        if not isinstance(dc, dict):
            raise ConfigError(f"{source}: dflash_config: got {dc!r}, expected an object")
        ids = dc.get("target_layer_ids")
        if ids is None:
            ids = cls.default_layer_ids(d["num_target_layers"], d["num_hidden_layers"])
        if not isinstance(ids, (list, tuple)) or not ids or any(isinstance(i, bool) or not isinstance(i, int)
                                                                for i in ids):
            raise ConfigError(f"{source}: dflash_config.target_layer_ids: got {ids!r}, expected a non-empty list "
                              f"of integers")
        bad = [i for i in ids if not 0 <= i < d["num_target_layers"]]
        if bad:
            raise ConfigError(f"{source}: dflash_config.target_layer_ids: layer {bad[0]} is outside [0, "
                              f"num_target_layers = {d['num_target_layers']})")
        d["target_layer_ids"] = tuple(ids)
        d["mask_token_id"] = need_int("dflash_config.mask_token_id", dc.get("mask_token_id"), lo=0)
        eps = raw.get("rms_norm_eps", 1e-6)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ConfigError(f"{source}: rms_norm_eps: got {eps!r}, expected a number in (0, 1)")
        d["rms_norm_eps"] = float(eps)
        try:
            d["rope_theta"], d["rope_scaling"] = parse_rope(raw, default_theta=1e6)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        ys = d["rope_scaling"]
        if ys is not None and not (ys["factor"] > 0 and ys["original_max_position_embeddings"] > 0):
            raise ConfigError(f"{source}: rope_scaling: factor {ys['factor']!r} and original_max_position_embeddings "
                              f"{ys['original_max_position_embeddings']!r} must be positive")
        if ys is not None:
            try:
                check_yarn(ys, d["rope_theta"])
            except ConfigError as e:
                raise ConfigError(f"{source}: {e}") from None
        d["max_position_embeddings"] = need_int("max_position_embeddings", raw.get("max_position_embeddings", 40960))
        if d["max_position_embeddings"] > 2 ** 31 - 1:
            raise ConfigError(f"{source}: max_position_embeddings: got {d['max_position_embeddings']}, expected at "
                              f"most 2**31 - 1 (positions are 32-bit)")
        for field, only in (("hidden_act", "silu"), ("attention_bias", False)):    # what this drafter computes
            if field in raw and raw[field] != only:                                # (tie_word_embeddings: moot,
                raise ConfigError(f"{source}: {field}: got {raw[field]!r}, expected {only!r} (the Qwen3-style "
                                  f"layers here implement only that)")              # it has no embedding of its own)
        return cls(**d)

    def check_target(self, tc) -> None:
        """Refuse a drafter that does not fit target config ``tc``, naming the field and both values."""
        pairs = (("hidden_size", self.hidden_size, tc.hidden_size), ("vocab_size", self.vocab_size, tc.vocab_size),
                 ("num_target_layers", self.num_target_layers, tc.num_hidden_layers))
        for field, mine, theirs in pairs:
            if mine != theirs:
                raise ConfigError(f"{field}: the drafter has {mine}, the target has {theirs}")
        if self.mask_token_id >= tc.vocab_size:
            raise ConfigError(f"dflash_config.mask_token_id: {self.mask_token_id} is outside the target's vocabulary "
                              f"[0, {tc.vocab_size})")

    def to_dict(self) -> dict:
        """The z-lab ``config.json`` form."""
        rp = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            ys = self.rope_scaling
            rp = {"rope_type": "yarn", "rope_theta": self.rope_theta, "factor": ys["factor"],
                  "original_max_position_embeddings": ys["original_max_position_embeddings"],
                  "beta_fast": ys["beta_fast"], "beta_slow": ys["beta_slow"], "truncate": ys["truncate"]}
        return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
                "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
                "head_dim": self.head_dim, "vocab_size": self.vocab_size, "rms_norm_eps": self.rms_norm_eps,
                "rope_theta": self.rope_theta, "rope_parameters": rp,
                "max_position_embeddings": self.max_position_embeddings, "hidden_act": "silu",
                "attention_bias": False, "tie_word_embeddings": False, "block_size": self.block_size,
                "num_target_layers": self.num_target_layers,
                "dflash_config": {"target_layer_ids": list(self.target_layer_ids),
                                  "mask_token_id": self.mask_token_id}}


def expected_shapes(cfg: DFlashConfig) -> dict[str, tuple]:
    """Every weight of a DFlash drafter and its shape (HF ``[out, in]`` layout)."""
    H, D, Nq, Nkv, inter = (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads,
                            cfg.intermediate_size)
    shapes = {"fc.weight": (H, cfg.n_features * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (Nq * D, H), p + "self_attn.k_proj.weight": (Nkv * D, H),
                       p + "self_attn.v_proj.weight": (Nkv * D, H), p + "self_attn.o_proj.weight": (H, Nq * D),
                       p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,),
                       p + "mlp.gate_proj.weight": (inter, H), p + "mlp.up_proj.weight": (inter, H),
                       p + "mlp.down_proj.weight": (H, inter), p + "input_layernorm.weight": (H,),
                       p + "post_attention_layernorm.weight": (H,)})
    return shapes


class DFlashDrafter(Drafter):
    """A DFlash drafter bound to its target (module docstring). Build with ``kd.load_drafter`` or
    ``from_state_dict``; ``depth = block_size - 1``; runs on the target's backend."""
    name = "dflash"

    def __init__(self, config: DFlashConfig, target, state: dict[str, np.ndarray]):
        config.check_target(target.config)
        self.config, self.target = config, target
        self.depth = config.block_size - 1
        self.vocab_size = target.config.vocab_size
        self.feature_layers = tuple(config.target_layer_ids)
        self.scale = config.head_dim ** -0.5
        inv_freq, self.rope_amp = rope_tables(config.head_dim, config.rope_theta, config.rope_scaling)
        with backend.use(target.backend):
            dev = backend.asarray
            self.w = {k: dev(np.asarray(state[k], np.float32)) for k in ("fc.weight", "hidden_norm.weight",
                                                                        "norm.weight")}
            self.layers = []
            ctx_kv = []
            for i in range(config.num_hidden_layers):
                p = f"layers.{i}."
                a, m = p + "self_attn.", p + "mlp."
                f32 = lambda k: np.asarray(state[k], np.float32)                       # noqa: E731
                ctx_kv += [f32(a + "k_proj.weight"), f32(a + "v_proj.weight")]
                self.layers.append({
                    "in_norm": dev(f32(p + "input_layernorm.weight")),
                    "post_norm": dev(f32(p + "post_attention_layernorm.weight")),
                    "qkv": dev(np.concatenate([f32(a + "q_proj.weight"), f32(a + "k_proj.weight"),
                                               f32(a + "v_proj.weight")])),              # [(Nq + 2Nkv) D, H]
                    "o": dev(f32(a + "o_proj.weight")),
                    "q_norm": dev(f32(a + "q_norm.weight")), "k_norm": dev(f32(a + "k_norm.weight")),
                    "gu": dev(np.concatenate([f32(m + "gate_proj.weight"), f32(m + "up_proj.weight")])),  # [2I, H]
                    "down": dev(f32(m + "down_proj.weight"))})
                L = self.layers[-1]                    # q and [k; v] as row blocks of qkv (views, no copy)
                nq = config.num_attention_heads * config.head_dim
                L["q"], L["kv"] = L["qkv"][:nq], L["qkv"][nq:]
                L["qkv_n"] = rmsnorm.folded_norm(L["qkv"], L["in_norm"])           # FOLD_NORMS' copies
                L["gu_n"] = rmsnorm.folded_norm(L["gu"], L["post_norm"])
            # every layer's [k; v] rows stacked: the context rows' k/v for all layers in one GEMM (they all read
            # the same ctx); a second copy of those weights, [layers * 2 Nkv D, H] (and one with hidden_norm folded)
            self.ctx_kv = dev(np.concatenate(ctx_kv))
            self.ctx_kv_n = rmsnorm.folded_norm(self.ctx_kv, self.w["hidden_norm.weight"])
            self.inv_freq = dev(inv_freq)
        self._k = self._v = None
        self._block_ids = None               # [B] device: root + MASKs of the captured draft (reserve)
        self.length = 0                      # committed context rows in the draft cache

    @classmethod
    def from_state_dict(cls, config: DFlashConfig, target, state: dict[str, np.ndarray]) -> "DFlashDrafter":
        """Check every key and shape (CheckpointError naming the key) and build."""
        if 3 + 11 * config.num_hidden_layers > len(state):    # a config claiming 2**62 layers: name one missing
            for i in range(config.num_hidden_layers):          # (found within len(state) + 1 steps)
                if f"layers.{i}.self_attn.q_proj.weight" not in state:
                    raise checkpoint.CheckpointError(f"layers.{i}.self_attn.q_proj.weight: missing from the drafter "
                                                     f"checkpoint")
        want = expected_shapes(config)
        for key in sorted(state):
            if key not in want:
                raise checkpoint.CheckpointError(f"{key}: unexpected tensor for this DFlash config")
        for key, shape in want.items():
            if key not in state:
                raise checkpoint.CheckpointError(f"{key}: missing from the drafter checkpoint")
            if tuple(state[key].shape) != shape:
                raise checkpoint.CheckpointError(f"{key}: expected shape {shape}, got {tuple(state[key].shape)}")
        return cls(config, target, state)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The z-lab-layout tensors, float32 host copies."""
        with backend.use(self.target.backend):
            h = lambda a: np.array(backend.to_host(a))                                  # noqa: E731
            sd = {k: h(v) for k, v in self.w.items()}
            for i, L in enumerate(self.layers):
                p = f"layers.{i}."
                a, m = p + "self_attn.", p + "mlp."
                gu, kv = h(L["gu"]), h(L["kv"])
                sd.update({p + "input_layernorm.weight": h(L["in_norm"]),
                           p + "post_attention_layernorm.weight": h(L["post_norm"]),
                           a + "q_proj.weight": h(L["q"]), a + "k_proj.weight": kv[:kv.shape[0] // 2],
                           a + "v_proj.weight": kv[kv.shape[0] // 2:], a + "o_proj.weight": h(L["o"]),
                           a + "q_norm.weight": h(L["q_norm"]), a + "k_norm.weight": h(L["k_norm"]),
                           m + "gate_proj.weight": gu[:gu.shape[0] // 2], m + "up_proj.weight": gu[gu.shape[0] // 2:],
                           m + "down_proj.weight": h(L["down"])})
        return sd

    def save(self, path: str) -> None:
        """Write ``config.json`` + ``model.safetensors`` (fp32) in the z-lab layout, atomically
        (checkpoint.save_dir: all or nothing; a stale weight index and its shards are replaced, other files kept)."""
        state, cfg = self.state_dict(), self.config.to_dict()

        def write(staging):
            checkpoint.save_safetensors(os.path.join(staging, checkpoint.WEIGHTS_NAME), state)
            checkpoint.write_json(os.path.join(staging, checkpoint.CONFIG_NAME), cfg)

        checkpoint.save_dir(path, write)

    # ------------------------------------------------------------------------------------------ the draft cache
    def reset(self) -> None:
        self.length = 0

    def _reserve(self, rows: int) -> None:
        """Grow the draft cache (doubling, rows kept) so that ``rows`` rows fit."""
        cap = 0 if self._k is None else self._k.shape[1]
        if rows <= cap:
            return
        c = self.config
        new = max(rows, 2 * cap, 64)
        k = backend.zeros((c.num_hidden_layers, new, c.num_key_value_heads, c.head_dim), np.float32)
        v = backend.zeros(k.shape, np.float32)
        if self._k is not None:
            k[:, :self.length] = self._k[:, :self.length]
            v[:, :self.length] = self._v[:, :self.length]
        self._k, self._v = k, v                                      # [layers, capacity, Nkv, D] each

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` cache rows, allocated now: a captured round (decode/ddtree_replay.py) must never see
        the cache move."""
        with backend.use(self.target.backend):
            self._reserve(rows)
            if self._block_ids is None:
                self._block_ids = backend.full((self.config.block_size,), self.config.mask_token_id, np.int32)

    def _kv(self, i: int, L: dict, kv, start, norm_rows=None) -> None:
        """Rows ``start .. start + T - 1`` of layer i's cache from the k/v projection ``kv [T, 2 Nkv D]`` (a column
        view of the fused product is fine): k = RoPE(k_norm(k)) at the rows' positions, v as it is, one launch
        (kernels/draft_kv.py). ``start`` may be a device int32 [1] (graph replay: read by the kernel, which also
        adds it to the row offsets for RoPE - no launch to make positions). ``norm_rows``: draft_kv's (a folded
        hidden_norm)."""
        c = self.config
        draft_kv.write_draft_kv(kv, L["k_norm"], c.rms_norm_eps, None, self.inv_freq, self.rope_amp,
                                self._k[i], self._v[i], start, norm_rows=norm_rows)

    def observe(self, features, start: int) -> None:
        """Append the context rows of positions ``start .. start + T - 1`` from target features ``[T, n_feat*H]``."""
        with backend.use(self.target.backend):
            c = self.config
            if start != self.length:
                raise ValueError(f"start: the draft cache holds {self.length} context rows, got features for "
                                 f"positions from {start} (they must follow on without a gap)")
            feats = _checks.array(features, "features", dtype=np.float32, shape=(None, c.n_features * c.hidden_size))
            T = feats.shape[0]
            if T == 0:
                return
            self._reserve(start + T + c.block_size)
            self._context_rows(feats, start)
            self.length = start + T

    def observe_at(self, features, start) -> None:
        """``observe`` with ``start`` a device int32 [1] (no host read: a captured round). All rows of
        ``features [M, n_feat*H]`` are written from start; rows past the accepted ones are overwritten by the next
        round's (the caller keeps the true length). Call ``reserve`` first; ``length`` is not updated."""
        with backend.use(self.target.backend):
            self._context_rows(features, start)

    def _context_rows(self, feats, start) -> None:
        c = self.config
        f = gemm.linear(feats, self.w["fc.weight"])                                          # [T, H]
        if FOLD_NORMS:                                                  # hidden_norm folded: rows scaled in _kv
            kv, norm = gemm.linear(f, self.ctx_kv_n), (f, c.rms_norm_eps)                     # [T, layers 2 Nkv D]
        else:
            kv, norm = gemm.linear(rmsnorm.rmsnorm(f, self.w["hidden_norm.weight"], c.rms_norm_eps), self.ctx_kv), None
        W = 2 * c.num_key_value_heads * c.head_dim
        for i, L in enumerate(self.layers):
            self._kv(i, L, kv[:, i * W:(i + 1) * W], start, norm)                           # [T, 2 Nkv D] view

    # ------------------------------------------------------------------------------------------ the draft
    def draft(self, context, root: int):
        """Logits ``[L, V]`` (device) for depths 1..L after the observed context + ``[root]``."""
        with backend.use(self.target.backend):
            c = self.config
            start, B = self.length, c.block_size
            if len(context) != start:
                raise ValueError(f"context: {len(context)} committed tokens, but the drafter observed features of "
                                 f"{start} (call observe with every committed position first)")
            self._reserve(start + B)
            ids = np.full(B, c.mask_token_id, np.int32)
            ids[0] = root
            return self._block(backend.asarray(ids), start, start + B)

    def draft_at(self, root, start):
        """``draft`` with the root token and the context length as device int32 [1] arrays (no host read: a
        captured round, decode/ddtree_replay.py). Call ``reserve`` first. ``root`` may be ``root_slot()`` itself,
        kept current by the caller: then nothing is copied."""
        with backend.use(self.target.backend):
            ids = self._block_ids                                                            # [B] root, MASK..
            if not backend.same_start(root, ids):
                ids[:1] = root
            return self._block(ids, start, (start, self.config.block_size))               # keys: start + B

    def root_slot(self):
        """The device int32 [1] the captured draft reads its root from (slot 0 of the block's ids; after
        ``reserve``). A caller that writes the root there itself - the replayed round's end kernel does, beside the
        verify's first id - passes it to ``draft_at`` and saves the copy launch a round."""
        if self._block_ids is None:
            raise RuntimeError("root_slot: call reserve first (the block's ids are allocated there)")
        return self._block_ids[:1]

    def _block(self, ids, start, n_keys):
        """The block's forward: ids [B] (device) at positions start .. start + B - 1 attending to ``n_keys`` cache
        rows (an int, or ``(start, B)`` with a device start: the attention kernel adds them)."""
        c = self.config
        B, Nq, D = c.block_size, c.num_attention_heads, c.head_dim
        h = embedding.embed(self.target.w["embed"], ids, check=False)                        # [B, H]
        norm = (h, c.rms_norm_eps) if FOLD_NORMS else None     # the folded norms' row scale: h's rows, each time
        for i, L in enumerate(self.layers):
            if FOLD_NORMS:
                y = gemm.linear(h, L["qkv_n"])                                               # [B, (Nq+2Nkv) D]
            else:
                y = gemm.linear(rmsnorm.rmsnorm(h, L["in_norm"], c.rms_norm_eps), L["qkv"])
            q = draft_kv.draft_qkv(y, L["q_norm"], L["k_norm"], c.rms_norm_eps, None, self.inv_freq, self.rope_amp,
                                   self._k[i], self._v[i], start, norm_rows=norm)   # [B, Nq, D]; the block's
                                                    # k/v rows after the context (uncommitted): one launch
            o = block_attention.block_attention(q, self._k[i], self._v[i], n_keys, self.scale)
            gemm.linear(o.reshape(B, Nq * D), L["o"], out=h, accumulate=True)                # h += o W_o^T
            if FOLD_NORMS:
                gu = gemm.linear(h, L["gu_n"])                                               # [B, 2I]
            else:
                gu = gemm.linear(rmsnorm.rmsnorm(h, L["post_norm"], c.rms_norm_eps), L["gu"])
            gemm.linear(swiglu.swiglu(gu, norm_rows=norm), L["down"], out=h, accumulate=True)
        out = rmsnorm.rmsnorm(h[1:], self.w["norm.weight"], c.rms_norm_eps)                   # depths 1 .. L
        return gemm.linear(out, self.target.w["lm_head"])                                    # [L, V]


def read_config(path: str) -> DFlashConfig:
    """The DFlashConfig of a drafter directory (ConfigError / CheckpointError naming the file and field)."""
    if not os.path.isdir(path):
        raise checkpoint.CheckpointError(f"path: {path} is not a directory (expected a DFlash drafter directory)")
    cfile = os.path.join(path, "config.json")
    try:
        with open(cfile) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise checkpoint.CheckpointError(f"path: {path} has no config.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{cfile}: not valid JSON ({e})") from None
    except IsADirectoryError:
        raise checkpoint.CheckpointError(f"{cfile}: a directory, expected the drafter's config.json") from None
    except RecursionError:
        raise ConfigError(f"{cfile}: not a usable JSON document (nested too deeply)") from None
    return DFlashConfig.from_dict(raw, source=cfile)


def load_drafter(path, target) -> DFlashDrafter:
    """Load a DFlash drafter directory (config.json + safetensors, fp32/bf16/fp16) for ``target`` (the Target whose
    hidden states it reads: ``kd.load_target`` / ``kd.load_default``)."""
    from .target import Target

    if not isinstance(target, Target):
        raise ValueError(f"target: expected the kdtree_numba Target the drafter reads its features from, got "
                         f"{type(target).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise CheckpointError(f"path: expected a DFlash drafter directory, got {path!r}")
    path = os.fspath(path)
    cfg = read_config(path)
    try:
        cfg.check_target(target.config)
    except ConfigError as e:                             # every loader error names the file it read
        raise ConfigError(f"{os.path.join(path, checkpoint.CONFIG_NAME)}: {e}") from None
    state = checkpoint.read_tensors(path)
    try:
        return DFlashDrafter.from_state_dict(cfg, target, state)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None


def random_drafter(target, seed: int = 0, std: float = 0.1, **overrides) -> DFlashDrafter:
    """A random DFlash drafter for ``target`` (tests, tutorials): 1 layer, 4 heads / 2 kv heads of head_dim
    hidden / 4, block 5, feature layers spread over the target; ``overrides`` are DFlashConfig fields."""
    tc = target.config
    L_t = tc.num_hidden_layers
    base = dict(hidden_size=tc.hidden_size, intermediate_size=2 * tc.hidden_size, num_hidden_layers=1,
                num_attention_heads=4, num_key_value_heads=2, head_dim=max(2, tc.hidden_size // 4 // 2 * 2),
                vocab_size=tc.vocab_size, block_size=5, num_target_layers=L_t,
                target_layer_ids=tuple(sorted({0, L_t // 2, max(L_t - 2, 0)})), mask_token_id=tc.vocab_size - 1,
                rope_theta=10000.0)
    cfg = DFlashConfig(**{**base, **overrides})
    rng = np.random.default_rng(seed)
    state = {}
    for key, shape in expected_shapes(cfg).items():
        if key.endswith("norm.weight") or key.endswith("layernorm.weight"):
            state[key] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            state[key] = (std * rng.standard_normal(shape)).astype(np.float32)
    return DFlashDrafter.from_state_dict(cfg, target, state)
