"""Tiny random DeepseekV3ForCausalLM models built with transformers (the peer reference nobody here wrote)."""
import numpy as np

torch = None
transformers = None
try:
    import torch
    import transformers
except ImportError:  # the `ref` extra is not installed
    pass

BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, kv_lora_rank=16,
            q_lora_rank=24, qk_rope_head_dim=8, v_head_dim=12, qk_nope_head_dim=12, n_group=4, topk_group=2,
            num_experts_per_tok=2, first_k_dense_replace=1, initializer_range=0.1, max_position_embeddings=512,
            routed_scaling_factor=2.5)


def yarn(theta=10000.0, factor=4.0, orig=128, beta_fast=32, mscale=1.0, mscale_all_dim=1.0):
    return {"rope_type": "yarn", "rope_theta": theta, "factor": factor, "original_max_position_embeddings": orig,
            "beta_fast": beta_fast, "beta_slow": 1, "mscale": mscale, "mscale_all_dim": mscale_all_dim}


VARIANTS = {
    "plain": dict(),
    "yarn": dict(rope_parameters=yarn(), max_position_embeddings=512),
    "q_lora_null": dict(q_lora_rank=None),
    "groups_bias": dict(n_group=4, topk_group=2, num_experts_per_tok=3),
    "dense2_shared2": dict(first_k_dense_replace=2, n_shared_experts=2, num_hidden_layers=4),
    "no_shared": dict(n_shared_experts=0),
    "kimi_like": dict(n_group=1, topk_group=1, rms_norm_eps=1e-5, routed_scaling_factor=2.827,
                      rope_parameters=yarn(theta=50000.0, factor=32.0, orig=16, beta_fast=1)),
    "yarn_no_mscale": dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
                                            "original_max_position_embeddings": 64}),
}


def make(variant="plain", seed=0, **extra):
    """A random HF model of a variant; norms and the router bias are randomised (HF starts them at 1 and 0)."""
    kw = {**BASE, **VARIANTS[variant], **extra}
    cfg = transformers.DeepseekV3Config(**kw)
    torch.manual_seed(seed)
    model = transformers.DeepseekV3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.e_score_correction_bias.normal_(0, 0.05)
    return model


def load_f64(path):
    return transformers.DeepseekV3ForCausalLM.from_pretrained(
        path, dtype=torch.float64, attn_implementation="eager", experts_implementation="eager").eval()


def logits_f64(model64, ids) -> np.ndarray:
    with torch.no_grad():
        return model64(torch.tensor(np.asarray(ids))[None]).logits[0].numpy()


def greedy_f64(model64, ids, n) -> list[int]:
    with torch.no_grad():
        out = model64.generate(torch.tensor(np.asarray(ids))[None], max_new_tokens=n, do_sample=False,
                               min_new_tokens=n, pad_token_id=0, eos_token_id=None)
    return out[0, len(ids):].tolist()
