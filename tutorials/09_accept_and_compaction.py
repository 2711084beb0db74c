"""Tutorial 09: accept (choose a token at every node, walk from the root) and KV compaction (commit).

Run:  KDTREE_BACKEND=sim python tutorials/09_accept_and_compaction.py [--size small|large] [--out DIR]
"""
# %% [markdown]
# # 09 - Accepting a path, then compacting the cache
#
# After verify (tutorial 08) row i of the target logits is the target's next-token distribution after
# `committed + root + path(i)`. Accepting is two steps:
#
#     chosen[i] = argmax(logits[i])                          (T = 0)
#               = a sample of softmax(logits[i] / T)         (T > 0; Gumbel-max with counter-based uniforms)
#     path = [0];  while some child j of path[-1] has tokens[j] == chosen[path[-1]]:  path.append(j)
#     bonus = chosen[path[-1]]
#
# Every emitted token is a genuine target choice (argmax or sample) given its prefix, so this is **lossless at any
# temperature**: the output is exactly what plain decoding would produce (T = 0), or has exactly its distribution
# (T > 0). No draft-probability rejection step is involved. Siblings carry distinct tokens, so at most one child
# matches at each step.
#
# **Commit.** The accepted nodes' cache rows (written during verify at `start + node index`) move to
# `start, start + 1, ..` in every layer - the cache then holds exactly the rows a plain decoder would have
# written. `start += len(path)`, and the bonus becomes the next round's root.

# %%
import numpy as np

from _common import (banner, check, check_true, finish, host, parse_args, rng, save_figure, section, stopwatch,
                     table)

import kdtree_numba as kd
from kdtree_numba.kernels import kv_compaction, logprobs, tree_accept

args = parse_args(__doc__)
banner("Tutorial 09 - accept and KV compaction", args)
Rng = rng(args, 9)
LARGE = args.size == "large"

# %% [markdown]
# ## A hand-made verified tree
#
#     root ─ 1 (tok 5) ─ 3 (tok 9)
#          └ 2 (tok 7) ─ 4 (tok 2)
#                      └ 5 (tok 8) ─ 6 (tok 3)
#
# We give the target logits a clear favourite per node: root -> 7, node 2 -> 8, node 5 -> 3, node 6 -> 11.
# The walk must accept nodes 0, 2, 5, 6 (tokens 7, 8, 3) and emit the bonus 11.

# %%
section("the tree and the target's choices")
V = 12
parents = np.array([-1, 0, 0, 1, 2, 2, 5], np.int32)       # node 0 = root
tokens = np.array([5, 7, 9, 2, 8, 3], np.int32)            # node i's token at index i - 1
n = len(tokens)
favourite = np.array([7, 4, 8, 0, 1, 3, 11])               # per node (rows 1, 3, 4: anything not a child's token)
logits = Rng.standard_normal((n + 1, V)).astype(np.float32)
logits[np.arange(n + 1), favourite] += 6.0
chosen_ref = logprobs.choose_tokens_ref(logits, 0.0)
table([(i, int(parents[i]), "-" if i == 0 else int(tokens[i - 1]), int(chosen_ref[i]),
        [int(tokens[j - 1]) for j in range(1, n + 1) if parents[j] == i]) for i in range(n + 1)],
      ("node", "parent", "token", "target's argmax", "children's tokens"))

# %% [markdown]
# ## The reference: `walk_ref` (plain Python)

# %%
section("greedy accept: reference")
path_ref, bonus_ref = tree_accept.walk_ref(chosen_ref, tokens, parents[1:], n)
print(f"walk_ref: accepted nodes {path_ref}, emitted tokens {[int(tokens[j - 1]) for j in path_ref[1:]]} "
      f"+ bonus {bonus_ref}")
check("walk_ref accepted path == [0, 2, 5, 6]", np.array(path_ref), np.array([0, 2, 5, 6]))
check("walk_ref bonus == 11", np.array([bonus_ref]), np.array([11]))

# %% [markdown]
# ## The kernels
#
# * `logprobs._choose_kernel` - **one block per node row**: threads stride over the vocabulary keeping their best
#   (value, index) - at T > 0 the value is `logit / T + Gumbel(u)`, u from the counter-based generator
#   Philox4x32-10 keyed by (seed, stream, row, token) - then a shared-memory arg-max reduction (lower index on
#   ties). A counter-based generator needs no RNG state, so a run is reproducible from its seed and the reference
#   (`choose_tokens_ref`) computes the very same u.
# * `tree_accept._walk_kernel` - **one block**: at each step (at most L + 1) every thread scans a strided share of
#   the nodes for the child whose token matches, a barrier, and thread 0 records the step. It writes the accepted
#   node indices, their count and one packed row `[m, token_1 .. token_{m-1}, bonus]` - the only thing the decode
#   loop reads back to the host per round.
#
# `tree_accept.accept(logits, tokens, parents, n, temperature, seed, stream)` runs both (the host convenience).

# %%
section("greedy accept: kernels vs reference")
with stopwatch() as t:
    path_k, bonus_k = tree_accept.accept(logits, tokens, parents[1:], n)
print(f"accept (choose + walk kernels): accepted {path_k}, bonus {bonus_k}  ({t.ms:.0f} ms)")
check("choose_tokens kernel (T=0) vs choose_tokens_ref", logprobs.choose_tokens(logits, 0.0), chosen_ref)
check("accept kernel path vs walk_ref", np.array(path_k), np.array(path_ref))
check("accept kernel bonus vs walk_ref", np.array([bonus_k]), np.array([bonus_ref]))

# %% [markdown]
# ## T > 0: sampling, reproducible from the seed
#
# Same logits with a milder favourite, temperature 1. Each seed gives one sample per node; the same seed gives the
# same result every time, on every backend.

# %%
section("sampled accept (T = 1)")
soft = Rng.standard_normal((n + 1, V)).astype(np.float32)
soft[np.arange(n + 1), favourite] += 2.0
T_ = 1.0
rows = []
for seed in range(4 if not LARGE else 12):
    a1 = tree_accept.accept(soft, tokens, parents[1:], n, temperature=T_, seed=seed, stream=1)
    a2 = tree_accept.accept(soft, tokens, parents[1:], n, temperature=T_, seed=seed, stream=1)
    ch = logprobs.choose_tokens_ref(soft, T_, seed, 1)
    pr, br = tree_accept.walk_ref(ch, tokens, parents[1:], n)
    check(f"seed {seed}: same seed -> same result", np.array(a1[0] + [a1[1]]), np.array(a2[0] + [a2[1]]))
    check(f"seed {seed}: kernel == reference sampler + walk_ref", np.array(a1[0] + [a1[1]]), np.array(pr + [br]))
    rows.append((seed, a1[0], [int(tokens[j - 1]) for j in a1[0][1:]] + [a1[1]]))
table(rows, ("seed", "accepted nodes", "emitted tokens"))

# Why it is lossless: the root's choice is a sample of softmax(logits[0] / T); over many seeds its frequencies match.
freq = np.bincount([logprobs.choose_tokens_ref(soft[:1], T_, s, 1)[0] for s in range(2000)], minlength=V) / 2000
p = np.exp(soft[0] / T_ - soft[0].max() / T_)
p /= p.sum()
check("root token frequencies (2000 seeds) ~ softmax(logits/T)", freq, p, atol=0.03, rtol=0)

# %% [markdown]
# ## KV compaction: `kernels/kv_compaction.py::_compact_kernel`
#
#     for every layer l, j < len(accepted):   cache[l, start + j] = cache[l, start + accepted[j]]
#
# `accepted` is ascending with the root first, so `accepted[j] >= j`: rows only move towards the front - but the
# source and destination ranges **overlap**. A sequential loop in ascending j is safe (a row is read before anyone
# overwrites it); a descending loop is not. The kernel: grid (layer, column chunk of 128), each block copies its
# chunk of up to 16 accepted rows at a time through shared memory - **all reads of the group, a barrier, then all
# writes** - so no row is overwritten before it is read, whatever order the threads run in. One launch moves the
# rows of every layer (the latent cache is one `[layers, capacity, 576]` buffer).

# %%
section("compaction: the overlap hazard")
layers, cap, W = (61, 4096, 576) if LARGE else (2, 12, 6)
start = 3 if not LARGE else 3000
accepted = np.array(path_k, np.int32)                     # [0, 2, 5, 6]: tree rows start+0, +2, +5, +6
base = np.zeros((layers, cap, W), np.float32)
base += np.arange(cap, dtype=np.float32)[None, :, None]                    # value = row id ...
base += 1000 * np.arange(layers, dtype=np.float32)[:, None, None]          # ... + 1000 * layer
base += np.arange(W, dtype=np.float32)[None, None, :] / 100                # ... + column / 100

want = base.copy()
kv_compaction.compact_ref(want, start, accepted)          # fancy indexing copies the sources first
desc = base.copy()                                        # a naive loop in descending j: overwrites too early
for j in reversed(range(len(accepted))):
    desc[:, start + j] = desc[:, start + accepted[j]]
asc = base.copy()
for j in range(len(accepted)):
    asc[:, start + j] = asc[:, start + accepted[j]]
check("ascending sequential loop == compact_ref", asc, want, atol=0, rtol=0)
check_true("descending sequential loop is wrong (hazard)", not np.array_equal(desc, want),
           f"row {start + 1} got {desc[0, start + 1, 0]:.0f}, expected {want[0, start + 1, 0]:.0f}")

section("compaction: kernel vs reference")
got = kd.backend.asarray(base.copy())
with stopwatch() as t:
    kv_compaction.compact(got, start, accepted)
print(f"_compact_kernel[grid=({layers}, {-(-W // kv_compaction.CHUNK)}), block="
      f"{kd.backend.block_size(256, 32)}]: {t.ms:.1f} ms")
got = host(got)
check("compact kernel vs compact_ref (exact, every layer)", got, want, atol=0, rtol=0)
check("rows before start untouched", got[:, :start], base[:, :start], atol=0, rtol=0)
check("rows after start + len(accepted) untouched", got[:, start + len(accepted):],
      base[:, start + len(accepted):], atol=0, rtol=0)
padded = np.full(8, -1, np.int32)                         # the decode loop's form: count on the device
padded[:len(accepted)] = accepted
dev = kd.backend.asarray(base.copy())
kv_compaction.compact(dev, start, padded, n_accepted=kd.backend.asarray(np.array([len(accepted)], np.int32)))
check("with n_accepted on the device (padded accepted)", dev, want, atol=0, rtol=0)

if not LARGE:
    show = range(start + n + 1)
    table([(r, f"{base[0, r, 0]:.0f}", f"{got[0, r, 0]:.0f}", f"{got[1, r, 0]:.0f}",
            "<- committed" if r < start else ("<- accepted" if r < start + len(accepted) else "scratch"))
           for r in show], ("row", "layer 0 before", "layer 0 after", "layer 1 after", ""))
    print(f"(values = source row id + 1000 * layer; tree rows {start}..{start + n}, accepted nodes {path_k} -> "
          f"rows {[start + a for a in path_k]} -> {start}..{start + len(path_k) - 1}; the new length is "
          f"start + {len(path_k)} = {start + len(path_k)})")

# %% [markdown]
# ## A picture: the cache rows before and after (layer 0)

# %%
import matplotlib.pyplot as plt  # noqa: E402

rows_shown = min(cap, start + n + 3)
fig, ax = plt.subplots(1, 2, figsize=(4.5, 3.2), sharey=True)
for a, data, title in ((ax[0], base, "before (verify wrote the tree)"), (ax[1], got, "after compact")):
    a.imshow(data[0, :rows_shown, :1] % 1000, cmap="tab20", aspect=0.25, vmin=0, vmax=20)
    for r in range(rows_shown):
        a.text(0, r, f"{data[0, r, 0]:.0f}", ha="center", va="center", fontsize=7)
    a.axhline(start - 0.5, color="k", lw=1)
    a.set_title(title, fontsize=9)
    a.set_xticks([])
ax[0].set_ylabel("cache row (label: source row id)")
save_figure(fig, args, "09_compaction.png")

# %%
finish()
