"""Tutorial 05: MLA and the latent cache - absorption, 576 numbers per token, the absorbed attention kernel.

Run:  KDTREE_BACKEND=sim python tutorials/05_mla_latent_cache.py [--size small|large] [--out DIR]
"""
# %% [markdown]
# # 05 - Multi-head latent attention (MLA) and the latent cache
#
# MLA (DeepSeek-V2/V3, Kimi K2) does not cache per-head keys and values. Per token it caches one compressed
# **latent** `c_kv` (Lkv = 512 numbers, after `kv_a_layernorm`) plus one small roped key `k_rot` (R = 64) shared by
# all heads. Each head h would *expand* the latent into its own key and value:
#
#     k_nope[h] = W_UK[h] @ c_kv      [P = 128]        key[h]   = [k_nope[h] ; k_rot]      (P + R = 192)
#     v[h]      = W_UV[h] @ c_kv      [Vd = 128]
#
# **Absorption** (the trick that makes the cache small *and* the attention cheap): matrix products associate, so
#
#     q_nope[h] . (W_UK[h] @ c) = (q_nope[h] @ W_UK[h]) . c  = q_lat[h] . c
#     sum_s p[s] * (W_UV[h] @ c[s]) = W_UV[h] @ (sum_s p[s] * c[s])
#
# With `q[h] = [q_lat[h] (Lkv) ; q_rot[h] (R)]` every head attends over the *same* 576-wide cache rows
# `[c_kv ; k_rot]` (multi-query attention, one "kv head"), the values are the latent itself, and `W_UV` is applied
# once to the attention output. Nothing per-head is ever stored.
#
#     score[h, s] = scale * (q_lat[h] . c[s] + q_rot[h] . k_rot[s]),   scale = (P + R)^-0.5 (x YaRN m^2)
#     o_lat[h]    = sum_s softmax_s(score[h, :])[s] * c[s]                  -> o[h] = W_UV[h] @ o_lat[h]

# %%
import numpy as np

from _common import (banner, check, check_true, draw_owners, finish, host, parse_args, rng, save_figure, section,
                     show_kernel, stopwatch,
                     table)

import kdtree_numba as kd
from kdtree_numba.kernels import mla_attention as mla

args = parse_args(__doc__)
banner("Tutorial 05 - MLA and the latent cache", args)
Rng = rng(args, 5)
LARGE = args.size == "large"
if LARGE:
    N, P, R, Vd, Lkv, start, T = 64, 128, 64, 128, 512, 3000, 16      # Kimi-K2 attention, a 16-token chunk
else:
    N, P, R, Vd, Lkv, start, T = 3, 8, 4, 6, 16, 5, 4                 # tiny: 3 heads, 20-wide cache rows
D = Lkv + R
scale = (P + R) ** -0.5

# %% [markdown]
# ## Absorption, numerically (float64)

# %%
section("absorption: expanded == absorbed")
S = 7                                                       # keys
c = Rng.standard_normal((S, Lkv))                           # latents            [S, Lkv]
k_rot = Rng.standard_normal((S, R))                         # shared rope keys   [S, R]
q_nope = Rng.standard_normal((N, P))                        # one query token    [N, P]
q_rot = Rng.standard_normal((N, R))                         #                    [N, R]
W_UK = Rng.standard_normal((N, P, Lkv)) * 0.2               # kv_b_proj rows per head: first P ...
W_UV = Rng.standard_normal((N, Vd, Lkv)) * 0.2              # ... then Vd

k_nope = np.einsum("hpl,sl->hsp", W_UK, c)                  # expanded keys      [N, S, P]   (never stored)
v = np.einsum("hvl,sl->hsv", W_UV, c)                       # expanded values    [N, S, Vd]  (never stored)
scores_exp = np.einsum("hp,hsp->hs", q_nope, k_nope) + q_rot @ k_rot.T
q_lat = np.einsum("hp,hpl->hl", q_nope, W_UK)               # absorbed query     [N, Lkv]
scores_abs = q_lat @ c.T + q_rot @ k_rot.T                  # one MQA over [c ; k_rot]
check("scores: q.(W_UK c) == (q W_UK).c", scores_abs, scores_exp, atol=1e-10, rtol=1e-10)
p = np.exp(scale * scores_abs - (scale * scores_abs).max(1, keepdims=True))
p /= p.sum(1, keepdims=True)
o_exp = np.einsum("hs,hsv->hv", p, v)
o_abs = np.einsum("hvl,hl->hv", W_UV, p @ c)                # W_UV applied once, after attention
check("values: sum p (W_UV c) == W_UV (sum p c)", o_abs, o_exp, atol=1e-10, rtol=1e-10)

# %% [markdown]
# ## Why 576 numbers per token per layer
#
# The cache row is `[c_kv (512) ; k_rot (64)]` for every token and layer, whatever the number of heads. The
# expanded per-head K/V cache a plain MHA engine would keep is `heads x (P + R + Vd)` = `heads x (192 + 128)`.

# %%
section("cache size per token and layer")
rows = []
for name, heads, layers in (("Kimi-K2 (64 heads, 61 layers)", 64, 61), ("DeepSeek-V3 (128 heads, 61 layers)", 128, 61)):
    latent, expanded = 512 + 64, heads * (192 + 128)
    rows.append((name, latent, expanded, f"{expanded / latent:.1f}x",
                 f"{latent * layers * 2 / 1024:.1f} KiB", f"{expanded * layers * 2 / 1024 ** 2:.2f} MiB"))
table(rows, ("model", "latent", "expanded K+V", "ratio", "MLA/token (bf16)", "MHA/token (bf16)"))
check_true("Kimi: 64 x (192 + 128) / 576 = 35.6x smaller", abs(64 * 320 / 576 - 35.56) < 0.01,
           f"{64 * 320} / 576 = {64 * 320 / 576:.2f}")

# %% [markdown]
# ## Writing a row: `kernels/mla_latent.py`
#
# The row comes straight from the layer's `kv_a_proj_with_mqa` output `ckv [T, Lkv + R]`: the first Lkv columns
# are RMS-normalised (`kv_a_layernorm`), the last R are turned by RoPE at the token's position, and the result is
# stored in cache row `start + t`. One launch does all three (`write_latent`: one block per token; its threads sum
# the latent's squares, scale it from a shared copy, and the first R/2 threads rotate the rope pairs) - on a GPU
# every launch costs microseconds whatever its work, and this used to be six of them per layer.

# %%
section("the latent write")
from kdtree_numba.kernels import mla_latent, rope  # noqa: E402

show_kernel(mla_latent._latent_kernel)
ckv = Rng.standard_normal((T, D)).astype(np.float32)                        # kv_a output   [T, Lkv + R]
w_norm = (1 + 0.1 * Rng.standard_normal(Lkv)).astype(np.float32)            # kv_a_layernorm weight
positions = np.arange(start, start + T, dtype=np.int32)
inv_freq = rope.rope_inv_freq(R, 10000.0)
rows_cache = kd.backend.full((start + T + 2, D), np.nan, np.float32)         # NaN: rows never written show up
mla_latent.write_latent(ckv, w_norm, 1e-6, positions, inv_freq, 1.0, rows_cache, start)
got = host(rows_cache)
check("rows start .. start + T - 1 == [rmsnorm(c) ; rope(k_rot)]", got[start:start + T],
      mla_latent.latent_rows_ref(ckv, w_norm, 1e-6, positions, inv_freq), atol=1e-5, rtol=1e-5)
check_true("the other rows are untouched", np.isnan(got[:start]).all() and np.isnan(got[start + T:]).all())

# %% [markdown]
# ## The kernel: `kernels/mla_attention.py::_attention_kernel`
#
# Inputs: `q [T, N, D]` (the absorbed queries, `D = Lkv + R`), `cache [C, D]`; token t of a chunk starting at
# `start` sees cache rows `0 .. start + t` (its own row is already written: the model writes the chunk's rows
# first). Thread mapping:
#
# * grid `(token t, head group of HG = 4 heads, key split z)`; a block of 128 threads (32 on the simulator);
# * the block copies its HG queries into shared memory (pre-scaled), then walks its keys in **tiles of BK = 8 cache
#   rows**: the tile goes to shared memory; each of the HG x BK scores is summed by `threads / 32` threads over
#   interleaved slices of the D dims; one thread per head updates the **online softmax** (running max m, running
#   sum l, rescale factor exp(m_old - m_new)); every thread updates its share of the HG x Lkv output accumulators;
# * with one split the block writes `o / l`; with several (decode on the GPU: few tokens, long context) every split
#   writes (o, m, l) and `_combine_kernel` merges them:
#   `M = max m_z;  out = sum exp(m_z - M) o_z / sum exp(m_z - M) l_z`.
#
# The reference `mla_attention_ref` is a float64 softmax over each token's key list.
#
# Below: the kernel on the page (printed from the package: v1, the readable variant - the kernel and its per-tile
# device function; v2, the tensor-core variant the GPU runs, is described in the module's docstring), then which
# block reads which cache row for a chunk of
# 3 tokens after 6 committed rows with 2 key splits: split length = ceil(9 / 2) = 5 rounded up to a whole tile of
# BK = 8 rows, so split 0 reads rows 0-7 of every token's list and split 1 row 8 (only token 2's list is that
# long); cells past a token's last row (causal) are blank. Every head group of the token repeats the same picture.

# %%
section("the kernel on the page")
show_kernel(mla._attention_kernel)
show_kernel(mla._v1_tile)                                       # one key tile: load, scores, softmax, accumulate
check_true("the text's constants match the code (HG = 4 heads per block, BK = 8 rows per tile, rows up to 576)",
           mla.HG == 4 and mla.BK == 8 and mla.MAX_D == 576)
n_keys = 6 + np.arange(3) + 1                                  # token t sees rows 0 .. 6 + t
split_len = -(-(-(-9 // 2)) // mla.BK) * mla.BK                # ceil(9 / 2) -> whole tiles of BK rows
owner = np.where(np.arange(9)[None, :] < n_keys[:, None], np.arange(9)[None, :] // split_len, -1)   # [3, 9]
save_figure(draw_owners(owner, f"MLA attention, start 6, 3 tokens, 2 key splits of {split_len} rows: the number = "
                        f"the split z (grid axis 2) whose block reads the row", "cache row", "token t",
                        [f"token {t}" for t in range(3)]), args, "05_mla_attention_blocks.png")

# %%
section("kernel vs reference (causal, on a tiny cache)")
C = start + T + 2                                            # two unused rows after the chunk: never read
cache = Rng.standard_normal((C, D)).astype(np.float32)       # rows [c_kv ; k_rot]
q = Rng.standard_normal((T, N, D)).astype(np.float32)        # absorbed queries
ref = mla.mla_attention_ref(q, cache, start, scale, Lkv)
out = kd.backend.full((T, N, Lkv), np.nan, np.float32)
with stopwatch() as t:
    mla.mla_attention(q, cache, start, scale, Lkv, out=out)
print(f"_attention_kernel[grid=({T}, {-(-N // mla.HG)}, splits), block={kd.backend.block_size(128, 32)}]: "
      f"{t.ms:.1f} ms")
check("mla_attention kernel vs mla_attention_ref", out, ref, atol=1e-5, rtol=1e-4)
splits = 2 if not LARGE else 8
check(f"same with {splits} key splits + _combine_kernel", mla.mla_attention(q, cache, start, scale, Lkv, splits=splits),
      ref, atol=1e-5, rtol=1e-4)
ex_cache = np.array([[1, 0], [0, 1]], np.float32)
ex_q = np.array([[[0, 0]], [[np.log(3), 0]]], np.float32)
check("docstring example -> [1, 0.75]", host(mla.mla_attention(ex_q, ex_cache, 0, 1.0, 1)).ravel(),
      np.array([1.0, 0.75], np.float32), atol=1e-6, rtol=0)
changed = cache.copy()
changed[start + T:] = 1e6                                    # rows after the chunk: future tokens
check("rows after start + t are never read (causal)", mla.mla_attention(q, changed, start, scale, Lkv), out,
      atol=0, rtol=0)

# %% [markdown]
# ## End to end: the kernel's absorbed attention == expanded per-head attention
#
# Build per-head keys/values from the same latents and weights, run a textbook causal softmax attention per head,
# and compare with `W_UV @ mla_attention(...)`.

# %%
section("absorbed kernel == expanded multi-head attention")
W_UK = (0.2 * Rng.standard_normal((N, P, Lkv))).astype(np.float32)
W_UV = (0.2 * Rng.standard_normal((N, Vd, Lkv))).astype(np.float32)
qn = Rng.standard_normal((T, N, P)).astype(np.float32)
qr = Rng.standard_normal((T, N, R)).astype(np.float32)
q_abs = np.concatenate([np.einsum("thp,hpl->thl", qn, W_UK), qr], axis=-1).astype(np.float32)   # [T, N, D]
o = np.einsum("hvl,thl->thv", W_UV, host(mla.mla_attention(q_abs, cache, start, scale, Lkv)))  # [T, N, Vd]
c64, kr64 = cache[:, :Lkv].astype(np.float64), cache[:, Lkv:].astype(np.float64)
want = np.empty((T, N, Vd))
for h in range(N):
    K_h = np.concatenate([c64 @ W_UK[h].T, kr64], axis=1)    # [C, P + R] expanded keys of head h
    V_h = c64 @ W_UV[h].T                                    # [C, Vd]
    for tt in range(T):
        sc = scale * (K_h[:start + tt + 1] @ np.concatenate([qn[tt, h], qr[tt, h]]))
        pr = np.exp(sc - sc.max())
        want[tt, h] = (pr / pr.sum()) @ V_h[:start + tt + 1]
check("W_UV @ kernel(q_abs, latent cache) == expanded MHA", o, want, atol=1e-4, rtol=1e-4)

# %% [markdown]
# ## A picture: who attends to whom (head 0), and the cache sizes

# %%
import matplotlib.pyplot as plt  # noqa: E402

show_T, show_C = min(T, 16), min(start + T, 48)
probs = np.full((show_T, show_C), np.nan)
for tt in range(show_T):
    n = start + tt + 1
    sc = scale * (cache[:n].astype(np.float64) @ q[tt, 0].astype(np.float64))
    pr = np.exp(sc - sc.max())
    pr /= pr.sum()
    probs[tt, :min(n, show_C)] = pr[:show_C] if n > show_C else pr
fig, ax = plt.subplots(1, 2, figsize=(11, 3), gridspec_kw={"width_ratios": [2, 1]})
im = ax[0].imshow(probs, cmap="viridis", aspect="auto")
ax[0].axvline(start - 0.5, color="w", lw=1)
ax[0].set_xlabel(f"cache row (white line: start = {start}; blank: not visible)")
ax[0].set_ylabel("token of the chunk")
ax[0].set_yticks(range(show_T))
ax[0].set_title("attention probabilities, head 0 (causal)")
fig.colorbar(im, ax=ax[0])
ax[1].bar(["MLA latent", "Kimi MHA K+V"], [576, 64 * 320], color=["tab:blue", "tab:gray"])
ax[1].set_yscale("log")
ax[1].set_title("numbers per token per layer")
save_figure(fig, args, "05_mla_attention.png")

# %%
finish()
