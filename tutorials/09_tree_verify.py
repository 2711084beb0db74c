"""Tutorial 09: tree verify - positions start + depth, the ancestor mask, tree attention, and the key property.

Run:  KDTREE_BACKEND=sim python tutorials/09_tree_verify.py [--size small|large] [--out DIR]
      (the tree attention kernel runs on the simulator at a tiny shape; the trained target on NumPy there)
"""
# %% [markdown]
# # 09 - Verifying a whole tree in one target forward
#
# With `start` committed tokens in the cache, the verify input is the root (the last bonus token, not yet in the
# cache) followed by the n tree nodes: `[root, node_1, .., node_n]`, n + 1 tokens in **one** forward.
#
# * **Positions**: the root sits at `start`, node i at `start + depth[i]` (siblings share a position, tutorial 02).
# * **Visibility**: every tree token sees all committed tokens, its ancestors and itself - nothing else. Row i of
#   the tree block's mask = row `parents[i]` plus column i.
#
# Then the logits at node i are **exactly** the target's next-token logits after the sequence
# `committed + root + path(i)` - as if that path had been decoded one token at a time. That is the property that
# makes DDTree lossless, and the one this tutorial checks on the trained target, with a real DFlash draft tree on a
# held-out prompt.

# %%
import numpy as np

from _common import (banner, check, check_true, finish, heldout_prompts, host, load_pair, parse_args, rng,
                     save_figure, section, show_text, stopwatch, table, token_texts)

import kdtree_numba as kd
from kdtree_numba.kernels import logprobs, tree_accept, tree_verify
from kdtree_numba.model.target import TreeInput

args = parse_args(__doc__)
banner("Tutorial 09 - tree verify", args)
Rng = rng(args, 9)
LARGE = args.size == "large"
PROC = kd.backend.process_name

# %% [markdown]
# ## A draft tree (tutorial 08) and its positions
#
# The first round on a held-out prompt: the trained pair's DFlash draft after the prompt, the target's greedy
# token as the root, and the best-first tree of a small budget.

# %%
section("the tree, its positions and root-to-node paths")
target, drafter = load_pair()
tok = target.tokenizer
task = heldout_prompts()[1]
prompt = np.asarray(tok.encode(task["prompt"]), np.int32)
print(f"{task['task_id']} ({len(prompt)} tokens), ending with")
print(show_text(task["prompt"], last_lines=3))
L, BUDGET, V = drafter.depth, (64 if LARGE else 12), target.config.vocab_size
root = int(np.argmax(target.logits(prompt)[-1]))                   # the bonus token of the previous round
draft = drafter.draft_logits(prompt, root)                          # [L, V] (tutorial 07)
lp, ids = logprobs.topk_logprobs_ref(draft, min(BUDGET, V))
tree = kd.build_tree(lp, ids, BUDGET)
n = tree.n
paths, pdepth = tree.paths(L)                    # [n+1, L+1] node indices by depth (-1 padded), [n+1] depths
start = len(prompt)
positions = (start + pdepth).astype(np.int32)    # root: start, node i: start + depth
words = ["root " + repr(tok.token_text(root))] + [repr(w) for w in token_texts(tok, tree.tokens)]
if not LARGE:
    table([(i, int(tree.parents[i]), pdepth[i], positions[i], paths[i, :pdepth[i] + 1].tolist(), words[i])
           for i in range(n + 1)], ("node", "parent", "depth", "position", "path (root..node)", "token"))

# %% [markdown]
# ## The ancestor mask
#
# The official DDTree code builds a dense (n+1) x (n+1) bool matrix on the CPU and a dense float mask over the whole
# context. kdtree_numba never materialises it: the attention kernel reads each node's key list from `paths`
# (committed rows `0 .. start-1`, then `start + paths[i, 0..depth[i]]`), at most L + 1 tree rows per node. We draw
# the mask here only to look at it (the committed rows, all visible to every tree token, as one column).

# %%
section("the mask")
C_all = start + n + 1
mask = np.zeros((n + 1, C_all), bool)
mask[:, :start] = True                                   # every tree token sees the committed prefix
for i in range(n + 1):
    mask[i, start + paths[i, :pdepth[i] + 1]] = True     # ... and its ancestors and itself
rec = np.eye(n + 1, dtype=bool)                          # the recurrence: row i = row parents[i] | column i
for i in range(1, n + 1):
    rec[i] |= rec[tree.parents[i]]
check("mask from paths == recurrence row(parent) | col(i)", mask[:, start:], rec)
print(f"tree block visible entries: {int(rec.sum())} of {(n + 1) ** 2} (a causal mask would allow "
      f"{(n + 1) * (n + 2) // 2})")

import matplotlib.pyplot as plt  # noqa: E402

shown_n = min(n, 24)                                     # the first nodes (all of them at the small size)
view = np.concatenate([mask[:shown_n + 1, :1], mask[:shown_n + 1, start:start + shown_n + 1]], axis=1)
fig, ax = plt.subplots(figsize=(3 + 0.32 * (shown_n + 2), 1.5 + 0.3 * (shown_n + 1)))
ax.imshow(view, cmap="Greens", vmin=0, vmax=1.3, aspect="equal")
ax.axvline(0.5, color="k", lw=1)
ax.set_xticks(range(shown_n + 2))
ax.set_xticklabels([f"0..{start - 1}"] + [f"t{c}" for c in range(shown_n + 1)], fontsize=7, rotation=90)
ax.set_yticks(range(shown_n + 1))
ax.set_yticklabels([f"{words[i]} (node {i}, pos {positions[i]})" for i in range(shown_n + 1)], fontsize=7)
ax.set_xlabel(f"cache row: committed 0..{start - 1} | tree rows t0 (root) .. t{shown_n}")
ax.set_title("who sees whom in the verify pass")
save_figure(fig, args, "09_tree_mask.png")

# %% [markdown]
# ## The kernel: `kernels/tree_verify.py`
#
# `tree_verify.tree_attention(q, cache, start, paths, depths, scale, lkv)` runs the causal MLA machinery of
# tutorial 05 (`mla_attention.py`: the tile loop, online softmax and split merge as device functions) over another
# key list. v1 (`_tree_attention_kernel`, the readable one, used on the simulator): grid (tree token, head group,
# key split), a block streams its token's keys `[0 .. start-1] + [start + paths[i, 0], .., start + paths[i,
# depth[i]]]` through shared memory in tiles with an online softmax. v2 (`_tree_attention_v2_kernel`): a block
# takes 32 (token, head) rows, streams the committed rows once for all of them in tiles of 16 keys with
# tensor-core MMAs, then the tile's ancestor rows, each visible to a row iff it lies on that token's path; v3 (the
# GPU default, tutorial 14 section 7) is the same kernel with tiles of 32 keys.
# The reference `tree_attention_ref(q, cache, start, parents, ...)` builds the explicit visibility matrix.
# Below: the real tree's structure, random q and cache at a tiny shape (2 heads, latent 8 + rope 4, 5 committed
# rows), the output poisoned with NaN before the launch.

# %%
section("tree attention: kernel vs reference")
N, Lkv, R = (64, 512, 64) if LARGE else (2, 8, 4)
start_k = 2000 if LARGE else 5
D = Lkv + R
cache = Rng.standard_normal((start_k + n + 1, D)).astype(np.float32)
q = Rng.standard_normal((n + 1, N, D)).astype(np.float32)
scale = 0.3
ref = tree_verify.tree_attention_ref(q, cache, start_k, tree.parents, scale, Lkv)
out = kd.backend.full((n + 1, N, Lkv), np.nan, np.float32)
with stopwatch() as t:
    tree_verify.tree_attention(q, cache, start_k, paths, pdepth, scale, Lkv, max_depth=L, out=out)
print(f"tree_attention over {n + 1} tree tokens, {start_k} committed rows: {t.ms:.1f} ms")
check("tree_attention kernel vs tree_attention_ref", out, ref, atol=1e-5, rtol=1e-4)
other = cache.copy()
for i in range(n + 1):                        # poison the tree rows node 1 must not see: its output is unchanged
    if not rec[1, i]:
        other[start_k + i] = 1e3
check("node 1 ignores non-ancestor tree rows", host(tree_verify.tree_attention(q, other, start_k, paths, pdepth,
                                                                               scale, Lkv, max_depth=L))[1],
      host(out)[1], atol=0, rtol=0)

# %% [markdown]
# ## The key property on the trained target
#
# Prefill the prompt, verify `[root] + tree` in one forward with `TreeInput(positions, paths, depths, max_depth)`,
# and compare every node's row with a plain causal forward over `prompt + root + path(node)` (its last row).
# (On the simulator the trained target runs on the NumPy references: tutorials 01-06 checked each stage's kernel
# against them; on a GPU it runs the kernels.)

# %%
section("verify logits == plain causal forward over each root-to-node path")
cache = target.new_cache(start + n + 1)
target.forward(prompt, cache, 0)                                 # prefill: rows 0 .. start-1
verify_ids = np.concatenate([[root], tree.tokens]).astype(np.int32)
tin = TreeInput(positions=(start + pdepth).astype(np.int32), paths=paths, depths=pdepth, max_depth=L)
with stopwatch() as t:
    vlogits, _ = target.forward(verify_ids, cache, start, tree=tin)   # ONE forward for the whole tree
vlogits = host(vlogits)
print(f"verify forward over {n + 1} tree tokens on {target.backend}: {t.ms:.0f} ms")

rows, plain_rows = [], []
for i in range(n + 1):
    path_tokens = [root] + [int(tree.tokens[j - 1]) for j in paths[i, 1:pdepth[i] + 1]]
    plain = target.logits(np.concatenate([prompt, path_tokens]).astype(np.int32))[-1]
    plain_rows.append(plain)
    err = float(np.abs(vlogits[i] - plain).max())
    if i < 16:
        rows.append((i, pdepth[i], repr(tok.decode(path_tokens)), repr(tok.token_text(int(np.argmax(vlogits[i])))),
                     repr(tok.token_text(int(np.argmax(plain)))), f"{err:.2e}"))
table(rows, ("node", "depth", "root + path", "verify argmax", "plain argmax", "max|diff|"))
print(f"(logits up to |{np.abs(vlogits).max():.1f}|)")
check("every node: verify row == causal forward over its path", vlogits, np.stack(plain_rows), atol=1e-4,
      rtol=1e-4)
check("greedy choice at every node == the causal forward's", np.argmax(vlogits, axis=1),
      np.argmax(np.stack(plain_rows), axis=1))
acc_path, bonus = tree_accept.walk_ref(np.argmax(vlogits, axis=1).astype(np.int32), tree.tokens, tree.parents[1:], n)
print(f"with these rows the target accepts nodes {acc_path} "
      f"({tok.decode([int(tree.tokens[j - 1]) for j in acc_path[1:]])!r}) and adds the bonus "
      f"{tok.token_text(bonus)!r} (tutorial 10)")

# %% [markdown]
# ## Without the tree mask it goes wrong
#
# A plain causal forward over the flattened tree (positions start, start+1, .., every token seeing all earlier
# ones) gives the right logits only for nodes whose path happens to be a prefix of the flattened order - a pitfall
# other ports hit ("a chain walked where no tree mask was applied").

# %%
section("the same tokens without the tree mask")
flat = target.logits(np.concatenate([prompt, verify_ids]).astype(np.int32))[start:]
errs = np.abs(flat - vlogits).max(axis=1)
on_chain = [i for i in range(n + 1) if list(paths[i, :pdepth[i] + 1]) == list(range(pdepth[i] + 1))]
print("max|causal-flattened - verify| per node: " + ", ".join(f"{i}:{e:.2g}" for i, e in enumerate(errs[:16])))
print(f"nodes whose path is 0, 1, .., i (a prefix of the flattened order): {on_chain}")
off_chain = [i for i in range(n + 1) if i not in on_chain]
check_true("flattened causal forward is wrong for every other node", all(errs[i] > 1e-3 for i in off_chain),
           f"{len(off_chain)} nodes differ by >= {min([errs[i] for i in off_chain] or [0]):.2g}")

# %%
finish()
