"""Tutorial 10: the full DDTree loop vs autoregressive decoding - same greedy output, fewer target forwards.

Run:  KDTREE_BACKEND=numpy python tutorials/10_ddtree_loop.py [--size small|large] [--out DIR]
      KDTREE_BACKEND=sim   python tutorials/10_ddtree_loop.py      (tiny: under a minute of simulated kernels)
"""
# %% [markdown]
# # 10 - The DDTree loop
#
# `kd.generate(target, prompt, n, drafter=..., budget=B)` runs rounds of (`decode/ddtree.py`):
#
# 1. **draft** - the drafter's logits for depths 1..L after the root (the last committed token)       [L, V]
# 2. **build** - top-K log-probs per depth and the best-first tree of B nodes (tutorial 07)
# 3. **verify** - ONE target forward over [root, node_1 .. node_B] at positions start + depth with the ancestor
#    mask (tutorial 08)                                                                                  [B+1, V]
# 4. **accept** - the target's token at every node, walk from the root (tutorial 09)
# 5. **commit** - compact the accepted rows of every layer's cache (tutorial 09); emit the accepted tokens and
#    the bonus; the bonus is the next root.
#
# Each round costs one target forward and commits `len(path)` tokens (accepted drafts + the bonus), so
#
#     acceptance length  tau = mean tokens per round,     target forwards per token ~ 1 / tau
#
# versus exactly 1 forward per token for plain (autoregressive) decoding. At T = 0 the output is *identical* to
# greedy decoding, token for token, whatever the drafter - a bad drafter only costs speed.
#
# The drafter here is `kd.OracleDrafter(target, noise)`: the target's own next-token logits along its greedy
# continuation, plus Gaussian noise (scaled to each row's spread). noise 0 is a perfect drafter; larger noise
# scrambles the ranking and acceptance drops. (It is as slow as the target: it shows acceptance, not speed.)

# %%
import numpy as np

from _common import banner, check, check_true, finish, parse_args, save_figure, section, stopwatch, table

import kdtree_numba as kd

args = parse_args(__doc__)
banner("Tutorial 10 - the DDTree loop vs autoregressive decoding", args)
PROC = kd.backend.process_name
LARGE = args.size == "large"

# %% [markdown]
# ## The target, the prompt, and the settings
#
# On the simulator every target forward takes seconds, so it runs a tiny 2-layer model, 6 new tokens, budget 4,
# depth 3, one DDTree run on the simulated kernels, and the noise sweep on a NumPy twin of the same target
# (`target.with_backend("numpy")`: same weights, the stage references). The drafter always runs on NumPy there.

# %%
section("setup")
if LARGE:
    target = kd.tiny_target(args.seed, vocab_size=2048, hidden_size=256, intermediate_size=512,
                            moe_intermediate_size=64, num_hidden_layers=4, num_attention_heads=8,
                            num_key_value_heads=8, kv_lora_rank=64, q_lora_rank=96, qk_rope_head_dim=16,
                            v_head_dim=32, qk_nope_head_dim=32, n_routed_experts=16, n_group=4, topk_group=2,
                            num_experts_per_tok=4)
    n_new, budget, depth, noises = 96, 64, 8, [0.0, 0.5, 1.0, 2.0, 4.0, 8.0]
elif PROC == "sim":
    target = kd.tiny_target(args.seed, num_hidden_layers=2, vocab_size=64, hidden_size=32, n_routed_experts=4,
                            n_group=1, topk_group=1, num_attention_heads=2, kv_lora_rank=16, q_lora_rank=None)
    n_new, budget, depth, noises = 6, 4, 3, [0.0, 0.5, 1.0, 2.0, 4.0, 8.0]
else:
    target = kd.tiny_target(args.seed)                    # vocab 256, 3 layers (1 dense + 2 MoE), MLA with q_lora
    n_new, budget, depth, noises = 32, 16, 5, [0.0, 0.5, 1.0, 2.0, 4.0, 8.0]
fast = target.with_backend("numpy") if PROC == "sim" else target     # for drafting (and the sweep on sim)
sw_new, sw_budget, sw_depth = (24, 8, 4) if fast is not target else (n_new, budget, depth)   # the sweep's settings


def generate_fast(*a, **kw):
    """kd.generate on ``fast``. The decode loop's own stages (top-K, tree build, accept, compact) run on the current
    backend, not the target's, so on the simulator the sweep switches the whole loop to NumPy."""
    if fast is target:
        return kd.generate(fast, *a, **kw)
    with kd.backend.use("numpy"):
        return kd.generate(fast, *a, **kw)


cfg = target.config
rng = np.random.default_rng([args.seed, 10])
prompt = rng.integers(0, cfg.vocab_size, 6).astype(np.int32).tolist()
print(f"target: {cfg.num_hidden_layers} layers, vocab {cfg.vocab_size}, hidden {cfg.hidden_size}, "
      f"{cfg.n_routed_experts} experts; backend {target.backend}")
print(f"prompt {prompt}; {n_new} new tokens; budget {budget}; depth {depth}")

# %% [markdown]
# ## Plain decoding: one forward per token

# %%
section("autoregressive (the baseline)")
with stopwatch() as t:
    ar = kd.generate(target, prompt, n_new)
print(f"tokens {ar.tokens}\ntarget forwards {ar.target_forwards} ({ar.forwards_per_token:.2f} per token), "
      f"{t.ms:.0f} ms")

# %% [markdown]
# ## DDTree on the process backend

# %%
section(f"DDTree on {target.backend}")
with stopwatch() as t:
    dd = kd.generate(target, prompt, n_new, drafter=kd.OracleDrafter(fast, noise=0.0 if PROC == "sim" else 1.0,
                                                                     depth=depth), budget=budget)
print(f"tokens {dd.tokens}\nrounds {len(dd.rounds)}, tau {dd.acceptance_length:.2f}, target forwards "
      f"{dd.target_forwards} ({dd.forwards_per_token:.2f} per token), {t.ms:.0f} ms")
check(f"DDTree greedy == autoregressive greedy ({target.backend})", np.array(dd.tokens), np.array(ar.tokens))
print("per-stage totals (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in dd.stage_totals().items())
      + ("   (simulated kernels: slow, and not a speed measurement)" if PROC == "sim" else ""))
for i, r in enumerate(dd.rounds[:4]):
    print(f"  round {i}: start {r.start}, root {r.root}, tree of {r.tree.n} nodes, accepted nodes {r.accepted} "
          f"-> tokens {r.accepted_tokens} + bonus {r.bonus}")

# %% [markdown]
# ## Sweeping the drafter's quality
#
# Greedy output must not depend on the drafter at all; tau and the forwards per token do. The chain baseline
# (`chain=True`: only the drafter's top-1 token per depth, DFlash-style) shows what the tree adds at equal depth.

# %%
section("noise sweep" + (" (NumPy twin of the target)" if fast is not target else ""))
ar_fast = ar if fast is target else generate_fast(prompt, sw_new)
if fast is not target:
    print(f"(on the twin: {sw_new} new tokens, budget {sw_budget}, depth {sw_depth})")
    check("autoregressive: NumPy twin == simulator", np.array(ar_fast.tokens[:n_new]), np.array(ar.tokens))
STAGES = ("draft", "build", "verify", "accept", "compact")
runs, rows = {}, []
for noise in noises:
    with stopwatch() as t:
        res = generate_fast(prompt, sw_new, drafter=kd.OracleDrafter(fast, noise=noise, depth=sw_depth),
                            budget=sw_budget)
    runs[noise] = res
    same = res.tokens == ar_fast.tokens
    check(f"noise {noise:>4}: DDTree greedy == autoregressive", np.array(res.tokens), np.array(ar_fast.tokens))
    st = res.stage_totals()
    rows.append((noise, len(res.rounds), f"{res.acceptance_length:.2f}", res.target_forwards,
                 f"{res.forwards_per_token:.2f}", "yes" if same else "NO", *(f"{st[k]:.1f}" for k in STAGES)))
chain_noise = 1.0
chain = generate_fast(prompt, sw_new, drafter=kd.OracleDrafter(fast, noise=chain_noise, depth=sw_depth),
                    chain=True)
check(f"chain (noise {chain_noise}) greedy == autoregressive", np.array(chain.tokens), np.array(ar_fast.tokens))
st = chain.stage_totals()
rows.append((f"{chain_noise} chain", len(chain.rounds), f"{chain.acceptance_length:.2f}", chain.target_forwards,
             f"{chain.forwards_per_token:.2f}", "yes" if chain.tokens == ar_fast.tokens else "NO",
             *(f"{st[k]:.1f}" for k in STAGES)))
rows.append(("AR", "-", "1.00", ar_fast.target_forwards, f"{ar_fast.forwards_per_token:.2f}", "-",
             *("-" for _ in STAGES)))
table(rows, ("noise", "rounds", "tau", "forwards", "fwd/token", "== AR", *(f"{k} ms" for k in STAGES)))
def chain_in_tree(tree):
    """Length of the top-1 chain inside the tree: from the root, follow each node's first child (rank 0 pops first)."""
    node, n = 0, 0
    while True:
        kids = [i for i in range(1, tree.n + 1) if tree.parents[i] == node]
        if not kids:
            return n
        node, n = kids[0], n + 1


perfect = [(len(r.accepted), chain_in_tree(r.tree) + 1) for r in runs[0.0].rounds]
check_true("noise 0: every round accepts the whole top-1 chain the tree holds",
           all(a == c for a, c in perfect), f"(accepted, chain + 1) per round: {perfect}")
check_true("fewer forwards than AR with a good drafter", runs[0.0].target_forwards < ar_fast.target_forwards,
           f"{runs[0.0].target_forwards} < {ar_fast.target_forwards}")

# %% [markdown]
# ## T > 0: reproducible from the seed
#
# With sampling the DDTree output has the same *distribution* as plain sampling (each emitted token is a genuine
# target sample given its prefix), but not the same samples: the random streams differ. The same seed gives the
# same tokens.

# %%
section("sampling (T = 1)")
s1 = generate_fast(prompt, sw_new, drafter=kd.OracleDrafter(fast, noise=1.0, depth=sw_depth), budget=sw_budget,
                 temperature=1.0, seed=7)
s2 = generate_fast(prompt, sw_new, drafter=kd.OracleDrafter(fast, noise=1.0, depth=sw_depth), budget=sw_budget,
                 temperature=1.0, seed=7)
print(f"seed 7: {s1.tokens} (tau {s1.acceptance_length:.2f})")
check("T=1: same seed -> same tokens", np.array(s1.tokens), np.array(s2.tokens))

# %% [markdown]
# ## Pictures: tokens per round, and (when `kdtree_numba.viz` is there) a tree and a histogram

# %%
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(1, 2, figsize=(11, 3.5))
for noise, res in runs.items():
    ax[0].plot([len(r.accepted) for r in res.rounds], "o-", ms=3, label=f"noise {noise}")
ax[0].set_xlabel("round")
ax[0].set_ylabel("tokens committed (accepted + bonus)")
ax[0].legend(fontsize=7)
ns = list(runs)
xs = np.arange(len(ns))
ax[1].plot(xs, [runs[k].acceptance_length for k in ns], "o-", label="tau (tree)")
ax[1].plot(xs, [runs[k].forwards_per_token for k in ns], "s--", label="target forwards / token")
ax[1].axhline(1.0, color="k", lw=0.5)
ax[1].set_xticks(xs)
ax[1].set_xticklabels([str(k) for k in ns])
ax[1].set_xlabel("drafter noise")
ax[1].legend(fontsize=8)
save_figure(fig, args, "10_acceptance.png")

try:
    from kdtree_numba.viz import acceptance_histogram, plot_tree
except ImportError:
    acceptance_histogram = plot_tree = None
    print("kdtree_numba.viz not available: skipping its plots")
if plot_tree is not None:
    import os

    try:                                           # optional extras: never fail the tutorial
        mid = runs[noises[min(2, len(noises) - 1)]]
        best = max(mid.rounds, key=lambda r: (len(r.accepted), r.tree.n))
        plot_tree(best, vocab_size=cfg.vocab_size, path=os.path.join(args.out, "10_viz_tree.png"))
        print(f"saved figure: {os.path.join(args.out, '10_viz_tree.png')}")
        acceptance_histogram([runs[k] for k in ns], labels=[f"noise {k}" for k in ns],
                             path=os.path.join(args.out, "10_viz_acceptance_histogram.png"))
        print(f"saved figure: {os.path.join(args.out, '10_viz_acceptance_histogram.png')}")
    except Exception as e:
        print(f"kdtree_numba.viz plots skipped ({type(e).__name__}: {e})")

# %%
finish()
