"""Tutorial 06: the whole target model against HF transformers' DeepseekV3ForCausalLM (the peer reference).

Run:  KDTREE_BACKEND=numpy python tutorials/06_target_vs_transformers.py [--size small|large] [--out DIR]
      (KDTREE_BACKEND=sim also works: the comparisons run on the NumPy references, plus one short forward on the
      simulator; needs torch and transformers, otherwise prints SKIP and exits 0)
"""
# %% [markdown]
# # 06 - The target model vs transformers
#
# Tutorials 01-05 checked each stage against a NumPy reference *we* wrote. A reference written by the same people
# can share their misunderstandings, so the whole model is also checked against a reference nobody here wrote:
# transformers' `DeepseekV3ForCausalLM`, on the CPU, in float64.
#
# The recipe for a peer reference:
#
# 1. a tiny `DeepseekV3Config` (any variant: q_lora or not, groups, dense layers, YaRN) with
#    `initializer_range=0.1` so the logits are not all ~0, and a **random** `e_score_correction_bias` (HF starts
#    it at zero, which would hide a bias bug);
# 2. `save_pretrained(dir)` writes the hub layout (config.json + model.safetensors);
# 3. the peer loads it with `dtype=torch.float64, attn_implementation="eager", experts_implementation="eager"`;
# 4. kdtree_numba loads the same directory with `kd.load_target(dir)`: it parses the config, permutes the
#    interleaved rope rows to NeoX order (tutorial 02), splits `kv_b_proj` into W_UK / W_UV (tutorial 05), fuses
#    gate/up (tutorial 03) and stacks the experts (tutorial 04);
# 5. compare `target.logits(ids)` (float32) with HF's logits: max |diff| <= 1e-4, and the greedy tokens exactly.
#
# The model is `embed -> [RMSNorm -> MLA -> +res -> RMSNorm -> MLP or MoE -> +res] x layers -> RMSNorm -> lm_head`.

# %%
import os
import sys
import tempfile

import numpy as np

from _common import banner, check, finish, parse_args, save_figure, section, stopwatch, table

import kdtree_numba as kd

args = parse_args(__doc__)
banner("Tutorial 06 - the target model vs HF transformers", args)
LARGE = args.size == "large"

try:
    import torch
    import transformers
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
except ImportError as e:                                      # the peer is optional: say so and stop cleanly
    print(f"SKIP: torch/transformers not importable ({e}); install the 'ref' extra to run this tutorial")
    sys.exit(0)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
print(f"torch {torch.__version__}, transformers {transformers.__version__}")
PROC = kd.backend.process_name

# %% [markdown]
# ## Build two tiny peers
#
# A: q_lora, 2 expert groups (group-limited routing), one dense layer then MoE, plain RoPE.
# B: no q_lora (`q_proj`), no group limit (Kimi-style), YaRN RoPE with mscale (changes the softmax scale).

# %%
section("build tiny DeepseekV3 models with transformers")
if LARGE:
    common = dict(vocab_size=2048, hidden_size=256, intermediate_size=512, moe_intermediate_size=64,
                  num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8, kv_lora_rank=64,
                  qk_rope_head_dim=16, v_head_dim=32, qk_nope_head_dim=32, n_routed_experts=16,
                  num_experts_per_tok=4, max_position_embeddings=512)
    seq_len, n_new = 96, 16
else:
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16,
                  qk_rope_head_dim=4, v_head_dim=8, qk_nope_head_dim=8, n_routed_experts=4, num_experts_per_tok=2,
                  max_position_embeddings=128)
    seq_len, n_new = 9, 6
common.update(n_shared_experts=1, routed_scaling_factor=2.5, first_k_dense_replace=1, initializer_range=0.1,
              rms_norm_eps=1e-6)
variants = {
    "A (q_lora, groups, plain rope)": dict(q_lora_rank=24 if not LARGE else 96, n_group=2, topk_group=1,
                                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "B (q_proj, no groups, YaRN)": dict(q_lora_rank=None, n_group=1, topk_group=1,
                                        rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0,
                                                         "original_max_position_embeddings": 32, "beta_fast": 32.0,
                                                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}),
}
ROOT = tempfile.mkdtemp(prefix="kdtree_tutorial06_")


def build_peer(seed, cfg_kwargs, path):
    """A random HF model saved to ``path``, reloaded in float64 with the eager kernels (the peer reference)."""
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**common, **cfg_kwargs))
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):                                 # MoE layer: randomise the bias
                layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.1)
    model.save_pretrained(path)
    return DeepseekV3ForCausalLM.from_pretrained(path, dtype=torch.float64, attn_implementation="eager",
                                                 experts_implementation="eager").eval()


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()              # [T, V] float64


def hf_greedy(model, ids, n):
    """Greedy decoding with the peer: a full forward per token, argmax of the last row (no cache tricks)."""
    seq = list(ids)
    for _ in range(n):
        seq.append(int(np.argmax(hf_logits(model, seq)[-1])))
    return seq[len(ids):]


# %% [markdown]
# ## Compare
#
# On the simulator the model's kernels are slow (a 2-layer forward takes seconds), so with KDTREE_BACKEND=sim the
# kdtree side of the comparisons runs under `kd.backend.use("numpy")` (the stage references), and then one short
# forward runs on the simulator itself and is compared too. On numpy and cuda everything runs on the process
# backend.

# %%
rng = np.random.default_rng([args.seed, 6])
shown = None
for vi, (vname, vkw) in enumerate(variants.items()):
    section(f"variant {vname}")
    path = os.path.join(ROOT, f"variant{vi}")
    with stopwatch() as t:
        peer = build_peer(args.seed * 10 + vi, vkw, path)
    print(f"peer built and saved to {path} ({t.ms:.0f} ms)")
    ids = rng.integers(0, common["vocab_size"], seq_len).tolist()
    ref = hf_logits(peer, ids)

    if PROC == "sim":
        with kd.backend.use("numpy"):
            target = kd.load_target(path)                    # a target remembers the backend it was built on
    else:
        target = kd.load_target(path)
    cfg = target.config
    print(f"kd.load_target: {cfg.num_hidden_layers} layers, q_lora_rank={cfg.q_lora_rank}, n_group={cfg.n_group}, "
          f"rope_scaling={'yarn' if cfg.rope_scaling else None}, softmax_scale={cfg.softmax_scale:.6f}, "
          f"target backend: {target.backend}")
    with stopwatch() as t:
        got = target.logits(ids)
    print(f"target.logits over {len(ids)} tokens: {t.ms:.1f} ms")
    check(f"{vname[:1]}: kd logits vs HF float64 (max|diff| <= 1e-4)", got, ref, atol=1e-4, rtol=0)
    check(f"{vname[:1]}: per-position argmax", np.argmax(got, 1), np.argmax(ref, 1))
    kd_tokens = kd.generate(target, ids, n_new).tokens
    hf_tokens = hf_greedy(peer, ids, n_new)
    print(f"greedy {n_new} tokens: kd {kd_tokens}\n                 HF {hf_tokens}")
    check(f"{vname[:1]}: greedy tokens kd.generate == HF", np.array(kd_tokens), np.array(hf_tokens))

    if PROC == "sim":                                        # one short forward on the simulator's kernels
        sim_target = target.with_backend("sim")
        with stopwatch() as t:
            got_sim = sim_target.logits(ids[:3])
        print(f"simulator forward over 3 tokens: {t.ms:.0f} ms")
        check(f"{vname[:1]}: kd logits on the simulator vs HF (3 tokens)", got_sim, ref[:3], atol=1e-4, rtol=0)

    saved = os.path.join(ROOT, f"variant{vi}_resaved")        # the other direction: kdtree writes, HF reads
    target.save(saved)
    peer2 = DeepseekV3ForCausalLM.from_pretrained(saved, dtype=torch.float64, attn_implementation="eager",
                                                  experts_implementation="eager").eval()
    check(f"{vname[:1]}: HF loads target.save() and gets the same logits", hf_logits(peer2, ids), ref,
          atol=1e-6, rtol=0)
    if shown is None:
        shown = (vname, got, ref, ids)

# %% [markdown]
# ## A table and a picture (variant A)

# %%
vname, got, ref, ids = shown
table([(i, ids[i], int(np.argmax(ref[i])), int(np.argmax(got[i])), f"{np.abs(got[i] - ref[i]).max():.2e}")
       for i in range(min(len(ids), 12))], ("pos", "token", "HF next", "kd next", "max|diff| of row"))

import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
ax[0].scatter(ref.ravel(), got.ravel(), s=4)
lim = [ref.min(), ref.max()]
ax[0].plot(lim, lim, "k--", lw=0.5)
ax[0].set_xlabel("HF float64 logits")
ax[0].set_ylabel("kdtree_numba float32 logits")
ax[0].set_title(f"variant {vname[:1]}: {ref.size} logits")
ax[1].semilogy(np.abs(got - ref).max(axis=1), "o-")
ax[1].axhline(1e-4, color="tab:red", lw=0.8, label="tolerance")
ax[1].set_xlabel("position")
ax[1].set_ylabel("max |diff|")
ax[1].legend(fontsize=8)
save_figure(fig, args, "06_target_vs_hf.png")

# %%
finish()
