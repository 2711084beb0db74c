"""Tutorial 07: the DFlash drafter - a whole block of draft distributions in one forward, read from the target.

Run:  KDTREE_BACKEND=sim python tutorials/07_dflash_drafter.py [--size small|large] [--out DIR]
      (the block attention kernel runs on the simulator at tiny shapes; the trained pair runs on NumPy there)
"""
# %% [markdown]
# # 07 - The DFlash drafter
#
# A DDTree round starts with one distribution per future position: `[L, V]` draft logits for the tokens at
# `start + 1 .. start + L` (the root, the last committed token, sits at `start`). The shipped drafter is a
# **DFlash** block-diffusion drafter (`kdtree_numba/model/dflash.py`): it produces all L rows in **one** forward.
#
# * **The block.** Its input is `B = L + 1 = 16` tokens at positions `start .. start + 15`:
#   `[root, MASK, MASK, .., MASK]`. `MASK` (id 1, `<|mask|>`) means "unknown here"; the drafter's output at slot d
#   (d = 1..15) becomes the draft logits for depth d (the target's own `lm_head` turns it into `[V]`).
# * **Why slot 0 must hold the root.** The drafter conditions on the target's *own hidden states* of the
#   committed context - but only of positions `0 .. start - 1`, the ones the target has already processed. The
#   root was *chosen* by the target (the bonus token of the last round) and has not been fed through it yet: its
#   hidden state appears only in the next verify forward, where it is node 0. So the block's slot 0 is the one
#   place where the drafter learns which token sits at `start`. With a MASK there instead, depth 1 would have to
#   guess the root and its successor at once (the drafter is trained with a real token in slot 0: "anchored"
#   blocks). We measure the difference below.
# * **The target's features.** `ctx = hidden_norm(fc(concat(h_1, h_2, h_3)))`, h_k = the target's residual stream
#   after decoder layer k (`target_layer_ids = (1, 2, 3)` of 5): one `[H]` row per committed position. Each draft
#   layer turns the context rows into k/v rows (`k_norm(k_proj(ctx))` + RoPE, `v_proj(ctx)`) in a **draft cache**
#   - they never change, so `observe(features, start)` appends them once. (One GEMM over every layer's `[k_proj;
#   v_proj]` weights stacked, then one launch of `kernels/draft_kv.py` per layer normalises, rotates and writes
#   the rows.)
# * **The layers.** Qwen3-style: `q/k/v` of the block, **block attention** (grouped-query, *non-causal*: every
#   block slot sees every context row and the whole block), `o_proj`, SwiGLU MLP. The embedding and the LM head
#   are the target's. (The block's q, k and v come from one GEMM over the fused `[q_proj; k_proj; v_proj]`
#   weight; `draft_kv.draft_qkv` normalises and rotates the query and writes the block's k/v rows in one launch,
#   and the residual adds ride on the `o_proj` and `down` GEMMs.)
#
# Because the whole block is drafted in one pass, slot d's distribution cannot depend on what was drafted at slot
# d - 1 (there is only a MASK there): it is a **marginal** over the branches. That is why DDTree builds a *tree*
# from these rows, and the last part of this tutorial measures what that buys over a chain.

# %%
import inspect

import numpy as np

from _common import (banner, check, check_true, finish, heldout_prompts, host, load_pair, parse_args, plot_round,
                     rng, save_figure, section, show_text, stopwatch, table, token_texts)

import kdtree_numba as kd
from kdtree_numba.decode import ddtree as ddtree_module
from kdtree_numba.kernels import block_attention as ba
from kdtree_numba.model.drafters import concat_features

args = parse_args(__doc__)
banner("Tutorial 07 - the DFlash drafter", args)
Rng = rng(args, 7)
LARGE = args.size == "large"

# %% [markdown]
# ## The trained pair
#
# `kd.load_default()` returns the shipped pair: a 9.1 M-parameter DeepSeek-V3-architecture code model (MLA + MoE,
# byte-level BPE with 4096 tokens) and its DFlash drafter. The prompts are HumanEval's, held out of the training
# corpus. (On the simulator the whole-model runs use the NumPy references: `model_backend()`.)

# %%
section("the trained pair")
target, drafter = load_pair()
tok = target.tokenizer
dc, tc = drafter.config, target.config
n_draft = sum(int(np.prod(a.shape)) for a in drafter.state_dict().values())
print(f"target : {tc.num_hidden_layers} layers, hidden {tc.hidden_size}, vocab {tc.vocab_size}  (backend "
      f"{target.backend})")
print(f"drafter: {dc.num_hidden_layers} layers, {dc.num_attention_heads} query / {dc.num_key_value_heads} kv heads "
      f"of {dc.head_dim}, block {dc.block_size} -> depth {drafter.depth}, reads target layers "
      f"{list(dc.target_layer_ids)}, mask token {dc.mask_token_id} = {tok.token_text(dc.mask_token_id)!r}, "
      f"{n_draft / 1e6:.2f} M parameters of its own")
prompts = heldout_prompts()
task = prompts[3]
prompt = tok.encode(task["prompt"])
print(f"\nheld-out prompt {task['task_id']} ({len(prompt)} tokens), its last lines:")
print(show_text(task["prompt"], last_lines=4))

# %% [markdown]
# ## One block, by hand
#
# The first round of a generation: prefill the prompt (the target returns the features of rows 0..P-1 with its
# logits), `observe` them, take the target's greedy token as the root, and draft. Next to the draft we print what
# the target itself would write (greedy decoding): a depth's row is good when the target's token ranks high.

# %%
section("the block [root, MASK x 15] and its draft")
with kd.backend.use(target.backend):
    feats = drafter.feature_layers
    logits, hid = target.forward(np.asarray(prompt, np.int32), target.new_cache(len(prompt)), 0,
                                 hidden_layers=feats)
    drafter.reset()
    drafter.observe(concat_features(hid, feats), 0)                    # context rows 0 .. P-1
    root = int(np.argmax(host(logits)[-1]))                            # the target's next token
    draft = host(drafter.draft(np.asarray(prompt, np.int32), root))    # [15, V]: depths 1 .. 15
greedy = kd.generate(target, prompt, 1 + drafter.depth).tokens         # root + what the target writes next
check("root == the target's greedy token after the prompt", np.array([root]), np.array(greedy[:1]))
block = [root] + [dc.mask_token_id] * drafter.depth
print("slot   position  token  text")
for s in (0, 1, 2, 15):
    print(f"{s:>4}  {len(prompt) + s:>9}  {block[s]:>5}  {tok.token_text(block[s])!r}")
print("(slots 3 .. 14: MASK too)\n")

lp_draft = draft - draft.max(axis=1, keepdims=True)
lp_draft -= np.log(np.exp(lp_draft).sum(axis=1, keepdims=True))        # log-softmax per depth
order = np.argsort(-lp_draft, axis=1, kind="stable")
rows = []
for d in range(drafter.depth):
    want = greedy[d + 1]
    rank = int(np.flatnonzero(order[d] == want)[0])
    rows.append((d + 1, " ".join(f"{t!r}:{np.exp(lp_draft[d, i]):.2f}" for t, i in
                                 zip(token_texts(tok, order[d, :3]), order[d, :3])),
                 repr(tok.token_text(want)), rank))
table(rows, ("depth", "drafter's top 3 (probability)", "target's greedy token", "its rank (0 = top-1)"))

# %% [markdown]
# ## Folded norms: the same draft with five launches fewer a round
#
# Each of the drafter's RMSNorms (hidden_norm, and per layer input_layernorm and post_attention_layernorm) feeds one
# projection, and `rmsnorm(x, w) @ W^T = (x @ (W diag w)^T) / rms(x)`. So `model/dflash.py` folds w into W at load
# (`rmsnorm.folded_norm`) and the kernel after the product applies the row scale 1 / rms(x) (`draft_kv`'s and
# `swiglu`'s `norm_rows`): two launches per layer of every draft and one per observe go, each ~3 us of a GPU's
# time whatever its work. It is on by default (`dflash.FOLD_NORMS = False` turns it off): on an H200
# it made DDTree-32 1.3 % faster. The draft agrees with the plain norms' up to float rounding.

# %%
section("folded norms vs the norm launches")
from kdtree_numba.kernels import rmsnorm  # noqa: E402
from kdtree_numba.model import dflash  # noqa: E402

launches, plain_norm, fold_default = [], rmsnorm.rmsnorm, dflash.FOLD_NORMS
rmsnorm.rmsnorm = lambda *a, **k: launches.append(1) or plain_norm(*a, **k)
drafts = {}
try:
    for fold in (True, False):
        dflash.FOLD_NORMS, launches[:] = fold, []
        with kd.backend.use(target.backend):
            drafter.reset()
            drafter.observe(concat_features(hid, feats), 0)
            drafts[fold] = (host(drafter.draft(np.asarray(prompt, np.int32), root)), len(launches))
finally:
    dflash.FOLD_NORMS, rmsnorm.rmsnorm = fold_default, plain_norm
gap = float(np.abs(drafts[True][0] - drafts[False][0]).max())
print(f"RMSNorm launches in one observe + draft: {drafts[False][1]} plain, {drafts[True][1]} folded; largest logit "
      f"difference {gap:.2e} (logits up to {np.abs(draft).max():.1f})")
check("the default path's draft is the draft above", drafts[fold_default][0], draft)
check_true("folded: within float rounding of the plain norms", gap <= 1e-4 * np.abs(draft).max(), f"{gap:.2e}")
check_true("folded: 5 RMSNorm launches fewer (2 layers x 2 + the observe's)",
           drafts[False][1] - drafts[True][1] == 5, f"{drafts[False][1]} -> {drafts[True][1]}")

# %% [markdown]
# ## Why the root goes in slot 0 (and not a MASK)
#
# Take a greedy continuation of the prompt (so the target's own next tokens are known), cut it at several
# places c, feed the features of rows 0..c-1, and draft twice: with the real root (token c) in slot 0, and with a
# MASK there. We score the draft's depth-1 row on the target's actual token c + 1: its log-probability, whether it
# is the top-1, and the chain length (leading depths whose top-1 is the target's token).

# %%
section("slot 0: the root vs a MASK")
cont = kd.generate(target, prompt, 48).tokens
full = np.asarray(prompt + cont, np.int32)
with kd.backend.use(target.backend):
    _, hid = target.forward(full, target.new_cache(len(full)), 0, hidden_layers=feats)
    F = host(concat_features(hid, feats))                              # [len(full), 3H]
    score = {"root": [], "MASK": []}
    for c in range(len(prompt), len(full) - drafter.depth - 1, 3):
        drafter.reset()
        drafter.observe(F[:c], 0)
        truth = full[c + 1:c + 1 + drafter.depth]
        for name, slot0 in (("root", int(full[c])), ("MASK", dc.mask_token_id)):
            d = host(drafter.draft(full[:c], slot0))
            lp1 = d[0] - d[0].max() - np.log(np.exp(d[0] - d[0].max()).sum())
            top = np.argmax(d, axis=1)
            run = int(np.argmin(np.append(top == truth, False)))      # leading matches
            score[name].append((lp1[truth[0]], top[0] == truth[0], run))
res = {k: np.array(v, np.float64).mean(axis=0) for k, v in score.items()}
table([(k, f"{v[0]:.2f}", f"{100 * v[1]:.0f} %", f"{v[2]:.2f}") for k, v in res.items()],
      ("slot 0", "mean log q(target's token), depth 1", "depth-1 top-1 hits", "mean top-1 chain length"))
print(f"({len(score['root'])} cut points)")
check_true("root in slot 0 beats MASK: depth-1 log-prob of the target's token",
           res["root"][0] > res["MASK"][0] + 0.3, f"{res['root'][0]:.2f} vs {res['MASK'][0]:.2f}")
check_true("root in slot 0 beats MASK: depth-1 top-1 hit rate", res["root"][1] > res["MASK"][1],
           f"{100 * res['root'][1]:.0f} % vs {100 * res['MASK'][1]:.0f} %")

# %% [markdown]
# ## How the target's features reach the drafter (`decode/ddtree.py`)
#
# The loop asks the target for the residual streams of `drafter.feature_layers` in the forwards it runs anyway:
#
# * after the **prefill**: the prompt's rows 0..P-1;
# * after every **verify** forward: the rows of the *accepted path* - the root and the accepted nodes - taken out
#   of the tree's rows (`take(.., accepted[:m])`). They are the committed positions `start .. start + m - 1`, and
#   because a tree node's verify row equals a causal forward over its path (tutorial 09), they are exactly the
#   features a plain prefill of the committed text would give. The bonus token's row is not there (it was not an
#   input of this verify): it arrives next round, as that round's root.
#
# The lines of `ddtree.py` that do it:

# %%
section("the feature flow in decode/ddtree.py")
src, first = inspect.getsourcelines(ddtree_module.ddtree)
keys = ("feats", "observe", "hidden_layers", "drafter.draft")
shown = [(first + i, line.rstrip()) for i, line in enumerate(src) if any(k in line for k in keys)]
for no, line in shown:
    print(f"  ddtree.py:{no:<4d}{line}")
check_true("ddtree.py observes the prefill rows and the accepted path's rows",
           sum("drafter.observe" in line for _, line in shown) == 2 and any("accepted" in line for _, line in shown),
           f"{len(shown)} lines")

# %% [markdown]
# Now watch it happen: a recording wrapper around the drafter's `observe` and `draft` during a real generation.
# Checks: the observed rows are contiguous (prefill first, then exactly `len(accepted)` rows per round); every
# draft sees all committed positions but the root; and the features the loop passed are those of one plain causal
# forward over the committed text.

# %%
section("recording observe / draft during kd.generate")
log_obs, log_draft = [], []
_observe, _draft = drafter.observe, drafter.draft


def observe_rec(features, start):
    log_obs.append((start, host(features).copy()))
    return _observe(features, start)


def draft_rec(context, root):
    out = _draft(context, root)
    log_draft.append((len(context), int(root), drafter.length, host(out).copy()))
    return out


drafter.observe, drafter.draft = observe_rec, draft_rec                # instance attributes shadow the methods
try:
    gen = kd.generate(target, prompt, 40, drafter=drafter, budget=15)
finally:
    del drafter.observe, drafter.draft
spans = [(s, f.shape[0]) for s, f in log_obs]
contiguous = all(spans[i + 1][0] == spans[i][0] + spans[i][1] for i in range(len(spans) - 1))
check_true("first observe = the prefill rows 0 .. P-1", spans[0] == (0, len(prompt)), f"{spans[0]}")
check_true("observe rows are contiguous", contiguous, f"{len(spans)} calls")
check_true("round i observes len(accepted_i) rows (root + accepted drafts)",
           [n for _, n in spans[1:]] == [len(r.accepted) for r in gen.rounds[:len(spans) - 1]])
check_true("every draft: drafter.length == committed tokens (root not yet observed)",
           all(n_ctx == length for n_ctx, _, length, _ in log_draft), f"{len(log_draft)} drafts")
committed = np.asarray(prompt + gen.tokens, np.int32)[:spans[-1][0] + spans[-1][1]]
with kd.backend.use(target.backend):
    _, hid = target.forward(committed, target.new_cache(len(committed)), 0, hidden_layers=feats)
    plain_feats = host(concat_features(hid, feats))
check("fed features == one causal forward over the committed text", np.concatenate([f for _, f in log_obs]),
      plain_feats, atol=1e-4, rtol=1e-4)
table([(i, r.start, f"{r.start}..{r.start + len(r.accepted) - 1}", repr(tok.decode([r.root])),
        repr(tok.decode(r.accepted_tokens)), repr(tok.decode([r.bonus])))
       for i, r in enumerate(gen.rounds[:6])],
      ("round", "start", "rows observed after verify", "root", "accepted drafts", "bonus (next root)"))

# %% [markdown]
# ## The block attention kernel: `kernels/block_attention.py::_block_attention_kernel`
#
#     score[t, h, s] = scale * q[t, h] . k[s, g(h)]      s = 0 .. n_keys - 1: the context rows, then the block
#     out[t, h]      = sum_s softmax_s(score[t, h, :]) v[s, g(h)]          g(h) = h // (Nq / Nkv)   (GQA)
#
# No causal mask: every block slot sees every key (the block's own rows included - slot 0 attends to the MASK
# rows after it). Thread mapping, in the source below:
#
# * **grid = (B, Nkv)**: one block of threads per (query slot t, kv head g), serving the G = Nq / Nkv query heads
#   that share kv head g - each key/value row is read from global memory once for G heads. 128 threads on a GPU,
#   32 on the simulator.
# * The G queries (pre-scaled) sit in shared memory; the keys stream through in **tiles of BK = 8 rows** (the `ks`
#   tile has an odd row stride, MAX_D + 1, so threads reading different rows hit different banks).
# * Per tile: thread i computes one (head, row) score over all D dims; then **one thread per head** runs the
#   online-softmax update (new max m, rescale alpha = exp(m_old - m), running sum l); then the threads stride over
#   the G x D accumulators `o = o * alpha + p @ v_tile`. A `syncthreads()` separates the phases.
# * At the end `out = o / l`. The drafter's key count is small (context + 16), so there is no key split.

# %%
section("the kernel source")
module_src = inspect.getsource(ba)
a = module_src.find("@cuda.jit\ndef _block_attention_kernel")
b = module_src.find("\ndef block_attention(")
kernel_src = module_src[a:b].rstrip()
check_true("found _block_attention_kernel in kernels/block_attention.py", a >= 0 and b > a,
           f"{kernel_src.count(chr(10)) + 1} lines")
for i, line in enumerate(kernel_src.splitlines()):
    print(f"  {i + 1:3d}  {line}")

# %% [markdown]
# ## Kernel vs `block_attention_ref` at an irregular tiny shape
#
# B = 5 slots, 6 query heads over 2 kv heads (G = 3), head dim 12, 13 keys (two tiles, the second partial) in a
# 20-row cache whose rows past `n_keys` hold NaN: they must never be read. The output is poisoned with NaN before
# the launch, so an unwritten element fails the check. Tolerance: atol 1e-5, rtol 1e-4 (float32 online softmax
# against the float64 reference).

# %%
section("block attention: kernel vs reference")
B_, NQ, NKV, D_, S_, NK = (16, 64, 8, 128, 4096, 3000) if LARGE else (5, 6, 2, 12, 20, 13)
q = Rng.standard_normal((B_, NQ, D_)).astype(np.float32)
k = Rng.standard_normal((S_, NKV, D_)).astype(np.float32)
v = Rng.standard_normal((S_, NKV, D_)).astype(np.float32)
k[NK:], v[NK:] = np.nan, np.nan                                        # past n_keys: must be ignored
scale = 1.0 / np.sqrt(D_)
ref = ba.block_attention_ref(q, k, v, NK, scale)
out = kd.backend.full((B_, NQ, D_), np.nan, np.float32)                # poisoned
with stopwatch() as t:
    ba.block_attention(q, k, v, NK, scale, out=out)
print(f"_block_attention_kernel[grid=({B_}, {NKV}), block={kd.backend.block_size(128, 32)}] q {q.shape}, "
      f"{NK} keys: {t.ms:.0f} ms")
check("block_attention kernel vs block_attention_ref (rows >= n_keys NaN)", out, ref, atol=1e-5, rtol=1e-4)
q1 = np.zeros((1, 1, 1), np.float32) + 5.0
kk = np.zeros((2, 1, 1), np.float32)
vv = np.array([[[1.0]], [[3.0]]], np.float32)
check("docstring example: equal scores -> mean of v = 2; n_keys 1 -> 1",
      np.array([host(ba.block_attention(q1, kk, vv, 2, 1.0))[0, 0, 0], host(ba.block_attention(q1, kk, vv, 1,
                                                                                                 1.0))[0, 0, 0]]),
      np.array([2.0, 1.0], np.float32), atol=1e-6, rtol=0)
k2 = k.copy()
k2[NK - 1] = 3.0 * Rng.standard_normal((NKV, D_))                     # change the LAST key row only
moved = float(np.abs(host(ba.block_attention(q, k2, v, NK, scale)) - host(out))[0].max())
check_true("non-causal: slot 0 sees the last key row", moved > 1e-3, f"slot 0's output moved by {moved:.3g}")

# %% [markdown]
# The same kernel on the trained drafter's own inputs: we capture the arguments of the drafter's first block
# attention call (layer 0) during a draft after a short 12-token context (28 keys: 12 context rows + the 16 block
# rows), and run three of its query slots (the root, depth 1, depth 15) on the process backend.

# %%
section("block attention on the trained drafter's layer-0 inputs")
short = tok.encode("def add(a, b):\n    return a + b\n")[:13]
captured = []
_ba = ba.block_attention


def ba_rec(q, k, v, n_keys, scale, out=None):
    captured.append((host(q).copy(), host(k)[:n_keys].copy(), host(v)[:n_keys].copy(), n_keys, scale))
    return _ba(q, k, v, n_keys, scale, out=out)


ba.block_attention = ba_rec                                            # dflash.py calls it through the module
try:
    drafter.draft_logits(short[:-1], short[-1])
finally:
    ba.block_attention = _ba
cq, ck, cv, cn, cs = captured[0]
print(f"layer 0: q {cq.shape}, k/v {ck.shape} (n_keys {cn} = {len(short) - 1} context + {dc.block_size} block), "
      f"scale {cs:.4f}")
slots = [0, 1, dc.block_size - 1]
qs = np.ascontiguousarray(cq[slots])
got = kd.backend.full(qs.shape, np.nan, np.float32)
with stopwatch() as t:
    ba.block_attention(qs, ck, cv, cn, cs, out=got)
print(f"_block_attention_kernel[grid=({len(slots)}, {ck.shape[1]}), block={kd.backend.block_size(128, 32)}]: "
      f"{t.ms:.0f} ms")
check("kernel vs reference on the drafter's q/k/v (slots 0, 1, 15)", got,
      ba.block_attention_ref(qs, ck, cv, cn, cs), atol=1e-5, rtol=1e-4)

# %% [markdown]
# ## Marginals ignore the branch - why a tree beats a chain at equal node count
#
# Slot d sees only MASKs at slots 1..d-1, so its row `q_d` is the drafter's belief about position `start + d`
# **averaged over** whatever comes before it - not conditioned on the token drafted at depth d - 1. A chain
# (DFlash's own decoding: the top-1 token of every row, 15 nodes) bets everything on the top-1 token at every
# depth; the first miss wastes all deeper nodes. DDTree spends the same 15 nodes where the surrogate
# `w(node) = prod q_d(token_d)` along its path (tutorial 08) is largest - with a drafter whose rows are flat
# (this one's depth-2 row rarely puts more than 10 % on any token) that means siblings near the root, and a
# shorter spine.
#
# Three measurements on real rounds of the trained pair:
# 1. the surrogate's expected accepted length (sum of w over the nodes) of the 15-node tree vs the 15-node chain,
#    on the drafts the loop really made;
# 2. the measured tau of `kd.generate(.., chain=True)` vs `kd.generate(.., budget=15)` on a few held-out prompts
#    (greedy: both must reproduce autoregressive decoding exactly);
# 3. one round where the accepted path **leaves the top-1 chain** - the chain would have stopped there.

# %%
section("surrogate: 15-node tree vs 15-node chain on the recorded drafts")
from kdtree_numba.kernels import logprobs, tree_build  # noqa: E402

surr = []
for _, _, _, d in log_draft:
    lp, ids = logprobs.topk_logprobs_ref(d, 15)
    tree15 = tree_build.build_tree_ref(lp, ids, 15)
    chain_w = np.exp(np.cumsum(lp[:, 0].astype(np.float64))).sum()
    surr.append((np.exp(tree15.logw).sum(), chain_w, np.bincount(tree15.depths, minlength=16)[1:6]))
s_tree, s_chain = np.mean([s[0] for s in surr]), np.mean([s[1] for s in surr])
print(f"{len(surr)} drafts: mean sum of w  tree {s_tree:.3f}   chain {s_chain:.3f}")
print(f"mean tree nodes at depth 1..5: {np.round(np.mean([s[2] for s in surr], axis=0), 1).tolist()} "
      f"(the chain: 1 per depth, 15 deep)")
check_true("surrogate: the 15-node tree expects more accepted tokens than the 15-node chain", s_tree > s_chain,
           f"{s_tree:.3f} > {s_chain:.3f}")

# %%
section("measured: chain (15 nodes) vs DDTree budget 15 on held-out prompts")
N_NEW = 64 if LARGE else 40
picks = [prompts[i] for i in ((3, 7, 11, 20, 31, 42) if LARGE else (3, 7, 20))]
rows, all_chain, all_tree, tree_runs = [], [], [], []
for p in picks:
    ids_p = tok.encode(p["prompt"])
    ar = kd.generate(target, ids_p, N_NEW)
    with stopwatch() as t:
        ch = kd.generate(target, ids_p, N_NEW, drafter=drafter, chain=True)
        log_draft.clear()
        drafter.draft = draft_rec                                      # record this run's drafts (per round)
        try:
            tr = kd.generate(target, ids_p, N_NEW, drafter=drafter, budget=15)
        finally:
            del drafter.draft
    tree_runs.append((p, ids_p, tr, [x[3] for x in log_draft]))
    same = ch.tokens == ar.tokens and tr.tokens == ar.tokens
    check_true(f"{p['task_id']}: chain and tree greedy == autoregressive", same, f"{len(ar.tokens)} tokens")
    all_chain += [len(r.accepted) for r in ch.rounds]
    all_tree += [len(r.accepted) for r in tr.rounds]
    rows.append((p["task_id"], len(ids_p), f"{ch.acceptance_length:.2f}", len(ch.rounds),
                 f"{tr.acceptance_length:.2f}", len(tr.rounds), f"{t.ms / 1e3:.1f}"))
tau_c, tau_t = float(np.mean(all_chain)), float(np.mean(all_tree))
rows.append(("all", "", f"{tau_c:.2f}", len(all_chain), f"{tau_t:.2f}", len(all_tree), ""))
table(rows, ("prompt", "prompt tokens", "chain tau", "rounds", "tree (B=15) tau", "rounds", "both runs s"))
check_true("measured: DDTree (15 nodes) tau > chain (15 nodes) tau", tau_t > tau_c, f"{tau_t:.2f} > {tau_c:.2f}")


# %% [markdown]
# A round where the accepted path leaves the chain. The chain's token at depth d is the first node of depth d in
# pop order (all ranks 0). We pick the tree round with the longest accepted path among those that leave it.

# %%
section("one round that leaves the top-1 chain")


def chain_tokens(tree):
    """The top-1 chain inside a best-first tree: the first node of every depth in pop order."""
    out = {}
    for i in range(tree.n):
        out.setdefault(int(tree.depths[i]), int(tree.tokens[i]))
    return out


leaving = []                                          # (accepted length, prompt index, round index, depth it left)
for pi, (_, _, tr, _) in enumerate(tree_runs):
    for ri, r in enumerate(tr.rounds):
        ct = chain_tokens(r.tree)
        for depth, tok_id in enumerate(r.accepted_tokens, 1):
            if ct.get(depth) != tok_id:
                leaving.append((len(r.accepted), pi, ri, depth))
                break
n_rounds = sum(len(x[2].rounds) for x in tree_runs)
check_true("some accepted paths leave the top-1 chain", len(leaving) > 0,
           f"{len(leaving)} of {n_rounds} rounds (the chain would have stopped at that depth)")
best = max(leaving)
_, pi, ri, left_at = best
p, ids_p, tr, drafts = tree_runs[pi]
r = tr.rounds[ri]
d = drafts[ri]
lpr = d - d.max(axis=1, keepdims=True)
lpr -= np.log(np.exp(lpr).sum(axis=1, keepdims=True))
ordr = np.argsort(-lpr, axis=1, kind="stable")
committed_text = tok.decode((ids_p + tr.tokens)[:r.start])
print(f"{p['task_id']}, round {ri}: start {r.start}, root {tok.token_text(r.root)!r}; the text so far ends with")
print(show_text(committed_text, last_lines=2))
acc = r.accepted_tokens
rows = []
for depth in range(1, max(len(acc), left_at) + 3):
    top = ordr[depth - 1, :4]
    mark = ""
    if depth <= len(acc):
        rank = int(np.flatnonzero(ordr[depth - 1] == acc[depth - 1])[0])
        mark = f"accepted {tok.token_text(acc[depth - 1])!r} (rank {rank})"
    elif depth == len(acc) + 1:
        mark = f"bonus {tok.token_text(r.bonus)!r} (the target's token)"
    rows.append((depth, "  ".join(f"{t!r}:{np.exp(lpr[depth - 1, i]):.2f}" for t, i in
                                  zip(token_texts(tok, top), top)), mark))
table(rows, ("depth", "draft's top 4 at this depth (probability)", "this round"))
print(f"the tree accepted {len(acc)} draft token(s); the chain (top-1 at every depth) would have accepted "
      f"{left_at - 1}: it leaves the chain at depth {left_at}")

# the marginal vs the conditional: the block's depth-(left_at + 1) row vs a fresh draft given the taken branch
if len(acc) >= left_at:
    ctx = (ids_p + tr.tokens)[:r.start] + [r.root] + acc[:left_at - 1]
    cond = drafter.draft_logits(ctx, acc[left_at - 1])[0]           # depth 1 after the token actually accepted
    cond_lp = cond - cond.max() - np.log(np.exp(cond - cond.max()).sum())
    top_m, top_c = ordr[left_at, :3], np.argsort(-cond_lp)[:3]
    print(f"\nposition start + {left_at + 1}: the block's marginal (depth {left_at + 1}) vs a draft that knows the "
          f"branch taken ({tok.token_text(acc[left_at - 1])!r} at depth {left_at}):")
    print("  marginal   : " + "  ".join(f"{t!r}:{np.exp(lpr[left_at, i]):.2f}" for t, i in
                                         zip(token_texts(tok, top_m), top_m)))
    print("  conditional: " + "  ".join(f"{t!r}:{np.exp(cond_lp[i]):.2f}" for t, i in
                                         zip(token_texts(tok, top_c), top_c)))

# %% [markdown]
# ## Pictures: how much of each row the top few tokens hold, and that round's tree
#
# Left: per depth, the probability mass of the top-1 token, of ranks 2-4 and of ranks 5-16, averaged over all the
# drafts of the measured runs - a chain keeps only the bottom bar; the tree can hedge with the next ones, most
# usefully where the bottom bar is short. Right: the surrogate-expected accepted length as the node budget grows,
# tree vs chain, on the same drafts.

# %%
import matplotlib.pyplot as plt  # noqa: E402

all_drafts = [d for *_, ds in tree_runs for d in ds]
L = drafter.depth
mass = np.zeros((L, 3))
for d in all_drafts:
    pr = np.exp(d - d.max(axis=1, keepdims=True))
    pr /= pr.sum(axis=1, keepdims=True)
    srt = -np.sort(-pr, axis=1)
    mass += np.stack([srt[:, 0], srt[:, 1:4].sum(1), srt[:, 4:16].sum(1)], axis=1)
mass /= len(all_drafts)
budgets = [1, 2, 4, 8, 15, 32, 64]
exp_tree, exp_chain = np.zeros(len(budgets)), np.zeros(len(budgets))
for d in all_drafts:
    lp, ids = logprobs.topk_logprobs_ref(d, 64)
    cum = np.exp(np.cumsum(lp[:, 0].astype(np.float64)))
    for j, bud in enumerate(budgets):
        exp_tree[j] += np.exp(tree_build.build_tree_ref(lp, ids, bud).logw).sum()
        exp_chain[j] += cum[:min(bud, L)].sum()
exp_tree /= len(all_drafts)
exp_chain /= len(all_drafts)

fig, ax = plt.subplots(1, 2, figsize=(12, 3.8))
x = np.arange(1, L + 1)
ax[0].bar(x, mass[:, 0], color="#2767b0", label="top-1 (the chain's token)")
ax[0].bar(x, mass[:, 1], bottom=mass[:, 0], color="#5b9bd5", label="ranks 2-4")
ax[0].bar(x, mass[:, 2], bottom=mass[:, 0] + mass[:, 1], color="#a9cbee", label="ranks 5-16")
ax[0].set_xlabel("depth d (block slot)")
ax[0].set_ylabel("mean draft probability mass")
ax[0].set_xticks(x)
ax[0].set_title(f"DFlash rows are marginals: {len(all_drafts)} real drafts")
ax[0].legend(fontsize=8)
ax[1].plot(budgets, exp_tree, "o-", color="#2767b0", label="best-first tree")
ax[1].plot(budgets, exp_chain, "s--", color="#e8590c", label="top-1 chain (at most 15 nodes)")
ax[1].set_xscale("log", base=2)
ax[1].set_xticks(budgets)
ax[1].set_xticklabels([str(b) for b in budgets])
ax[1].set_xlabel("nodes")
ax[1].set_ylabel("expected accepted drafts (surrogate)")
ax[1].axvline(15, color="0.6", lw=0.8, ls=":")
ax[1].set_title("same drafts, same node count: tree vs chain")
ax[1].legend(fontsize=8)
save_figure(fig, args, "07_dflash_marginals.png")
check_true("surrogate at every node count >= 2: tree > chain",
           all(exp_tree[j] > exp_chain[j] for j, b in enumerate(budgets) if b >= 2),
           ", ".join(f"{b}: {t:.2f}/{c:.2f}" for b, t, c in zip(budgets, exp_tree, exp_chain)))

plot_round(r, target, f"{args.out}/07_dflash_round_tree.png",
           title=f"{p['task_id']} round {ri}: the accepted path leaves the top-1 chain at depth {left_at}")

# %%
finish()
