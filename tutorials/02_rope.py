"""Tutorial 02: RoPE - NeoX rotate-half with explicit positions, tree positions, and the GPT-J -> NeoX row permutation.

Run:  KDTREE_BACKEND=sim python tutorials/02_rope.py [--size small|large] [--out DIR]
"""
# %% [markdown]
# # 02 - Rotary position embedding (RoPE)
#
# RoPE encodes a token's position by rotating pairs of query/key dims by an angle proportional to the position:
#
#     angle[t, i] = pos[t] * inv_freq[i],          inv_freq[i] = base^(-2i/R),   i < R/2
#     y[i]       = x[i]       * cos(angle) - x[i + R/2] * sin(angle)        ("NeoX" / rotate-half layout:
#     y[i + R/2] = x[i + R/2] * cos(angle) + x[i]       * sin(angle)         pair i = dims (i, i + R/2))
#
# Rotating q at position m and k at position n makes `q.k` depend on m - n only. In MLA only the small
# `qk_rope_head_dim` part (R = 64 for DeepSeek/Kimi) is rotated; the key part is one vector shared by all heads.
#
# **Positions are an input array, never `arange`.** In a DDTree verify pass, the tokens are a tree: node i is the
# draft's guess for position `start + depth[i]`, so siblings (alternatives for the same slot) get the *same*
# position, and a node's position has nothing to do with its index in the flattened tree.

# %%
import numpy as np

from _common import banner, check, check_true, finish, host, parse_args, rng, save_figure, section, stopwatch, table

import kdtree_numba as kd
from kdtree_numba.kernels import rope

args = parse_args(__doc__)
banner("Tutorial 02 - RoPE", args)
Rng = rng(args, 2)
LARGE = args.size == "large"

# %% [markdown]
# ## Positions of a tree
#
# A tiny tree after `start = 10` committed tokens: the root (the last bonus token, position 10) and 5 draft nodes.
# Node 2 and node 3 are both children of node 1 - two guesses for position 12.

# %%
section("tree positions: start + depth")
start = 10
parents = np.array([-1, 0, 1, 1, 0, 3], np.int32)          # node 0 = root; parents[i] < i (pop order)
depths = np.zeros(len(parents), np.int32)
for i in range(1, len(parents)):
    depths[i] = depths[parents[i]] + 1
positions = (start + depths).astype(np.int32)
table([(i, parents[i], depths[i], positions[i], start + i) for i in range(len(parents))],
      ("node", "parent", "depth", "position = start+depth", "start+index (wrong)"))
check_true("siblings share a position", positions[2] == positions[3] and positions[1] == positions[4],
           f"nodes 2,3 -> {positions[2]}, nodes 1,4 -> {positions[1]}")

# %% [markdown]
# ## The reference
#
# The plain NumPy version of rotate-half, then the package's `rope_ref` (which also takes YaRN's amplitude).

# %%
section("reference")
T, N, R = (512, 64, 64) if LARGE else (len(positions), 3, 8)   # tokens x heads x rope dims
if LARGE:
    positions = Rng.integers(0, 4096, T).astype(np.int32)
x = Rng.standard_normal((T, N, R)).astype(np.float32)
inv_freq = rope.rope_inv_freq(R, 10000.0)                            # [R/2]

ang = positions.astype(np.float32)[:, None] * inv_freq[None, :]      # [T, R/2]
cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]          # [T, 1, R/2] broadcast over heads
x1, x2 = x[..., :R // 2], x[..., R // 2:]
plain = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
ref = rope.rope_ref(x, positions, inv_freq)
check("plain NumPy == rope_ref", plain, ref, atol=1e-6, rtol=1e-6)
check("example: R=2, angle pi/2 rotates [1, 0] to [0, 1]",
      rope.rope_ref(np.array([[[1, 0]]], np.float32), np.array([1]), np.array([np.pi / 2], np.float32))[0, 0],
      np.array([0, 1], np.float32), atol=1e-6, rtol=0)

# %% [markdown]
# ## The kernel: `kernels/rope.py::_rope_kernel`
#
# Thread mapping: **one block per token t**; the block's threads are a multiple of R/2 (up to 256 on a GPU, 32 on
# the simulator). Thread j owns the pair `i = j mod (R/2)` - it computes its angle `positions[t] * inv_freq[i]`
# and its cos/sin once - and the heads `h = j div (R/2)`, `h + step`, `h + 2*step`, ... (`step = threads / (R/2)`),
# two heads per loop step. For each head it reads its two inputs `x[t, h, i]`, `x[t, h, i + R/2]` before writing
# its two outputs, so `out` may be `x` itself (the model rotates in place). An optional `base` (an int, or a device
# int32 [1] the kernel reads) is added to every position: a tree verify passes its nodes' depths with base = its
# start, so no launch computes `start + depth` first.
# Launch: `apply_rope(x, positions, inv_freq)` -> `_rope_kernel[T, threads]`.

# %%
section("kernel vs reference")
out = kd.backend.full(x.shape, np.nan, np.float32)
with stopwatch() as t:
    rope.apply_rope(x, positions, inv_freq, out=out)
print(f"_rope_kernel[grid={T} tokens] over {N} heads x {R // 2} pairs each: {t.ms:.1f} ms")
got = host(out)
check("apply_rope kernel vs rope_ref", got, ref, atol=1e-5, rtol=1e-5)
inplace = kd.backend.asarray(x.copy())
rope.apply_rope(inplace, positions, inv_freq, out=inplace)
check("in place (out = x) gives the same", inplace, ref, atol=1e-5, rtol=1e-5)
if not LARGE:                                     # siblings 2 and 3 holding the same vector rotate identically
    twins = np.ascontiguousarray(x[[2, 3]].copy())
    twins[1] = twins[0]
    tw = host(rope.apply_rope(twins, positions[[2, 3]], inv_freq))
    check("siblings (same position, same vector) -> same output", tw[1], tw[0], atol=0, rtol=0)

# %% [markdown]
# ## Why it works: scores depend on the position difference only
#
# `rope(q, m) . rope(k, n)` is the same for (m, n) = (7, 3) and (m, n) = (104, 100): both have m - n = 4.

# %%
section("relative positions")
q1 = Rng.standard_normal((1, 1, R)).astype(np.float32)
k1 = Rng.standard_normal((1, 1, R)).astype(np.float32)


def score(m, n):
    return float(np.sum(rope.rope_ref(q1, np.array([m]), inv_freq) * rope.rope_ref(k1, np.array([n]), inv_freq)))


rows = [(m, n, m - n, f"{score(m, n):+.5f}") for m, n in [(7, 3), (104, 100), (1004, 1000), (7, 4)]]
table(rows, ("m (query)", "n (key)", "m - n", "rope(q,m).rope(k,n)"))
check("score(7,3) == score(104,100) == score(1004,1000)", np.array([score(104, 100), score(1004, 1000)]),
      np.array([score(7, 3)] * 2), atol=1e-4, rtol=1e-4)

# %% [markdown]
# ## Interleaved checkpoints and the one-time row permutation
#
# DeepSeek/Kimi checkpoints were trained with the **GPT-J** layout: the rotated pairs are *adjacent* dims
# `(x[2i], x[2i+1])` (`rope_gptj_ref`). Running NeoX rotate-half on that raw layout pairs the wrong dims and gives
# a different model. Instead of a second kernel, the loader permutes the R rope *rows* of the projection weights
# once (`rope.permute_rope_rows(W, starts, R)`), putting the even dims first and the odd dims second
# (`neox_order(R) = [0, 2, 4, .., R-2, 1, 3, .., R-1]`). Then for x = W h:
#
#     NeoX(x permuted) == GPT-J(x raw), permuted          and the attention scores q.k are identical,
#
# because q and k are permuted the same way and a dot product does not care about the order of dims.

# %%
section("GPT-J (interleaved) -> NeoX by permuting rows")
Hd = 24
order = rope.neox_order(R)
print(f"neox_order({R}) = {order.tolist()}")
W_q = Rng.standard_normal((R, Hd)).astype(np.float32)          # rope rows of a query projection (raw layout)
W_k = Rng.standard_normal((R, Hd)).astype(np.float32)
h = Rng.standard_normal((T, Hd)).astype(np.float32)            # hidden states
W_q_perm = rope.permute_rope_rows(W_q, [0], R)                  # what the loader stores
W_k_perm = rope.permute_rope_rows(W_k, [0], R)
check("permute_rope_rows == W[neox_order]", W_q_perm, W_q[order], atol=0, rtol=0)
check("inverse=True restores the checkpoint rows", rope.permute_rope_rows(W_q_perm, [0], R, inverse=True), W_q,
      atol=0, rtol=0)

q_raw, k_raw = (h @ W_q.T)[:, None, :], (h @ W_k.T)[:, None, :]             # [T, 1, R] raw interleaved layout
q_prm, k_prm = (h @ W_q_perm.T)[:, None, :], (h @ W_k_perm.T)[:, None, :]   # [T, 1, R] permuted layout
gptj_q = rope.rope_gptj_ref(q_raw, positions, inv_freq)                     # what the checkpoint means
neox_q = host(rope.apply_rope(np.ascontiguousarray(q_prm), positions, inv_freq))   # what the engine runs (kernel)
check("NeoX kernel on permuted rows == GPT-J on raw, permuted", neox_q, gptj_q[..., order], atol=1e-5, rtol=1e-4)
scores_ckpt = np.einsum("tr,sr->ts", rope.rope_gptj_ref(q_raw, positions, inv_freq)[:, 0],
                        rope.rope_gptj_ref(k_raw, positions, inv_freq)[:, 0])
scores_eng = np.einsum("tr,sr->ts", neox_q[:, 0], rope.rope_ref(k_prm, positions, inv_freq)[:, 0])
check("attention scores identical (q.k invariant to a common permutation)", scores_eng, scores_ckpt,
      atol=1e-4, rtol=1e-4)
wrong = rope.rope_ref(q_raw, positions, inv_freq)                # NeoX on the raw layout: the classic bug
err_wrong = float(np.abs(wrong - gptj_q).max())
check_true("NeoX on the raw layout is NOT the checkpoint's RoPE", err_wrong > 1e-2,
           f"max|NeoX(raw) - GPT-J(raw)| = {err_wrong:.3f}")

# %% [markdown]
# ## YaRN: stretching the low frequencies for long contexts
#
# DeepSeek-V3 and Kimi K2 extend the context with YaRN (`rope.yarn_inv_freq`): high-frequency pairs (small i)
# keep `base^(-2i/R)` ("extrapolation"), low frequencies are divided by `factor` ("interpolation"), and a linear
# ramp blends the two in between. The ramp's ends are the pairs whose wavelength fits `beta_fast` and `beta_slow`
# full turns into the original context:
#
#     corr(beta) = R * ln(orig / (2 pi beta)) / (2 ln base)
#     low = floor(corr(beta_fast)),   high = ceil(corr(beta_slow)),   ramp[i] = clamp((i - low) / (high - low), 0, 1)
#     inv_freq = inv_extra * (1 - ramp) + inv_inter * ramp
#
# DeepSeek-V3's parameters (R 64, base 10000, factor 40, original context 4096, beta_fast 32, beta_slow 1) give a
# ramp over ~13 pairs. Kimi K2's (base 50000, factor 32, **beta_fast = beta_slow = 1**) make both ends the same
# corr value, so `high - low` is 1 (floor and ceil of one number): the ramp is a **step** - every pair keeps its
# frequency or is divided by the full factor, nothing in between. Both are plotted.

# %%
section("YaRN inverse frequencies")
import matplotlib.pyplot as plt  # noqa: E402

YARN = {"DeepSeek-V3": dict(base=10000.0, factor=40.0, orig=4096, beta_fast=32.0, beta_slow=1.0),
        "Kimi K2": dict(base=50000.0, factor=32.0, orig=4096, beta_fast=1.0, beta_slow=1.0)}
fig, ax = plt.subplots(1, 2, figsize=(11, 3.4))
for j, (name, c) in enumerate(YARN.items()):
    plain_f = rope.rope_inv_freq(64, c["base"])
    yarn_f = rope.yarn_inv_freq(64, c["base"], c["factor"], c["orig"], beta_fast=c["beta_fast"],
                                beta_slow=c["beta_slow"])
    ratio = plain_f / yarn_f
    between = int(np.sum((ratio > 1 + 1e-4) & (ratio < c["factor"] * (1 - 1e-4))))   # pairs strictly on the ramp
    check_true(f"YaRN {name}: first pair unchanged, last pair divided by factor",
               abs(ratio[0] - 1) < 1e-6 and abs(ratio[-1] - c["factor"]) < 1e-3,
               f"ratio[0] {ratio[0]:.4f}, ratio[-1] {ratio[-1]:.2f}")
    if name == "DeepSeek-V3":
        check_true("YaRN DeepSeek-V3: a ramp (many pairs strictly between 1 and factor)", between >= 8,
                   f"{between} pairs on the ramp")
    else:
        check_true("YaRN Kimi K2: a step (beta_fast = beta_slow: no pair strictly between)", between == 0,
                   f"{between} pairs on the ramp")
    ax[0].semilogy(plain_f, "o-" if j == 0 else "^-", ms=3, color=f"C{j}", alpha=0.4, label=f"{name} plain")
    ax[0].semilogy(yarn_f, "s-" if j == 0 else "v-", ms=3, color=f"C{j}", label=f"{name} YaRN")
    ramp = (1 - yarn_f / plain_f) / (1 - 1 / c["factor"])          # recovered from inv_freq: 0 = plain, 1 = / factor
    ax[1].plot(ramp, "o-" if j == 0 else "v--", ms=3, color=f"C{j}",
               label=f"{name}: beta_fast {c['beta_fast']:g}, beta_slow {c['beta_slow']:g} ({between} ramp pairs)")
ax[0].set_xlabel("pair i")
ax[0].set_ylabel("inv_freq")
ax[0].legend(fontsize=7)
ax[1].set_xlabel("pair i")
ax[1].set_ylabel("ramp[i]")
ax[1].set_title("the ramp: extrapolation (0) -> interpolation (1)")
ax[1].legend(fontsize=7)
save_figure(fig, args, "02_rope_yarn_inv_freq.png")

# %%
finish()
