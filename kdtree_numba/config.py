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

from . import rope_frequencies as _rope

SUPPORTED_MODEL_TYPES = ("deepseek_v3", "kimi_k2")
SUPPORTED_ARCHITECTURES = ("DeepseekV3ForCausalLM",)
FAMILY_CLASS_PREFIXES = ("deepseekv3", "kimi")   # an ``architectures`` list names one of these (lowercase prefix)


class ConfigError(ValueError):
    """A config field is missing, inconsistent or unsupported."""


#: positions are int32 on every backend
MAX_POSITION = 2 ** 31 - 1


def is_int(v) -> bool:
    """A JSON integer (a bool is not one); shared by the config, checkpoint and trace validators."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v) -> bool:
    """A JSON number (a bool is not one)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def short_repr(v, limit: int = 80) -> str:
    """repr of a config value, cut to ``limit`` characters (a field can hold a whole JSON document)."""
    r = repr(v)
    return r if len(r) <= limit else r[:limit - 3] + "..."


def check_yarn(ys: dict, theta) -> None:
    """The normalised YaRN dict (``parse_rope``'s form) holds usable values."""
    def need(cond, field, value, expected):
        if not cond:
            raise ConfigError(f"rope_scaling.{field}: got {short_repr(value)}, expected {expected}")

    def finite(v):
        return is_num(v) and math.isfinite(v)

    f = ys.get("factor")
    need(finite(f) and f > 0, "factor", f, "a finite positive number")
    o = ys.get("original_max_position_embeddings")
    need(is_int(o) and 0 < o <= MAX_POSITION, "original_max_position_embeddings", o,
         f"a positive integer <= {MAX_POSITION}")
    for k in ("beta_fast", "beta_slow"):
        need(finite(ys.get(k)) and ys.get(k) > 0, k, ys.get(k), "a finite positive number")
    for k in ("mscale", "mscale_all_dim"):
        need(ys.get(k) is None or finite(ys.get(k)), k, ys.get(k), "null or a finite number")
    a = ys.get("attention_factor")
    need(a is None or (finite(a) and a > 0), "attention_factor", a, "null or a finite positive number")
    need(isinstance(ys.get("truncate", True), bool), "truncate", ys.get("truncate"), "true or false")
    for k in ("beta_fast", "beta_slow"):      # the ramp takes ln(original / (2 pi beta)): it must be finite
        r = o / (ys[k] * 2 * math.pi)
        need(0 < r < math.inf, k, ys[k], f"a rotation count whose wavelength fits a finite ramp for "
                                         f"original_max_position_embeddings {o}")
    if not (is_num(theta) and theta > 1):
        raise ConfigError(f"rope_theta: got {short_repr(theta)}, expected a number > 1 with YaRN scaling (its ramp "
                          f"divides by ln(rope_theta))")


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
    #: DeepSeek-V3's multi-token-prediction layers, stored as ``model.layers.{num_hidden_layers + i}``; the engine
    #: does not run them, the loader skips them (and says so)
    num_nextn_predict_layers: int = 0
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
        """Check every field's type and value (a config read from JSON can hold anything): ConfigError naming the
        field, the value and what was expected. Types first, then the relations between fields."""
        def need(cond, field, value, expected):
            if not cond:
                raise ConfigError(f"{field}: got {short_repr(value)}, expected {expected}")

        for f in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim"):
            v = getattr(self, f)
            need(is_int(v) and v > 0, f, v, "a positive integer")
        need(is_int(self.max_position_embeddings) and 0 < self.max_position_embeddings <= MAX_POSITION,
             "max_position_embeddings", self.max_position_embeddings, f"a positive integer <= {MAX_POSITION}")
        for f in ("intermediate_size", "moe_intermediate_size", "n_shared_experts", "n_routed_experts", "n_group",
                  "topk_group", "num_experts_per_tok", "first_k_dense_replace", "num_nextn_predict_layers"):
            v = getattr(self, f)
            need(is_int(v) and v >= 0, f, v, "an integer >= 0")
        need(self.q_lora_rank is None or (is_int(self.q_lora_rank) and self.q_lora_rank > 0),
             "q_lora_rank", self.q_lora_rank, "null or a positive integer")
        need(self.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim", self.qk_rope_head_dim, "an even number")
        need(self.hidden_act == "silu", "hidden_act", self.hidden_act, "'silu' (the only activation supported)")
        for f in ("norm_topk_prob", "rope_interleave", "attention_bias", "tie_word_embeddings"):
            v = getattr(self, f)
            need(isinstance(v, bool), f, v, "true or false")
        need(not self.attention_bias, "attention_bias", self.attention_bias, "false (biases are not supported)")
        need(is_num(self.rms_norm_eps) and math.isfinite(self.rms_norm_eps) and 0 < self.rms_norm_eps < 1,
             "rms_norm_eps", self.rms_norm_eps, "a number in (0, 1)")
        need(is_num(self.rope_theta) and math.isfinite(self.rope_theta) and self.rope_theta > 0, "rope_theta",
             self.rope_theta, "a finite positive number")
        need(is_num(self.routed_scaling_factor) and math.isfinite(self.routed_scaling_factor)
             and self.routed_scaling_factor > 0, "routed_scaling_factor", self.routed_scaling_factor,
             "a finite positive number")
        need(is_int(self.moe_layer_freq) and self.moe_layer_freq == 1, "moe_layer_freq", self.moe_layer_freq,
             "1 (every known checkpoint)")
        need(isinstance(self.weight_prefix, str), "weight_prefix", self.weight_prefix, "a string")
        V = self.vocab_size
        need(self.bos_token_id is None or (is_int(self.bos_token_id) and 0 <= self.bos_token_id < V),
             "bos_token_id", self.bos_token_id, f"null or a token id in [0, vocab_size = {V})")
        eos = self.eos_token_id
        eos_list = eos if isinstance(eos, list) else [] if eos is None else [eos]
        need(isinstance(eos, (list, type(None))) or is_int(eos), "eos_token_id", eos,
             "null, a token id or a list of token ids")
        need(all(is_int(t) and 0 <= t < V for t in eos_list), "eos_token_id", eos,
             f"token ids in [0, vocab_size = {V})")
        dense_layers = min(self.first_k_dense_replace, self.num_hidden_layers)
        if dense_layers:
            need(self.intermediate_size > 0, "intermediate_size", self.intermediate_size, "a positive integer")
        if dense_layers < self.num_hidden_layers:
            E = self.n_routed_experts
            need(E > 0, "n_routed_experts", E, "a positive integer (MoE layers exist)")
            need(self.moe_intermediate_size > 0, "moe_intermediate_size", self.moe_intermediate_size,
                 "a positive integer")
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
            need(isinstance(ys, dict), "rope_scaling", ys, "null or a normalised YaRN dict (config.parse_rope)")
            check_yarn(ys, self.rope_theta)
        return self

    # ---------------------------------------------------------------------------------------------- parsing
    @classmethod
    def from_dict(cls, raw: dict, source: str | None = None) -> "TargetConfig":
        """Parse and validate an HF config dict (any of the forms in the module docstring). ``source`` (the file)
        prefixes every error message."""
        try:
            return cls._from_dict(raw)
        except ConfigError as e:
            if source is None:
                raise
            raise ConfigError(f"{source}: {e}") from None

    @classmethod
    def _from_dict(cls, raw: dict) -> "TargetConfig":
        if not isinstance(raw, dict):
            raise ConfigError(f"config: expected a JSON object, got {type(raw).__name__}")
        prefix = ""
        d = raw
        text = raw.get("text_config")
        if text is not None:
            if not isinstance(text, dict):
                raise ConfigError(f"text_config: got {short_repr(text)}, expected an object (the nested text model's "
                                  f"config) or null")
            d = dict(text)
            prefix = "language_model."
        model_type = d.get("model_type", raw.get("model_type"))
        archs = d.get("architectures") or raw.get("architectures") or []
        if not isinstance(archs, list):
            raise ConfigError(f"architectures: got {short_repr(archs)}, expected a list of class names")
        if model_type not in SUPPORTED_MODEL_TYPES and not any(a in SUPPORTED_ARCHITECTURES for a in archs):
            raise ConfigError(f"model_type: got {short_repr(model_type)} (architectures {short_repr(archs)}), expected one "
                              f"of {', '.join(SUPPORTED_MODEL_TYPES)} (the DeepSeek-V3 family)")
        if archs and not any(isinstance(a, str) and a.lower().startswith(FAMILY_CLASS_PREFIXES) for a in archs):
            raise ConfigError(f"architectures: got {short_repr(archs)} beside model_type {short_repr(model_type)}, "
                              f"expected a DeepSeek-V3-family class (DeepseekV3ForCausalLM, or a Kimi wrapper)")
        if d.get("topk_method", "noaux_tc") not in ("noaux_tc", None):
            raise ConfigError(f"topk_method: got {short_repr(d['topk_method'])}, expected 'noaux_tc'")
        if d.get("scoring_func", "sigmoid") not in ("sigmoid", None):
            raise ConfigError(f"scoring_func: got {short_repr(d['scoring_func'])}, expected 'sigmoid'")

        names = {f.name for f in dataclasses.fields(cls)} - {"rope_scaling", "rope_theta", "weight_prefix"}
        kw: dict[str, Any] = {k: d[k] for k in names if k in d and (d[k] is not None or k == "q_lora_rank")}
        if kw.get("num_key_value_heads") is None:
            kw["num_key_value_heads"] = kw.get("num_attention_heads", cls.num_attention_heads)
        theta, scaling = parse_rope(d)
        cfg = cls(**kw, rope_theta=theta, rope_scaling=scaling, weight_prefix=prefix)
        if "max_position_embeddings" not in d:
            cfg.max_position_embeddings = TargetConfig.max_position_embeddings
        cfg.validate()
        if d.get("head_dim") is not None and d["head_dim"] != cfg.qk_rope_head_dim:
            raise ConfigError(f"head_dim: got {short_repr(d['head_dim'])}, expected qk_rope_head_dim "
                              f"({cfg.qk_rope_head_dim}) or none: MLA's head sizes are qk_nope_head_dim / "
                              f"qk_rope_head_dim / v_head_dim, and transformers writes head_dim = qk_rope_head_dim")
        return cfg

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "TargetConfig":
        """Read and validate a ``config.json``; every error names the file."""
        return cls.from_dict(read_json(path, "config"), source=os.fspath(path))

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


def read_json(path, what: str = "config"):
    """The JSON document in ``path`` (ConfigError naming the file when it is missing or not JSON)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{what}: {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{what}: {path} is a directory, expected a JSON file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what}: {path} is not valid JSON (not UTF-8 text: {e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what}: {path} is not valid JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise ConfigError(f"{what}: {path} is not a usable JSON document (nested too deeply)") from None


def parse_rope(d: dict, default_theta: float = 10000.0) -> tuple[float, dict | None]:
    """(rope_theta, normalised YaRN dict or None) from an HF config dict, in either form (module docstring);
    ``default_theta`` where the dict names none. ConfigError naming the field when a rope field has the wrong type
    or is not finite, or when ``rope_parameters`` and the older ``rope_scaling`` / top-level ``rope_theta`` are both
    present and describe different RoPE (the first used to win silently); ``check_yarn`` checks the YaRN values'
    ranges."""
    rp = d.get("rope_parameters")
    if isinstance(rp, dict) and rp and (d.get("rope_scaling") or "rope_theta" in d):
        new = _parse_rope({k: v for k, v in d.items() if k != "rope_scaling"}, default_theta)
        old = _parse_rope({k: v for k, v in d.items() if k != "rope_parameters"}, default_theta)
        if "rope_theta" in rp and "rope_theta" in d and rp["rope_theta"] != d["rope_theta"]:
            raise ConfigError(f"rope_theta: got {short_repr(d['rope_theta'])} beside rope_parameters.rope_theta "
                              f"{short_repr(rp['rope_theta'])}, expected one value")
        if d.get("rope_scaling") and new[1] != old[1]:      # the scaling; theta is compared above when both say it
            raise ConfigError(f"rope_parameters and rope_scaling describe different RoPE ({short_repr(rp)} / "
                              f"{short_repr(d['rope_scaling'])}), expected one of them or the same")
        return new
    return _parse_rope(d, default_theta)


def _parse_rope(d: dict, default_theta: float) -> tuple[float, dict | None]:
    """parse_rope for a dict whose rope forms do not conflict."""
    def number(field, v, positive=True):
        if not is_num(v) or not math.isfinite(v) or (positive and v <= 0):
            raise ConfigError(f"{field}: got {short_repr(v)}, expected a finite {'positive ' if positive else ''}number")
        return float(v)

    rp = d.get("rope_parameters")
    rs = d.get("rope_scaling")
    for field, v in (("rope_parameters", rp), ("rope_scaling", rs)):
        if v is not None and not isinstance(v, dict):
            raise ConfigError(f"{field}: got {short_repr(v)}, expected an object or null")
    if rp:
        params, field = dict(rp), "rope_parameters"
        theta = params.get("rope_theta", d.get("rope_theta", default_theta))
    elif rs:
        params, field = dict(rs), "rope_scaling"
        theta = d.get("rope_theta", default_theta)
    else:
        return number("rope_theta", d.get("rope_theta", default_theta)), None
    theta = number("rope_theta", theta)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "yarn":
        raise ConfigError(f"rope_scaling.type: got {short_repr(kind)}, expected 'yarn' or none (plain RoPE)")
    orig = params.get("original_max_position_embeddings", d.get("max_position_embeddings", 4096))
    if not is_int(orig) or not 0 < orig <= MAX_POSITION:
        raise ConfigError(f"{field}.original_max_position_embeddings: got {short_repr(orig)}, expected a positive "
                          f"integer <= {MAX_POSITION}")
    factor = params.get("factor")
    if factor is None:
        mpe = d.get("max_position_embeddings", 4096)
        if not is_int(mpe) or mpe <= 0:
            raise ConfigError(f"max_position_embeddings: got {short_repr(mpe)}, expected a positive integer (the YaRN "
                              f"factor is derived from it)")
        factor = mpe / orig
    out = {
        "factor": number(f"{field}.factor", factor, positive=False),
        "original_max_position_embeddings": orig,
        "beta_fast": number(f"{field}.beta_fast", params.get("beta_fast") or 32.0, positive=False),
        "beta_slow": number(f"{field}.beta_slow", params.get("beta_slow") or 1.0, positive=False),
        "mscale": params.get("mscale"),
        "mscale_all_dim": params.get("mscale_all_dim"),
        "truncate": params.get("truncate", True),
        "attention_factor": params.get("attention_factor"),
    }
    for k in ("mscale", "mscale_all_dim"):
        if out[k] is not None:
            out[k] = number(f"{field}.{k}", out[k], positive=False)
    if out["attention_factor"] is not None:
        out["attention_factor"] = number(f"{field}.attention_factor", out["attention_factor"], positive=False)
    if not isinstance(out["truncate"], bool):
        raise ConfigError(f"{field}.truncate: got {short_repr(out['truncate'])}, expected true or false")
    return theta, out           # the values' ranges: check_yarn (TargetConfig.validate, DFlashConfig.from_dict)
