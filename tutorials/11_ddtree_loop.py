"""Tutorial 11: the full DDTree loop vs autoregressive decoding - same greedy output, fewer target forwards.

Run:  KDTREE_BACKEND=numpy python tutorials/11_ddtree_loop.py [--size small|large] [--out DIR]
      KDTREE_BACKEND=sim   python tutorials/11_ddtree_loop.py   (adds ~30 s: one tiny generation on simulated kernels)
"""
# %% [markdown]
# # 11 - The DDTree loop
#
# `kd.generate(target, prompt, n, drafter=..., budget=B)` runs rounds of (`decode/ddtree.py`):
#
# 1. **draft** - the DFlash drafter's logits for depths 1..L after the root (the last committed token), one block
#    forward on the target's features (tutorial 07)                                                     [L, V]
# 2. **build** - top-K log-probs per depth and the best-first tree of B nodes (tutorial 08)
# 3. **verify** - ONE target forward over [root, node_1 .. node_B] at positions start + depth with the ancestor
#    mask (tutorial 09); it also returns the feature rows the drafter reads                              [B+1, V]
# 4. **accept** - the target's token at every node, walk from the root (tutorial 10)
# 5. **commit** - compact the accepted rows of every layer's cache (tutorial 10), hand the accepted path's feature
#    rows to the drafter (tutorial 07); emit the accepted tokens and the bonus; the bonus is the next root.
#
# Each round costs one target forward and commits `len(path)` tokens (accepted drafts + the bonus), so
#
#     acceptance length  tau = mean tokens per round,     target forwards per token ~ 1 / tau
#
# versus exactly 1 forward per token for plain (autoregressive) decoding. At T = 0 the output is *identical* to
# greedy decoding, token for token, whatever the drafter - a bad drafter only costs speed.
#
# Everything below runs the shipped trained pair (`kd.load_default()`) on held-out HumanEval prompts. One section
# swaps the drafter for `kd.OracleDrafter(target, noise)` - a **controlled knob**, not a real drafter: it drafts
# the target's own greedy continuation plus Gaussian noise, so acceptance can be dialled from perfect to useless.

# %%
import numpy as np

from _common import (banner, check, check_true, finish, heldout_prompts, load_pair, parse_args, plot_round,
                     save_figure, section, show_text, stopwatch, table)

import kdtree_numba as kd

args = parse_args(__doc__)
banner("Tutorial 11 - the DDTree loop vs autoregressive decoding", args)
PROC = kd.backend.process_name
LARGE = args.size == "large"
STAGES = ("draft", "build", "verify", "accept", "compact")

# %% [markdown]
# ## The pair, the prompts, the settings

# %%
section("setup")
target, drafter = load_pair()
tok = target.tokenizer
prompts = heldout_prompts()
picks = [prompts[i] for i in ((4, 9, 15, 23, 30, 38) if LARGE else (4, 9))]
N_NEW = 128 if LARGE else 40
BUDGET = 64
SWEEP = (4, 16, 64, 256) if LARGE else (4, 16, 64)
print(f"target on {target.backend}: {target.config.num_hidden_layers} layers, vocab {target.config.vocab_size}; "
      f"DFlash drafter depth {drafter.depth}")
print(f"{len(picks)} held-out prompts, {N_NEW} new tokens each, budget {BUDGET}")

# %% [markdown]
# ## Plain decoding vs DDTree on each prompt
#
# Greedy (T = 0): the DDTree output must equal plain decoding's exactly.

# %%
section("autoregressive vs DDTree (greedy)")
rows, runs, ars = [], {}, {}
for p in picks:
    ids = tok.encode(p["prompt"])
    with stopwatch() as t_ar:
        ar = kd.generate(target, ids, N_NEW)
    with stopwatch() as t_dd:
        dd = kd.generate(target, ids, N_NEW, drafter=drafter, budget=BUDGET)
    ars[p["task_id"]], runs[p["task_id"]] = ar, dd
    check(f"{p['task_id']}: DDTree greedy == autoregressive greedy", np.array(dd.tokens), np.array(ar.tokens))
    rows.append((p["task_id"], len(ids), ar.target_forwards, f"{t_ar.ms / 1e3:.2f}", len(dd.rounds),
                 f"{dd.acceptance_length:.2f}", dd.target_forwards, f"{dd.forwards_per_token:.2f}",
                 f"{t_dd.ms / 1e3:.2f}"))
table(rows, ("prompt", "prompt tokens", "AR forwards", "AR s", "rounds", "tau", "DDTree forwards", "fwd/token",
             "DDTree s"))
first = picks[0]
dd = runs[first["task_id"]]
check_true("DDTree needs fewer target forwards than AR", all(runs[k].target_forwards < ars[k].target_forwards
                                                            for k in runs))
print(f"\n{first['task_id']}: the prompt ends with")
print(show_text(first["prompt"], last_lines=3))
print("and the completion (identical for both) is")
print(show_text(tok.decode(dd.tokens)))
print("\nthe first rounds:")
for i, r in enumerate(dd.rounds[:6]):
    print(f"  round {i}: start {r.start}, root {tok.token_text(r.root)!r:>12}, tree of {r.tree.n} nodes, accepted "
          f"nodes {r.accepted} -> {tok.decode(r.accepted_tokens)!r} + bonus {tok.token_text(r.bonus)!r}")
st = dd.stage_totals()
print("per-stage totals (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in st.items())
      + ("   (NumPy references on the host: a correctness run, not a speed measurement)"
         if target.backend != "cuda" else ""))

# %% [markdown]
# ## What the budget buys: DDTree at several budgets vs the chain
#
# `chain=True` is DFlash's own decoding: the drafter's top-1 token per depth (15 nodes). Greedy output never
# depends on these settings; tau and the forwards per token do.

# %%
section(f"budget sweep on {first['task_id']}")
ids = tok.encode(first["prompt"])
ar = ars[first["task_id"]]
sweep = {}
for b in SWEEP:
    sweep[b] = dd if b == BUDGET else kd.generate(target, ids, N_NEW, drafter=drafter, budget=b)
chain = kd.generate(target, ids, N_NEW, drafter=drafter, chain=True)
rows = []
for name, g in [(f"B = {b}", sweep[b]) for b in SWEEP] + [("chain (15)", chain)]:
    check(f"{name}: greedy == autoregressive", np.array(g.tokens), np.array(ar.tokens))
    s_ = g.stage_totals()
    rows.append((name, len(g.rounds), f"{g.acceptance_length:.2f}", g.target_forwards,
                 f"{g.forwards_per_token:.2f}", *(f"{s_[k]:.0f}" for k in STAGES)))
rows.append(("AR", "-", "1.00", ar.target_forwards, f"{ar.forwards_per_token:.2f}", *("-" for _ in STAGES)))
table(rows, ("drafting", "rounds", "tau", "forwards", "fwd/token", *(f"{k} ms" for k in STAGES)))
check_true(f"tau grows with the budget: B = {SWEEP[-1]} > B = {SWEEP[0]}",
           sweep[SWEEP[-1]].acceptance_length > sweep[SWEEP[0]].acceptance_length,
           f"{sweep[SWEEP[-1]].acceptance_length:.2f} > {sweep[SWEEP[0]].acceptance_length:.2f}")
# On one 40-token prompt a 16-node tree can tie a 15-node chain (the shipped drafter's top-1 is often right); at
# the tutorial's budget the tree holds the chain's path and many more: over all 164 held-out prompts, tau 5.86 at
# B = 64 vs 4.25 (README).
check_true(f"DDTree (B = {BUDGET}) beats the chain (15 nodes)",
           sweep[BUDGET].acceptance_length > chain.acceptance_length,
           f"tau {sweep[BUDGET].acceptance_length:.2f} > {chain.acceptance_length:.2f}")
check_true("DDTree (B = 16) at least matches the chain (15 nodes)",
           sweep[16].acceptance_length >= chain.acceptance_length,
           f"tau {sweep[16].acceptance_length:.2f} >= {chain.acceptance_length:.2f}")

# %% [markdown]
# ## A controlled knob: `OracleDrafter` at several noise levels
#
# Not a real drafter: at depth d it returns the *target's* logits after its own greedy continuation, plus
# Gaussian noise scaled to each row's spread (noise 0 = a perfect drafter). It runs the target itself, so it shows
# acceptance, not speed. Depth 6 and budget 8 keep it cheap. What it teaches: greedy output is the same at every
# noise level; tau falls from "the whole chain every round" to ~1.

# %%
section("OracleDrafter noise sweep (a controlled knob)")
NOISES = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0) if LARGE else (0.0, 0.5, 1.0, 2.0, 4.0)
O_NEW, O_DEPTH, O_BUDGET = (64, 8, 16) if LARGE else (24, 6, 8)
ar_o = kd.generate(target, ids, O_NEW)
oracle, rows = {}, []
for noise in NOISES:
    g = kd.generate(target, ids, O_NEW, drafter=kd.OracleDrafter(target, noise=noise, depth=O_DEPTH),
                    budget=O_BUDGET)
    oracle[noise] = g
    check(f"oracle noise {noise:>3}: greedy == autoregressive", np.array(g.tokens), np.array(ar_o.tokens))
    rows.append((noise, len(g.rounds), f"{g.acceptance_length:.2f}", g.target_forwards, f"{g.forwards_per_token:.2f}"))
table(rows, ("noise", "rounds", "tau", "forwards", "fwd/token"))


def chain_in_tree(tree):
    """Length of the top-1 chain inside the tree: the first node of every depth, in pop order."""
    return len({int(d) for d in tree.depths})


perfect = [(len(r.accepted), chain_in_tree(r.tree) + 1) for r in oracle[0.0].rounds]
check_true("noise 0: every round accepts the whole top-1 chain the tree holds", all(a == c for a, c in perfect),
           f"(accepted, chain + 1) per round: {perfect}")
check_true(f"noise {NOISES[-1]} is close to useless: tau < 1.5", oracle[NOISES[-1]].acceptance_length < 1.5,
           f"tau {oracle[NOISES[-1]].acceptance_length:.2f}")
check_true("tau falls as the noise grows", all(oracle[a].acceptance_length >= oracle[b].acceptance_length
                                               for a, b in zip(NOISES, NOISES[1:])),
           " > ".join(f"{oracle[k].acceptance_length:.2f}" for k in NOISES))

# %% [markdown]
# ## T > 0: reproducible from the seed, and plain sampling's tokens
#
# With sampling each emitted token is a genuine target sample given its prefix (tested position by position in
# tutorial 10). More than that: every draw is keyed by the position it follows, so a node the walk reaches draws
# the uniforms plain sampling draws there, from the same logits - DDTree emits plain sampling's tokens exactly,
# for the same seed, whatever its trees look like. The same seed gives the same tokens; another seed others.

# %%
section("sampling (T = 1)")
T_NEW = 32
s1 = kd.generate(target, ids, T_NEW, drafter=drafter, budget=16, temperature=1.0, seed=7)
s2 = kd.generate(target, ids, T_NEW, drafter=drafter, budget=16, temperature=1.0, seed=7)
s3 = kd.generate(target, ids, T_NEW, drafter=drafter, budget=16, temperature=1.0, seed=8)
print(f"seed 7: {tok.decode(s1.tokens)!r} (tau {s1.acceptance_length:.2f})")
print(f"seed 8: {tok.decode(s3.tokens)!r} (tau {s3.acceptance_length:.2f})")
check("T=1: same seed -> same tokens", np.array(s1.tokens), np.array(s2.tokens))
check_true("T=1: another seed -> other tokens", s1.tokens != s3.tokens)
plain7 = kd.generate(target, ids, T_NEW, temperature=1.0, seed=7)
check("T=1: DDTree == plain sampling, token for token (seed 7)", np.array(s1.tokens), np.array(plain7.tokens))

# %% [markdown]
# ## On the simulated kernels (KDTREE_BACKEND=sim only)
#
# Everything above ran the trained pair on `model_backend()` (NumPy on the simulator). Here the loop runs once on
# the simulated kernels end to end: a tiny random target (2 layers, vocab 64) and a random tiny DFlash drafter
# (`model/dflash.random_drafter`, block 4), 4 new tokens - about half a minute.

# %%
if PROC == "sim":
    section("the loop on the simulator (tiny random models)")
    from kdtree_numba.model.dflash import random_drafter

    tiny = kd.tiny_target(args.seed, num_hidden_layers=2, vocab_size=64, hidden_size=32, n_routed_experts=4,
                          n_group=1, topk_group=1, num_attention_heads=2, kv_lora_rank=16, q_lora_rank=None)
    tiny_prompt = [1, 5, 9, 3, 7]
    with stopwatch() as t:
        g_sim = kd.generate(tiny, tiny_prompt, 4, drafter=random_drafter(tiny, args.seed, block_size=4), budget=3)
    ar_np = kd.generate(tiny.with_backend("numpy"), tiny_prompt, 4)
    print(f"{len(g_sim.rounds)} rounds on the simulator in {t.ms / 1e3:.1f} s: {g_sim.tokens}")
    check("simulated DDTree greedy == autoregressive (NumPy twin)", np.array(g_sim.tokens), np.array(ar_np.tokens))

# %% [markdown]
# ## Pictures
#
# Left: tokens generated against target forwards spent (one point per round, the prefill first) at each budget,
# the chain, and plain decoding (the diagonal: one forward per token) - the slope is tau. Middle: tau and target
# forwards per token against the budget (the chain as dashed lines). Right: the same staircase for the oracle
# knob at each noise level (distinct markers and line styles, so no level hides under another or under the
# diagonal). Then, from `kdtree_numba.viz`: the tree of the round with the longest accepted path, and the
# acceptance histogram of the budget sweep.

# %%
import matplotlib.pyplot as plt  # noqa: E402

MARKERS, STYLES = "os^Dvx", ["-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1))]


def staircase(ax, g, j, label, **kw):
    """Tokens generated (y) after each target forward (x): the prefill gives the first token, each round len(path)."""
    y = np.cumsum([1] + [len(r.accepted) for r in g.rounds])
    y = np.minimum(y, len(g.tokens))
    ax.plot(np.arange(1, len(y) + 1), y, marker=MARKERS[j % 6], ls=STYLES[j % 6], ms=4, lw=1.2,
            label=f"{label}: tau {g.acceptance_length:.2f}", **kw)


fig, ax = plt.subplots(1, 3, figsize=(16, 4))
for j, (name, g) in enumerate([(f"B = {b}", sweep[b]) for b in SWEEP] + [("chain (15)", chain)]):
    staircase(ax[0], g, j, name)
ax[0].plot([0, N_NEW], [0, N_NEW], color="k", lw=0.8, label="autoregressive")
ax[0].set_xlabel("target forwards")
ax[0].set_ylabel("tokens generated")
ax[0].set_title(f"{first['task_id']}: the trained pair")
ax[0].legend(fontsize=7)
xs = np.array(SWEEP)
ax[1].plot(xs, [sweep[b].acceptance_length for b in SWEEP], "o-", label="tau (tree)")
ax[1].plot(xs, [sweep[b].forwards_per_token for b in SWEEP], "s-", label="target forwards / token (tree)")
ax[1].axhline(chain.acceptance_length, color="C0", ls="--", lw=1, label="tau (chain, 15 nodes)")
ax[1].axhline(chain.forwards_per_token, color="C1", ls="--", lw=1, label="forwards / token (chain)")
ax[1].axhline(1.0, color="k", lw=0.5)
ax[1].set_xscale("log", base=2)
ax[1].set_xticks(xs)
ax[1].set_xticklabels([str(b) for b in SWEEP])
ax[1].set_xlabel("tree budget")
ax[1].legend(fontsize=7)
ax[2].plot([0, O_NEW], [0, O_NEW], color="k", lw=0.8, label="autoregressive", zorder=1)
for j, (noise, g) in enumerate(oracle.items()):
    staircase(ax[2], g, j, f"noise {noise}", mfc="none" if j % 2 else None, zorder=10 - j)
ax[2].set_xlabel("target forwards")
ax[2].set_ylabel("tokens generated")
ax[2].set_title(f"OracleDrafter (controlled knob), depth {O_DEPTH}, budget {O_BUDGET}")
ax[2].legend(fontsize=7)
save_figure(fig, args, "11_acceptance.png")

try:
    from kdtree_numba.viz import acceptance_histogram
except ImportError:
    acceptance_histogram = None
    print("kdtree_numba.viz not available: skipping its plots")
if acceptance_histogram is not None:
    best = max(dd.rounds, key=lambda r: (len(r.accepted), r.tree.n))
    plot_round(best, target, f"{args.out}/11_viz_tree.png")
    acceptance_histogram([sweep[b] for b in SWEEP] + [chain], labels=[f"B = {b}" for b in SWEEP] + ["chain"],
                         path=f"{args.out}/11_viz_acceptance_histogram.png")
    print(f"saved figure: {args.out}/11_viz_acceptance_histogram.png")

# %%
finish()
