"""TargetConfig: every DeepseekV3 field the engine uses, parsed from an HF ``config.json`` in its known forms.

Forms accepted:
- transformers v5 ``save_pretrained``: ``rope_parameters: {rope_type, rope_theta, factor, ...}`` (its ``head_dim``
  equals qk_rope_head_dim and is never used as the attention head size);
- hub checkpoints: top-level ``rope_theta`` + ``rope_scaling: {type: "yarn", ...}`` or none;
- Kimi-K2.5 style: the text config nested under ``text_config`` (weights prefixed ``language_model.``).
Inconsistent or unsupported configs raise ``ConfigError`` naming the field and the value.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import numpy as np

from .kernels import rope as _rope

SUPPORTED_MODEL_TYPES = ("deepseek_v3", "kimi_k2")
SUPPORTED_ARCHITECTURES = ("DeepseekV3ForCausalLM",)


class ConfigError(ValueError):
    """A config field is missing, inconsistent or unsupported."""


@dataclasses.dataclass
class TargetConfig:
    vocab_size: int = 129280
    hidden_size: int = 7168
    intermediate_size: int = 18432
    moe_intermediate_size: int = 2048
    num_hidden_layers: int = 61
    num_attention_heads: int = 128
    num_key_value_heads: int = 128
    n_shared_experts: int = 1
    n_routed_experts: int = 256
    routed_scaling_factor: float = 2.5
    kv_lora_rank: int = 512
    q_lora_rank: int | None = 1536
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    qk_nope_head_dim: int = 128
    n_group: int = 8
    topk_group: int = 4
    num_experts_per_tok: int = 8
    first_k_dense_replace: int = 3
    norm_topk_prob: bool = True
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    #: None (plain RoPE) or a normalised YaRN dict: factor, original_max_position_embeddings, beta_fast, beta_slow,
    #: mscale, mscale_all_dim, truncate, attention_factor (None = derived as HF does)
    rope_scaling: dict | None = None
    rope_interleave: bool = True
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    moe_layer_freq: int = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list | None = 1
    #: "" for the plain layout, "language_model." for Kimi-K2.5-style checkpoints
    weight_prefix: str = ""

    # ---------------------------------------------------------------------------------------------- derived
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Width of one cache row: [normed c_kv (kv_lora_rank) ; roped k_rope (qk_rope_head_dim)]."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def is_moe_layer(self, layer: int) -> bool:
        return self.n_routed_experts > 0 and layer >= self.first_k_dense_replace

    @property
    def softmax_scale(self) -> float:
        """(P + R)^-0.5 * m^2, m = 0.1 * mscale_all_dim * ln(factor) + 1 under YaRN (NOT 576^-0.5)."""
        scale = self.qk_head_dim ** -0.5
        ys = self.rope_scaling
        if ys is not None and ys.get("mscale_all_dim"):
            m = _rope.yarn_mscale(ys["factor"], ys["mscale_all_dim"])
            scale *= m * m
        return scale

    def rope_tables(self) -> tuple[np.ndarray, float]:
        """(inv_freq [R/2] float32, cos/sin amplitude) for this config, as HF computes them."""
        return rope_tables(self.qk_rope_head_dim, self.rope_theta, self.rope_scaling)

    # ---------------------------------------------------------------------------------------------- validation
    def validate(self) -> "TargetConfig":
        def need(cond, field, value, expected):
            if not cond:
                raise ConfigError(f"{field}: got {value!r}, expected {expected}")

        for f in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank",
                  "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim"):
            v = getattr(self, f)
            need(isinstance(v, int) and not isinstance(v, bool) and v > 0, f, v, "a positive integer")
        need(self.q_lora_rank is None or (isinstance(self.q_lora_rank, int) and self.q_lora_rank > 0),
             "q_lora_rank", self.q_lora_rank, "null or a positive integer")
        need(self.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim", self.qk_rope_head_dim, "an even number")
        need(self.hidden_act == "silu", "hidden_act", self.hidden_act, "'silu' (the only activation supported)")
        need(not self.attention_bias, "attention_bias", self.attention_bias, "false (biases are not supported)")
        need(self.rms_norm_eps > 0, "rms_norm_eps", self.rms_norm_eps, "a positive number")
        need(self.rope_theta > 0, "rope_theta", self.rope_theta, "a positive number")
        need(0 <= self.first_k_dense_replace, "first_k_dense_replace", self.first_k_dense_replace, ">= 0")
        need(self.moe_layer_freq == 1, "moe_layer_freq", self.moe_layer_freq, "1 (every known checkpoint)")
        dense_layers = min(self.first_k_dense_replace, self.num_hidden_layers)
        if dense_layers:
            need(self.intermediate_size > 0, "intermediate_size", self.intermediate_size, "a positive integer")
        if dense_layers < self.num_hidden_layers:
            E = self.n_routed_experts
            need(E > 0, "n_routed_experts", E, "a positive integer (MoE layers exist)")
            need(self.moe_intermediate_size > 0, "moe_intermediate_size", self.moe_intermediate_size,
                 "a positive integer")
            need(self.n_shared_experts >= 0, "n_shared_experts", self.n_shared_experts, ">= 0")
            need(self.n_group >= 1 and E % self.n_group == 0, "n_group", self.n_group,
                 f"a divisor of n_routed_experts ({E})")
            need(1 <= self.topk_group <= self.n_group, "topk_group", self.topk_group,
                 f"between 1 and n_group ({self.n_group})")
            need(self.topk_group == self.n_group or E // self.n_group >= 2, "n_group", self.n_group,
                 "at least 2 experts per group when routing is group-limited")
            need(1 <= self.num_experts_per_tok <= E, "num_experts_per_tok", self.num_experts_per_tok,
                 f"between 1 and n_routed_experts ({E})")
            kept = self.topk_group * (E // self.n_group)
            need(self.num_experts_per_tok <= kept, "num_experts_per_tok", self.num_experts_per_tok,
                 f"<= the experts in the kept groups ({kept})")
        ys = self.rope_scaling
        if ys is not None:
            need(ys["factor"] > 0, "rope_scaling.factor", ys["factor"], "a positive number")
            need(ys["original_max_position_embeddings"] > 0, "rope_scaling.original_max_position_embeddings",
                 ys["original_max_position_embeddings"], "a positive integer")
        return self

    # ---------------------------------------------------------------------------------------------- parsing
    @classmethod
    def from_dict(cls, raw: dict) -> "TargetConfig":
        """Parse an HF config dict (any of the forms in the module docstring)."""
        if not isinstance(raw, dict):
            raise ConfigError(f"config: expected a JSON object, got {type(raw).__name__}")
        prefix = ""
        d = raw
        if isinstance(raw.get("text_config"), dict):
            d = dict(raw["text_config"])
            prefix = "language_model."
        model_type = d.get("model_type", raw.get("model_type"))
        archs = d.get("architectures") or raw.get("architectures") or []
        if model_type not in SUPPORTED_MODEL_TYPES and not any(a in SUPPORTED_ARCHITECTURES for a in archs):
            raise ConfigError(f"model_type: got {model_type!r} (architectures {archs}), expected one of "
                              f"{', '.join(SUPPORTED_MODEL_TYPES)} (the DeepSeek-V3 family)")
        if d.get("topk_method", "noaux_tc") not in ("noaux_tc", None):
            raise ConfigError(f"topk_method: got {d['topk_method']!r}, expected 'noaux_tc'")
        if d.get("scoring_func", "sigmoid") not in ("sigmoid", None):
            raise ConfigError(f"scoring_func: got {d['scoring_func']!r}, expected 'sigmoid'")

        names = {f.name for f in dataclasses.fields(cls)} - {"rope_scaling", "rope_theta", "weight_prefix"}
        kw: dict[str, Any] = {k: d[k] for k in names if k in d and (d[k] is not None or k == "q_lora_rank")}
        if kw.get("num_key_value_heads") is None:
            kw["num_key_value_heads"] = kw.get("num_attention_heads", cls.num_attention_heads)
        theta, scaling = parse_rope(d)
        cfg = cls(**kw, rope_theta=theta, rope_scaling=scaling, weight_prefix=prefix)
        if "max_position_embeddings" not in d:
            cfg.max_position_embeddings = TargetConfig.max_position_embeddings
        return cfg.validate()

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "TargetConfig":
        try:
            with open(path) as f:
                raw = json.load(f)
        except FileNotFoundError:
            raise ConfigError(f"config: {os.fspath(path)} does not exist") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"config: {os.fspath(path)} is not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(raw)

    def to_hf_dict(self) -> dict:
        """The transformers-v5 form (``rope_parameters``), loadable by DeepseekV3Config."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name not in ("rope_scaling", "rope_theta", "weight_prefix")}
        rp: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            ys = self.rope_scaling
            rp = {"rope_type": "yarn", "rope_theta": self.rope_theta, "factor": ys["factor"],
                  "original_max_position_embeddings": ys["original_max_position_embeddings"],
                  "beta_fast": ys["beta_fast"], "beta_slow": ys["beta_slow"], "truncate": ys["truncate"]}
            for k in ("mscale", "mscale_all_dim", "attention_factor"):
                if ys.get(k) is not None:
                    rp[k] = ys[k]
        d.update(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", rope_parameters=rp,
                 head_dim=self.qk_rope_head_dim, qk_head_dim=self.qk_head_dim, topk_method="noaux_tc",
                 scoring_func="sigmoid")
        return d

    def replace(self, **changes) -> "TargetConfig":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"{sorted(unknown)[0]}: not a TargetConfig field")
        return dataclasses.replace(self, **changes).validate()


def rope_tables(dim: int, theta: float, scaling: dict | None) -> tuple[np.ndarray, float]:
    """(inv_freq [dim/2] float32, cos/sin amplitude) of plain RoPE (``scaling`` None) or of a normalised YaRN dict
    (as ``parse_rope`` returns it), as HF computes them; shared by the target and the DFlash drafter."""
    if scaling is None:
        return _rope.rope_inv_freq(dim, theta), 1.0
    ys = scaling
    inv = _rope.yarn_inv_freq(dim, theta, ys["factor"], ys["original_max_position_embeddings"],
                              ys["beta_fast"], ys["beta_slow"], ys["truncate"])
    amp = ys.get("attention_factor")
    if amp is None:
        if ys.get("mscale") and ys.get("mscale_all_dim"):
            amp = _rope.yarn_mscale(ys["factor"], ys["mscale"]) / _rope.yarn_mscale(ys["factor"], ys["mscale_all_dim"])
        else:
            amp = _rope.yarn_mscale(ys["factor"])
    return inv, float(amp)


def parse_rope(d: dict) -> tuple[float, dict | None]:
    """(rope_theta, normalised YaRN dict or None) from an HF config dict, in either form (module docstring)."""
    rp = d.get("rope_parameters")
    rs = d.get("rope_scaling")
    if isinstance(rp, dict) and rp:
        params = dict(rp)
        theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
        kind = params.get("rope_type", params.get("type", "default"))
    elif isinstance(rs, dict) and rs:
        params = dict(rs)
        theta = d.get("rope_theta", 10000.0)
        kind = params.get("rope_type", params.get("type", "default"))
    else:
        return float(d.get("rope_theta", 10000.0)), None
    if kind == "default":
        return float(theta), None
    if kind != "yarn":
        raise ConfigError(f"rope_scaling.type: got {kind!r}, expected 'yarn' or none (plain RoPE)")
    orig = params.get("original_max_position_embeddings", d.get("max_position_embeddings", 4096))
    factor = params.get("factor")
    if factor is None:
        factor = d.get("max_position_embeddings", 4096) / orig
    out = {
        "factor": float(factor),
        "original_max_position_embeddings": int(orig),
        "beta_fast": float(params.get("beta_fast") or 32.0),
        "beta_slow": float(params.get("beta_slow") or 1.0),
        "mscale": params.get("mscale"),
        "mscale_all_dim": params.get("mscale_all_dim"),
        "truncate": bool(params.get("truncate", True)),
        "attention_factor": params.get("attention_factor"),
    }
    if not math.isfinite(out["factor"]):
        raise ConfigError(f"rope_scaling.factor: got {factor!r}, expected a finite number")
    return float(theta), out
