"""Tutorial 15: prefill in MLA's decompressed form - per-head keys and values, and the GQA kernels (v3, v4) that run it.

Run:  KDTREE_BACKEND=sim python tutorials/15_decompressed_prefill.py [--size small|large] [--out DIR]
"""
# %% [markdown]
# # 15 - Prefill in MLA's decompressed form, and GQA on tensor cores
#
# Tutorials 05 and 14 ran MLA in its **absorbed** form: every head attends over the shared 576-wide latent rows,
# W_UK folded into the query and W_UV applied after. That form is right for a decode step and a tree verify, whose
# cost is reading the latent cache. A long **prefill** chunk is compute-bound instead, and there the absorbed form
# does 3.4x the FLOPs of the textbook (decompressed) form at Kimi's shape. So the target (`model/target.py`)
# switches: a causal chunk of at least `DECOMPRESSED_PREFILL_TOKENS` tokens decompresses per-head keys and values
# from the latent rows and runs grouped-query attention (`kernels/gqa_attention.py`). This tutorial:
#
# 1. the FLOP count of the two forms, where the decompression pays, and a check that both compute the same thing;
# 2. the target really switches (the trained pair, a held-out prompt): same logits, the GQA function called;
# 3. GQA itself: kv heads, tile rows -> query heads (`_v2_qrow`), causal or not (`visible_rows`);
# 4. the v3 kernel's mapping (a picture): a warp per 16 query rows, a quad of lanes per row, P through shared memory;
# 5. the bank arithmetic behind its three padded strides (K_STRIDE, V_STRIDE, P_STRIDE);
# 6. its online softmax step, `_v3_row_softmax`, on the device against NumPy in float64;
# 7. the whole kernel, variants v2, v3 and v4, against `gqa_attention_ref` on NaN-poisoned outputs;
# 8. v4, what v3 became: P never leaves the registers (a permuted key order, checked in NumPy), the query rows
#    staged in shared memory, the heaviest blocks first;
# 9. what it bought on an H200, quoted from docs/PERFORMANCE.md.
#
# Functions and constants are read from the package and kernels printed from it (`show_kernel`).

# %%
import inspect
import math

import numpy as np

from _common import (banner, check, check_true, finish, heldout_prompts, host, load_pair, model_backend, parse_args,
                     rng, save_figure, section, show_kernel, spy, stopwatch, table)

import kdtree_numba as kd
from numba import cuda, float32, int64
from kdtree_numba.kernels import block_attention as ba
from kdtree_numba.kernels import gqa_attention as gqa
from kdtree_numba.kernels import mla_attention as mla
from kdtree_numba.kernels.primitives import GROUP_BUF
from kdtree_numba.model import target as target_module

args = parse_args(__doc__)
banner("Tutorial 15 - prefill in MLA's decompressed form, and GQA on tensor cores", args)
R = rng(args, 15)
KERNELS = kd.backend.name != "numpy"          # False: the package's calls run references, our own kernels are skipped
BIG = args.size == "large" and kd.backend.name != "sim"   # GPU-sized shapes; the simulator stays tiny
if args.size == "large" and not BIG:
    print("note: --size large on the simulator keeps the tiny shapes (a v3 launch costs a second or two there)")
QT, KT3, WARPS3 = gqa.QT, gqa.KT3, gqa.WARPS3
K_STRIDE, V_STRIDE, P_STRIDE = gqa.K_STRIDE, gqa.V_STRIDE, gqa.P_STRIDE
W3 = gqa.v3_warps()                           # warps per v3 block on this backend (GPU 8, simulator 2)
THRESH = target_module.DECOMPRESSED_PREFILL_TOKENS
print(f"v3 constants: QT {QT} query rows per warp, KT3 {KT3} keys per tile, WARPS3 {WARPS3} warps per block on the "
      f"GPU ({QT * WARPS3} rows); this backend: {W3} warps ({QT * W3} rows); strides K {K_STRIDE}, V {V_STRIDE}, "
      f"P {P_STRIDE}; target.DECOMPRESSED_PREFILL_TOKENS = {THRESH}")


# %% [markdown]
# ## 1. Two forms of the same attention, and what each costs
#
# Per token and layer MLA caches one latent row `[c (Lkv) ; k_rot (R)]`, shared by the N heads. Head h's query is
# `[q_nope (P) ; q_rot (R)]`, and W_UK [N, P, Lkv], W_UV [N, Lkv, Vd] expand the latent into the head's key and value.
# Two ways to evaluate the same scores and outputs:
#
#     absorbed:      q_abs = [q_nope W_UK[h] ; q_rot]  (Lkv + R)      score = q_abs . [c ; k_rot]
#                    o_lat = sum_s p_s c_s  (Lkv)                      out = o_lat W_UV[h]  (Vd)
#     decompressed:  k[s, h] = [c_s W_UK[h]^T ; k_rot_s]  (P + R)      score = [q_nope ; q_rot] . k[s, h]
#                    v[s, h] = c_s W_UV[h]  (Vd)                       out = sum_s p_s v[s, h]
#
# since `q_nope . (c W_UK^T) = (q_nope W_UK) . c` and `sum_s p_s (c_s W_UV) = (sum_s p_s c_s) W_UV`. Per (query,
# key) pair and head, a dot product and an accumulate cost
#
#     absorbed      2 (Lkv + R + Lkv)         the score over Lkv + R dims, the accumulate over Lkv
#     decompressed  2 (P + R + Vd)            the score over P + R dims, the accumulate over Vd
#
# plus, for the decompressed form, `2 Lkv (P + Vd) N` FLOPs per key row to build k and v (two batched GEMMs). It pays
# once each key row is seen by more than `Lkv (P + Vd) / (2 Lkv - P - Vd)` queries (decompression / saving per
# pair). A causal chunk from position 0 of T tokens has T (T + 1) / 2 pairs over T key rows, (T + 1) / 2 per row;
# a later chunk (start > 0) decompresses its prefix rows again, S = start + T rows for T (start + (T + 1) / 2) pairs.
# Decode (T = 1) and a tree verify (65 nodes) are nowhere near: their cost is the latent's bytes, and the absorbed
# form reads 576 floats per key where Kimi's decompressed keys and values are N (P + R + Vd) = 20480.

# %%
section("FLOPs per (query, key) pair and head: Kimi K2 and the default pair")
target, drafter = load_pair()
cfg = target.config
N_d, P_d, R_d, L_d, V_d = (cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank,
                           cfg.v_head_dim)
SHAPES = {"Kimi K2": (64, 128, 64, 512, 128), "default pair": (N_d, P_d, R_d, L_d, V_d)}   # N, P, R, Lkv, Vd


def costs(N, P, Rr, Lkv, Vd):
    """(absorbed, decompressed) FLOPs per pair and head, decompression FLOPs per key row, break-even queries per key."""
    absorbed, decomp = 2 * (Lkv + Rr + Lkv), 2 * (P + Rr + Vd)
    per_row = 2 * Lkv * (P + Vd) * N
    return absorbed, decomp, per_row, per_row / ((absorbed - decomp) * N)


rows_c = []
for name, shp in SHAPES.items():
    a, d, row, be = costs(*shp)
    rows_c.append((name, " / ".join(map(str, shp)), a, d, f"{a / d:.2f}x", f"{row:,}", f"{be:.1f}",
                   f"{2 * be - 1:.0f}"))
table(rows_c, ("model", "N / P / R / Lkv / Vd", "absorbed", "decompressed", "ratio", "decompress / key row",
               "break-even queries/key", "causal T from 0"))
w_uk, w_uv = target.layers[0]["w_uk"], target.layers[0]["w_uv_t"]
check_true("the default pair's layer-0 W_UK [N, P, Lkv] and W_UV [N, Lkv, Vd] have the config's shapes",
           tuple(w_uk.shape) == (N_d, P_d, L_d) and tuple(w_uv.shape) == (N_d, L_d, V_d),
           f"w_uk {tuple(w_uk.shape)}, w_uv_t {tuple(w_uv.shape)}")

print("\nFLOPs of one attention layer, causal chunk from 0 (Kimi K2, all 64 heads; decompressed = attention + the "
      "two GEMMs):")
N_k, P_k, R_k, L_k, V_k = SHAPES["Kimi K2"]
a_k, d_k, row_k, _ = costs(*SHAPES["Kimi K2"])
rows_t = []
for T in (128, 256, 512, 1024, 4096):
    pairs = T * (T + 1) // 2
    fa, fd, fx = a_k * N_k * pairs, d_k * N_k * pairs, row_k * T
    rows_t.append((T, f"{fa / 1e9:.1f}", f"{fd / 1e9:.1f}", f"{fx / 1e9:.1f}", f"{fa / (fd + fx):.2f}x"))
table(rows_t, ("tokens", "absorbed GFLOP", "decompressed attention", "decompression", "absorbed / decompressed"))
print(f"By FLOPs alone the decompressed form wins from T ~ {2 * costs(*SHAPES['Kimi K2'])[3] - 1:.0f} at Kimi's "
      "shape; on the H200 it already wins at 128\n(section 8): the decompression runs as cuBLAS GEMMs at high "
      "throughput, and at a few hundred tokens neither\nattention kernel is FLOP-bound. The target's threshold "
      f"{THRESH} is a measured choice, not the FLOP break-even.")

# %% [markdown]
# The check: a random latent cache and random W_UK, W_UV; the absorbed form through the package's
# `mla_attention_ref` (then `o_lat W_UV`), the decompressed form through `gqa_attention_ref` (G = 1: one kv head per
# query head). Both references compute in float64 and round their outputs to float32, so the outputs agree to
# float32's rounding; the scores, computed here in float64 both ways, agree to float64's.

# %%
section("absorbed == decompressed (the package's references)")


def both_forms(N, P, Rr, Lkv, Vd, T, start, wk=None, wv=None):
    """(absorbed out, decompressed out, absorbed scores, decompressed scores) for random inputs: [T, N, Vd] x 2,
    [T, N, S] x 2 (float64 scores, unscaled)."""
    S = start + T
    c = R.standard_normal((S, Lkv))                                            # [S, Lkv] latent
    k_rot = R.standard_normal((S, Rr))                                         # [S, R]
    wk = R.standard_normal((N, P, Lkv)) / math.sqrt(Lkv) if wk is None else np.asarray(wk, np.float64)
    wv = R.standard_normal((N, Lkv, Vd)) / math.sqrt(Lkv) if wv is None else np.asarray(wv, np.float64)
    q_nope, q_rot = R.standard_normal((T, N, P)), R.standard_normal((T, N, Rr))   # [T, N, P], [T, N, R]
    scale = (P + Rr) ** -0.5
    cache = np.concatenate([c, k_rot], 1)                                      # [S, Lkv + R]
    q_abs = np.concatenate([np.einsum("thp,hpl->thl", q_nope, wk), q_rot], 2)  # [T, N, Lkv + R]
    o_lat = mla.mla_attention_ref(q_abs, cache, start, scale, Lkv)             # [T, N, Lkv] (float32)
    out_abs = np.einsum("thl,hlv->thv", o_lat.astype(np.float64), wv)          # [T, N, Vd]
    k = np.concatenate([np.einsum("sl,hpl->shp", c, wk), np.broadcast_to(k_rot[:, None], (S, N, Rr))], 2)
    v = np.einsum("sl,hlv->shv", c, wv)                                        # [S, N, Vd]
    q = np.concatenate([q_nope, q_rot], 2)                                     # [T, N, P + R]
    out_dec = gqa.gqa_attention_ref(q, k, v, start, scale, causal=True)        # [T, N, Vd] (float32)
    return out_abs, out_dec, np.einsum("thd,sd->ths", q_abs, cache), np.einsum("thd,shd->ths", q, k)


oa, od, sa, sd = both_forms(2, P_k, R_k, L_k, V_k, T=4, start=5)
check("Kimi dims (2 heads): scores q_abs . [c ; k_rot] == q . k  (float64)", sa, sd, atol=1e-12, rtol=1e-12)
check("Kimi dims: mla_attention_ref + W_UV == gqa_attention_ref on decompressed k, v", oa, od, atol=1e-6, rtol=1e-5)
oa, od, _, _ = both_forms(N_d, P_d, R_d, L_d, V_d, T=6, start=9, wk=host(w_uk), wv=host(w_uv))
check("default pair dims, its layer-0 W_UK / W_UV: absorbed == decompressed", oa, od, atol=1e-6, rtol=1e-5)

# %% [markdown]
# ## 2. The target switches
#
# `Target._attention` writes the chunk's latent rows, then, for a causal chunk (no tree, a host-side start) of at
# least `DECOMPRESSED_PREFILL_TOKENS` tokens, calls `_decompressed_attention`: k and v for every cached row of the
# layer (`rows[:start + T]`, prefix included) by two batched GEMMs, the query's rope half rotated in place, then
# `gqa_attention.gqa_attention(q, k, v, S - T, scale)`. Shorter chunks, decode steps and tree verifies take the
# absorbed path (`mla_attention` / `tree_attention`).
#
# On the trained pair (5 layers, 8 heads; on the simulator it runs on NumPy, `model_backend()`): a held-out prompt
# of 200 tokens as is, and again with the module constant patched to 10^9 (absorbed everywhere); the prompt cut to
# THRESH - 1 and THRESH tokens; and the 200 tokens as two chunks, 72 (absorbed) + 128 (decompressed over a
# 72-row prefix). The calls are counted by wrapping the module attributes target.py calls through.

# %%
section("the trained target: decompressed vs absorbed prefill")
show_kernel(target._decompressed_attention)


class calls:
    """``with calls() as c: ...``: c.gqa, c.mla count the calls of gqa_attention.gqa_attention and
    mla_attention.mla_attention made inside (target.py calls both through their modules)."""

    def __enter__(self):
        self.gqa = self.mla = 0
        self._g, self._m = gqa.gqa_attention, mla.mla_attention

        def g(*a, **kw):
            self.gqa += 1
            return self._g(*a, **kw)

        def m(*a, **kw):
            self.mla += 1
            return self._m(*a, **kw)
        gqa.gqa_attention, mla.mla_attention = g, m
        return self

    def __exit__(self, *exc):
        gqa.gqa_attention, mla.mla_attention = self._g, self._m
        return False


def prefill(ids, start=0, cache=None):
    """(logits [T, V] on the host, calls) of one forward of ``ids`` at ``start`` (a fresh cache unless given)."""
    cache = target.new_cache(256) if cache is None else cache
    with calls() as c:
        logits, _ = target.forward(np.asarray(ids, np.int32), cache, start)
    return host(logits), c, cache


prompts = heldout_prompts()
encoded = (target.tokenizer.encode(p["prompt"]) for p in prompts)
ids = np.asarray(next(e for e in encoded if len(e) >= 200)[:200], np.int32)    # [200] the first prompt this long
n_layers = cfg.num_hidden_layers
with stopwatch() as sw_dec:
    lg_dec, c_dec, _ = prefill(ids)
saved = target_module.DECOMPRESSED_PREFILL_TOKENS
target_module.DECOMPRESSED_PREFILL_TOKENS = 10 ** 9                            # absorbed for every chunk
try:
    with stopwatch() as sw_abs:
        lg_abs, c_abs, _ = prefill(ids)
finally:
    target_module.DECOMPRESSED_PREFILL_TOKENS = saved
print(f"200 tokens on {model_backend()}: decompressed {sw_dec.ms:.0f} ms ({c_dec.gqa} gqa_attention, {c_dec.mla} "
      f"mla_attention calls), absorbed {sw_abs.ms:.0f} ms ({c_abs.gqa}, {c_abs.mla})")
check("200-token prefill: decompressed logits vs absorbed (constant patched to 1e9)", lg_dec, lg_abs, atol=1e-4,
      rtol=1e-4)
check_true("same greedy next token at every position", np.array_equal(lg_dec.argmax(1), lg_abs.argmax(1)))
check_true(f"decompressed: gqa_attention once per layer ({n_layers}), mla_attention never; patched: the reverse",
           (c_dec.gqa, c_dec.mla, c_abs.gqa, c_abs.mla) == (n_layers, 0, 0, n_layers),
           f"{(c_dec.gqa, c_dec.mla)}, {(c_abs.gqa, c_abs.mla)}")
_, c_short, _ = prefill(ids[:THRESH - 1])
lg_at, c_at, _ = prefill(ids[:THRESH])
check_true(f"{THRESH - 1} tokens: absorbed ({c_short.mla} mla calls); {THRESH} tokens: decompressed ({c_at.gqa} gqa "
           f"calls)", (c_short.gqa, c_short.mla, c_at.gqa, c_at.mla) == (0, n_layers, n_layers, 0))
check(f"{THRESH} tokens: logits == the first {THRESH} rows of the 200-token forward (causal)", lg_at,
      lg_dec[:THRESH], atol=1e-4, rtol=1e-4)
lg_1, c_1, cache = prefill(ids[:72])
lg_2, c_2, _ = prefill(ids[72:], start=72, cache=cache)
check_true("chunks 72 + 128: the first absorbed, the second decompressed over the 72-row prefix",
           (c_1.gqa, c_1.mla, c_2.gqa, c_2.mla) == (0, n_layers, n_layers, 0))
check("chunked prefill (72 absorbed + 128 decompressed) == one 200-token forward", np.concatenate([lg_1, lg_2]),
      lg_dec, atol=1e-4, rtol=1e-4)

# %% [markdown]
# ## 3. Grouped-query attention: kv heads, tile rows, causal or not
#
#     score[t, h, s] = scale * q[t, h] . k[s, b],   b = h // G   (G = Nq / Nkv query heads per kv head)
#     out[t, h]      = sum_s softmax_s(score[t, h, :])[s] v[s, b]    over the rows token t sees
#
# Causal: token t of a chunk starting at `start` sees rows 0 .. start + t (`visible_rows`); not causal: every token
# sees rows 0 .. start + T - 1. The two users:
#
# * the decompressed prefill: G = 1 (each query head has its own decompressed keys), causal;
# * the DFlash drafter's block (`block_attention(variant="v2")`, tutorial 07): G = Nq / Nkv = 2 for the default
#   drafter, not causal - the block's 16 positions are drafted together. It calls the v2 kernel directly: 16 tokens
#   x 2 heads are exactly one 32-row v2 tile per kv head, where a 128-row v3 block would compute 96 padding rows.
#
# Absorbed MLA is the case Nkv = 1, G = N, v = the key rows' first Lkv columns.
#
# **Tile rows.** A kernel block works on one kv head b (grid axis z) and on its `n = T G` tile rows, token-major:
# tile row `r = t G + j` is token t, query head `b G + j`, i.e. row `t Nq + b G + j` of the flat `q [T Nq, Dk]`
# (`_v2_qrow`; rows past n clamp to the last, their outputs are never stored). All G heads of a token sit next to
# each other and read the same kv row: that is what makes GQA a matrix product per key tile.

# %%
section("the spec: visible_rows, GQA == per-head attention, absorbed MLA as a GQA case")
dc = drafter.config
print(f"the default drafter: {dc.num_attention_heads} query heads over {dc.num_key_value_heads} kv heads (G = "
      f"{dc.num_attention_heads // dc.num_key_value_heads}), head dim {dc.head_dim}, blocks of {dc.block_size} tokens "
      f"-> {dc.block_size * dc.num_attention_heads // dc.num_key_value_heads} tile rows per kv head; the default "
      f"target's prefill: G = 1, Dk = P + R = {P_d + R_d}, Dv = {V_d}")
vr_c, vr_n = gqa.visible_rows(3, 2, True), gqa.visible_rows(3, 2, False)       # [3, 5] each
print("visible_rows(T 3, start 2): causal / not causal (rows: tokens, columns: key rows)")
for t in range(3):
    print(f"    token {t}:  " + "".join("x" if v else "." for v in vr_c[t]) + "    "
          + "".join("x" if v else "." for v in vr_n[t]))
check("visible_rows: causal token t sees start + t + 1 rows, not causal all start + T", np.stack(
    [vr_c.sum(1), vr_n.sum(1)]), np.array([[3, 4, 5], [5, 5, 5]]))
qg = R.standard_normal((3, 4, 6))                                              # [T, Nq, Dk], G = 2
kg, vg = R.standard_normal((7, 2, 6)), R.standard_normal((7, 2, 5))            # [S, Nkv, .]
loop = np.empty((3, 4, 5))                                                     # per head, per token, float64
for h in range(4):
    for t in range(3):
        s = 0.7 * kg[:5, h // 2] @ qg[t, h]                                    # not causal: rows 0 .. start + T - 1
        p = np.exp(s - s.max())
        loop[t, h] = p @ vg[:5, h // 2] / p.sum()
check("gqa_attention_ref, G 2, not causal == a per-head loop over kv head h // G", gqa.gqa_attention_ref(
    qg, kg, vg, 2, 0.7, causal=False), loop, atol=1e-6, rtol=1e-6)
qm = R.standard_normal((3, 5, 12))                                             # [T, N, Lkv + R]
cm = R.standard_normal((9, 12))                                                # [S, Lkv + R]
check("absorbed MLA == GQA with one kv head, G = N, v = the rows' first Lkv columns", gqa.gqa_attention_ref(
    qm, cm[:, None], np.ascontiguousarray(cm[:, None, :8]), 4, 0.3), mla.mla_attention_ref(qm, cm, 4, 0.3, 8),
      atol=1e-6, rtol=1e-6)


@cuda.jit
def qrow_kernel(n, G, nq, out):
    """out[b, r] = _v2_qrow(r, n, G, nq, b): the flat q row that tile row r of kv head b stands for."""
    i = cuda.grid(1)
    if i < out.shape[0] * out.shape[1]:
        b = i // out.shape[1]
        r = i % out.shape[1]
        out[b, r] = int64(mla._v2_qrow(r, n, G, nq, b))


section("tile rows -> query rows (_v2_qrow)")
T_m, Nq_m, B_m = 3, 6, 2
G_m = Nq_m // B_m
n_m = T_m * G_m
want_q = np.array([[min(r, n_m - 1) // G_m * Nq_m + b * G_m + min(r, n_m - 1) % G_m for r in range(n_m + 2)]
                   for b in range(B_m)], np.int64)                             # [B, n + 2]: two rows past the end
table([(r, r // G_m, r % G_m, f"{b * G_m + r % G_m}", int(want_q[b, r])) for b in range(B_m) for r in range(n_m)
       if r < 4 or b == 1 and r >= n_m - 2],
      ("tile row r", "token t = r // G", "j = r % G", "query head b G + j", "q row t Nq + b G + j"))
print(f"(T {T_m}, Nq {Nq_m}, Nkv {B_m}, G {G_m}; rows 0..3 of kv head 0 and the last two of kv head 1)")
check_true("the tile rows of all kv heads cover every query row exactly once",
           np.array_equal(np.sort(want_q[:, :n_m].ravel()), np.arange(T_m * Nq_m)))
if KERNELS:
    got_q = kd.backend.full((B_m, n_m + 2), -7, np.int64)                      # [B, n + 2] poisoned
    kd.backend.launch(qrow_kernel, 1, 64, n_m, G_m, Nq_m, got_q)
    check("_v2_qrow on the device == t Nq + b G + j (rows past n clamp to the last)", got_q, want_q)

# %% [markdown]
# ## 4. v3: a warp per 16 query rows
#
# v2 (`_attention_v2_kernel`, tutorial 14) was built for absorbed MLA's 576-wide rows: 32 query rows per block, the
# score dims split over 4 warps ("k-parts") and summed through shared memory, the softmax on 8 lanes per row - five
# block barriers per key tile. Decompressed heads are narrow (Kimi: Dk = P + R = 192, Dv = 128), so **v3**
# (`_gqa_v3_kernel`) uses FlashAttention-2's mapping: **warp w owns 16 tile rows** (one m16 MMA block) with *all*
# their key dims and output columns. A GPU block is WARPS3 = 8 warps = 128 tile rows (on the simulator
# `v3_warps()` = 2 warps = 32 rows, so a test needs few blocks); grid `(ceil(T G / (16 warps)), splits, Nkv)`.
# Per key tile of KT3 = 16 rows: keys and values by cp.async into `ks [16, K_STRIDE]` and `vs [16, V_STRIDE]`,
# one barrier, then every warp alone:
#
#     S [16, 16] = Q K^T          2 n8 blocks x ceil(Dk / 8) k8 steps, 3xTF32; S stays in registers (C fragments)
#     softmax                      lane 4g + t holds rows g and g + 8, keys 2t, 2t + 1, 8 + 2t, 9 + 2t of the tile:
#                                  a row's 16 scores sit in one quad (4 lanes) -> max and sum over 4 lanes
#     P -> ps[w]  (C layout), syncwarp, P <- ps[w] (A layout)
#     O [16, Dv] = alpha O + P V   2 k8 steps x ceil(Dv / 8) n8 fragments, 64 accumulators per lane
#
# and one barrier before the next tile overwrites ks / vs: two block barriers per 16 keys instead of v2's five.
#
# **Why P goes through shared memory.** The MMA's output (C) fragment and its input (A) fragment put the same
# [16, 8] matrix in different lanes: C has lane 4g + t at columns 2t, 2t + 1; A has it at columns t, t + 4. The
# scores come out as C, but P V needs P as A. The picture shows both for a whole 16 x 16 tile; each warp writes
# its P into its own `ps[w] [16, P_STRIDE]` and reads it back after a `syncwarp` (on the simulator a block
# barrier: its warps are not lock-step).

# %%
section("the v3 warp and lane mapping (picture)")
show_kernel(gqa._v3_warps)
lane = np.arange(32)
g_l, t_l = lane // 4, lane % 4                                                 # [32] group, thread in group
lanes_C = np.full((QT, KT3), -1)                                               # [16, 16] lane holding S / P (C)
lanes_A = np.full((QT, KT3), -1)                                               # [16, 16] lane reading P (A)
cover_C = np.zeros((QT, KT3), int)
cover_A = np.zeros((QT, KT3), int)
for nb in range(2):                                                            # the scores' two n8 blocks
    for rr, cc in ((g_l, 8 * nb + 2 * t_l), (g_l, 8 * nb + 2 * t_l + 1), (g_l + 8, 8 * nb + 2 * t_l),
                   (g_l + 8, 8 * nb + 2 * t_l + 1)):                           # c0 .. c3
        lanes_C[rr, cc] = lane
        np.add.at(cover_C, (rr, cc), 1)
for kk in range(2):                                                            # P V's two k8 steps
    for rr, cc in ((g_l, 8 * kk + t_l), (g_l + 8, 8 * kk + t_l), (g_l, 8 * kk + t_l + 4),
                   (g_l + 8, 8 * kk + t_l + 4)):                               # a0 .. a3
        lanes_A[rr, cc] = lane
        np.add.at(cover_A, (rr, cc), 1)
same = lanes_C == lanes_A
print("lane 4g + t in the C layout (scores, P as computed): row g, keys "
      + ", ".join(f"t={t}: {sorted(np.nonzero(lanes_C[0] == t)[0].tolist())}" for t in range(4)))
print("                   in the A layout (P as P V reads it): row g, keys "
      + ", ".join(f"t={t}: {sorted(np.nonzero(lanes_A[0] == t)[0].tolist())}" for t in range(4)))
check_true("both layouts cover the 16 x 16 tile once; C: lane 4g + t holds keys 2t, 2t+1, 8+2t, 9+2t of rows g, g+8",
           np.all(cover_C == 1) and np.all(cover_A == 1)
           and all(sorted(np.nonzero(lanes_C[gg] == 4 * gg + t)[0].tolist()) == [2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t]
                   and np.array_equal(lanes_C[gg] // 4, lanes_C[gg + 8] // 4) for gg in range(8) for t in range(4)))
check_true("a row's 16 scores sit in one quad in both layouts (max / sum over 4 lanes: group width 4)",
           all(set((lanes_C[r] // 4).tolist()) == {r % 8} == set((lanes_A[r] // 4).tolist()) for r in range(QT)))
check_true(f"C != A: only {int(same.sum())} of 256 P values are already in the lane that reads them",
           int(same.sum()) == 64, f"{256 - int(same.sum())} must move between lanes (within their quad)")

import matplotlib.pyplot as plt  # noqa: E402

fig, axes = plt.subplots(1, 3, figsize=(16, 7.5), gridspec_kw=dict(width_ratios=[1.1, 3, 3]))
warp_of_row = np.repeat(np.arange(WARPS3), QT)[:, None]                        # [128, 1]
ax = axes[0]
ax.imshow(warp_of_row % 10, cmap="tab10", vmin=0, vmax=9, aspect="auto", interpolation="nearest")
for w in range(WARPS3):
    ax.text(0, QT * w + QT / 2 - 0.5, f"warp {w}\nrows\n{QT * w}..{QT * w + QT - 1}", ha="center", va="center",
            fontsize=7)
ax.axhline(QT * W3 - 0.5, color="k", lw=2.5)
ax.text(0.55, QT * W3 - 2, f"simulator\nblock: {W3} warps\n= rows 0..{QT * W3 - 1}" if W3 < WARPS3 else "",
        fontsize=7, va="bottom", ha="left", transform=ax.transData, clip_on=False)
ax.set_xticks([])
ax.set_yticks(range(0, QT * WARPS3 + 1, QT))
ax.set_ylabel("tile row r of the block (r = t G + j: token t, query head b G + j)")
ax.set_title(f"a GPU block: {WARPS3} warps x {QT} rows", fontsize=9)


def lane_grid(ax, lanes, title, mark=None):
    ax.imshow(lanes % 20, cmap="tab20", vmin=0, vmax=19, aspect="auto", interpolation="nearest")
    for r in range(lanes.shape[0]):
        for c in range(lanes.shape[1]):
            bold = mark is not None and mark[r, c]
            ax.text(c, r, str(lanes[r, c]), ha="center", va="center", fontsize=7,
                    fontweight="bold" if bold else "normal", color="k")
            if bold:
                ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, lw=1.6, ec="k"))
    ax.axvline(7.5, color="k", lw=1.5)
    ax.axhline(7.5, color="w", lw=1, ls=":")
    ax.set_xticks(range(KT3))
    ax.set_yticks(range(QT))
    ax.set_xlabel("key j of the 16-key tile")
    ax.set_ylabel("row of the warp's 16 (g and g + 8: the same lanes)")
    ax.set_title(title, fontsize=9)


lane_grid(axes[1], lanes_C, "S and P as the score MMAs leave them (C fragments, 2 n8 blocks):\nlane 4g + t holds "
          "rows g, g+8 x keys 2t, 2t+1, 8+2t, 9+2t")
lane_grid(axes[2], lanes_A, "P as the P V MMAs read it (A fragments, 2 k8 steps):\nlane 4g + t reads keys t, t+4, "
          "8+t, 12+t  (boxed: already in that lane)", mark=same)
fig.suptitle("v3 (_gqa_v3_kernel): which warp owns which query rows, which lane holds which score - so P goes "
             f"through the warp's shared buffer ps[w] [16, {P_STRIDE}]", fontsize=10)
fig.tight_layout()
save_figure(fig, args, "15_v3_warps.png")

# %% [markdown]
# ## 5. Shared-memory banks: why 260, 136 and 20
#
# Shared memory has 32 banks of 4-byte words; a warp's load is one transaction when its 32 lanes hit 32 different
# banks. Word address -> bank is `address mod 32`. The three fragment loads of a tile, lane 4g + t:
#
#     score B fragment   ks[key g, dim t]        g K_STRIDE + t     260 = 4 mod 32 -> 4g + t: 32 banks
#     P V B fragment     vs[key t, column g]     t V_STRIDE + g     136 = 8 mod 32 -> 8t + g: 32 banks
#     P A fragment       ps[row g, key t]        g P_STRIDE + t      20: 20 g mod 32 = 0, 20, 8, 28, 16, 4, 24, 12
#
# The natural strides (Dk = 256, v3's widest key row, or v2's 576; Dv = 128; 16 keys) are multiples of 32 or 16 and
# serialise the load 4-8 ways. (The C-layout *stores* of P, `ps[g, 2t]` and `ps[g, 2t + 1]`, are 2-way with stride
# 20: eight stores per lane and tile, read back by eight conflict-free A-fragment loads.)

# %%
section("bank arithmetic of the three strides (host)")


def banks(addr):
    """(distinct banks, most lanes on one bank) of a warp's 32 word addresses."""
    b = np.asarray(addr) % 32
    return len(set(b.tolist())), int(np.bincount(b, minlength=32).max())


LOADS = {  # name: (the package's stride, other strides, word address of lane (g, t) for a stride)
    "score B  ks[g, t]": (K_STRIDE, (256, 576), lambda s: g_l * s + t_l),
    "P V B    vs[t, g]": (V_STRIDE, (128, 132), lambda s: t_l * s + g_l),
    "P A      ps[g, t]": (P_STRIDE, (16, 24), lambda s: g_l * s + t_l),
    "P store  ps[g, 2t]": (P_STRIDE, (16,), lambda s: g_l * s + 2 * t_l),
}
rows_b, res = [], {}
for name, (mine, others, addr) in LOADS.items():
    for s in (mine,) + others:
        nb, worst = banks(addr(s))
        res[name, s] = (nb, worst)
        rows_b.append((name, s, s % 32, "package" if s == mine else "", nb, f"{worst}-way" if worst > 1 else "free"))
table(rows_b, ("warp access", "stride", "mod 32", "", "banks hit", "conflict"))
check_true(f"K_STRIDE {K_STRIDE}: the score B loads hit 32 banks (256: 4 banks, 8-way; 576: 8-way)",
           res["score B  ks[g, t]", K_STRIDE] == (32, 1) and res["score B  ks[g, t]", 256] == (4, 8)
           and res["score B  ks[g, t]", 576] == (4, 8))
check_true(f"V_STRIDE {V_STRIDE}: the P V B loads hit 32 banks (128: 8 banks, 4-way)",
           res["P V B    vs[t, g]", V_STRIDE] == (32, 1) and res["P V B    vs[t, g]", 128] == (8, 4))
check_true(f"P_STRIDE {P_STRIDE}: the P A loads hit 32 banks (16: 8 banks, 4-way)",
           res["P A      ps[g, t]", P_STRIDE] == (32, 1) and res["P A      ps[g, t]", 16] == (8, 4))
ks_bytes, vs_bytes, ps_bytes = KT3 * K_STRIDE * 4, KT3 * V_STRIDE * 4, WARPS3 * QT * P_STRIDE * 4
check_true(f"strides hold the widest rows (Dk {gqa.MAX_DK3}, Dv {gqa.MAX_DV3}, {KT3} keys); ks + vs + ps = "
           f"{ks_bytes:,} + {vs_bytes:,} + {ps_bytes:,} bytes < 48 KB static shared memory",
           K_STRIDE >= gqa.MAX_DK3 and V_STRIDE >= gqa.MAX_DV3 and P_STRIDE >= KT3
           and ks_bytes + vs_bytes + ps_bytes < 48 * 1024)

# %% [markdown]
# ## 6. The online softmax step on a quad: `_v3_row_softmax`
#
# Each lane calls it twice per key tile, for its rows g and g + 8, with its four scores (keys kf, kf + 1, kf + 8,
# kf + 9, kf = k0 + 2t) and the row's key limit `lim` (keys >= lim are hidden: the causal mask, the end of the
# block's keys, or a split past the token's last key). It returns P for its four keys, the new running max and sum,
# and alpha, the factor the row's accumulators are rescaled by:
#
#     m_new = max(m_old, max of the row's visible scaled scores)     group_max over the quad (shuffles on the GPU)
#     P_j   = exp(s_j - m_new) (0 if hidden),   alpha = exp(m_old - m_new),   l_new = alpha l_old + sum_j P_j
#
# A row with no visible key so far keeps m = -inf, l = 0, alpha = 1, P = 0. Below, our own one-warp kernel calls the
# package's function over two key tiles of 16 rows x 32 keys (each lane writes the state it got, so the four lanes
# of a quad must agree) against a float64 NumPy online softmax; then the kernel's P, alpha and l give the plain
# softmax. Rows: all keys visible; one key; keys 0..8 (key 9 hidden inside a quad's pair); tile 0 only; none;

# %%
section("_v3_row_softmax (device, one warp) vs a float64 online softmax")
show_kernel(gqa._v3_row_softmax)


@cuda.jit
def row_softmax_kernel(S, lim, scale, p_out, st_out):
    """One warp: lane 4g + t runs the package's _v3_row_softmax for rows g and g + 8 of S [16, tiles * KT3] over the
    key tiles, with its four keys of each; P -> p_out [16, tiles * KT3], its (m, l, alpha) of rows g and g + 8 after
    each tile -> st_out [tiles, 32, 6]."""
    buf = cuda.shared.array(GROUP_BUF, float32)          # the simulator's group scratch (GPU: unused)
    ln = cuda.threadIdx.x
    g = ln // 4
    t = ln % 4
    m_a = float32(-math.inf)
    m_b = float32(-math.inf)
    l_a = float32(0.0)
    l_b = float32(0.0)
    for tile in range(S.shape[1] // KT3):
        kf = tile * KT3 + 2 * t
        pa0, pa1, pa2, pa3, m_a, l_a, xa = gqa._v3_row_softmax(S[g, kf], S[g, kf + 1], S[g, kf + 8], S[g, kf + 9],
                                                               kf, lim[g], scale, m_a, l_a, buf)
        pb0, pb1, pb2, pb3, m_b, l_b, xb = gqa._v3_row_softmax(S[g + 8, kf], S[g + 8, kf + 1], S[g + 8, kf + 8],
                                                               S[g + 8, kf + 9], kf, lim[g + 8], scale, m_b, l_b,
                                                               buf)
        p_out[g, kf], p_out[g, kf + 1], p_out[g, kf + 8], p_out[g, kf + 9] = pa0, pa1, pa2, pa3
        p_out[g + 8, kf], p_out[g + 8, kf + 1], p_out[g + 8, kf + 8], p_out[g + 8, kf + 9] = pb0, pb1, pb2, pb3
        st_out[tile, ln, 0], st_out[tile, ln, 1], st_out[tile, ln, 2] = m_a, l_a, xa
        st_out[tile, ln, 3], st_out[tile, ln, 4], st_out[tile, ln, 5] = m_b, l_b, xb


def online_softmax_f64(S, lim, scale, tiles):
    """The online softmax in float64, tile by tile: (P [16, tiles KT3], state [tiles, 16, 3] = m, l, alpha)."""
    rows = S.shape[0]
    P = np.zeros(S.shape)
    state = np.zeros((tiles, rows, 3))
    m, l_ = np.full(rows, -np.inf), np.zeros(rows)
    for tile in range(tiles):
        keys = np.arange(tile * KT3, (tile + 1) * KT3)
        s = np.where(keys[None, :] < lim[:, None], S[:, keys].astype(np.float64) * scale, -np.inf)   # [16, 16]
        m_new = np.maximum(m, s.max(1))
        ok = m_new > -np.inf
        p = np.where(ok[:, None], np.exp(s - np.where(ok, m_new, 0)[:, None]), 0.0)
        a = np.where(ok, np.exp(m - np.where(ok, m_new, 0)), 1.0)
        l_ = a * l_ + p.sum(1)
        m = m_new
        P[:, keys] = p
        state[tile] = np.stack([m, l_, a], 1)
    return P, state


S_sm = (2 * R.standard_normal((QT, 2 * KT3))).astype(np.float32)              # [16, 32] two key tiles
lim_sm = R.integers(1, 2 * KT3 + 1, QT).astype(np.int32)                       # [16] keys < lim visible
lim_sm[:6] = [2 * KT3, 1, 9, KT3, 0, KT3 + 1]   # row 0 sees every key, row 1 key 0, row 2 keys 0..8 (key 9 hidden
# inside a lane's pair), row 3 tile 0 only, row 4 none, row 5 tile 0 + key 16; the rest random - and larger scores
# in tile 1 wherever a row sees it, so that the max moves there (alpha < 1).
both = lim_sm > KT3                                                            # [16] rows that see keys in tile 1
S_sm[both, KT3:] += 12                                                         # there tile 1 raises the max
scale_sm = np.float32(0.37)
P64, st64 = online_softmax_f64(S_sm, lim_sm, float(scale_sm), 2)
seen = lim_sm > 0                                                              # rows with a visible key
plain = np.where(np.arange(2 * KT3)[None] < lim_sm[:, None], S_sm.astype(np.float64) * float(scale_sm), -np.inf)
plain = np.exp(plain[seen] - plain[seen].max(1, keepdims=True))
plain /= plain.sum(1, keepdims=True)                                           # [rows seen, 32] float64 softmax
check("NumPy online softmax (float64) over 2 tiles == the plain softmax", np.concatenate(
    [P64[seen, :KT3] * st64[1, seen, 2:3], P64[seen, KT3:]], 1) / st64[1, seen, 1:2], plain, atol=1e-12, rtol=1e-12)
check_true("NumPy: row 4 (no key) m -inf, l 0, alpha 1, P 0; row 3 (tile 0 only) alpha 1, P 0 in tile 1",
           np.all(np.isneginf(st64[:, 4, 0])) and np.all(st64[:, 4, 1:] == [0, 1]) and not P64[4].any()
           and st64[1, 3, 2] == 1 and not P64[3, KT3:].any() and np.all(st64[1, both, 2] < 1),
           f"alpha < 1 after tile 1 in the {int(both.sum())} rows that see it")
if KERNELS:
    p_k = kd.backend.full((QT, 2 * KT3), np.nan, np.float32)                   # [16, 32] poisoned
    st_k = kd.backend.full((2, 32, 6), np.nan, np.float32)                     # [2, 32, 6] poisoned
    with stopwatch() as sw:
        kd.backend.launch(row_softmax_kernel, 1, 32, kd.backend.asarray(S_sm), kd.backend.asarray(lim_sm), scale_sm,
                          p_k, st_k)
    want_st = np.concatenate([st64[:, g_l], st64[:, g_l + 8]], 2)              # [2, 32, 6]: every lane of a quad
    finite = lambda a: np.where(np.isneginf(a), -1e30, a)                      # noqa: E731  (m = -inf as -1e30)
    check(f"_v3_row_softmax: P of both tiles vs float64 (one warp, {sw.ms:.0f} ms)", p_k, P64, atol=1e-6, rtol=1e-5)
    check("_v3_row_softmax: (m, l, alpha) of rows g, g + 8 in all 4 lanes of each quad, after each tile",
          finite(host(st_k).astype(np.float64)), finite(want_st), atol=1e-6, rtol=1e-5)
    pk, sk = host(p_k).astype(np.float64), host(st_k).astype(np.float64)
    quad0 = 4 * np.arange(8)                                                   # lane 4g: rows g and g + 8
    a1 = np.concatenate([sk[1, quad0, 2], sk[1, quad0, 5]])[:, None]           # [16, 1] alpha of tile 1, rows 0..15
    l1 = np.concatenate([sk[1, quad0, 1], sk[1, quad0, 4]])[:, None]           # [16, 1] final l
    check("the kernel's (P tile 0 x alpha tile 1, P tile 1) / l == the plain softmax", (np.concatenate(
        [pk[:, :KT3] * a1, pk[:, KT3:]], 1) / np.where(l1 > 0, l1, 1))[seen], plain, atol=1e-6, rtol=1e-5)

# %% [markdown]
# ## 7. The whole kernel, v2, v3 and v4, against the reference
#
# `gqa_attention(q, k, v, start, scale, causal, variant=...)`: v3 (`default_variant` while Dk <= 256 and Dv <= 128:
# the decompressed prefill and the drafter) or v2 (the absorbed kernel over kv heads: the values land in the same
# key tile at column `value_column(Dk)` = Dk rounded up to 8). Outputs are filled with NaN first: a row no block
# writes stays NaN and fails. Tiny shapes on the simulator (a launch there costs a second or two: every simulated
# MMA is a block barrier):
#
# * the docstring example (one head, Dk = Dv = 1): causal -> 1, 2; not causal -> 2, 2;
# * the decompressed prefill, G = 1, causal: T 3, 2 heads (2 kv heads: grid z = 2), Dk = P + R = 8 + 4, Dv 8,
#   start 12 (15 keys, one tile: tokens 0 and 1 masked inside it); then (v3) every row after start + 0 set to
#   1e3 / 1e6 - rows token 0's block loads but token 0 must not see: its output must not change, bit for bit;
# * the drafter's block, G = 2, not causal: 16 tokens x 2 query heads over one kv head (32 tile rows: one block
#   for v2 and for the simulator's v3), Dk = Dv = 8, 7 context rows (23 keys: two key tiles); then (v3) the same
#   with 2 key splits + the combine; and `block_attention(variant="v2")`, the call the drafter makes, on the same
#   inputs.

# %%
section("gqa_attention v2 / v3 / v4 vs gqa_attention_ref (NaN-poisoned outputs)")
print("default_variant(Dk, Dv): Kimi prefill (192, 128) -> " + gqa.default_variant(192, 128) + ", default pair "
      f"({P_d + R_d}, {V_d}) -> {gqa.default_variant(P_d + R_d, V_d)}, default drafter (32, 32) -> "
      f"{gqa.default_variant(32, 32)}, absorbed rows (576, 512) -> {gqa.default_variant(576, 512)}")
if not KERNELS:
    print("numpy backend: gqa_attention runs its float32 NumPy path, not a kernel")
TOL = dict(atol=1e-4 if BIG else 1e-5, rtol=1e-4)
timing = []


def run(name, q, k, v, start, causal, variant, splits=None):
    """gqa_attention into a NaN-poisoned out; returns (out, launches)."""
    out = kd.backend.full((q.shape[0], q.shape[1], v.shape[2]), np.nan, np.float32)   # [T, Nq, Dv] poisoned
    with spy() as s, stopwatch() as sw:
        gqa.gqa_attention(q, k, v, start, 0.3, causal=causal, out=out, splits=splits, variant=variant)
    timing.append((name, variant, f"{sw.ms:.0f}"))
    return out, s.launches


def qkv(T, Nq, Nkv, Dk, Dv, S):
    return ((2 * R.standard_normal((T, Nq, Dk))).astype(np.float32), R.standard_normal((S, Nkv, Dk)).astype(
        np.float32), R.standard_normal((S, Nkv, Dv)).astype(np.float32))


def grid_of(T, Nq, Nkv, S, rows, tile=KT3, wave=None):
    """The launch grid (row tiles, key splits, kv heads) for blocks of ``rows`` tile rows and S = start + T keys in
    tiles of ``tile``; the split count from ``plan_splits`` as the launchers call it (1 on the simulator; on the GPU
    enough splits for about 264 blocks for the GQA kernels, planned by ``wave`` for the MLA tiled kernel)."""
    tiles = -(-(T * (Nq // Nkv)) // rows)
    return tiles, mla.plan_splits(tiles * Nkv, S, tile, mla.MIN_SPLIT_TILES * tile, None, wave)[0], Nkv


def launched(launches, name, grid, threads=None):
    """The kernel ``name`` on ``grid`` (with ``threads`` when given), then the combine iff there are splits."""
    first = launches[0] if launches else (None, None, None)
    combine = ["_combine_kernel"] if grid[1] > 1 else []
    return (first[0], first[1]) == (name, grid) and (threads is None or first[2] == threads) \
        and [n for n, _, _ in launches[1:]] == combine


q_e = np.array([[[0.5]], [[-2.0]]], np.float32)                               # [2, 1, 1]
k_e = np.zeros((2, 1, 1), np.float32)
v_e = np.array([[[1.0]], [[3.0]]], np.float32)
ex = [host(run("docstring", q_e, k_e, v_e, 0, causal, "v3")[0])[:, 0, 0] for causal in (True, False)]
check(f"docstring example, {'v3' if KERNELS else 'numpy path'}: causal -> [1, 2], not causal -> [2, 2]",
      np.stack(ex), np.array([[1, 2], [2, 2]], np.float32), atol=1e-6, rtol=1e-6)

if BIG:   # the GPU tests' shapes: Kimi's decompressed chunk (16 of its 64 heads), the default drafter's block
    T1, N1, Dk1, Dv1, st1, T2, Nq2, Nkv2, D2, st2 = 512, 16, 192, 128, 256, 16, 8, 4, 32, 300
else:
    T1, N1, Dk1, Dv1, st1, T2, Nq2, Nkv2, D2, st2 = 3, 2, 12, 8, 12, 16, 2, 1, 8, 7
q1, k1, v1 = qkv(T1, N1, N1, Dk1, Dv1, st1 + T1 + 2)
want1 = gqa.gqa_attention_ref(q1, k1, v1, st1, 0.3, causal=True)
k1f, v1f = k1.copy(), v1.copy()
k1f[st1 + 1:], v1f[st1 + 1:] = 1e3, 1e6                                       # rows token 0 must not see
q2, k2, v2 = qkv(T2, Nq2, Nkv2, D2, D2, st2 + T2 + 3)
want2 = gqa.gqa_attention_ref(q2, k2, v2, st2, 0.3, causal=False)
WAVE = mla.tiled_wave()                                                        # the MLA tiled kernel's wave
for variant in gqa.VARIANTS:
    who = variant if KERNELS else f"numpy path ({variant} asked)"
    out1, l1 = run("G 1 causal", q1, k1, v1, st1, True, variant)
    check(f"{who}: G 1, causal, T {T1}, {N1} heads, Dk {Dk1}, Dv {Dv1}, start {st1}", out1, want1, **TOL)
    if variant in ("v3", "v4"):
        out1f, _ = run("G 1 causal, future rows", q1, k1f, v1f, st1, True, variant)
        check(f"{who}: token 0 ignores the rows after start + 0 (set to 1e3 / 1e6), bit for bit", host(out1f)[0],
              host(out1)[0], exact=True)
    out2, l2 = run("G 2 not causal", q2, k2, v2, st2, False, variant)
    check(f"{who}: G 2, not causal, {T2} tokens x {Nq2} / {Nkv2} heads, D {D2}, start {st2}", out2, want2, **TOL)
    if KERNELS and variant == "v3":
        check_true(f"v3 launched on grid (ceil(T G / {QT * W3}), splits, Nkv), {32 * W3} threads ({W3} warps)",
                   launched(l1, "_gqa_v3_kernel", grid_of(T1, N1, N1, st1 + T1, QT * W3), 32 * W3)
                   and launched(l2, "_gqa_v3_kernel", grid_of(T2, Nq2, Nkv2, st2 + T2, QT * W3), 32 * W3),
                   f"{l1}, {l2}")
    if KERNELS and variant == "v4":
        check_true(f"v4 launched _gqa_v4_kernel on the same grid (key splits in tiles of {gqa.KT4})",
                   launched(l1, "_gqa_v4_kernel", grid_of(T1, N1, N1, st1 + T1, QT * W3, gqa.KT4), 32 * W3)
                   and launched(l2, "_gqa_v4_kernel", grid_of(T2, Nq2, Nkv2, st2 + T2, QT * W3, gqa.KT4), 32 * W3),
                   f"{l1}, {l2}")
    if KERNELS and variant == "v2":
        check_true(f"v2 launched _attention_v2_kernel on grid (ceil(T G / {mla.MT}), splits, Nkv)",
                   launched(l1, "_attention_v2_kernel", grid_of(T1, N1, N1, st1 + T1, mla.MT, mla.KT, WAVE))
                   and launched(l2, "_attention_v2_kernel", grid_of(T2, Nq2, Nkv2, st2 + T2, mla.MT, mla.KT, WAVE)),
                   f"{l1}, {l2}")
        out_b = kd.backend.full((T2, Nq2, D2), np.nan, np.float32)             # [B, Nq, D] poisoned
        ba.block_attention(q2, k2, v2, st2 + T2, 0.3, out=out_b, variant="v2")
        check("block_attention(variant='v2') == gqa_attention(v2, not causal, start = n_keys - B), bit for bit",
              out_b, out2, exact=True)
out_s, l_s = run("G 2 not causal, 2 splits", q2, k2, v2, st2, False, "v3", splits=2)
check(f"{'v3' if KERNELS else 'numpy path'}: G 2 not causal, splits=2 (+ combine)", out_s, want2, **TOL)
if KERNELS:
    check_true("splits=2: the v3 grid has 2 splits, then _combine_kernel",
               [n for n, _, _ in l_s] == ["_gqa_v3_kernel", "_combine_kernel"] and l_s[0][1][1] == 2, f"{l_s}")
table(timing, ("case", "variant", f"{kd.backend.name} ms"))

# %%
section("the v3 kernel on the page: the softmax, P through ps[w], P V")
src = (getattr(gqa._gqa_v3_kernel, "py_func", None) or getattr(gqa._gqa_v3_kernel, "fn", None)
       or gqa._gqa_v3_kernel)
lines = inspect.getsource(src).splitlines()
i0 = next(i for i, ln in enumerate(lines) if "kf = k0 + 2 * t" in ln)
i1 = next(i for i, ln in enumerate(lines) if "the tiles and P are rewritten next" in ln)
show_kernel(gqa._gqa_v3_kernel, i0, i1 + 1)

# %% [markdown]
# ## 8. v4: P stays in registers, the query rows in shared memory
#
# ncu on v3 (docs/PERFORMANCE.md, eighth session) found it issue-bound: ~3300 instructions per 16 x 16 warp tile
# for 240 MMAs, most of them the address arithmetic of the four *global* query loads of every k8 step. v4
# (`_gqa_v4_kernel`, the default while Dk <= 192) keeps v3's warp mapping and changes three things:
#
# 1. **Tiles of 32 keys, P kept in registers.** The scores' C fragment gives lane 4 g + t the entries
#    (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1) of each n8 block; the P V step needs P as an *A* fragment,
#    (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4) of each k8 step - a different layout, hence v3's trip through
#    shared memory. But the k dimension of P V is the keys, and a sum over keys does not care about their order:
#    give the k8 step the key order (0, 2, 4, 6, 1, 3, 5, 7), i.e. column t = key 2t and column t + 4 = key 2t + 1,
#    read the value rows in that same order, and the A fragment **is** the lane's C fragment (c0, c2, c1, c3).
#    No shared buffer, no shuffle, no barrier for P. (The value tile's row stride becomes 132 = 4 mod 32, so the
#    B loads of rows 2t and 2t + 1 stay conflict-free.)
# 2. **The block's 128 query rows copied once into shared memory** (`_v4_load_q`, 100 KB of *dynamic* shared
#    memory: numba's static arrays stop at 48 KB, and `backend.launch` opts a kernel in above that), so every k8
#    step reads its A fragments with a 32-bit shared address instead of a 64-bit global one.
# 3. **The heaviest blocks first**: under a causal mask the last query tiles see the most keys; the block's linear
#    id counts kv heads fastest, then splits, then query tiles *from the last*, so the light blocks fill the tail.
#
# The cell below checks change 1 in NumPy, lane by lane, for one n8 block of scores.

# %%
section("v4's permuted k8 step: the C fragment of S is the A fragment of P V (NumPy, every lane)")
P8 = R.random((16, 8)).astype(np.float32)                                      # one n8 block of P [16 rows, 8 keys]
V8 = R.standard_normal((8, 8)).astype(np.float32)                              # the 8 value rows [keys, 8 columns]
perm = np.array([0, 2, 4, 6, 1, 3, 5, 7])                                      # k8 column c -> key perm[c]
ok = True
for lane in range(32):
    g, t = lane // 4, lane % 4
    c_frag = [P8[g, 2 * t], P8[g, 2 * t + 1], P8[g + 8, 2 * t], P8[g + 8, 2 * t + 1]]   # c0 c1 c2 c3 (scores)
    a_frag = [P8[g, perm[t]], P8[g + 8, perm[t]], P8[g, perm[t + 4]], P8[g + 8, perm[t + 4]]]   # a0 a1 a2 a3
    ok &= a_frag == [c_frag[0], c_frag[2], c_frag[1], c_frag[3]]
check_true("for every lane, the permuted A fragment (a0, a1, a2, a3) = its C fragment (c0, c2, c1, c3)", ok)
check("P[:, perm] @ V[perm, :] = P @ V (the permuted k8 step computes the same product)",
      P8[:, perm].astype(np.float64) @ V8[perm].astype(np.float64), P8.astype(np.float64) @ V8.astype(np.float64),
      atol=1e-12, rtol=1e-12)
print(f"v4 constants: KT4 {gqa.KT4} keys per tile, MAX_DK4 {gqa.MAX_DK4}, strides K {gqa.K_STRIDE4} / V "
      f"{gqa.V_STRIDE4} / staged q {gqa.Q_STRIDE4} (each 4 mod 32); dynamic shared memory per block "
      f"{4 * QT * gqa.v3_warps() * gqa.Q_STRIDE4} bytes on this backend")
check_true("v4's strides are 4 mod 32 (conflict-free fragment loads: bank 4 g + t, or 8 t + g for the values)",
           all(x % 32 == 4 for x in (gqa.K_STRIDE4, gqa.V_STRIDE4, gqa.Q_STRIDE4)))
show_kernel(gqa._v4_pv_step)

# %% [markdown]
# ## 9. On the H200
#
# Quoted from docs/PERFORMANCE.md, sections "Prefill in MLA's decompressed form, and GQA on tensor cores - measured
# 2026-12-03 (seventh session), H200" and "Ninth session", **not measured by this tutorial**. One attention
# layer at Kimi's shape (64 heads, P / R / Vd 128 / 64 / 128, causal from 0), device times of CUDA-graph replays;
# SDPA fp32 is given the per-head K and V (transformers' own form). The checks below tie the quoted TFLOP/s to
# section 1's count, 640 FLOPs x 64 heads x T (T + 1) / 2 pairs.

# %%
section("quoted from docs/PERFORMANCE.md (H200, 2026-12-03) - not measured here")
LAYER = [  # tokens, absorbed v2 ms, decompress ms, GQA v3 ms, decompressed total ms, vs absorbed, GQA v2 ms,
    #        SDPA fp32 ms, v3 TFLOP/s
    (128, 0.263, 0.072, 0.096, 0.167, 1.57, 0.134, 0.026, 3.5),
    (256, 0.354, 0.115, 0.223, 0.337, 1.05, 0.271, 0.068, 6.0),
    (512, 1.176, 0.215, 0.521, 0.737, 1.60, 0.814, 0.193, 10.3),
    (1024, 4.199, 0.421, 1.329, 1.750, 2.40, 2.745, 0.593, 16.2),
    (4096, 61.525, 1.520, 15.277, 16.798, 3.66, 38.212, 7.730, 22.5),
]
pairs_of = lambda T: T * (T + 1) / 2                                           # noqa: E731
table([(T, f"{ab:.3f}", f"{dc:.3f}", f"{v3:.3f}", f"{tot:.3f}", f"{x:.2f}x", f"{v2:.3f}", f"{sdpa:.3f}", tf,
        f"{a_k * N_k * pairs_of(T) / ab / 1e9:.1f}")
       for T, ab, dc, v3, tot, x, v2, sdpa, tf in LAYER],
      ("tokens", "absorbed v2 ms", "decompress ms", "+ GQA v3 ms", "total ms", "vs absorbed", "GQA v2 ms",
       "SDPA fp32 ms", "v3 TFLOP/s", "absorbed TFLOP/s (derived)"))
check_true("quoted table consistent: decompress + v3 = total (+-0.002 ms), absorbed / total = 'vs absorbed' (1 %), "
           "v3 TFLOP/s = 640 x 64 x T (T + 1) / 2 / time (2 %)",
           all(abs(dc + v3 - tot) <= 0.002 and abs(ab / tot / x - 1) < 0.01
               and abs(d_k * N_k * pairs_of(T) / v3 / 1e9 / tf - 1) < 0.02 for T, ab, dc, v3, tot, x, v2, sdpa, tf
               in LAYER))
STACK = dict(ours=10241, transformers=10471, before=0.81)                      # prefill tokens/s, Kimi-shaped stack
DRAFT = [(150, 42.3, 23.4, 1.81), (300, 74.6, 25.1, 2.97), (450, 109.3, 26.4, 4.14)]   # keys, v1 us, v2 us, speedup
print(f"4096 tokens: absorbed {LAYER[-1][1]:.1f} ms -> decompressed {LAYER[-1][4]:.1f} ms ({LAYER[-1][5]:.2f}x), "
      f"v3 at {LAYER[-1][8]} TFLOP/s (3xTF32), SDPA fp32 {LAYER[-1][7]:.1f} ms (v3 is still "
      f"{LAYER[-1][3] / LAYER[-1][7]:.1f}x slower than SDPA's attention); v3 vs v2 on these heads: "
      f"{LAYER[-1][6] / LAYER[-1][3]:.1f}x at 4096.")
print(f"Kimi-shaped stack (bench_model.py), prefill tokens/s: kdtree_numba {STACK['ours']} vs transformers "
      f"{STACK['transformers']}: {STACK['before']}x -> {STACK['ours'] / STACK['transformers']:.2f}x with v3 (the "
      "seventh session; v4 below).")
V4 = [(128, 0.095, 0.098), (512, 0.523, 0.374), (1024, 1.332, 0.630), (4096, 15.361, 7.944)]   # tokens, v3, v4 ms
STACK9 = dict(ours=19815, transformers=19281)        # prefill tokens/s with the last row's logits, ninth session
table([(T, f"{a:.3f}", f"{b:.3f}", f"{a / b:.2f}x", f"{d_k * N_k * pairs_of(T) / b / 1e9:.1f}") for T, a, b in V4],
      ("tokens (ninth session, one call)", "GQA v3 ms", "GQA v4 ms", "v4 speedup", "v4 TFLOP/s"))
print(f"v4 at 4096 tokens: {V4[-1][2]:.2f} ms against SDPA fp32's {LAYER[-1][7]:.2f} ms of the seventh session's run "
      f"(not the same call); the Kimi-shaped stack's prefill (last row's logits) {STACK9['ours']} vs transformers "
      f"{STACK9['transformers']} tokens/s = {STACK9['ours'] / STACK9['transformers']:.2f}x (goal >= 1.0x: met).")
check_true("quoted v4 numbers consistent: v4 / v3 = 1.93x at 4096, 43.3 TFLOP/s (1 %)",
           round(V4[-1][1] / V4[-1][2], 2) == 1.93
           and abs(d_k * N_k * pairs_of(4096) / V4[-1][2] / 1e9 / 43.3 - 1) < 0.01)
table([(k, f"{a:.1f}", f"{b:.1f}", f"{x:.2f}x") for k, a, b, x in DRAFT],
      ("drafter block attention: keys", "v1 us", "v2 us", "v2 speedup"))
check_true("quoted stack and drafter numbers consistent: 10241 / 10471 = 0.98x; v1 / v2 = 1.81x .. 4.14x (1 %)",
           round(STACK["ours"] / STACK["transformers"], 2) == 0.98
           and all(abs(a / b / x - 1) < 0.01 for _, a, b, x in DRAFT))

# %%
finish()
