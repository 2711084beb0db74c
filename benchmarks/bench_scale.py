"""DDTree's round against the DFlash chain's as the target grows: what a replayed round costs on this engine at
four model sizes, and what DDTree / chain tokens/s that cost allows with the trained pair's acceptance.

Per scale a random target of the default pair's family (DeepSeek-V3: MLA, MoE top-2 with a shared expert, the first
layer dense; vocabulary 4096) and a random DFlash drafter shaped like the trained one (2 layers, block 16, head_dim
32, hidden / 32 heads, three feature layers). Weights are random: the rounds accept ~1 token, which changes nothing
the kernels do - a round's device time depends on the shapes (the tree's rows, the budget), not on the values.
Per method (the chain, DDTree at each ``--budgets``) two replayed generations of ``--tokens`` after a 120-token
prompt; the second's rounds 2.. give the mean device time of each stage (``RoundTrace.times``: device clock stamps
inside the graph, kernels/stamp.py) and their sum, the round.
"Allowed x chain" = (DDTree tau / chain tau of the trained pair on the 164 held-out prompts, read from
``default_model/eval_humaneval.json``) x (chain round / DDTree round): DDTree / chain tokens/s if every round
cost what it costs here and the pair accepted what the trained one does - rounds only (no prefill, no host), an
estimate from two measurements, not a measured speed-up (issue 13 asks for 1.25x).

    PYTHONPATH=$PWD KDTREE_BACKEND=cuda python3 benchmarks/bench_scale.py [--scales A,B,C,D] [--budgets 32,64]

Example (2026-12-06, H100; docs/PERFORMANCE.md, thirty-eighth session): A (the trained pair's shape, 9.8 M
parameters) chain 649.8 us a round, DDTree-32 690.9 (1.063x: allowed 1.229x the chain); C (510 M) chain 3073.7 us,
DDTree-32 3771.7 (1.227x: allowed 1.065x) - at the wider models a 33-row verify costs far more than a 16-row one on
these fp32 kernels (the grouped expert GEMM most of all), so the tree's extra acceptance buys little.
"""
import json
import os

import numpy as np

from _common import args, fail_args, kd, save, table

from kdtree_numba.argtypes import whole, whole_list  # noqa: E402
from kdtree_numba.decode.replay import weight_arrays  # noqa: E402
from kdtree_numba.decode.trace import STAGES  # noqa: E402
from kdtree_numba.model.dflash import random_drafter  # noqa: E402
from kdtree_numba.model.presets import DEFAULT_DIR, tiny_target  # noqa: E402

# name: (hidden, layers, heads, dense intermediate, expert intermediate, q_lora, kv_lora, routed experts)
SCALES = {"A": (256, 5, 8, 768, 192, 128, 96, 8),           # the trained pair's target
          "B": (512, 8, 16, 1536, 384, 256, 192, 8),
          "C": (1024, 12, 16, 3072, 768, 512, 256, 16),
          "D": (2048, 8, 32, 6144, 1024, 768, 512, 16),
          "tiny": (64, 3, 4, 96, 32, 48, 32, 8)}            # --quick


def scaled_pair(name: str, vocab: int):
    """(target, drafter): random weights at scale ``name`` (module docstring)."""
    H, layers, heads, inter, moe_inter, q_lora, kv_lora, experts = SCALES[name]
    target = tiny_target(0, vocab_size=vocab, hidden_size=H, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=heads, intermediate_size=inter, moe_intermediate_size=moe_inter,
                         q_lora_rank=q_lora, kv_lora_rank=kv_lora, n_routed_experts=experts, n_group=1,
                         topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1, qk_rope_head_dim=16,
                         qk_nope_head_dim=32, v_head_dim=32, max_position_embeddings=2048)
    drafter = random_drafter(target, num_hidden_layers=2, num_attention_heads=max(4, H // 32),
                             num_key_value_heads=max(2, H // 64), head_dim=32, intermediate_size=3 * H,
                             block_size=16, target_layer_ids=(1, layers // 2, layers - 2))
    return target, drafter


def tau_ratios() -> dict:
    """{budget: DDTree tau / chain tau} of the trained pair's held-out CPU eval (the model card's)."""
    with open(os.path.join(DEFAULT_DIR, "eval_humaneval.json")) as f:
        methods = json.load(f)["tau"]["methods"]
    chain = methods["chain"]["tau"]
    return {int(k.split("@")[1]): v["tau"] / chain for k, v in methods.items() if k.startswith("ddtree@")}


def round_stages(target, drafter, prompt, tokens: int, **kw) -> dict:
    """Mean device us of each stage over rounds 2.. of a replayed generation (after one to compile and capture)."""
    kd.generate(target, prompt, tokens, drafter=drafter, replay=True, **kw)
    g = kd.generate(target, prompt, tokens, drafter=drafter, replay=True, **kw)
    rounds = g.rounds[1:] or g.rounds
    return {s: 1e3 * float(np.mean([r.times[s] for r in rounds])) for s in STAGES}


a = args(__doc__, lambda p: (
    p.add_argument("--scales", default=None, help="comma-separated scales of " + ", ".join(SCALES) +
                   " (default A,B,C,D)"),
    p.add_argument("--budgets", type=whole_list(1, 1024), default=[32, 64], help="DDTree budgets (default 32,64)"),
    p.add_argument("--tokens", type=whole(3), default=48, help="new tokens a generation (default 48)")))
scales = (a.scales or ("tiny" if a.quick else "A,B,C,D")).split(",")
bad = [s for s in scales if s not in SCALES]
if bad:
    fail_args(f"--scales: unknown scale {bad[0]!r}, expected some of {', '.join(SCALES)}")
budgets = [4] if a.quick else a.budgets
tokens = 6 if a.quick else a.tokens
ratios = tau_ratios()
rows = []
for name in scales:
    target, drafter = scaled_pair(name, vocab=256 if name == "tiny" else 4096)
    params = sum(int(np.prod(w.shape)) for w in weight_arrays(target)) / 1e6
    prompt = np.random.default_rng(0).integers(2, target.config.vocab_size - 2, 120).astype(np.int32)
    chain = round_stages(target, drafter, prompt, tokens, chain=True)
    t_chain = sum(chain.values())
    for label, kw, budget in [("chain", dict(chain=True), None)] + [(f"DDTree-{b}", dict(budget=b), b)
                                                                    for b in budgets]:
        st = chain if budget is None else round_stages(target, drafter, prompt, tokens, **kw)
        t = sum(st.values())
        allowed = f"{ratios[budget] * t_chain / t:.3f}x" if budget in ratios else "-"
        rows.append([name, f"{params:.1f}", label] + [f"{st[s]:.1f}" for s in STAGES] +
                    [f"{t:.1f}", f"{t / t_chain:.3f}", "-" if budget is None else allowed])
        print(" | ".join(rows[-1]), flush=True)
    del target, drafter
table(f"A replayed round by model size ({kd.backend.name}; random weights; device us a stage, mean of rounds 2..; "
      f"tau ratios of the trained pair's held-out eval)",
      ["scale", "target M params", "method"] + [f"{s} us" for s in STAGES] +
      ["round us", "round / chain", "allowed x chain"], rows)
save("bench_scale")
