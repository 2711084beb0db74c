"""Tutorial 04: MoE routing (DeepSeek-V3 noaux_tc), ties, and grouping tokens by expert.

Run:  KDTREE_BACKEND=sim python tutorials/04_moe_routing.py [--size small|large] [--out DIR]
"""
# %% [markdown]
# # 04 - MoE routing: which experts see which token
#
# A MoE layer has E routed experts (SwiGLU MLPs, tutorial 03) and sends each token to k of them. DeepSeek-V3's
# router ("noaux_tc"), per token, in float32:
#
#     s      = sigmoid(x @ W_gate^T)                  [E]  affinities; the weights come from s
#     choice = s + e_score_correction_bias            [E]  used ONLY to choose experts (load balancing)
#     group score = sum of the top-2 `choice` values in each of n_group groups; keep the topk_group best groups;
#     experts of dropped groups get -inf; choose the top_k experts by `choice`
#     w = s[chosen];  if norm_topk_prob: w = w / (sum(w) + 1e-20);  w *= routed_scaling_factor
#     y = sum_k w_k * Expert_k(x) + SharedExperts(x)
#
# The bias is learned to balance the experts' load without an auxiliary loss; it steers the *choice* but never
# the weights. Ties (equal values) go to the lower expert (group) index, in the reference and the kernel alike.
# DeepSeek-V3 uses 256 experts in 8 groups, keeps 4 groups, top-8; Kimi K2 has 384 experts and no group limit.

# %%
import numpy as np

from _common import (banner, check, check_true, draw_owners, finish, host, parse_args, rng, save_figure, section,
                     show_kernel, stopwatch, table)

import kdtree_numba as kd
from kdtree_numba.kernels import moe_routing as moe

args = parse_args(__doc__)
banner("Tutorial 04 - MoE routing", args)
R = rng(args, 4)
LARGE = args.size == "large"
if LARGE:
    T, E, G, TG, K, SCALE = 4096, 256, 8, 4, 8, 2.5        # DeepSeek-V3 routing
else:
    T, E, G, TG, K, SCALE = 5, 16, 4, 2, 3, 2.5            # 16 experts in 4 groups of 4, keep 2 groups, top-3


def fmt(v):
    return "[" + ", ".join(f"{float(a):.4f}" for a in v) + "]"

# %% [markdown]
# ## The reference, step by step for one token

# %%
section("reference, one token step by step")
logits = R.standard_normal((T, E)).astype(np.float32)            # router logits x @ W_gate^T   [T, E]
bias = (0.1 * R.standard_normal(E)).astype(np.float32)           # e_score_correction_bias      [E]
t0 = 0
s = 1 / (1 + np.exp(-logits[t0]))
choice = s + bias
gsize = E // G
gscore = np.sort(choice.reshape(G, gsize), axis=1)[:, -2:].sum(axis=1)     # top-2 sum per group
kept = np.argsort(-gscore, kind="stable")[:TG]
masked = np.where(np.isin(np.arange(E) // gsize, kept), choice, -np.inf)
chosen = np.argsort(-masked, kind="stable")[:K]
w = s[chosen] / (s[chosen].sum() + 1e-20) * SCALE
if not LARGE:
    table([(e, e // gsize, f"{s[e]:.4f}", f"{bias[e]:+.4f}", f"{choice[e]:.4f}",
            "kept" if e // gsize in kept else "dropped", "<- chosen" if e in chosen else "") for e in range(E)],
          ("expert", "group", "s=sigmoid", "bias", "choice", "group", ""))
print(f"group scores (top-2 sums): {fmt(gscore)} -> keep groups {sorted(kept.tolist())}")
print(f"chosen experts {chosen.tolist()}, weights {fmt(w)} (sum {w.sum():.4f} = scale {SCALE})")
idx_ref, w_ref = moe.route_ref(logits, bias, K, G, TG, True, SCALE)
check("step-by-step == route_ref (token 0): experts", idx_ref[t0], chosen.astype(np.int32))
check("step-by-step == route_ref (token 0): weights", w_ref[t0], w, atol=1e-6, rtol=1e-5)

# %% [markdown]
# ## The kernel: `kernels/moe_routing.py::_route_kernel`
#
# Thread mapping: **one block per token**. The block's threads stride over the experts to fill shared arrays
# `s[e]` and `choice[e]`; then **one thread per group** sums its group's top-2; thread 0 marks the `topk_group`
# best groups (lower index on ties) and the threads blank the dropped groups' experts to -inf; finally `top_k`
# rounds of a **block-wide arg-max reduction** (a shared-memory tree like tutorial 00, comparing (value, index) so
# the lower index wins ties), each round removing its winner. Thread 0 writes the normalised, scaled weights.
# Block size: the largest power of two <= E, capped at 128 (8 on the simulator).
#
# On a real GPU the launcher uses the faster `_route_warp_kernel` instead: **one warp per token** (four tokens per
# block), lane l owning experts l, l + 32, ...; each of the k rounds is a lane-local scan plus a 5-step
# `shfl_xor` arg-max, with no block barrier. The simulator has no warp shuffles, so it runs the block version;
# both follow the same tie rule and are checked against the same reference.

# %% [markdown]
# The block kernel on the page (printed from the package), and who touches what at this tutorial's small shape:
# block t = token t; with 8 threads for 16 experts, thread j fills `s` / `choice` for experts j and j + 8, and
# thread g < 4 sums group g's top-2 (drawn as the second panel's numbers: the expert columns of each group).

# %%
section("the kernel on the page")
show_kernel(moe._route_kernel)
TH = moe._pow2_at_most(16, 8)                               # the simulator's block for 16 experts
check_true("the text's constants match the code (block <= 128 threads on a GPU, 8 on the simulator, a power of "
           "two <= E)", moe._pow2_at_most(384, 128) == 128 and TH == 8 and moe._pow2_at_most(6, 8) == 4)
fill = np.tile(np.arange(16) % TH, (3, 1))                  # [3 tokens, 16 experts] thread filling s/choice
group = np.tile(np.arange(16) // 4, (3, 1))                 # [3, 16] thread summing the expert's group
both = np.concatenate([fill, np.full((1, 16), -1), group])
save_figure(draw_owners(both, "MoE routing, one block per token: rows 0-2 thread filling s/choice per expert (8 "
                        "threads); rows 4-6 thread summing each group's top-2 (4 groups of 4)", "expert e", "",
                        [f"token {t}" for t in range(3)] + [""] + [f"token {t} (groups)" for t in range(3)]),
            args, "04_moe_routing_threads.png")

# %%
section("kernel vs reference")
with stopwatch() as t:
    idx, wts = moe.route(logits, bias, K, G, TG, True, SCALE)
print(("_route_warp_kernel" if kd.backend.name == "cuda" else
       f"_route_kernel[grid={T}, block={moe._pow2_at_most(E, kd.backend.block_size(128, 8))}]") + f": {t.ms:.1f} ms")
idx, wts = host(idx), host(wts)
check("route kernel vs route_ref: expert ids (exact)", idx, idx_ref)
check("route kernel vs route_ref: weights", wts, w_ref, atol=1e-6, rtol=1e-5)
check("weights sum to routed_scaling_factor (norm_topk_prob)", wts.sum(axis=1), np.full(T, SCALE, np.float32),
      atol=1e-5, rtol=1e-5)
in_kept = all(len({int(e) // gsize for e in row}) <= TG for row in idx)
check_true(f"every token's experts lie in <= {TG} groups", in_kept)
sig = 1 / (1 + np.exp(-logits.astype(np.float64)))
unbiased = np.take_along_axis(sig, idx, 1)
check("weights come from s (unbiased), not from s + bias", wts,
      unbiased / unbiased.sum(axis=1, keepdims=True) * SCALE, atol=1e-5, rtol=1e-5)

# %% [markdown]
# ## The bias chooses, but does not weigh
#
# One token, 8 experts, no groups, top-2. Expert 6 has a low affinity but a large bias: it gets *chosen*, and its
# weight is still computed from its small `s`.

# %%
section("bias: selection only")
lg = np.array([[2.0, 1.5, 0.5, 0.0, -0.5, -1.0, -2.0, -3.0]], np.float32)
b0 = np.zeros(8, np.float32)
b6 = b0.copy()
b6[6] = 1.0
i_nob, w_nob = (host(a) for a in moe.route(lg, b0, 2, 1, 1, True, 1.0))
i_b, w_b = (host(a) for a in moe.route(lg, b6, 2, 1, 1, True, 1.0))
s_row = 1 / (1 + np.exp(-lg[0].astype(np.float64)))
table([("bias 0", i_nob[0].tolist(), fmt(w_nob[0])), ("bias[6] = 1", i_b[0].tolist(), fmt(w_b[0]))],
      ("", "experts", "weights"))
check("without bias: experts [0, 1]", i_nob[0], np.array([0, 1], np.int32))
check("with bias[6]=1: experts [6, 0]", i_b[0], np.array([6, 0], np.int32))
check("expert 6's weight uses s[6] = sigmoid(-2)", w_b[0], s_row[[6, 0]] / s_row[[6, 0]].sum(), atol=1e-6, rtol=1e-5)

# %% [markdown]
# ## Ties: the lower index wins
#
# Expert ties: experts 3 and 5 share the best logit, top-1 -> expert 3. Group ties: groups 1 (experts 2, 3) and
# 2 (experts 4, 5) have the same top-2 sum, keep one group -> group 1, experts 2 and 3. Both the reference
# (stable argsort) and the kernel (`_better(v, i, best_v, best_i)`: larger value, or equal value and lower index)
# follow this rule, so the kernel reproduces the reference exactly.

# %%
section("ties")
tie_e = np.array([[0.1, 0.2, 0.3, 1.5, 0.0, 1.5, -1.0, 0.4]], np.float32)
want_e = moe.route_ref(tie_e, b0, 1, 1, 1, True, 1.0)[0]
got_e = host(moe.route(tie_e, b0, 1, 1, 1, True, 1.0)[0])
check("expert tie -> lower index (3), reference", want_e[0], np.array([3], np.int32))
check("expert tie -> lower index (3), kernel", got_e[0], np.array([3], np.int32))
tie_g = np.array([[0.0, -1.0, 2.0, 1.0, 1.0, 2.0, -2.0, 0.5]], np.float32)     # 4 groups of 2
want_g = moe.route_ref(tie_g, b0, 2, 4, 1, True, 1.0)[0]
got_g = host(moe.route(tie_g, b0, 2, 4, 1, True, 1.0)[0])
check("group tie -> lower group (1): experts [2, 3], reference", want_g[0], np.array([2, 3], np.int32))
check("group tie -> lower group (1): experts [2, 3], kernel", got_g[0], np.array([2, 3], np.int32))

# %% [markdown]
# ## Grouping tokens by expert, and combining back
#
# To run each expert once on all of its tokens, the T*k assignments `a = t*k + j` are sorted by expert, stably
# (`group_by_expert`): `counts[e]`, `offsets` (exclusive prefix sums, [E+1]), `order` (assignment ids,
# expert-major) and its inverse `slot` (where assignment a sits in `order`). The model gathers `x[order // k]`
# (`gather_rows`, one launch), runs expert e's two GEMMs on rows `offsets[e] .. offsets[e+1]`, and `combine` adds
# each token's k results back:
#
#     out[t] = sum_j w[t, j] * expert_out[slot[t*k + j]]        (j = 0..k-1 in order: deterministic, no atomics)
#
# Kernels: `_group_kernel` (one block per expert: a block reduction counts the assignments of lower experts - its
# offset - then a block-wide Hillis-Steele prefix scan over chunks of assignments gives each of its own assignments
# its position, in order) and `_combine_kernel` (one thread per output element).
#
# Round trip: with "experts" that multiply their input by (e + 1), the result must be
# `sum_j w[t, j] * (idx[t, j] + 1) * x[t]`.

# %%
section("group_by_expert + combine")
with stopwatch() as t:
    counts, offsets, order, slot = (host(a) for a in moe.group_by_expert(idx, E))
print(f"_group_kernel[grid={E}]: {t.ms:.1f} ms")
for name, got_a, want_a in zip(("counts", "offsets", "order", "slot"), (counts, offsets, order, slot),
                               moe.group_by_expert_ref(idx, E)):
    check(f"group_by_expert {name} vs reference (exact)", got_a, want_a)
flat = idx.reshape(-1)
check_true("order is expert-major and stable", np.all(np.diff(flat[order]) >= 0) and
           all(np.all(np.diff(order[offsets[e]:offsets[e + 1]]) > 0) for e in range(E)))
check("slot is the inverse of order", order[slot], np.arange(T * K, dtype=np.int32))
if not LARGE:
    table([(e, counts[e], offsets[e], order[offsets[e]:offsets[e + 1]].tolist()) for e in range(E) if counts[e]],
          ("expert", "count", "offset", "assignments a = t*k + j"))

H = 1024 if LARGE else 11
x = R.standard_normal((T, H)).astype(np.float32)
xs = x[order // K]                                           # gather: [T*k, H], expert-major
ys = (xs * (flat[order] + 1)[:, None]).astype(np.float32)    # expert e multiplies by e + 1
out = host(moe.combine(ys, wts, slot))
want = (wts * (idx + 1)).sum(axis=1, keepdims=True) * x
check("combine(experts(gather(x))) == sum_j w*(e+1)*x", out, want, atol=1e-5, rtol=1e-5)
check("combine kernel vs combine_ref", out, moe.combine_ref(ys, wts, slot), atol=1e-6, rtol=1e-6)
acc0 = R.standard_normal((T, H)).astype(np.float32)          # the shared experts' output
acc = kd.backend.asarray(acc0.copy())
moe.combine(ys, wts, slot, out=acc)
check("combine adds onto out= (the shared expert's result)", acc, acc0 + want, atol=1e-5, rtol=1e-5)

# %% [markdown]
# ## A picture: the routing weights (tokens x experts)

# %%
import matplotlib.pyplot as plt  # noqa: E402

Tp = min(T, 32)
dense = np.zeros((Tp, E), np.float32)
for tt in range(Tp):
    dense[tt, idx[tt]] = wts[tt]
fig, ax = plt.subplots(figsize=(min(12, 2 + E * 0.35), 1.2 + Tp * 0.35))
im = ax.imshow(dense, cmap="Blues", aspect="auto")
for gb in range(1, G):
    ax.axvline(gb * gsize - 0.5, color="tab:red", lw=1)
ax.set_xlabel(f"expert (red lines: {G} groups)")
ax.set_ylabel("token")
ax.set_title(f"routing weights, top-{K}, keep {TG} of {G} groups")
fig.colorbar(im, ax=ax)
save_figure(fig, args, "04_moe_routing.png")

# %%
finish()
