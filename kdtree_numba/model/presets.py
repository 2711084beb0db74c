"""Tiny random DeepSeek-V3-family targets for tests and tutorials, and the loader of the embedded trained pair.

``tiny_target(seed, **overrides)`` builds any TargetConfig (defaults below: vocab 256, hidden 64, 4 heads, MLA
with q_lora, 3 layers of which 1 dense, 8 routed experts top-2 in 2 groups + 1 shared) with random weights that
give non-trivial, peaked logits: N(0, 0.1) matrices like HF's initializer_range=0.1, norms near 1, a non-zero
e_score_correction_bias, and a wider lm_head (N(0, 0.5)) so next-token distributions have a clear favourite.
"""
from __future__ import annotations

import os

import numpy as np

from ..config import TargetConfig
from . import checkpoint
from .target import Target

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
            routed_scaling_factor=2.5, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, v_head_dim=16,
            qk_nope_head_dim=16, n_group=2, topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1,
            max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10000.0, bos_token_id=0, eos_token_id=1)


def tiny_config(**overrides) -> TargetConfig:
    unknown = set(overrides) - set(TargetConfig.__dataclass_fields__)
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]}: not a TargetConfig field")
    return TargetConfig(**{**TINY, **overrides}).validate()


def random_state_dict(cfg: TargetConfig, seed: int = 0, std: float = 0.1, head_std: float = 0.5):
    """HF-layout random float32 tensors for ``cfg``."""
    rng = np.random.default_rng(seed)
    state = {}
    for key, shape in checkpoint.expected_shapes(cfg).items():
        if key.endswith("norm.weight") or key.endswith("layernorm.weight"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif key.endswith("e_score_correction_bias"):
            w = 0.05 * rng.standard_normal(shape)
        elif key == "lm_head.weight":
            w = head_std * rng.standard_normal(shape)
        else:
            w = std * rng.standard_normal(shape)
        state[key] = w.astype(np.float32)
    return state


def tiny_target(seed: int = 0, **overrides) -> Target:
    """A random tiny target of any DeepseekV3 config (``overrides`` are TargetConfig fields)."""
    cfg = tiny_config(**overrides)
    return Target.from_state_dict(cfg, random_state_dict(cfg, seed))


# ------------------------------------------------------------------------------------------------ the default pair
DEFAULT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "default_model")


def load_default():
    """The embedded default pair ``(target, drafter)``: a DeepSeek-V3-architecture code model and its DFlash
    drafter, trained by ``python -m kdtree_numba.train`` (default_model/MODEL_CARD.md: data, steps, how to rebuild).
    ``target.tokenizer`` encodes and decodes text."""
    from .dflash import load_drafter

    for part in ("target", "drafter"):
        if not os.path.isfile(os.path.join(DEFAULT_DIR, part, "config.json")):
            raise FileNotFoundError(f"default model: {os.path.join(DEFAULT_DIR, part)} is missing (a broken install?"
                                    f" reinstall kdtree-numba)")
    from .. import load_target

    target = load_target(os.path.join(DEFAULT_DIR, "target"))
    return target, load_drafter(os.path.join(DEFAULT_DIR, "drafter"), target)


def describe(target: Target) -> str:
    c = target.config
    moe = sum(c.is_moe_layer(i) for i in range(c.num_hidden_layers))
    return (f"{c.num_hidden_layers} layers ({moe} MoE, {c.n_routed_experts} experts top-{c.num_experts_per_tok}), "
            f"hidden {c.hidden_size}, {c.num_attention_heads} heads, latent {c.kv_lora_rank}+{c.qk_rope_head_dim}, "
            f"vocab {c.vocab_size}")
