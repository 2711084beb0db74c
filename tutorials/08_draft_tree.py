"""Tutorial 08: draft distributions -> top-K log-probs per depth -> DDTree's best-first draft tree.

Run:  KDTREE_BACKEND=sim python tutorials/08_draft_tree.py [--size small|large] [--out DIR]
"""
# %% [markdown]
# # 08 - From draft distributions to the best-first tree
#
# A DDTree round starts with the drafter's logits for depths 1..L (`[L, V]`): depth d is its guess for the token
# at position `start + d` (the root, the last committed token, sits at `start`). The DFlash drafter (tutorial 07)
# proposes one distribution per *position* - marginals, not a tree; DDTree builds the tree:
#
# 1. **Top-K per depth.** `K = min(budget, V)`. For each depth the K best tokens and their log-probs from an fp32
#    log-softmax: `lp[d][r] = logit[d][ids[d][r]] - logsumexp(logits[d])`, sorted descending (equal logits: lower
#    token id first). Draft logits are never divided by the temperature.
# 2. **Best-first tree.** A node is a rank tuple `(r_1, .., r_d)` = "the r_i-th best token at depth i". Its weight
#
#        logw = sum_i lp[i][r_i]          (float64)   = log of the product of the per-depth draft probabilities
#
#    is a *surrogate* for "probability that the whole path gets accepted" - exact if the positions were
#    independent and the draft were the target. The tree is the `budget` nodes of largest weight; a max-heap
#    finds them without enumerating all K^L tuples: pop the best, push its next sibling (same parent, rank+1) and
#    its first child (depth+1, rank 0).
#
# **Why the node set is prefix-closed**: log-probs are <= 0, so a child never outweighs its parent, and a
# sibling of rank r+1 never outweighs rank r. Whenever a node is among the best, its parent (and its elder
# siblings) are too - so every node's path to the root is in the tree, which is what verification needs (a node
# is only useful if its parent is accepted). Summing `exp(logw)` over the tree gives the expected number of
# accepted draft tokens under the surrogate; the top-`budget` set maximises it.

# %%
import numpy as np

from _common import (banner, check, check_true, draw_owners, finish, heldout_prompts, host, load_pair, parse_args,
                     rng, save_figure, section, show_kernel, show_text, stopwatch, table, token_texts)

import kdtree_numba as kd
from kdtree_numba.kernels import logprobs, topk_block as tb, topk_split as ts, tree_build, tree_heap

args = parse_args(__doc__)
banner("Tutorial 08 - draft distributions and the best-first tree", args)
Rng = rng(args, 8)
LARGE = args.size == "large"
PROC = kd.backend.process_name

# %% [markdown]
# ## Real draft logits
#
# The first round on a held-out HumanEval prompt: the trained pair's DFlash draft after the prompt, with the
# target's greedy next token as the root - `[15, 4096]` logits. (`--size large` instead makes up logits over
# Kimi-K2's 163840-token vocabulary, a favourite per depth plus noise, to exercise the split top-K path on a GPU.)

# %%
section("the draft")
target, drafter = load_pair()
tok = target.tokenizer
if LARGE:
    L, V, BUDGET = 15, 163840, 256                           # depths, vocabulary, tree budget
    draft = Rng.standard_normal((L, V)).astype(np.float32)
    draft[np.arange(L), Rng.integers(0, V, L)] += np.linspace(6.0, 2.0, L).astype(np.float32)
    labels = None
else:
    task = heldout_prompts()[0]
    prompt = tok.encode(task["prompt"])
    root = int(kd.generate(target, prompt, 1).tokens[0])          # the target's greedy token after the prompt
    draft = drafter.draft_logits(prompt, root)                   # [L, V], host float32
    L, V = draft.shape
    BUDGET = 24
    labels = tok
    print(f"{task['task_id']} ({len(prompt)} tokens), ending with")
    print(show_text(task["prompt"], last_lines=3))
    print(f"root {tok.token_text(root)!r}; draft logits {draft.shape} (depths 1..{L}, vocabulary {V})")
K = min(BUDGET, V)


def text(ids):
    """Token labels: their text with the trained pair's tokenizer, else ids."""
    return token_texts(labels, ids)


# %% [markdown]
# ## Top-K log-probs: the reference

# %%
section("top-K log-probs per depth: reference")
m = draft.max(axis=1, keepdims=True)
lse = m + np.log(np.exp(draft - m).sum(axis=1, keepdims=True))            # logsumexp per depth
ids_plain = np.argsort(-draft, axis=1, kind="stable")[:, :K]              # best K tokens (lower id on ties)
lp_plain = np.take_along_axis(draft, ids_plain, 1) - lse
lp_ref, ids_ref = logprobs.topk_logprobs_ref(draft, K)
check("plain NumPy == topk_logprobs_ref: ids", ids_ref, ids_plain.astype(np.int32))
check("plain NumPy == topk_logprobs_ref: log-probs", lp_ref, lp_plain, atol=1e-6, rtol=1e-6)

# %% [markdown]
# ## The kernel: `kernels/topk_block.py::_topk_kernel`
#
# `logprobs.topk_logprobs` runs one of two top-K kernels, by row length; the pieces both share (the packed key, the
# fold, the histogram threshold, the sort) are in `kernels/topk_common.py`.
#
# Thread mapping: **one block per row** (a depth), 512 threads on a GPU (`MAX_THREADS`; 32 on the simulator).
# Every (value, index) is packed into one 64-bit number `order_key << 32 | ~index` (the float's bits flipped so
# that unsigned order = float order): one unsigned compare then orders by (value desc, index asc), and no two
# elements tie.
# * Pass 1: each thread folds its strided elements, eight loads per step, into a running (max, sum of exp) - an
#   "online" log-sum-exp, combined across the block by a reduction into the row's lse - and keeps **two tops**:
#   the maximum of its even steps and the maximum of its odd steps (two distinct elements, one compare each per
#   element instead of the three that keeping its two largest elements would cost).
# * Threshold: those 2 x threads tops belong to distinct elements, so their K-th largest is a lower bound for the
#   row's K-th largest. A shared **2048-bin histogram** of them (over [smallest second top, row max]) finds the
#   bin b* holding it; the bin map is monotone, so every element of the top K lies in a bin >= b*.
# * Pass 2 collects the elements in bins >= b* (typically K plus a few percent) and sorts them: a **rank sort**
#   (each candidate counts the candidates above it) up to 1024 candidates, a bitonic network above.
# * Long runs of equal values can overflow the 4096-entry candidate buffer: then each thread's 4 largest
#   composites are bitonic-sorted, and failing that a radix search finds the exact threshold key (ties broken by
#   an ordered scan, lowest ids first).
# * Only **large vocabularies, V >= 2 x 16384 = 32768** (`SPLIT_CHUNK`), split a row over several blocks
#   (`kernels/topk_split.py`), so that a single request's 15 rows still fill the GPU: one block of 512 threads
#   per **16384-column chunk**, staged in 64 KB of dynamic shared memory, finds its own bound t (<= its K-th
#   largest) from the thread tops and lists the elements >= t; a per-row select kernel sorts what survives the
#   largest t. The logits are read once. The trained pair's 4096-token rows take the one-block path;
#   `--size large` (V = 163840) the split one.

# %%
section("top-K log-probs: kernel vs reference")
check_true("the constants the text describes", (tb.MAX_THREADS, ts.SPLIT_CHUNK, tb.NBINS, tb.RANK_SORT, tb.CAP)
           == (512, 16384, 2048, 1024, 4096),
           f"MAX_THREADS {tb.MAX_THREADS}, SPLIT_CHUNK {ts.SPLIT_CHUNK} (split at V >= {2 * ts.SPLIT_CHUNK}), "
           f"NBINS {tb.NBINS}, RANK_SORT {tb.RANK_SORT}, CAP {tb.CAP}")
# on the simulator three rows (depths 1, 2 and 15) are plenty: every row is its own block
rows_k = [0, 1, L - 1] if PROC == "sim" else list(range(L))
split = V >= 2 * ts.SPLIT_CHUNK
with stopwatch() as t:
    lp_k, ids_k = logprobs.topk_logprobs(np.ascontiguousarray(draft[rows_k]), K)
how = (f"split: {-(-V // ts.SPLIT_CHUNK)} chunks x {len(rows_k)} rows" if split else
       f"_topk_kernel[grid={len(rows_k)}, block={kd.backend.block_size(tb.MAX_THREADS, 32)}]")
print(f"{how} on [{len(rows_k)}, {V}], K={K}: {t.ms:.1f} ms"
      + ("  (rows of depths 1, 2, 15 on the simulator)" if PROC == "sim" else ""))
check("topk_logprobs kernel vs reference: ids (exact)", host(ids_k), ids_ref[rows_k])
check("topk_logprobs kernel vs reference: log-probs", host(lp_k), lp_ref[rows_k], atol=1e-5, rtol=1e-5)
lp, ids = lp_ref, ids_ref                      # the tree below uses all 15 rows (equal to the kernel's where run)
if not LARGE:
    table([(d + 1, " ".join(f"{w!r}" for w in text(ids[d, :4])), " ".join(f"{np.exp(v):.3f}" for v in lp[d, :4]),
            f"{np.exp(lp[d]).sum():.3f}")
           for d in range(L)], ("depth", "top-4 tokens", "draft probabilities", f"mass in top-{K}"))

# %% [markdown]
# ## The heap reference and the GPU formulation
#
# `tree_build.build_tree_ref(lp, ids, budget)` is the heap algorithm exactly as the official DDTree code runs it
# (entries `(-logw, rank_tuple, parent, depth, rank, logw)`; equal weights pop in rank-tuple order; sibling
# weights telescoped in float64 as `logw - lp[d][r] + lp[d][r+1]`).
#
# `kd.build_tree(lp, ids, budget)` runs `_build_kernel` on the device (the numpy backend runs the heap): **one block
# per request**, level by level d = 1..L:
# 1. *expand* - every kept node of depth d-1 gets its children's sibling chain with the heap's exact float64
#    arithmetic (stopping at rank `budget`, a -inf log-prob, or once the list is full, below the current
#    budget-th weight). While every telescoping step is exact - the rule for float32 log-probs - a chain's
#    weights are `W_parent + lp[d][r]`, so one thread per parent finds its length by binary search and one thread
#    per child writes it; an inexact step makes that level walk its chains in order instead;
# 2. *sort* the candidates in heap pop order (rank sort or bitonic sort in shared memory, with a comparator that
#    reproduces the heap's tie order even when telescoped weights differ by an ulp; at d = 1 the root's single
#    chain is already in order);
# 3. *merge* them with the kept list (co-ranking by binary search) and keep the first `budget`.
#
# It must give **the same tree**: same tokens, depths, parents, and bit-identical float64 weights (`Tree.__eq__`
# compares the weights' bit patterns).

# %%
section("best-first tree: heap reference vs kd.build_tree")
ref_tree = tree_build.build_tree_ref(lp, ids, BUDGET)          # same inputs as the device build
with stopwatch() as t:
    tree = kd.build_tree(lp, ids, BUDGET)
print(f"kd.build_tree ({'heap reference' if kd.backend.process_name == 'numpy' else '_build_kernel'}): "
      f"{tree.n} nodes in {t.ms:.1f} ms")
check_true("kd.build_tree == build_tree_ref (Tree ==, incl. float64 weights)", tree == ref_tree, f"{tree.n} nodes")
check("weights bit-identical", tree.logw.view(np.int64), ref_tree.logw.view(np.int64))

parents = tree.parents
check_true("pop order: parents[i] < i", all(parents[i] < i for i in range(1, tree.n + 1)))
check_true("depth[i] == depth[parent] + 1", all(tree.depths[i - 1] == (tree.depths[parents[i] - 1] if parents[i]
                                                                    else 0) + 1 for i in range(1, tree.n + 1)))
check_true("pops come out in non-increasing weight", bool(np.all(np.diff(tree.logw) <= 1e-12)))
check_true("prefix-closed: a node never outweighs its parent",
           all(parents[i] == 0 or tree.logw[i - 1] <= tree.logw[parents[i] - 1] for i in range(1, tree.n + 1)))

# %% [markdown]
# **The chain** (`kd.generate(..., chain=True)`, the DFlash baseline) asks for one draft per depth (K = 1): the heap
# pops depth 1, 2, .. in order. The kernel does not run its level loop for that - it cost the chain 78 us a round
# on the H200, one pass per depth - but writes the chain directly (`_chain_nodes`), with the same weights.

# %%
chain_lp, chain_ids = lp[:, :1].copy(), ids[:, :1].copy()                    # [L, 1]: the top-1 per depth
chain = kd.build_tree(chain_lp, chain_ids, BUDGET)
check_true("K = 1: the chain, node d the child of node d - 1, == build_tree_ref",
           chain == tree_build.build_tree_ref(chain_lp, chain_ids, BUDGET)
           and list(chain.parents) == list(range(-1, chain.n)), f"{chain.n} nodes")

# %% [markdown]
# **Small budgets, deep trees: the heap itself** (`kernels/tree_heap.py`). The level loop costs a pass per depth
# (~6 us), a heap pop ~0.3 us (H100) whatever the depth - a trained drafter's trees run 10-15 deep. For
# budgets up to `tree_heap.HEAP_BUDGET` (64) the kernel reads a bound on the depth off the rows
# (`tree_heap.depth_bound`: no depth is reached whose greedy path weighs less than depth 1's budget-th log-prob) and
# runs the heap algorithm itself in one warp (`tree_heap._heap_lanes`) when budget <= 8 x that bound
# (`tree_build.heap_path`), the level loop otherwise. Both give the same tree.

# %%
bound = tree_heap.depth_bound(lp, BUDGET)
print(f"depth bound {bound} (the tree is {tree.depths.max()} deep): mode 0 runs "
      f"{'the heap itself' if tree_build.heap_path(lp, BUDGET, 0) else 'the level loop'}")
check_true("depth_bound >= the tree's depth", bound >= tree.depths.max())
if PROC != "numpy":
    ran = tree_build.HEAP if tree_build.heap_path(lp, BUDGET, 0) else tree_build.LEVELS   # kd.build_tree's path above
    for mode, name in ((tree_build.HEAP, "heap path"), (tree_build.LEVELS, "level loop")):
        if mode == ran:                        # kd.build_tree (mode 0) ran this one above: its tree, not a rerun
            check_true(f"the {name} (kd.build_tree above, mode 0) == build_tree_ref", tree == ref_tree)
            continue
        forced = tree_build.TreeBuilder(1, L, K, BUDGET, mode=mode)
        forced.build(kd.backend.asarray(lp[None]), kd.backend.asarray(ids[None].astype(np.int32)))
        check_true(f"the {name} (TreeBuilder mode {mode}) == build_tree_ref", forced.out.to_trees()[0] == ref_tree)

# %% [markdown]
# ## The GPU formulation on one page: a teaching version
#
# The kernel (`_build_kernel`: a loop over depths calling named device functions - `_choose_floor`, `_write_children`,
# `_walk_chains`, the sorts, `_merge`, `_rewrite_table`, `_write_outputs`; printed below the teaching version) spends
# most of its code on doing this fast and on the ulp-level tie rules. Without those, its level-by-level idea fits in a
# dozen lines of NumPy: at depth d every kept node of depth d-1 is a parent; its candidate children are its parent's
# weight plus each of the top-K log-probs of depth d (one *chain* per parent, non-increasing, so at most `budget` of
# each can matter); the candidates are merged with the kept list in pop order (weight descending, rank tuple ascending
# on ties) and the first `budget` stay. Why the split by level loses nothing: a node's parent always pops before it, so
# the best `budget` nodes of depths <= d are exactly the best `budget` among (the kept list + the children of its
# depth-(d-1) nodes). On the GPU one thread per parent sizes its chain, one thread per candidate writes it, a block-wide
# sort orders them, and a merge by binary search keeps the first `budget`: the same three steps as the loop below.

# %%
section("the level-by-level build, as a teaching version")


def teaching_build(lp, budget):
    """Rank tuples of the best-first tree in pop order: level by level, expand -> sort -> merge -> keep budget."""
    kept = []                                                   # [(rank tuple, weight)], pop order
    parents = [((), 0.0)]                                       # the root
    for d in range(lp.shape[0]):
        cand = [(t + (r,), w + float(lp[d, r])) for t, w in parents
                for r in range(min(budget, lp.shape[1])) if lp[d, r] > -np.inf]             # expand: chains
        kept = sorted(kept + cand, key=lambda n: (-n[1], n[0]))[:budget]                   # sort + merge + keep
        parents = [n for n in kept if len(n[0]) == d + 1]
        if not parents:
            break
    return kept


teach = teaching_build(lp.astype(np.float64), BUDGET) if not LARGE else []
rank_of = [{int(t): r for r, t in enumerate(ids[d])} for d in range(L)]   # token -> its rank at depth d


def rank_tuple(tree, i):                                        # node i (1-based) -> its rank tuple
    out = []
    while i:
        out.append(rank_of[tree.depths[i - 1] - 1][int(tree.tokens[i - 1])])
        i = tree.parents[i]
    return tuple(reversed(out))


if not LARGE:      # (at Kimi's size ulp-close weights appear, whose heap order only the kernel's comparator keeps)
    check_true("teaching version == kd.build_tree: the same nodes in the same pop order",
               [t for t, _ in teach] == [rank_tuple(tree, i) for i in range(1, tree.n + 1)], f"{len(teach)} nodes")
    check("teaching version's weights == the tree's", np.array([w for _, w in teach]), tree.logw, atol=1e-12,
          rtol=0)

# %% [markdown]
# ## The tree as an outline
#
# `q` = the draft probability of the node's token at its depth (`exp(lp)`), `w` = `exp(logw)`, the product of the
# q's along the path (the surrogate weight). Children are listed in pop order.

# %% [markdown]
# ## The kernel on the page
#
# The real kernel's body, printed from the package: per depth, (1) expand - the floor below which no chain can
# reach the top `budget` and each chain's length (one thread per parent, binary search, a block scan into slots),
# the children written (one thread per candidate), or the chains walked in order when a telescoped step is
# inexact; (2) sort the candidates in shared memory (rank sort when few, bitonic above); (3) merge them into the
# top list and rewrite the node table in pop order. The device functions it calls sit above it in
# `kernels/tree_build.py`, each with its spec.

# %%
section("the tree-build kernel on the page")
show_kernel(tree_build._build_kernel)

# %% [markdown]
# ### Which thread writes which candidate: the expansion of level 2 (a made-up draft, K = 8, budget 8)
#
# Step 1 of a level: one thread per parent finds how many of its children reach the level's floor (a binary
# search down its chain, whose weights never rise), a block scan turns those lengths into first slots, and thread
# `slot` writes candidate `slot` (`_write_children`: its parent is the last whose first slot is <= slot, its rank
# is slot - that first slot). After depth 1 the kept list G holds budget = 8 depth-1 nodes, so the floor is G's
# lightest weight (minus a rounding margin): a child lighter than 8 nodes we already have can never be among the
# best 8. Blank cells are children below the floor - never written, never sorted. (On the GPU the block has 256
# threads, so for up to 256 candidates the thread is the slot.)

# %%
section("thread-to-data: the expansion of level 2")
logits_m = np.array([[3.0, 2.2, 1.5, 1.0, 0.4, 0.0, -0.5, -1.0], [2.5, 2.4, 0.3, 0.2, 0.0, -0.3, -1.0, -2.0]])
lp_m = (logits_m - np.log(np.exp(logits_m).sum(axis=1, keepdims=True))).astype(np.float32)   # [2, 8] sorted
ids_m = np.tile(np.arange(8, dtype=np.int32), (2, 1))                 # token = rank, so tokens show rank tuples
B_m = 8
top = tree_build.build_tree_ref(lp_m[:1], ids_m[:1], B_m)             # G after depth 1, in pop order
par_w = top.logw[top.depths == 1]                                      # the level-2 parents' weights
floor = tree_build.level_counts_ref(lp_m, B_m).floors[1]
child_w = par_w[:, None] + lp_m[1].astype(np.float64)[None, :]         # [parents, ranks] candidate weights
lengths = (child_w >= floor).sum(axis=1)                               # each chain: a prefix of its ranks
first = np.concatenate([[0], np.cumsum(lengths)[:-1]])                 # the block scan: first slots
owner = np.full(child_w.shape, -1)
for p_, (f_, n_) in enumerate(zip(first, lengths)):
    owner[p_, :n_] = f_ + np.arange(n_)                                # thread = slot
check_true("the chain lengths add up to the kernel spec's level-2 candidate count",
           int(lengths.sum()) == int(tree_build.level_counts_ref(lp_m, B_m).candidates[1]),
           f"{int(lengths.sum())} of {child_w.size} children are written")
tree_m = kd.build_tree(lp_m, ids_m, B_m)
row_of = {int(r): i for i, r in enumerate(top.tokens)}                 # depth-1 rank -> its row (pop order)
deep = [(int(tree_m.tokens[tree_m.parents[n + 1] - 1]), int(tree_m.tokens[n])) for n in range(tree_m.n)
        if tree_m.depths[n] == 2]
check_true("every depth-2 node of the final tree was a written candidate",
           all(owner[row_of[r1], r2] >= 0 for r1, r2 in deep), f"depth-2 nodes (rank tuples): {deep}")
save_figure(draw_owners(owner, "tree build, level 2: the thread that writes candidate (parent, rank); blank = "
                        "below the floor", "rank of the child at depth 2", "parent (its depth-1 rank, pop order)",
                        row_names=[f"({int(r)})" for r in top.tokens]), args, "08_expand_threads.png")

# %%
section("the tree")


def outline(tree, max_lines=40):
    children = {i: [] for i in range(tree.n + 1)}
    for i in range(1, tree.n + 1):
        children[int(tree.parents[i])].append(i)
    lines = ["root (position start)"]

    def walk(node, prefix):
        kids = children[node]
        for j, c in enumerate(kids):
            last = j == len(kids) - 1
            par_w = tree.logw[tree.parents[c] - 1] if tree.parents[c] else 0.0
            q, w = np.exp(tree.logw[c - 1] - par_w), np.exp(tree.logw[c - 1])
            lines.append(f"{prefix}{'`-- ' if last else '|-- '}[{c}] {text([tree.tokens[c - 1]])[0]!r:<12s} "
                         f"q={q:.3f}  w={w:.4f}")
            walk(c, prefix + ("    " if last else "|   "))

    walk(0, "")
    print("\n".join(lines[:max_lines]) + ("\n..." if len(lines) > max_lines else ""))


outline(tree)
print(f"\nsum of exp(logw) = {np.exp(tree.logw).sum():.3f} expected accepted draft tokens under the surrogate "
      f"(a chain of the top-1 tokens: {np.exp(np.cumsum(lp[:, 0].astype(np.float64))).sum():.3f})")

# %% [markdown]
# ## It really is the top-`budget` set of prefixes
#
# For a small problem we can enumerate every rank tuple up to depth Ls (K + K^2 + .. + K^Ls of them) and compare
# the tree's weights with the `budget` largest. We cut the real draft down to its first 4 depths and 6 ranks
# (1554 prefixes) and build a tree of 12 nodes from it.

# %%
section("brute force: all prefixes (the draft cut to 4 depths x 6 ranks)")
Ls, Ks, Bs = 4, 6, 12
lp_s, ids_s = np.ascontiguousarray(lp[:Ls, :Ks]), np.ascontiguousarray(ids[:Ls, :Ks])
tree_s = kd.build_tree(lp_s, ids_s, Bs)
lp64 = lp_s.astype(np.float64)
weights, level = [], np.zeros(1)
for d in range(Ls):
    level = (level[:, None] + lp64[d][None, :]).ravel()             # all tuples of depth d + 1
    weights.append(level)
allw = np.sort(np.concatenate(weights))[::-1]
print(f"{allw.size} prefixes enumerated")
check_true("kd.build_tree == build_tree_ref (cut draft)", tree_s == tree_build.build_tree_ref(lp_s, ids_s, Bs),
           f"{tree_s.n} nodes")
check("tree weights == the budget largest prefix weights", np.sort(tree_s.logw)[::-1], allw[:Bs],
      atol=1e-12, rtol=0)

# %% [markdown]
# ## Ties: uniform rows (made-up logits)
#
# Real drafts rarely tie, so here the logits are made up on purpose. With all draft logits equal every tuple of a
# depth has the same weight, and only the heap's tie rule (rank tuples in Python tuple order) decides. Telescoped
# float64 weights may even differ by an ulp between tuples that are mathematically equal - the GPU version
# reproduces the heap's order anyway.

# %%
section("ties: uniform and partly tied rows (made-up logits)")
Lt, Vt, Bt = (L, V, BUDGET) if LARGE else (4, 40, 10)
Kt = min(Bt, Vt)
uniform = np.zeros((Lt, Vt), np.float32)
# every row is the same: the kernel ranks one (a block per row) and the tree gets Lt copies of it
lp_u, ids_u = (np.repeat(host(a), Lt, axis=0) for a in logprobs.topk_logprobs(uniform[:1], Kt))
lp_u_ref, ids_u_ref = logprobs.topk_logprobs_ref(uniform, Kt)
check("uniform rows: top-K ids == lowest ids first", ids_u, ids_u_ref)
check("uniform rows: log-probs == -log V", lp_u, np.full((Lt, Kt), -np.log(Vt), np.float32), atol=1e-5, rtol=1e-5)
tu = kd.build_tree(lp_u, ids_u, Bt)
check_true("uniform rows: kd.build_tree == build_tree_ref", tu == tree_build.build_tree_ref(lp_u, ids_u, Bt),
           f"{tu.n} nodes")
tied = np.round(Rng.standard_normal((Lt, Vt)) * 2).astype(np.float32) / 2      # values on a 0.5 grid: many ties
lp_t, ids_t = (host(a) for a in logprobs.topk_logprobs(tied, Kt))
lp_t_ref, ids_t_ref = logprobs.topk_logprobs_ref(tied, Kt)
check("partly tied rows: top-K ids (exact)", ids_t, ids_t_ref)
tt = kd.build_tree(lp_t, ids_t, Bt)
check_true("partly tied rows: kd.build_tree == build_tree_ref",
           tt == tree_build.build_tree_ref(lp_t, ids_t, Bt), f"{tt.n} nodes")

ex = kd.build_tree(np.array([[-0.1, -2.5], [-0.2, -1.8]], np.float32), np.array([[10, 11], [20, 21]]), 3)
check("docstring example: tokens [10, 20, 21], parents [-1, 0, 1, 1]",
      np.concatenate([ex.tokens, ex.parents]), np.array([10, 20, 21, -1, 0, 1, 1], np.int32))

# %% [markdown]
# ## Pictures: the draft probabilities and the tree
#
# Left: each depth's top-16 probabilities - a real drafter is sure about little beyond depth 1 (the rows are
# marginals, tutorial 07). Right: the tree, nodes coloured by their path weight w on a log scale: the budget goes
# to siblings near the root, where the draft is uncertain but a node still carries weight.

# %%
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402


def draw_tree(ax, tree, max_nodes=40):
    n = min(tree.n, max_nodes)
    children = {i: [] for i in range(n + 1)}
    for i in range(1, n + 1):
        children[int(tree.parents[i])].append(i)
    xs, counter = {}, [0]

    def place(node):                                       # leaves left to right, parents centred over children
        if not children[node]:
            xs[node] = counter[0]
            counter[0] += 1
        else:
            for c in children[node]:
                place(c)
            xs[node] = np.mean([xs[c] for c in children[node]])

    place(0)
    depth = {0: 0, **{i: int(tree.depths[i - 1]) for i in range(1, n + 1)}}
    for i in range(1, n + 1):
        p = int(tree.parents[i])
        ax.plot([xs[p], xs[i]], [-depth[p], -depth[i]], "-", color="0.6", lw=1, zorder=1)
    w = np.concatenate([[1.0], np.exp(tree.logw[:n])])
    sc = ax.scatter([xs[i] for i in range(n + 1)], [-depth[i] for i in range(n + 1)], c=np.maximum(w, 1e-3),
                    cmap="viridis", norm=LogNorm(vmin=1e-3, vmax=1), s=260, zorder=2, edgecolors="k")
    for i in range(1, n + 1):
        ax.annotate(text([tree.tokens[i - 1]])[0][:6], (xs[i], -depth[i]), ha="center", va="center", fontsize=6,
                    color="w")
    ax.annotate("root", (xs[0], 0), ha="center", va="center", fontsize=7, color="k")
    ax.set_yticks([-d for d in range(max(depth.values()) + 1)])
    ax.set_yticklabels([f"depth {d}" for d in range(max(depth.values()) + 1)])
    ax.set_xticks([])
    return sc


fig, ax = plt.subplots(1, 2, figsize=(14, 4.2), gridspec_kw={"width_ratios": [1, 2]})
kk = min(K, 16)
im = ax[0].imshow(np.exp(lp[:, :kk]), cmap="viridis", vmin=0, aspect="auto")
fig.colorbar(im, ax=ax[0])
ax[0].set_xlabel("rank r")
ax[0].set_yticks(range(L))
ax[0].set_yticklabels([f"depth {d + 1}" for d in range(L)])
ax[0].set_title("draft probability exp(lp[d][r])")
sc = draw_tree(ax[1], tree)
ax[1].set_title(f"best-first tree, budget {BUDGET} (colour: path weight w, log scale)")
fig.colorbar(sc, ax=ax[1])
save_figure(fig, args, "08_draft_tree.png")


# %%
finish()
