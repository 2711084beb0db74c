"""Tutorial 10: accept (choose a token at every node, walk from the root) and KV compaction (commit).

Run:  KDTREE_BACKEND=sim python tutorials/10_accept_and_compaction.py [--size small|large] [--out DIR]
"""
# %% [markdown]
# # 10 - Accepting a path, then compacting the cache
#
# After verify (tutorial 09) row i of the target logits is the target's next-token distribution after
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
#
# The kernels are checked first on a small hand-made tree (a controlled example whose answer we know), then on a
# real round of the trained pair.

# %%
from types import SimpleNamespace

import numpy as np

from _common import (banner, check, check_true, finish, heldout_prompts, host, load_pair, parse_args, rng,
                     save_figure, section, stopwatch, table)

import kdtree_numba as kd
from kdtree_numba.kernels import kv_compaction, round_end, sampling, tree_accept
from kdtree_numba.model.target import TreeInput

args = parse_args(__doc__)
banner("Tutorial 10 - accept and KV compaction", args)
Rng = rng(args, 10)
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
chosen_ref = sampling.choose_tokens_ref(logits, 0.0)
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
# * `sampling._choose_kernel` - **one block per node row**: threads stride over the vocabulary keeping their best
#   (value, index) - at T > 0 the value is `logit / T + Gumbel(u)`, u from the counter-based generator
#   Philox4x32-10 keyed by (seed, stream, row, token) - then a shared-memory arg-max reduction (lower index on
#   ties). A counter-based generator needs no RNG state, so a run is reproducible from its seed and the reference
#   (`choose_tokens_ref`) computes the very same u. Rows wider than `sampling.CHUNK` (4096; a Kimi vocabulary is
#   163840) are split over blocks - chunk maxima, chunk winners, a pick among them - for the same token.
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
check("choose_tokens kernel (T=0) vs choose_tokens_ref", sampling.choose_tokens(logits, 0.0), chosen_ref)
check("accept kernel path vs walk_ref", np.array(path_k), np.array(path_ref))
check("accept kernel bonus vs walk_ref", np.array([bonus_k]), np.array([bonus_ref]))

# %% [markdown]
# ## The round's end: its records and the next round's state, one launch (`kernels/round_end.py`)
#
# A DDTree round ends by writing what the trace needs (the tree, the walk's outputs and, per accepted depth, the
# log-prob the *draft* gave the token the target chose there) into row `round - 1` of device-side records, and -
# in a graph-replayed round, where the state lives on the device - by moving the state on:
#
#     start += n_acc;   root = result[m] (the bonus);   round += 1
#
# `round_end._round_end_kernel` is **one block**: its threads stride over the record columns, each looks up one
# depth's draft log-prob in that depth's top-K ids, a barrier (every thread has read the row index, which is the
# round counter it is about to advance), then thread 0 writes the scalars. The replayed round did this with
# ~16 small launches (scatters into the record rows, CuPy operations for the state).

# %%
section("the round's end: records and state")
B, Ld = kd.backend, 3
acc = tree_accept.Acceptor(Ld, n)
depth = np.array([1, 1, 2, 2, 2, 3], np.int32)                               # of nodes 1..6
acc.run(B.asarray(logits), B.asarray(tokens), B.asarray(parents[1:]), B.asarray(np.array([n], np.int32)), 0.0, 0, 20,
        B.asarray(np.concatenate([[0], depth]).astype(np.int32)))          # the root at position 20
tree = SimpleNamespace(tokens=B.asarray(tokens[None]), depth=B.asarray(depth[None]),
                       parent=B.asarray(parents[None, 1:]), logw=B.asarray(-np.arange(1.0, n + 1)[None]),
                       n=B.asarray(np.array([n], np.int32)))
ids = np.array([[7, 5], [2, 8], [3, 4]], np.int32)                          # the draft's top-2 per depth
lp = np.array([[-0.2, -1.9], [-0.9, -0.6], [-0.3, -1.5]], np.float32)
rec = {f: B.zeros((4,) + shape, dt) for f, shape, dt in (
    ("tokens", (n,), np.int32), ("depth", (n,), np.int32), ("parent", (n,), np.int32), ("logw", (n,), np.float64),
    ("n", (), np.int32), ("accepted", (Ld + 1,), np.int32), ("n_acc", (), np.int32), ("result", (Ld + 2,), np.int32),
    ("draft_lp", (Ld,), np.float32))}
start, root, rnd = (B.asarray(np.array([v], np.int32)) for v in (20, 0, 2))   # round 2 -> record row 1
round_end.round_end(rec, tree, acc, B.asarray(lp), B.asarray(ids), rnd, row_offset=-1, advance=(start, root, rnd))
print(f"record row 1: accepted {host(rec['accepted'])[1].tolist()}, result {host(rec['result'])[1].tolist()}, "
      f"draft log-probs {[round(float(x), 3) for x in host(rec['draft_lp'])[1]]}")
print(f"state: start {int(host(start)[0])}, root {int(host(root)[0])}, round {int(host(rnd)[0])}")
check("record: the accepted nodes", host(rec["accepted"])[1], np.array([0, 2, 5, 6]))
check("record: the result row [m, tokens.., bonus]", host(rec["result"])[1], np.array([4, 7, 8, 3, 11]))
check("record: the draft's log-prob of each chosen token (7, 8, 3)", host(rec["draft_lp"])[1],
      np.array([-0.2, -0.6, -0.3], np.float32))
check("record: row 0 untouched", host(rec["n_acc"])[0:1], np.array([0]))
check("state: start + 4, root = bonus 11, round 3", np.concatenate([host(start), host(root), host(rnd)]),
      np.array([24, 11, 3]))

# %% [markdown]
# ## T > 0: sampling, reproducible from the seed
#
# Same logits with a milder favourite, temperature 1. Each seed gives one sample per node; the same seed gives the
# same result every time, on every backend: the kernel reproduces the reference sampler's choice for every seed, and
# a second run of seed 0 repeats the first (once: on the simulator an accept costs seconds). Each node's draw is
# keyed by its *position*: the root sits at position `stream` (1 here) and node i draws from stream `1 + depth(i)`
# - the uniforms a plain decode step at that position would use (kernels/sampling.py), which is why DDTree's
# sampled output is plain sampling's, token for token, for the same seed (tutorial 11).

# %%
section("sampled accept (T = 1)")
node_depth = np.zeros(n + 1, np.int32)                       # the root 0, then each node's parent's + 1
for j in range(1, n + 1):
    node_depth[j] = node_depth[parents[j]] + 1
soft = Rng.standard_normal((n + 1, V)).astype(np.float32)
soft[np.arange(n + 1), favourite] += 2.5
T_ = 1.0
rows = []
for seed in range(4 if not LARGE else 12):
    a1 = tree_accept.accept(soft, tokens, parents[1:], n, temperature=T_, seed=seed, stream=1)
    ch = sampling.choose_tokens_ref(soft, T_, seed, 1, row_streams=node_depth)       # node i at position 1 + depth
    pr, br = tree_accept.walk_ref(ch, tokens, parents[1:], n)
    if seed == 0:
        a2 = tree_accept.accept(soft, tokens, parents[1:], n, temperature=T_, seed=seed, stream=1)
        check(f"seed {seed}: same seed -> same result", np.array(a1[0] + [a1[1]]), np.array(a2[0] + [a2[1]]))
    check(f"seed {seed}: kernel == reference sampler + walk_ref", np.array(a1[0] + [a1[1]]), np.array(pr + [br]))
    rows.append((seed, a1[0], [int(tokens[j - 1]) for j in a1[0][1:]] + [a1[1]]))
table(rows, ("seed", "accepted nodes", "emitted tokens"))

# %% [markdown]
# ## T > 0 is lossless at every accepted position, in distribution
#
# Plain sampling emits t_1 ~ p(. | prefix), then t_2 ~ p(. | prefix, t_1), ... The walk emits, at each node it
# reaches, that node's sample `chosen[i]` - and row i of the verify logits *is* p(. | prefix, path(i))
# (tutorial 09). Whether node i is reached depends only on its ancestors' samples, which use other uniforms
# (the counter holds the position, and ancestors sit at earlier ones; siblings share theirs, but the walk reaches
# at most one of them), so **conditioned on reaching node i, the token emitted after it is distributed as
# softmax(logits[i] / T)**. By the chain rule that makes the emitted sequence distributed exactly as plain
# sampling's - at every accepted position, the bonus included. (With the same uniforms per position it is in fact
# plain sampling's own sequence: tutorial 11 checks that token for token.)
#
# We test it over many seeds: a vectorised copy of the reference sampler (the same Philox uniforms, all seeds at
# once: checked equal to `choose_tokens_ref`), the walk for every seed, then per reached node a chi-square test of
# the emitted tokens against the node's softmax (bins with expected count < 5 pooled; critical value at
# p = 0.001 by the Wilson-Hilferty approximation). And a counterfactual to show the test has teeth: the same
# uniforms for every row (the depth left out of the key) correlate a node's sample with its parent's and fail.

# %%
section("T > 0: the emitted tokens' distribution at every accepted position")
S_SEEDS = 80000 if LARGE else 40000
two32 = 4294967296.0


def uniforms(seeds, stream, n_cols, same_rows=False):
    """u[s, r, v] of the sampler for many seeds at once (sampling.uniforms_ref, vectorised over the key): row r
    (node r) draws at position stream + node_depth[r] (counter row 0), or all rows at ``stream``."""
    sd = np.asarray(seeds, np.uint64)[:, None, None]
    v = np.arange(n_cols, dtype=np.uint64)[None, None, :]
    pos = np.zeros(n + 1, np.uint64) if same_rows else node_depth.astype(np.uint64)
    z = np.zeros((1, 1, 1), np.uint64)
    h = sampling.philox_ref(v, z, np.uint64(stream) + pos[None, :, None], z, sd & np.uint64(0xFFFFFFFF),
                            sd >> np.uint64(32))
    return (h.astype(np.float64) + 0.5) / two32


def sample(logits, T, seeds, stream, same_rows=False):
    """chosen[s, i] for every seed: argmax(logits / T + Gumbel(u)), as choose_tokens_ref."""
    g = -np.log(-np.log(uniforms(seeds, stream, logits.shape[1], same_rows)))
    return np.argmax(logits.astype(np.float64)[None] / T + g, axis=2).astype(np.int32)


child_of = np.full((n + 1, V), -1, np.int64)                # child_of[node, token] = the child carrying token
for j in range(1, n + 1):
    child_of[parents[j], tokens[j - 1]] = j


def walk_all(chosen):
    """Every seed's walk at once: reached[s, i] = node i is on seed s's accepted path."""
    S = chosen.shape[0]
    reached = np.zeros((S, n + 1), bool)
    cur, alive = np.zeros(S, np.int64), np.ones(S, bool)
    while alive.any():
        reached[np.flatnonzero(alive), cur[alive]] = True
        nxt = child_of[cur, chosen[np.arange(S), cur]]
        alive &= nxt >= 0
        cur = np.where(alive, nxt, cur)
    return reached


seeds = np.arange(S_SEEDS, dtype=np.uint64)
with stopwatch() as t:
    chosen_all = sample(soft, T_, seeds, 1)
    reached = walk_all(chosen_all)
print(f"{S_SEEDS} seeds sampled and walked in {t.ms:.0f} ms")
check("vectorised sampler == choose_tokens_ref (first 20 seeds)", chosen_all[:20],
      np.stack([sampling.choose_tokens_ref(soft, T_, s, 1, row_streams=node_depth) for s in range(20)]))
check_true("vectorised walk == walk_ref (first 200 seeds)",
           all(np.flatnonzero(reached[s]).tolist() == tree_accept.walk_ref(chosen_all[s], tokens, parents[1:], n)[0]
               for s in range(200)))


def chi_square(samples, p):
    """(statistic, degrees of freedom, critical value at p = 0.001, total variation distance)."""
    cnt = np.bincount(samples, minlength=len(p)).astype(np.float64)
    exp = p * len(samples)
    big = exp >= 5
    obs_b, exp_b = list(cnt[big]), list(exp[big])
    if (~big).any():                                         # pool the rare tokens into one bin
        obs_b.append(cnt[~big].sum())
        exp_b.append(exp[~big].sum())
    obs_b, exp_b = np.array(obs_b), np.array(exp_b)
    stat = float(((obs_b - exp_b) ** 2 / exp_b).sum())
    k = len(obs_b) - 1
    crit = k * (1 - 2 / (9 * k) + 3.09 * np.sqrt(2 / (9 * k))) ** 3     # Wilson-Hilferty, z(0.999) = 3.09
    return stat, k, crit, 0.5 * float(np.abs(cnt / len(samples) - p).sum())


probs = np.exp(soft.astype(np.float64) / T_ - soft.max(axis=1, keepdims=True) / T_)
probs /= probs.sum(axis=1, keepdims=True)
chosen_bad = sample(soft, T_, seeds, 1, same_rows=True)     # the counterfactual: one u vector for all rows
reached_bad = walk_all(chosen_bad)
rows, MIN_VISITS = [], 50
for i in range(n + 1):
    visits = int(reached[:, i].sum())
    depth_i = int(node_depth[i])
    if visits < MIN_VISITS:
        rows.append((i, depth_i, visits, "-", "-", "-", "(too few visits to test)"))
        continue
    stat, k, crit, tv = chi_square(chosen_all[reached[:, i], i], probs[i])
    ok = check_true(f"node {i}: emitted token ~ softmax(logits[{i}] / T)", stat < crit,
                    f"chi2 {stat:.1f} < {crit:.1f} ({k} dof), TV {tv:.3f}, {visits} visits")
    bad = reached_bad[:, i].sum()
    bstat = chi_square(chosen_bad[reached_bad[:, i], i], probs[i])[0] if bad >= MIN_VISITS else float("nan")
    rows.append((i, depth_i, visits, f"{stat:.1f}", f"{crit:.1f}", f"{tv:.3f}", f"{bstat:.1f}"))
table(rows, ("node", "depth", "visits", "chi2", "critical", "TV", "chi2, same u every row"))
bad_stats = [chi_square(chosen_bad[reached_bad[:, i], i], probs[i])[:3] for i in range(1, n + 1)
             if reached_bad[:, i].sum() >= MIN_VISITS]
check_true("the test has teeth: with the same uniforms in every row some deeper node fails",
           any(st > cr for st, _, cr in bad_stats),
           "max chi2 / critical " + f"{max(st / cr for st, _, cr in bad_stats):.1f}" if bad_stats else "no node")

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
# ## A real round of the trained pair
#
# The same steps on real data: a greedy DDTree generation (budget 16) on a held-out prompt, and one of its rounds
# whose accepted nodes are not simply 0, 1, 2, .. (so the commit really moves rows). We replay that round by hand:
# prefill the committed text, verify the round's tree in one forward (tutorial 09), accept, compact - and check
#
# * the replay accepts the same nodes and bonus as the loop did;
# * after the compaction the cache's rows `0 .. start + m - 1` - every layer - equal those of a plain prefill of
#   the committed text plus the accepted tokens: the cache is exactly what plain decoding would hold;
# * the compaction kernel (on the process backend) moves the real cache exactly as `compact_ref` does.

# %%
section("a real round: verify -> accept -> compact")
target, drafter = load_pair()
tok = target.tokenizer
task = heldout_prompts()[2]
prompt = tok.encode(task["prompt"])
gen = kd.generate(target, prompt, 48, drafter=drafter, budget=16)
moving = [i for i, r in enumerate(gen.rounds) if r.accepted != list(range(len(r.accepted)))]
check_true("some round's accepted nodes are not 0, 1, 2, ..", len(moving) > 0,
           f"{len(moving)} of {len(gen.rounds)} rounds ({task['task_id']}, tau {gen.acceptance_length:.2f})")
ri = max(moving or [0], key=lambda i: (len(gen.rounds[i].accepted), -i))
r = gen.rounds[ri]
start, tree, n_r = r.start, r.tree, r.tree.n
committed = np.asarray((prompt + gen.tokens)[:start], np.int32)
with kd.backend.use(target.backend):
    cache = target.new_cache(start + n_r + 1)
    target.forward(committed, cache, 0)                                       # rows 0 .. start-1
    paths_r, depth_r = tree.paths(drafter.depth)
    tin = TreeInput((start + depth_r).astype(np.int32), paths_r, depth_r, drafter.depth)
    vlog, _ = target.forward(np.concatenate([[r.root], tree.tokens]).astype(np.int32), cache, start, tree=tin)
    acc, bonus = tree_accept.accept(vlog, tree.tokens, tree.parents[1:], n_r)   # greedy
    before = host(cache.data).copy()
print(f"round {ri}: start {start}, root {tok.token_text(r.root)!r}, tree of {n_r} nodes; accepted nodes {acc} "
      f"({tok.decode([int(tree.tokens[j - 1]) for j in acc[1:]])!r}), bonus {tok.token_text(bonus)!r}")
check("replayed round accepts what the loop accepted (nodes + bonus)", np.array(acc + [bonus]),
      np.array(r.accepted + [r.bonus]))
want_cache = before.copy()
kv_compaction.compact_ref(want_cache, start, np.array(acc, np.int32))
moved = kd.backend.asarray(before.copy())
with stopwatch() as t:
    kv_compaction.compact(moved, start, np.array(acc, np.int32))       # the process backend's kernel
print(f"compact on the real cache [{before.shape[0]} layers, {before.shape[1]} rows, {before.shape[2]} wide]: "
      f"{t.ms:.0f} ms")
check("compact kernel vs compact_ref on the real cache (exact)", moved, want_cache, atol=0, rtol=0)
m = len(acc)
plain_ids = np.concatenate([committed, [r.root], [int(tree.tokens[j - 1]) for j in acc[1:]]]).astype(np.int32)
with kd.backend.use(target.backend):
    plain = target.new_cache(len(plain_ids))
    target.forward(plain_ids, plain, 0)
check(f"compacted rows 0..{start + m - 1} == plain prefill's, every layer", host(moved)[:, :start + m],
      host(plain.data)[:, :start + m], atol=1e-4, rtol=1e-4)
uncompacted = float(np.abs(before[:, start:start + m] - host(plain.data)[:, start:start + m]).max())
check_true("... and without the compaction they would not be", uncompacted > 1e-3,
           f"max|diff| of rows {start}..{start + m - 1} before compaction: {uncompacted:.3g}")

# %% [markdown]
# ## A picture: the cache rows before and after (layer 0, the hand-made example)

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
save_figure(fig, args, "10_compaction.png")

# %%
finish()
