"""Tutorial 14: attention on tensor cores from numba - the v2 MLA attention kernel, tile by tile.

Run:  KDTREE_BACKEND=sim python tutorials/14_tensor_core_attention.py [--size small|large] [--out DIR]
"""
# %% [markdown]
# # 14 - Attention on tensor cores: the v2 MLA kernel
#
# Tutorial 05 showed absorbed MLA attention and its readable kernel (v1): a block per (token, 4 heads), CUDA-core
# dot products. The GPU runs **v2** (`kdtree_numba/kernels/mla_attention.py`, `_attention_v2_kernel`; the tree
# verify of tutorial 09 runs `tree_verify._tree_attention_v2_kernel`, the same machinery over another key list):
# tiles of 32 query rows x 16 cache rows, both products on tensor cores with 3xTF32, numba only. This tutorial
# takes it apart stage by stage, each time against something that could disagree:
#
# 1. what one block does, and which block reads which (query row, key) - a picture;
# 2. the tensor-core instruction `mma.sync.m16n8k8` (TF32), its fragment layout, and 3xTF32 (`kernels/mma.py`);
# 3. the key tile: asynchronous copies (`cp.async`), a group of threads per row (`row_share`, `_v2_load_keys`);
# 4. the online softmax on 8 lanes per query row (`_v2_row`, `_v2_softmax`);
# 5. the whole kernel against `mla_attention_ref` and `tree_attention_ref`, outputs poisoned with NaN;
# 6. what each change bought on an H200, quoted from docs/PERFORMANCE.md;
# 7. v3: the same kernel with key tiles of 32 rows (dynamic shared memory, `view2d`);
# 8. v4: every warp on both m16 blocks - the same MMAs, half the fragment splitting;
# 9. v5 - v8: whole fragments from shared memory with `ldmatrix` - what the instruction hands each lane (v5: the
#    default on a GPU);
# 10. "gemm": the same attention as two dense products on cuBLAS's tensor cores, for the big launches.
#
# The functions are called by their names in the package; the constants (MT, KT, ...) are read from it, and the
# kernels are printed from it (`show_kernel`), so the page cannot drift from the code.

# %%
import inspect
import math

import numpy as np

from _common import (banner, check, check_true, draw_owners, finish, host, parse_args, rng, save_figure, section,
                     show_kernel, spy, stopwatch, table)

import kdtree_numba as kd
from numba import cuda, float32, int32
from kdtree_numba.kernels import mla_attention as mla
from kdtree_numba.kernels import mla_gemm_attention as mg, mma, tree as kt, tree_verify as tv
from kdtree_numba.kernels._intrinsics import copy_async_wait
from kdtree_numba.kernels.mma import SCRATCH_SHAPE
from kdtree_numba.kernels.primitives import GROUP_BUF

args = parse_args(__doc__)
banner("Tutorial 14 - attention on tensor cores: the v2 MLA kernel", args)
R = rng(args, 14)
KERNELS = kd.backend.name != "numpy"          # False: the package's calls run references, our own kernels are skipped
GPU = kd.backend.name == "cuda"
BIG = args.size == "large" and kd.backend.name != "sim"   # Kimi-sized shapes; the simulator stays tiny
MT, MB, KT, ROW_T, KPARTS, FRAGS, WARPS = mla.MT, mla.MB, mla.KT, mla.ROW_T, mla.KPARTS, mla.FRAGS, mla.WARPS
TILE_ALIGN = mla.TILE_ALIGN      # a global of this module: numba's shared-array alignment must be a constant here
if args.size == "large" and not BIG:
    print("note: --size large on the simulator keeps the tiny shapes (a v2 launch costs seconds there)")
print(f"v2 constants: MT {MT} query rows per tile (MB {MB} m16 blocks), KT {KT} keys per key tile, ROW_T {ROW_T} "
      f"floats per shared key row, up to KPARTS {KPARTS} k-parts, FRAGS {FRAGS} n8 fragments per warp, WARPS "
      f"{WARPS} warps per block on the GPU")


# %% [markdown]
# ## 1. What one block does
#
# The T x N query rows of a chunk (T tokens, N heads, `q [T, N, D]`, D = Lkv + R = 576 for Kimi / DeepSeek) are
# flattened token-major, **row r = t N + h**. A block takes
#
#     a tile of MT = 32 consecutive query rows     x = blockIdx.x,  rows 32 x .. 32 x + 31  (two m16 MMA blocks)
#     one key split                                 z = blockIdx.y,  keys z L .. min(start + t_last + 1, (z+1) L) - 1
#
# grid `(ceil(T N / 32), splits)`, 8 warps (256 threads) on the GPU. `t_last` is the tile's last token; the tile's key
# list is the union of its tokens' lists, rows `0 .. start + t_last` (causal). L is the split length from
# `plan_splits` (whole key tiles). The block walks its keys in **key tiles of KT = 16 cache rows**; per key tile:
#
#     1. ks [16, 580] <- the 16 cache rows (cp.async copies; zeros for rows past the list)       section 3
#     2. S  [32, 16]  =  Q K^T            on tensor cores, 3xTF32                                  section 2
#     3. online softmax, row (t, h) sees key k iff k <= start + t   (the mask inside the tile)     section 4
#     4. O  [32, Lkv] =  alpha O + P V    on tensor cores, 3xTF32; O stays in registers
#
# and writes `O / l` (one split) or its partial `(O, m, l)` for `_combine_kernel` (several splits).
#
# **Why MLA makes this pay.** In MHA each head has its own keys: a key tile serves only the rows of one head, and a
# decode step (T = 1) has one query row per head - a matrix-vector product, nothing for a 16-row MMA to chew on. In
# absorbed MLA every head of every token attends over the *same* 576-wide latent rows (multi-query attention), so the
# N heads of a token are the M dimension of the product: one 36 KB key tile (16 x 576 fp32) loaded into shared
# memory serves 32 query rows (v1: 4), for 32 x 16 x (576 + 512) x 2 = 1.1 MFLOP of work. Kimi's decode step
# (N = 64) fills two tiles from a single token.

# %%
section("one block: constants, shared-memory budget, MMA count")
smem_ks = KT * ROW_T * 4                                                       # bytes: the key tile
smem_sp = KPARTS * MT * KT * 4                                                 # the k-parts' partial scores
smem_state = 3 * MT * 4                                                        # m, l, alpha
smem_rows, smem_rows_tree = KT * 4, 3 * KT * 4                                 # key table (tree: rows, kdep, knode)
smem = smem_ks + smem_sp + smem_state + smem_rows
steps_gpu = (mla.MAX_D // 8) // KPARTS                                         # k8 steps per k-part at D = 576
mma_scores = steps_gpu * (KT // 8) * 3                                         # per warp: 3 TF32 products
mma_pv = (KT // 8) * FRAGS * 3                                                 # per warp: 2 k8 steps x 16 frags x 3
flops = MT * KT * (mla.MAX_D + mla.MAX_LKV) * 2
table([("ks: key tile [16, 580] fp32", f"{smem_ks:,}"), ("sp: partial scores [4, 32, 16]", f"{smem_sp:,}"),
       ("m, l, alpha [32] each", f"{smem_state:,}"), ("rows [16] int32 (tree: + kdep, knode)",
                                                     f"{smem_rows} ({smem_rows_tree})"),
       ("total (static; < 48 KB)", f"{smem:,}")], ("shared array", "bytes"))
print(f"per key tile and warp: {steps_gpu} k8 steps x {KT // 8} n8 blocks x 3 = {mma_scores} MMAs for S, "
      f"{KT // 8} k8 steps x {FRAGS} fragments x 3 = {mma_pv} for P V -> {mma_scores + mma_pv} per warp, "
      f"{WARPS * (mma_scores + mma_pv):,} per block; {flops / 1e6:.2f} MFLOP for one {smem_ks / 1024:.0f} KB tile "
      f"({flops / (KT * mla.MAX_D * 4):.0f} flop per byte loaded; v1, 4 query rows per load: "
      f"{flops / 8 / (KT * mla.MAX_D * 4):.1f})")
check_true("the text's constants match the code (MT 32 = 2 x m16, KT 16, 8 warps = 2 m16 blocks x 4 k-parts)",
           MT == 32 and MB == 2 and KT == 16 and WARPS == MB * KPARTS == 8 and FRAGS * 8 * KPARTS == mla.MAX_LKV
           and mla.MAX_D == 576)
check_true("the docstring's budget: 37,120 + 8,192 + 384 + 64 = 45,760 bytes (tree: 192 for the key table)",
           (smem_ks, smem_sp, smem_state, smem_rows, smem_rows_tree, smem) == (37120, 8192, 384, 64, 192, 45760)
           and smem + smem_rows_tree - smem_rows < 48 * 1024)
check_true("the docstring's work: 1.1 MFLOP as 8 x 204 = 1,632 MMA instructions per key tile",
           mma_scores + mma_pv == 204 and WARPS * 204 == 1632 and round(flops / 1e6, 1) == 1.1)

# %% [markdown]
# **Shared-memory banks.** Shared memory has 32 banks of 4 bytes; a warp's load is one transaction when its 32
# lanes hit 32 different banks (or the same word). In step 2 lane `4g + t` loads the B fragment `ks[key g, dim t]`
# (section 2): word `g * stride + t`. With the natural stride 576 = 0 mod 32 all 8 keys of a column sit in one bank
# (8-way conflict: 4 banks for 32 lanes); the padded stride ROW_T = 580 = 4 mod 32 puts `4g + t` - 32 different
# banks. (P V's B fragment `ks[key t, column g]` lands on `4t + g`: 2-way there, against 4-way at 576. v1's
# stride 577 - odd, so that lanes reading one dim of 8 different keys never conflict - would be 4-way here.)

# %%
section("bank conflicts of the fragment loads from ks")
lanes = np.arange(32)
g_l, t_l = lanes // 4, lanes % 4                                               # [32] group, thread in group
rows_b = []
banks = {}
for stride in (576, 577, ROW_T):
    score_b = (g_l * stride + t_l) % 32                                        # [32] bank of ks[g, t]
    pv_b = (t_l * stride + g_l) % 32                                           # [32] bank of ks[t, g]
    banks[stride] = (len(set(score_b)), int(np.bincount(score_b).max()), len(set(pv_b)), int(np.bincount(pv_b).max()))
    rows_b.append((stride, f"{stride % 32}", banks[stride][0], f"{banks[stride][1]}-way", banks[stride][2],
                   f"{banks[stride][3]}-way"))
table(rows_b, ("row stride", "mod 32", "S: banks hit", "conflict", "P V: banks hit", "conflict"))
check_true("stride 580: the score B-fragment loads hit 32 different banks (576: 4, 8-way; P V 2-way vs 4-way)",
           banks[ROW_T][:2] == (32, 1) and banks[576][:2] == (4, 8) and banks[ROW_T][3] == 2 and banks[576][3] == 4
           and ROW_T % 32 == 4)

# %% [markdown]
# **Key splits.** `plan_splits(blocks, max_keys, KT, MIN_SPLIT_TILES * KT, splits)` cuts every block's key list into
# runs of `L` keys (whole tiles). On the GPU the count is planned by waves (`wave_splits`): one tiled block runs per
# SM (`tiled_wave()` = 132 on an H200: eight warps of ~210 registers leave no room for a second), a block costs its
# key tiles + BLOCK_TILES = 2, and among the most splits that fit one, two or three waves the plan takes the least
# `ceil(blocks * splits / 132) * (tiles per split + 2)`, ties to fewer splits (a few blocks left for a second wave
# cost about a whole one: docs/PERFORMANCE.md has the measurements). With the count chosen,
# `L = ceil(ceil(max_keys / splits) / 16) * 16` and the count recomputed as `ceil(max_keys / L)` (so a forced count
# can come out smaller). On the simulator the plan is 1 split unless `splits=` forces one. With several, each split
# writes `(o, m, l)` and the combine merges them:
#
#     M = max_z m_z;   out = sum_z exp(m_z - M) o_z / sum_z exp(m_z - M) l_z
#
# A **device-side start** (a graph-replayed step or round) is read by the kernel, so the grid is planned for every
# cache row (`max_keys` = the cache's rows) and the launch passes `L = 0`: each block then cuts *its own* key list
# of `n_list` keys over the grid's `gridDim.y` splits, `L = ceil(ceil(n_list / 16) / gridDim.y) * 16`
# (`mla.split_range`). A decode step of the default pair in a 512-row cache at start 120: 32 splits planned, 121
# keys = 8 tiles, so `L` = 16 and splits 8 .. 31 start past the list; those exit at once after writing `l = -1`
# (`mla.past_the_list`), and the combine stops at the first such split (they are always a suffix). With the
# planned length instead, the first splits would each walk a capacity-sized run while the rest sat idle.
#
# Below, the module docstring's examples, replayed with the kernel's own first lines (`t_last`, `k_lo`, `k_hi`).

# %%
section("tiles, key lists and splits (the module docstring's examples)")


def gpu_split_count(blocks, max_keys):
    """plan_splits's GPU branch (splits=None on cuda), evaluated on any backend."""
    return mla.wave_splits(blocks, max_keys, KT, mla.MIN_SPLIT_TILES * KT, mla.tiled_wave())[0]


def v2_plan(T, N, start, splits):
    """attention_v2's grid for a causal chunk: (tiles, splits, split_len); the launch adds a third axis of 1 (kv
    heads: kernels/gqa_attention.py)."""
    tiles = -(-(T * N) // MT)
    Z, L = mla.plan_splits(tiles, start + T, KT, mla.MIN_SPLIT_TILES * KT, splits)
    return tiles, Z, L


def block_list(x, z, T, N, start, L):
    """_attention_v2_kernel's first lines for block (x, z): (first row, end row, k_lo, k_hi)."""
    r0 = x * MT
    n_rows = T * N
    t_last = (min(r0 + MT, n_rows) - 1) // N
    k_lo = z * L
    return r0, min(r0 + MT, n_rows), k_lo, min(start + t_last + 1, k_lo + L)


tiles_ex, _, L_ex = v2_plan(3, 20, 100, 1)
ex_rows = []
for x in range(tiles_ex):
    r0, r1, k_lo, k_hi = block_list(x, 0, 3, 20, 100, L_ex)
    toks = sorted({r // 20 for r in range(r0, r1)})
    key_tiles = [min(KT, k_hi - k0) for k0 in range(k_lo, k_hi, KT)]
    ex_rows.append((x, f"{r0}..{r1 - 1}", ", ".join(f"t{t} h{min(r for r in range(r0, r1) if r // 20 == t) % 20}.."
                                                    f"{max(r for r in range(r0, r1) if r // 20 == t) % 20}"
                                                    for t in toks),
                    f"0..{k_hi - 1}", f"{len(key_tiles)}: " + "+".join(map(str, key_tiles))))
table(ex_rows, ("tile x", "query rows", "tokens: heads", "key list", "key tiles: keys"))
hidden0 = [(t, k) for t in (0, 1) for k in range(96, 102) if k > 100 + t]      # tile 0's last key tile, masked
check_true("T 3, N 20, start 100: 2 tiles; tile 0 = token 0 + heads 0..11 of token 1, 7 key tiles (6 x 16 + 6), "
           "key 101 masked for token 0 only; tile 1 sees rows 0..102",
           tiles_ex == 2 and ex_rows[0][2] == "t0 h0..19, t1 h0..11" and ex_rows[0][3] == "0..101"
           and ex_rows[0][4] == "7: " + "+".join(["16"] * 6 + ["6"]) and hidden0 == [(0, 101)]
           and ex_rows[1][3] == "0..102")
kimi = []
for ctx in (32768, 4097):                                                      # keys incl. the new token
    blocks = -(-64 // MT)
    Z, L = mla.plan_splits(blocks, ctx, KT, mla.MIN_SPLIT_TILES * KT, gpu_split_count(blocks, ctx))
    kimi.append((ctx, blocks, Z, L))
table([(c, b, z, l, b * z) for c, b, z, l in kimi], ("keys (start + 1)", "tiles (N 64)", "GPU splits", "split length",
                                                     "blocks"))
check_true("Kimi decode, 32768 rows: 2 tiles x 64 splits of 512 rows (docstring); context 4096: 65 splits of 64",
           kimi[0][1:] == (2, 64, 512) and kimi[1][2:] == (65, 64))
if GPU:
    check_true("gpu_split_count == plan_splits's own GPU branch",
               all(mla.plan_splits(b, c, KT, KT, None, mla.tiled_wave())
                   == mla.plan_splits(b, c, KT, KT, gpu_split_count(b, c)) for c, b, _, _ in kimi))
print(f"on this backend plan_splits(2, 32768, ...) gives {mla.plan_splits(2, 32768, KT, KT, None)} (splits, length); "
      f"forcing splits=2 at 12 keys gives {mla.plan_splits(2, 12, KT, KT, 2)}: one tile cannot split")

# %% [markdown]
# The picture: T = 3 tokens, N = 20 heads, start 30 (33 keys), two forced splits - L = ceil(33 / 2) = 17 rounded up
# to 32. Every (query row, key) a block loads is coloured by the block; crossed cells are loaded but masked
# (the causal mask inside the tile: token 0's rows see keys <= 30, but tile 0 also holds token 1). Block (0, 1) has
# nothing to do (tile 0's list ends at key 31): it writes `m = -inf, l = 0` and the combine gives it weight 0.

# %%
section("who reads what: blocks (tile x, split z) over (query row, key)")
PT, PN, PSTART, PSPLITS = 3, 20, 30, 2
p_tiles, p_Z, p_L = v2_plan(PT, PN, PSTART, PSPLITS)
n_keys = PSTART + PT
owner = np.full((PT * PN, n_keys), -1)                                         # [rows, keys] block id x Z + z
masked = np.zeros((PT * PN, n_keys), bool)                                     # loaded, but hidden by the mask
cover = np.zeros((PT * PN, n_keys), int)                                       # blocks that use (row, key)
last_tile_only = True
for x in range(p_tiles):
    for z in range(p_Z):
        r0, r1, k_lo, k_hi = block_list(x, z, PT, PN, PSTART, p_L)
        for r in range(r0, r1):
            for k in range(k_lo, k_hi):
                if k <= PSTART + r // PN:                                      # the kernel's last_key test
                    owner[r, k] = x * p_Z + z
                    cover[r, k] += 1
                else:
                    masked[r, k] = True
                    last_tile_only &= k >= (k_hi - 1) // KT * KT               # only in the block's last key tile
visible = np.arange(n_keys)[None, :] <= PSTART + np.arange(PT * PN)[:, None] // PN     # [rows, keys]
check_true(f"grid ({p_tiles}, {p_Z}), L {p_L}: every visible (row, key) used by exactly one block, nothing else",
           np.array_equal(cover, visible.astype(int)), f"{int(visible.sum())} pairs")
check_true("masked-but-loaded keys only in a block's last key tile (in general: the last one or two)",
           last_tile_only and masked.any(),
           f"{int(masked.sum())} (row, key) pairs masked inside tiles")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

colors = plt.get_cmap("tab10")
img = np.ones((PT * PN, n_keys, 3))                                            # white: not loaded
for b in range(p_tiles * p_Z):
    img[owner == b] = colors(b)[:3]
img[masked] = (0.85, 0.85, 0.85)
fig, ax = plt.subplots(figsize=(9, 7))
ax.imshow(img, aspect="auto", interpolation="nearest")
mr, mc = np.nonzero(masked)
ax.plot(mc, mr, "kx", ms=4, mew=0.8)
for k in range(KT, n_keys, KT):
    ax.axvline(k - 0.5, color="k", lw=2.5 if k % p_L == 0 else 0.8, ls="-" if k % p_L == 0 else "--")
for r in range(MT, PT * PN, MT):
    ax.axhline(r - 0.5, color="k", lw=2.5)
for t in range(1, PT):
    ax.axhline(t * PN - 0.5, color="w", lw=1, ls=":")
ax.set_yticks([t * PN + PN // 2 for t in range(PT)])
ax.set_yticklabels([f"token {t}\n(rows {t * PN}..{t * PN + PN - 1})" for t in range(PT)], fontsize=8)
ax.set_xlabel(f"cache row (key); dashed: key tiles of {KT}; thick: the split at {p_L}")
ax.set_ylabel("query row r = t N + h (thick: query tiles of 32)")
ax.legend(handles=[Patch(color=colors(x * p_Z + z)[:3], label=f"block (x={x}, z={z})")
                   for x in range(p_tiles) for z in range(p_Z) if (owner == x * p_Z + z).any()]
          + [Patch(color=(0.85, 0.85, 0.85), label="loaded, masked (x)")], fontsize=8, loc="lower left")
ax.set_title(f"v2, T {PT}, N {PN}, start {PSTART}, splits={PSPLITS}: the block (of {p_tiles * p_Z}) using each "
             f"(query row, key); block (0, 1) has no keys", fontsize=10)
save_figure(fig, args, "14_v2_blocks.png")

# %% [markdown]
# ## 2. The tensor-core instruction from numba: `mma.sync.m16n8k8` TF32
#
# numba-cuda has no tensor-core API; `kernels/mma.py` emits the PTX instruction through an inline-asm intrinsic.
# One instruction, executed by the 32 lanes of a warp together, computes
#
#     D [16, 8] = A [16, 8] @ B [8, 8] + C [16, 8]          (TF32 inputs, fp32 accumulation)
#
# and each lane holds a fixed part of each matrix in registers (its *fragment*). With lane = 4 g + t
# (g = lane // 4, t = lane % 4):
#
#     A: a0 = A[g][t]  a1 = A[g+8][t]  a2 = A[g][t+4]  a3 = A[g+8][t+4]       B: b0 = B[t][g]  b1 = B[t+4][g]
#     C, D: c0 = C[g][2t]  c1 = C[g][2t+1]  c2 = C[g+8][2t]  c3 = C[g+8][2t+1]
#
# In the kernel the scores' A is the query block (rows g, g+8 of an m16 block, dims t, t+4 of a k8 step) and B is
# `K^T`, so `b0 = ks[key g, dim t]` (the bank picture above). TF32 keeps 10 of fp32's 23 mantissa bits (unit
# roundoff u = 2^-11); **3xTF32** splits each operand `x = hi + lo` and sums three products into the fp32 C,
#
#     a b  ~  lo_a hi_b + hi_a lo_b + hi_a hi_b       (lo_a lo_b dropped: |lo_a lo_b| <= u^2 |a b|)
#
# each TF32 x TF32 product exact in fp32: fp32-grade dot products for three MMAs instead of one. On the simulator
# the MMA is a stand-in with the same fragment layout (every lane posts its fragments to a shared `scratch`, one
# block barrier, each lane computes its four outputs); that barrier per MMA is why the simulator stays tiny here.
#
# First the layout on the host: which lane holds each element (the picture), and a check that the fragments
# cover each matrix exactly once.

# %%
section("the m16n8k8 fragment layout")
lane = np.arange(32)
g_l, t_l = lane // 4, lane % 4                                                 # [32] each


def fragments(A, B, C):
    """What lane 4g + t holds: a0..a3 [32, 4], b0, b1 [32, 2], c0..c3 [32, 4] (mma.py's table)."""
    fa = np.stack([A[g_l, t_l], A[g_l + 8, t_l], A[g_l, t_l + 4], A[g_l + 8, t_l + 4]], 1)          # [32, 4]
    fb = np.stack([B[t_l, g_l], B[t_l + 4, g_l]], 1)                                                # [32, 2]
    fc = np.stack([C[g_l, 2 * t_l], C[g_l, 2 * t_l + 1], C[g_l + 8, 2 * t_l], C[g_l + 8, 2 * t_l + 1]], 1)
    return fa, fb, fc


def assemble_c(fc):
    """D [16, 8] from every lane's d0..d3 [32, 4]."""
    D = np.full((16, 8), np.nan, np.float32)
    D[g_l, 2 * t_l], D[g_l, 2 * t_l + 1], D[g_l + 8, 2 * t_l], D[g_l + 8, 2 * t_l + 1] = fc.T
    return D


idx_a = np.arange(16 * 8).reshape(16, 8)                                       # [16, 8] element ids
idx_b = np.arange(8 * 8).reshape(8, 8)                                         # [8, 8]
fa_i, fb_i, fc_i = fragments(idx_a, idx_b, idx_a)
once = all(np.array_equal(np.sort(f.ravel()), np.arange(f.size)) for f in (fa_i, fb_i, fc_i))
check_true("fragments cover A, B and C exactly once (4 + 2 + 4 registers per lane)", once)
lanes_fig = np.full((16, 8 + 1 + 8 + 1 + 8), -1)                               # [16, 26]: A | B | C, -1 = gap
for reg in range(4):
    lanes_fig[np.unravel_index(fa_i[:, reg], (16, 8))] = lane
    r_, c_ = np.unravel_index(fc_i[:, reg], (16, 8))
    lanes_fig[r_, 18 + c_] = lane
for reg in range(2):
    r_, c_ = np.unravel_index(fb_i[:, reg], (8, 8))
    lanes_fig[r_, 9 + c_] = lane
fig = draw_owners(lanes_fig, "m16n8k8: the lane (4g + t) holding each element - A [16, 8] (cols 0-7), "
                  "B [8, 8] (cols 9-16), C / D [16, 8] (cols 18-25)", "column k of A | column n of B | column n "
                  "of C", "row")
save_figure(fig, args, "14_mma_fragments.png")


def tf32_round(x):
    """cvt.rna.tf32.f32 in NumPy: to nearest, ties away (add half a TF32 ulp, clear the 13 low mantissa bits)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)


def tf32_trunc(x):
    """The 13 low mantissa bits cleared (mma.trunc_tf32: one AND)."""
    return (np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def split_host(x):
    """mma.split_tf32: hi = tf32(x), lo = tf32(x - hi)."""
    hi = tf32_round(x)
    return hi, tf32_round(np.asarray(x, np.float32) - hi)


def split_fast_host(x):
    """mma.split_tf32_fast: hi = x truncated, lo = x - hi (exact, not rounded)."""
    hi = tf32_trunc(x)
    return hi, (np.asarray(x, np.float32) - hi).astype(np.float32)


@cuda.jit
def mma_kernel(a, b, c, three, frag, dfrag):
    """One warp: D = a @ b + c for a [16, K], b [K, 8], one m16n8k8 per k8 step (three: 3xTF32 with split_tf32,
    else plain TF32 of to_tf32-rounded operands). frag [32, 6]: each lane's a0..a3, b0, b1 of the first step;
    dfrag [32, 4]: each lane's d0..d3 (the host assembles D from them)."""
    scratch = cuda.shared.array(SCRATCH_SHAPE, float32)   # the simulator's fragment exchange (GPU: unused)
    lane = cuda.threadIdx.x % 32
    g = lane // 4
    t = lane % 4
    c0, c1, c2, c3 = c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1]
    for k0 in range(0, a.shape[1], 8):
        a0, a1, a2, a3 = a[g, k0 + t], a[g + 8, k0 + t], a[g, k0 + t + 4], a[g + 8, k0 + t + 4]
        b0, b1 = b[k0 + t, g], b[k0 + t + 4, g]
        if k0 == 0:
            frag[lane, 0], frag[lane, 1], frag[lane, 2], frag[lane, 3] = a0, a1, a2, a3
            frag[lane, 4], frag[lane, 5] = b0, b1
        c0, c1, c2, c3 = mma.mma_fp32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, three, scratch)
    dfrag[lane, 0], dfrag[lane, 1], dfrag[lane, 2], dfrag[lane, 3] = c0, c1, c2, c3


def mma_emulated(A, B, C, three):
    """The same k8 loop in NumPy: TF32 operands, each MMA's sum rounded to fp32 (the simulator's stand-in)."""
    d = C.astype(np.float32)                                                   # [16, 8]
    for k0 in range(0, A.shape[1], 8):
        a, b = A[:, k0:k0 + 8], B[k0:k0 + 8]                                   # [16, 8], [8, 8]
        if three:
            (ah, al), (bh, bl) = split_host(a), split_host(b)
            for x, y in ((al, bh), (ah, bl), (ah, bh)):                        # small products first
                d = (d + x.astype(np.float64) @ y.astype(np.float64)).astype(np.float32)
        else:
            d = (d + tf32_round(a).astype(np.float64) @ tf32_round(b).astype(np.float64)).astype(np.float32)
    return d


def run_mma(A, B, C, three):
    """(D [16, 8], frag [32, 6]) from mma_kernel; on the numpy backend (D from mma_emulated, None)."""
    if not KERNELS:
        return mma_emulated(A, B, C, three), None
    frag = kd.backend.full((32, 6), np.nan, np.float32)                        # [32, 6] poisoned
    dfrag = kd.backend.full((32, 4), np.nan, np.float32)                       # [32, 4] poisoned
    kd.backend.launch(mma_kernel, 1, 32, *(kd.backend.asarray(m) for m in (A, B, C)), three, frag, dfrag)
    return assemble_c(host(dfrag)), host(frag)


section("one MMA on small integers (exact in TF32 and fp32: a misplaced element shows)")
A_i = (np.arange(16 * 8).reshape(16, 8) % 29 - 14).astype(np.float32)         # [16, 8]
B_i = (np.arange(8 * 8).reshape(8, 8) * 7 % 31 - 15).astype(np.float32)        # [8, 8]
C_i = np.arange(16 * 8).reshape(16, 8).astype(np.float32)                      # [16, 8]
fa, fb, fc = fragments(A_i, B_i, C_i)
print("lane 4g + t holds (host, from the table):")
table([(ln, ln // 4, ln % 4, fa[ln].tolist(), fb[ln].tolist(), fc[ln].tolist()) for ln in (0, 1, 5, 31)],
      ("lane", "g", "t", "a0..a3", "b0, b1", "c0..c3"))
for three in (False, True):
    with stopwatch() as sw:
        D_k, frag_k = run_mma(A_i, B_i, C_i, three)
    name = "3xTF32" if three else "TF32"
    src = "mma_kernel" if KERNELS else "NumPy emulation"
    check(f"{src}, {name}: D == A @ B + C (exact), {sw.ms:.0f} ms", D_k, A_i @ B_i + C_i, exact=True)
    if KERNELS:
        check(f"mma_kernel: each lane loaded the fragments of the table ({name})", frag_k,
              np.concatenate([fa, fb], 1), exact=True)

# %% [markdown]
# Accuracy, `A [16, 64] @ B [64, 8] + C` (8 k8 steps) of standard normals, error relative to the size of the terms
# `max |D - exact| / max (|A| |B| + |C|)` against float64: plain TF32 carries ~u = 5e-4 per product, 3xTF32 about
# 3 u^2 ~ 7e-7 (the mma.py docstring; the GPU test holds it to 1e-6 at the attention's dot length 576).
#
# The attention kernels use the cheaper **truncating** split `split_tf32_fast`: hi = x with its 13 low mantissa bits
# cleared (one AND instead of a cvt), lo = x - hi exactly in fp32, handed to the MMA unrounded (the tensor core reads
# a TF32 operand's top 19 bits). `split_tf32` rounds both parts. (The simulator's stand-in rounds every operand
# to TF32 as `cvt.rna` does, an unrounded lo included, so there the truncating split comes out a little more
# accurate than on the GPU.)

# %%
section("3xTF32 vs TF32 against float64")
A_r = R.standard_normal((16, 64)).astype(np.float32)                           # [16, 64]
B_r = R.standard_normal((64, 8)).astype(np.float32)                            # [64, 8]
C_r = R.standard_normal((16, 8)).astype(np.float32)                            # [16, 8]
exact = A_r.astype(np.float64) @ B_r + C_r                                     # [16, 8]
terms = (np.abs(A_r.astype(np.float64)) @ np.abs(B_r) + np.abs(C_r)).max()
errs = {}
for three in (True, False):
    D_r, _ = run_mma(A_r, B_r, C_r, three)
    errs[three] = float(np.abs(D_r - exact).max() / terms)
src = "kernel" if KERNELS else "NumPy emulation"
print(f"relative error ({src}): 3xTF32 {errs[True]:.2e}, TF32 {errs[False]:.2e}  "
      f"(u = {2.0 ** -11:.1e}, 3 u^2 = {3 * 2.0 ** -22:.1e})")
check_true("3xTF32 is fp32-grade: relative error < 1e-6", errs[True] < 1e-6, f"{errs[True]:.2e}")
check_true("plain TF32 is not: 1e-5 < relative error < 4e-3", 1e-5 < errs[False] < 4e-3, f"{errs[False]:.2e}")


@cuda.jit
def split_kernel(x, out):
    """out[i] = split_tf32(x[i]) + split_tf32_fast(x[i]) (hi, lo, hi_fast, lo_fast)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i, 0], out[i, 1] = mma.split_tf32(x[i])
        out[i, 2], out[i, 3] = mma.split_tf32_fast(x[i])


section("split_tf32 (rounding) vs split_tf32_fast (truncating)")
xs = np.array([1 + 2.0 ** -12, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -12, -3.14159265, 0.1, 1e-30, 7.0], np.float32)   # [7]
hi_r, lo_r = split_host(xs)                                                    # [7] each
hi_f, lo_f = split_fast_host(xs)
want_split = np.stack([hi_r, lo_r, hi_f, lo_f], 1)                             # [7, 4]
bits = lambda v: f"{int(np.float32(v).view(np.uint32)):08x}"                   # noqa: E731
table([(f"{x:.9g}", bits(x), f"{h:.9g}", f"{lo:.3g}", f"{hf:.9g}", bits(hf), f"{lf:.3g}", bits(lf))
       for x, h, lo, hf, lf in zip(xs, hi_r, lo_r, hi_f, lo_f)],
      ("x", "bits", "hi (round)", "lo", "hi (trunc)", "bits", "lo = x - hi", "bits"))
if KERNELS:
    out_split = kd.backend.full((xs.size, 4), np.nan, np.float32)              # [7, 4] poisoned
    kd.backend.launch(split_kernel, 1, 32, kd.backend.asarray(xs), out_split)
    check("split kernels (device functions) == the NumPy bit recipes", out_split, want_split, exact=True)
check_true("truncating split: hi has its 13 low bits clear, hi + lo == x exactly, |lo| < 2^-10 |x|",
           np.all(hi_f.view(np.uint32) & 0x1FFF == 0) and np.array_equal(hi_f.astype(np.float64) + lo_f, xs)
           and np.all(np.abs(lo_f) < 2.0 ** -10 * np.abs(xs)) and (hi_f[0], lo_f[0]) == (1.0, np.float32(2.0 ** -12)))
check_true("rounding split: hi + lo == x up to 2^-21 |x|; 1 + 2^-11 rounds away to 1 + 2^-10",
           np.all(np.abs(hi_r.astype(np.float64) + lo_r - xs) <= 2.0 ** -21 * np.abs(xs))
           and hi_r[1] == np.float32(1 + 2.0 ** -10))
print(f"lo of the truncating split is not a TF32 number: lo(-pi) = {lo_f[3]:.6g}, its TF32 part (what the MMA "
      f"reads) {tf32_trunc(lo_f[3]):.6g}: kept to 2^-10 of itself, ~3e-6 per product instead of ~7e-7")

# %% [markdown]
# ## 3. The key tile: `cp.async`, a group of threads per row
#
# `copy_async(dst, dst_off, src, src_off, width, keep)` (`kernels/_intrinsics.py`) is one `cp.async` instruction:
# `width` floats (4 = 16 bytes, or 1) go from global memory (via L2) straight into shared memory, with no register
# in between - a thread issues all its copies of a tile back to back and waits once (`copy_async_wait`, then a
# block barrier publishes every thread's copies). `keep = False` zero-fills (nothing is read): rows past the key list
# (`rows[j] = -1`) become zero rows, which the mask then hides. Offsets are flat element offsets (`uint64`): one add
# per copy instead of numba's per-axis index arithmetic. Width 4 needs 16-byte aligned addresses, so `copy_width`
# picks 4 only when D % 4 == 0 and the cache's first row is 16-byte aligned.
#
# **Who copies what.** A tile is KT rows of `dq = D / width` copies. `row_share` splits the block's threads into
# groups of `tpr = threads / KT` consecutive threads, one group per row (16 on the GPU for KT = 16, 8 for v3's 32
# rows); thread `tid` takes row `tid // tpr` and, with `u = tid % tpr`, the units `u, u + tpr, u + 2 tpr, ..`
# (`copy_row`):
#
#     per row:   d = j ROW_T + col,  s = rows[j] * stride + base       (one product)
#     per copy:  cp.async(d + c, s + c);  c += tpr * width             (a 32-bit count)
#
# Consecutive threads copy consecutive 16 bytes of one row, so a quarter warp writes 128 contiguous bytes of shared
# memory (no bank conflict) and reads 128 contiguous bytes of the cache row. History (docs/PERFORMANCE.md): the
# first v2 numbered the copies `p = u * threads + tid` with a 64-bit division per copy (~50 instructions per MMA);
# its successor stepped a (row, column) pair by adds, still in 64 bits and with both copy widths in one loop body -
# 52 instructions per 16-byte copy in the v3 tree kernel's SASS (`benchmarks/ptxas_report.py --loops`, no GPU
# needed); this mapping takes ~8.
#
# The host replay below is checked for coverage (every (row, unit) of the tile exactly once), then against the device
# function itself, then the package's `_v2_load_keys` fills a NaN-poisoned tile on this backend.

# %%
section("who copies what, replayed on the host")
show_kernel(mla.row_share)
show_kernel(mla._v2_load_keys)


def row_share(tid, rows, threads):
    """mla.row_share on the host: (first row, row step, u, threads a row)."""
    tpr = max(threads // rows, 1)
    return tid // tpr, threads // tpr, tid % tpr, tpr


def copies(tid, D, width, threads):
    """_v2_load_keys's loops: this thread's (row, column unit) sequence."""
    j0, dj, u, tpr = row_share(tid, KT, threads)
    return [(j, c) for j in range(j0, KT, dj) for c in range(u, D // width, tpr)]


plan_rows = []
all_ok = True
for D_, w_, nt in ((576, 4, 256), (576, 1, 256), (112, 4, 256), (112, 4, 64), (24, 4, 64), (13, 1, 8)):
    dq = D_ // w_
    visits = np.zeros((KT, dq), int)                                           # [KT, dq]
    for tid in range(nt):
        for j, c in copies(tid, D_, w_, nt):
            visits[j, c] += 1
    ok = np.all(visits == 1)
    all_ok &= ok
    counts = [len(copies(tid, D_, w_, nt)) for tid in range(nt)]
    plan_rows.append((D_, w_, nt, dq, row_share(0, KT, nt)[3], min(counts), max(counts),
                      " ".join(f"({j},{c})" for j, c in copies(0, D_, w_, nt)[:5])))
table(plan_rows, ("D", "width", "threads", "dq", "threads a row", "fewest copies", "most copies",
                  "thread 0: (row, unit) .."))
check_true("every (row, unit) of the tile copied exactly once, with as few as 8 threads for 16 rows", all_ok,
           "6 configurations")

owner_c = np.full((KT, 112 // 4), -1)                                          # [16, 28] thread per 16-byte unit
for tid in range(256):
    for j, c in copies(tid, 112, 4, 256):
        owner_c[j, c] = tid
fig = draw_owners(owner_c, "the key tile at D = 112 (the shipped pair), width 4, 256 threads: the thread whose "
                  "cp.async fills each 16-byte unit\n(16 threads a row: thread 0 takes row 0 units 0 and 16, "
                  "thread 17 row 1 units 1 and 17)", "column unit (4 floats)", "key row j of the tile")
save_figure(fig, args, "14_copy_plan.png")


@cuda.jit
def key_tile_kernel(cache, rows_in, width, plan_out, tile_out):
    """The package's row_share + _v2_load_keys into a NaN-poisoned (KT, ROW_T) shared tile; each thread's share
    -> plan_out [threads, 4], the tile's first D columns -> tile_out [KT, D]."""
    ks = cuda.shared.array((KT, ROW_T), float32, alignment=TILE_ALIGN)
    rows = cuda.shared.array(KT, int32)
    tid = cuda.threadIdx.x
    D = cache.shape[1]
    for i in range(tid, KT * ROW_T, cuda.blockDim.x):
        ks[i // ROW_T, i % ROW_T] = float32(math.nan)   # poison: a copy that never lands stays NaN
    if tid < KT:
        rows[tid] = rows_in[tid]
    cuda.syncthreads()
    j0, dj, u, tpr = mla.row_share(KT, cuda.blockDim.x)
    plan_out[tid, 0], plan_out[tid, 1], plan_out[tid, 2], plan_out[tid, 3] = j0, dj, u, tpr
    mla._v2_load_keys(cache, rows, ks, D, width, D, 0, 0, KT)   # copy_async per copy: row r from r * D + 0,
    copy_async_wait()                                        # to tile column 0; then wait for them
    cuda.syncthreads()
    for i in range(tid, KT * D, cuda.blockDim.x):
        tile_out[i // D, i % D] = ks[i // D, i % D]


section("the package's _v2_load_keys on this backend (256 threads: the GPU's block)")
rows_tile = np.array([7, 2, -1, 0, 9, 9, 1, -1, 3, 4, 5, 6, 8, -1, -1, -1], np.int32)   # [KT]; -1: zero fill
for D_ in (576, 112, 13):
    cache_t = kd.backend.asarray(R.standard_normal((10, D_)).astype(np.float32))        # [10, D]
    w_ = mla.copy_width(cache_t)
    want_t = host(cache_t)[np.maximum(rows_tile, 0)] * (rows_tile >= 0)[:, None]       # [KT, D]
    if not KERNELS:
        print(f"D {D_}: copy_width {w_} (kernel not launched on the numpy backend)")
        continue
    plan_t = kd.backend.full((256, 4), -7, np.int32)                                    # [256, 4]
    tile_t = kd.backend.full((KT, D_), np.nan, np.float32)                              # [KT, D] poisoned
    with stopwatch() as sw:
        kd.backend.launch(key_tile_kernel, 1, 256, cache_t, kd.backend.asarray(rows_tile), w_, plan_t, tile_t)
    check(f"D {D_}, width {w_}: device row_share == host row_share, all 256 threads", plan_t,
          np.array([row_share(tid, KT, 256) for tid in range(256)], np.int32))
    check(f"D {D_}, width {w_}: tile == cache rows, zeros for rows -1 ({sw.ms:.0f} ms)", tile_t, want_t, exact=True)
aligned = kd.backend.asarray(np.zeros((10, 576), np.float32))                  # [10, 576]
shifted = kd.backend.zeros((10 * 576 + 1,), np.float32)[1:].reshape(10, 576)   # [10, 576], 4 bytes off
check_true("copy_width: 4 for aligned rows of 576, 1 for D = 13 and for a cache 4 bytes off alignment",
           (mla.copy_width(aligned), mla.copy_width(kd.backend.zeros((10, 13), np.float32)),
            mla.copy_width(shifted)) == (4, 1, 1))

# %% [markdown]
# ## 4. The online softmax, 8 lanes per query row
#
# After step 2, `sp [parts, 32, 16]` holds the k-parts' partial scores (on the GPU 4 warps share one m16 block,
# each over 144 of the 576 dims). `_v2_row` splits the block's threads into MT = 32 groups of `G = threads / 32`
# consecutive lanes, one group per query row, each lane taking `KT / G` consecutive keys: on the GPU (256 threads)
# **8 lanes x 2 keys**; on the simulator the launch has 2-8 warps (`v2_warps(Lkv)`), so G = 2-8. A lane's part of
# the online softmax step:
#
#     s_j   = scale * sum_p sp[p, r, j]    (or -inf where the mask hides key j)
#     m_new = max(m_old, max_j s_j)        group_max over the row's G lanes (shuffles, no barrier)
#     P_j   = exp(s_j - m_new)             written back to sp[0, r, j]: the A operand of P V
#     l_new = alpha l_old + sum_j P_j,     alpha = exp(m_old - m_new)     group_sum over the G lanes
#
# and step 4 rescales the accumulators, `O = alpha O + P V`. A row that has seen no visible key keeps
# m = -inf, l = 0 and gets alpha = 1, P = 0 (a split past a token's last key, a tree slot of another token).
# The first version ran this on one thread per row while seven warps waited.
#
# Below: the lane split covers each (row, key) once; a NumPy re-implementation of one tile's step, lane by lane,
# is checked against the package's `_v2_softmax` run on this backend, then (over two key tiles, with P V) against a
# plain float64 softmax.

# %%
section("the softmax lane split (_v2_row)")
show_kernel(mla._v2_softmax)


def row_split(tid, threads):
    """_v2_row on the host: (query row, first key, keys per lane)."""
    G = threads // MT
    return tid // G, tid % G * (KT // G), KT // G


split_ok = []
for threads in (256, 128, 64):
    G = threads // MT
    seen = np.zeros((MT, KT), int)                                             # [MT, KT]
    groups_in_warp = True
    for tid in range(threads):
        r, j0, kpt = row_split(tid, threads)
        seen[r, j0:j0 + kpt] += 1
        groups_in_warp &= (tid - tid % G) // 32 == (tid - tid % G + G - 1) // 32   # a row's lanes: one warp
    split_ok.append(bool(np.all(seen == 1) and groups_in_warp))
    print(f"{threads} threads ({threads // 32} warps): G = {G} lanes per row, {KT // G} keys per lane; thread 13 -> "
          f"(row, first key, keys) = {row_split(13, threads)}")
check_true("every (query row, key) of the tile owned by one lane; a row's lanes are aligned in one warp "
           "(256, 128, 64 threads)", all(split_ok))


def softmax_step(sp, vis, scale, m, l, G, parts):
    """_v2_softmax for one key tile in NumPy, lane by lane (float32): sp [>= parts, MT, KT], vis [MT, KT] bool;
    m, l [MT] (updated in place). Returns (P [MT, KT], alpha [MT])."""
    kpt = KT // G
    P = np.zeros((MT, KT), np.float32)
    alpha = np.ones(MT, np.float32)
    for r in range(MT):
        s_lane, mx_lane = [], []
        for ln in range(G):                                                    # this row's G lanes
            j0 = ln * kpt
            s = np.empty(kpt, np.float32)
            mx = m[r]
            for jj in range(kpt):
                v = np.float32(0.0)
                for p in range(parts):
                    v = np.float32(v + sp[p, r, j0 + jj])
                s[jj] = np.float32(v * scale) if vis[r, j0 + jj] else np.float32(-np.inf)
                mx = max(mx, s[jj])
            s_lane.append(s)
            mx_lane.append(mx)
        mx = max(mx_lane)                                                      # group_max
        lsum = np.float32(0.0)
        for ln in range(G):
            e = np.zeros(kpt, np.float32) if mx == -np.inf else np.exp(s_lane[ln].astype(np.float64) - mx).astype(
                np.float32)
            P[r, ln * kpt:(ln + 1) * kpt] = e
            lane_sum = np.float32(0.0)
            for v in e:
                lane_sum = np.float32(lane_sum + v)
            lsum = np.float32(lsum + lane_sum)                                 # group_sum
        a = np.float32(1.0) if mx == -np.inf else np.float32(math.exp(float(m[r]) - float(mx)))
        m[r], l[r], alpha[r] = mx, np.float32(l[r] * a + lsum), a
    return P, alpha


@cuda.jit
def softmax_kernel(sp_in, vis_in, scale, p_out, state_out):
    """Two key tiles through the package's _v2_softmax: sp_in [2, KPARTS, MT, KT] partial scores, vis_in
    [2, MT, KT] (1: visible) -> p_out [2, MT, KT] (P), state_out [2, 3, MT] (m, l, alpha after each tile)."""
    sp = cuda.shared.array((KPARTS, MT, KT), float32)
    m_run = cuda.shared.array(MT, float32)
    l_run = cuda.shared.array(MT, float32)
    alpha = cuda.shared.array(MT, float32)
    buf = cuda.shared.array(GROUP_BUF, float32)         # the simulator's group scratch (GPU: unused)
    tid = cuda.threadIdx.x
    if tid < MT:
        m_run[tid] = float32(-math.inf)
        l_run[tid] = float32(0.0)
    r, j0, kpt = mla._v2_row(KT)
    for tile in range(2):
        for i in range(tid, KPARTS * MT * KT, cuda.blockDim.x):
            sp[i // (MT * KT), i // KT % MT, i % KT] = sp_in[tile, i // (MT * KT), i // KT % MT, i % KT]
        cuda.syncthreads()
        vis = 0                                         # this lane's mask bits, as the kernel builds them
        for jj in range(KT):
            if jj < kpt:
                if vis_in[tile, r, j0 + jj] != 0:
                    vis |= 1 << jj
        mla._v2_softmax(sp, vis, scale, m_run, l_run, alpha, buf, KT, mla._v2_warps() // MB)
        cuda.syncthreads()
        for i in range(tid, MT * KT, cuda.blockDim.x):
            p_out[tile, i // KT, i % KT] = sp[0, i // KT, i % KT]
        if tid < MT:
            state_out[tile, 0, tid] = m_run[tid]
            state_out[tile, 1, tid] = l_run[tid]
            state_out[tile, 2, tid] = alpha[tid]
        cuda.syncthreads()


section("one tile's online softmax: NumPy lane by lane vs the package's _v2_softmax")
THREADS = 32 * mla.v2_warps(16)                                                # the v2 launch at Lkv 16
G_run, parts_run = THREADS // MT, THREADS // 32 // MB
S = (2 * R.standard_normal((MT, 2 * KT))).astype(np.float32)                   # [MT, 32] scores over 2 key tiles
V = R.standard_normal((2 * KT, 16)).astype(np.float32)                         # [32, 16] the keys' values
last = R.integers(0, 2 * KT, MT)                                               # [MT] each row sees keys <= last
last[:4] = [2 * KT - 1, 0, KT, KT + 3]                                         # all; one key; tile 1 only: 2 rows
first = np.zeros(MT, int)                                                      # [MT] ... and keys >= first
first[2:4] = KT                                                                # rows 2, 3 see nothing in tile 0
vis_all = (np.arange(2 * KT)[None, :] <= last[:, None]) & (np.arange(2 * KT)[None, :] >= first[:, None])  # [MT, 32]
sp_all = np.zeros((2, KPARTS, MT, KT), np.float32)                             # [2, KPARTS, MT, KT]
for tile in range(2):
    S_t = S[:, tile * KT:(tile + 1) * KT]
    parts_t = (R.standard_normal((KPARTS, MT, KT)) * 0.3).astype(np.float32)   # made-up k-part partials ...
    parts_t[parts_run - 1] = S_t - parts_t[:parts_run - 1].sum(0)              # ... summing to S over `parts`
    sp_all[tile] = parts_t
scale = 0.37
m_h, l_h = np.full(MT, -np.inf, np.float32), np.zeros(MT, np.float32)         # [MT] running state
host_P, host_state = [], []
for tile in range(2):
    P_t, a_t = softmax_step(sp_all[tile], vis_all[:, tile * KT:(tile + 1) * KT], scale, m_h, l_h, G_run, parts_run)
    host_P.append(P_t)
    host_state.append(np.stack([m_h.copy(), l_h.copy(), a_t]))
print(f"this backend's v2 block at Lkv 16: {THREADS} threads -> G = {G_run} lanes per row, {parts_run} k-part(s) "
      f"(GPU: 256 threads, G = 8, 4 k-parts)")
check_true("rows 2, 3 (nothing visible in tile 0): m = -inf, l = 0, P = 0 after tile 0; alpha = 1",
           np.all(np.isneginf(host_state[0][0, 2:4])) and np.all(host_state[0][1, 2:4] == 0)
           and np.all(host_P[0][2:4] == 0) and np.all(host_state[0][2, 2:4] == 1))
if KERNELS:
    p_k = kd.backend.full((2, MT, KT), np.nan, np.float32)                     # [2, MT, KT] poisoned
    st_k = kd.backend.full((2, 3, MT), np.nan, np.float32)                     # [2, 3, MT] poisoned
    with stopwatch() as sw:
        kd.backend.launch(softmax_kernel, 1, THREADS, kd.backend.asarray(sp_all),
                          kd.backend.asarray(vis_all.reshape(MT, 2, KT).transpose(1, 0, 2).astype(np.int32).copy()),
                          np.float32(scale), p_k, st_k)
    check(f"_v2_softmax (device, {THREADS} threads) vs NumPy lanes: P of both tiles ({sw.ms:.0f} ms)", p_k,
          np.stack(host_P), atol=1e-6, rtol=1e-6)
    finite = lambda a: np.where(np.isneginf(a), np.float32(-1e30), a)        # noqa: E731  (m = -inf: compare as -1e30)
    check("_v2_softmax vs NumPy lanes: m, l, alpha after each tile", finite(host(st_k)), finite(np.stack(host_state)),
          atol=1e-6, rtol=1e-6)

section("two tiles of the online softmax + P V vs a float64 softmax")
for G_, parts_ in dict.fromkeys([(8, 4), (G_run, parts_run)]):
    m_h, l_h = np.full(MT, -np.inf, np.float32), np.zeros(MT, np.float32)
    O = np.zeros((MT, V.shape[1]))                                             # [MT, 16] accumulators
    for tile in range(2):
        sp_g = sp_all[tile].copy()
        if parts_ != parts_run:                                                # re-cut S into this many k-parts
            sp_g[:parts_] = np.float32(0.0)
            sp_g[0] = S[:, tile * KT:(tile + 1) * KT]
        P_t, a_t = softmax_step(sp_g, vis_all[:, tile * KT:(tile + 1) * KT], scale, m_h, l_h, G_, parts_)
        O = a_t[:, None] * O + P_t.astype(np.float64) @ V[tile * KT:(tile + 1) * KT]
    s64 = np.where(vis_all, scale * S.astype(np.float64), -np.inf)             # [MT, 32]
    p64 = np.exp(s64 - s64.max(1, keepdims=True))
    want_o = (p64 / p64.sum(1, keepdims=True)) @ V                             # [MT, 16]
    check(f"online softmax, {G_} lanes x {KT // G_} keys per row, 2 tiles: O / l vs float64", O / l_h[:, None],
          want_o, atol=1e-6, rtol=1e-5)

# %% [markdown]
# ## 5. The whole kernel
#
# `_attention_v2_kernel`, printed from the package. Per key tile (its cache rows already in `rows`, -1 past the
# list): `_v2_load_keys`, barrier, `_v2_scores` (warp w: m16 block `w // kparts`, k-part `w % kparts`; A
# fragments from the block's query rows, copied once by `_v2_stage_q` into dynamic shared memory when its split has
# at least `STAGE_MIN_KEYS` = 48 keys (3 tiles), else straight from global q; B from ks; the three TF32 products in
# three accumulator sets), barrier, the
# lane's mask bits `vis`, `_v2_softmax`, barrier, the *next* tile's cache rows into `rows` (nothing reads them from
# here on), `_v2_accumulate` (warp w: m16 block and a group of Lkv columns, 16 n8 fragments = 64 fp32 accumulators
# per thread in registers), barrier - four a tile. At the end `_v2_end` stores `O / l` or the split's partials.

# %%
section("the kernel on the page")
show_kernel(mla._attention_v2_kernel)
tree_fn = getattr(tv._tree_attention_v2_kernel, "py_func", None) or getattr(tv._tree_attention_v2_kernel, "fn",
                                                                            None) or tv._tree_attention_v2_kernel
tree_src = inspect.getsource(tree_fn).splitlines()
i_vis = next(i for i, ln in enumerate(tree_src) if "vis = 0" in ln)
print("the tree kernel differs in its key list (committed rows, then each token's path slots) and in the mask:")
show_kernel(tv._tree_attention_v2_kernel, i_vis, i_vis + 7)

# %% [markdown]
# Against the references, outputs filled with NaN first (a row no block writes stays NaN and fails). Tolerance
# atol 1e-5, rtol 1e-4 (3xTF32 with the truncating split is fp32-grade: the H200 measured up to ~1e-4 against
# float64 at Kimi shapes). The cases (`variant="v2"` forced: the simulator's default is v1):
#
# * causal T 3, N 20, D 24, Lkv 16, start 9: 60 rows, 2 query tiles (tile 0 = token 0 + 12 heads of token 1, so
#   token 0's rows must mask key 10), one key tile; then the same with every row after `start` set to 1e6: token 0
#   loads them (its tile does) but must not see them - its output unchanged bit for bit;
# * causal, start 30, `splits=2`: the grid of the picture in section 1 (an empty block, the combine);
# * a random 8-node tree, N 5 (40 rows, 2 tiles over 7 + 2 tokens), start 9: `tree_attention` vs
#   `tree_attention_ref` (paths from `tree.ancestor_paths`).

# %%
section("v2 vs the references (NaN-poisoned outputs)")
TOL = dict(atol=1e-4 if BIG else 1e-5, rtol=1e-4)   # Kimi shapes: the GPU tests' 1e-4 (H200: up to ~5e-5 measured)
WHO = "v2" if KERNELS else "numpy path"                                       # what mla_attention runs here
if not KERNELS:
    print("numpy backend: mla_attention / tree_attention run masked_attention_fast (float32 NumPy), not the kernel")
if BIG:
    Tc, Nc, Lkv, Rr, start_a, start_b, tree_n, Nt, start_t = 16, 64, 512, 64, 3000, 3000, 64, 64, 3000
else:
    Tc, Nc, Lkv, Rr, start_a, start_b, tree_n, Nt, start_t = 3, 20, 16, 8, 9, 30, 7, 5, 9
Dc = Lkv + Rr
sc = Dc ** -0.5
timing = []


def causal_case(name, T, N, start, splits, cache=None, q=None):
    q = (2 * R.standard_normal((T, N, Dc))).astype(np.float32) if q is None else q          # [T, N, D]
    cache = R.standard_normal((start + T + 2, Dc)).astype(np.float32) if cache is None else cache   # [C, D]
    out = kd.backend.full((T, N, Lkv), np.nan, np.float32)                     # [T, N, Lkv] poisoned
    with spy() as s, stopwatch() as sw:
        mla.mla_attention(q, cache, start, sc, Lkv, out=out, splits=splits, variant="v2")
    timing.append((name, f"{sw.ms:.0f}"))
    return q, cache, out, s.launches


q_a, cache_a, out_a, launches_a = causal_case("causal, 1 split", Tc, Nc, start_a, None)
check(f"causal T {Tc} N {Nc} D {Dc} Lkv {Lkv} start {start_a}: {WHO} vs mla_attention_ref", out_a,
      mla.mla_attention_ref(q_a, cache_a, start_a, sc, Lkv), **TOL)
future = cache_a.copy()
future[start_a + 1:] = 1e6                                                     # rows token 0 loads but must not see
_, _, out_f, _ = causal_case("causal, future rows 1e6", Tc, Nc, start_a, None, cache=future, q=q_a)
check("token 0 ignores the rows after start + 0 that its tile loads (bit for bit)", host(out_f)[0],
      host(out_a)[0], exact=True)
if KERNELS:
    tiles_a, Z_a, _ = v2_plan(Tc, Nc, start_a, None)
    check_true("launched: _attention_v2_kernel on grid (ceil(T N / 32), splits, 1 kv head), 32 x v2_warps(Lkv) threads",
               launches_a[0] == ("_attention_v2_kernel", (tiles_a, Z_a, 1), 32 * mla.v2_warps(Lkv))
               and [n for n, _, _ in launches_a[1:]] == (["_combine_kernel"] if Z_a > 1 else []),
               f"{launches_a}")

q_b, cache_b, out_b, launches_b = causal_case("causal, splits=2", Tc, Nc, start_b, 2)
check(f"causal start {start_b}, splits=2: {WHO} (+ combine) vs mla_attention_ref", out_b,
      mla.mla_attention_ref(q_b, cache_b, start_b, sc, Lkv), **TOL)
if KERNELS:
    tiles_b, Z_b, L_b = v2_plan(Tc, Nc, start_b, 2)
    check_true(f"launched: the v2 grid ({tiles_b}, {Z_b}) (split length {L_b}), then _combine_kernel",
               [n for n, _, _ in launches_b] == ["_attention_v2_kernel", "_combine_kernel"]
               and launches_b[0][1] == (tiles_b, Z_b, 1) and (BIG or (tiles_b, Z_b, L_b) == (p_tiles, p_Z, p_L)),
               f"{launches_b}")

parents = np.concatenate([[-1], [R.integers(max(0, j - 3), j) for j in range(1, tree_n + 1)]]).astype(np.int64)
paths, depths = kt.ancestor_paths(parents)                                     # [n+1, L+1], [n+1]
q_t = (2 * R.standard_normal((tree_n + 1, Nt, Dc))).astype(np.float32)         # [n+1, N, D]
cache_t = R.standard_normal((start_t + tree_n + 3, Dc)).astype(np.float32)     # [C, D]
out_t = kd.backend.full((tree_n + 1, Nt, Lkv), np.nan, np.float32)             # [n+1, N, Lkv] poisoned
with stopwatch() as sw:
    tv.tree_attention(q_t, cache_t, start_t, paths, depths, sc, Lkv, out=out_t, variant="v2")
timing.append(("tree", f"{sw.ms:.0f}"))
if not BIG:
    print(f"tree parents {parents.tolist()}, depths {depths.tolist()}")
check(f"tree, {tree_n + 1} nodes, N {Nt}, start {start_t}: {WHO} vs tree_attention_ref", out_t,
      tv.tree_attention_ref(q_t, cache_t, start_t, parents, sc, Lkv), **TOL)
table(timing, ("case", f"{kd.backend.name} ms"))

# %% [markdown]
# ## 6. On the H200: what each change bought
#
# Quoted from docs/PERFORMANCE.md, section "v2 rebuilt, 3.9x faster - measured 2026-12-03" (H200, code 45a6095,
# `PYTHONPATH=$PWD KDTREE_BACKEND=cuda python3 benchmarks/bench_verify.py`; device time of CUDA-graph replays),
# **not measured by this tutorial**. Columns: tree verify at context / nodes / heads, causal prefill at tokens /
# start / heads, all with D 576, Lkv 512. The first v2 spent ~50 instructions per MMA (ncu); the rebuild is what
# sections 3 and 4 show (cp.async key tiles - then with an add-only copy plan, since replaced by a group of
# threads per row -, the 8-lane softmax) plus the truncating split of section 2 and separate accumulators for the
# scores' three products.

# %%
section("quoted from docs/PERFORMANCE.md (H200, 2026-12-03) - not measured here")
STEPS = [  # step, tree 4096/64/64 ms, tree 4096/256/64 ms, causal 512/0/64 ms, ncu instructions, kept
    ("before (771faa4)", 7.96, 31.74, 4.28, "2.69 G", True),
    ("cp.async key tiles + add-only copy plan, unsigned indices, softmax on 8 lanes per row, constant block splits",
     2.54, 9.77, 1.40, "", True),
    ("+ a second key tile in flight (cp.async groups, 74 KB dynamic shared) - dropped", 2.88, 11.26, 1.54,
     "1.23 G", False),
    ("+ the truncating 3xTF32 split (split_tf32_fast: one LOP3 instead of two cvt.rna)", 2.22, 8.59, 1.24, "", True),
    ("+ three accumulator sets for the scores (six MMA chains per warp), no per-fragment guard in P V at Lkv 512",
     2.02, 7.78, 1.08, "", True),
]
rows_q = []
prev = None
for name, a, b, c, ins, kept in STEPS:
    gain = f"{prev / a:.2f}x" if prev else ""
    rows_q.append((name[:70] + (".." if len(name) > 70 else ""), f"{a:.2f}", f"{b:.2f}", f"{c:.2f}", ins, gain))
    if kept:
        prev = a
table(rows_q, ("step", "tree 4096/64/64 ms", "tree 4096/256/64", "causal 512/0/64", "ncu instr.",
               "4096/64/64 vs last kept"))
FULL = [  # cell, v1 ms, v2 ms, quoted v2 vs v1, SDPA fp32 ms, quoted v2 speedup over SDPA (same section)
    ("tree 4096 / 64 / 64", 46.246, 2.032, 22.8, 2.134, 1.05),
    ("tree 32768 / 256 / 64", 1307.888, 60.475, 21.6, 38.589, 0.64),
    ("causal 512 / 0 / 64", 21.112, 1.077, 19.6, 0.867, 0.80),
    ("decode 1 / 32768 / 64", 9.853, 0.291, 33.9, 9.885, 33.99),
]
table([(c, f"{v1:.3f}", f"{v2:.3f}", f"{q1:.1f}x", f"{sd:.3f}", f"{q2:.2f}x") for c, v1, v2, q1, sd, q2 in FULL],
      ("cell (same section, full table)", "v1 ms", "v2 ms", "v2 vs v1", "SDPA fp32 ms", "v2 speedup over SDPA"))
total = STEPS[0][1] / STEPS[-1][1]
check_true("quoted numbers consistent: 7.96 / 2.02 = 3.9x (the section's title); ratios in the full table within 1 %",
           round(total, 1) == 3.9 and all(abs(v1 / v2 / q1 - 1) < 0.01 and abs(sd / v2 / q2 - 1) < 0.01
                                          for _, v1, v2, q1, sd, q2 in FULL), f"{total:.2f}x")
print("Same section: errors vs float64 stayed within the tests' 1e-4 (4096 / 64 / 64: 2.6e-5); 191 registers "
      "(tree 197), no spills, one 8-warp block per SM; 38-40 % of the fp32 roofline on the large cells; >= 1.0x "
      "SDPA in 11 of 18 tree cells and every decode step, 0.62-0.996x in the rest.")

# %% [markdown]
# ## 7. v3: the same kernel with key tiles of 32 rows
#
# Section 1's per-tile work has a part that grows with the keys (the MMAs, the copies) and a part that does not: the
# key table, the block barriers (five then, four now), the softmax's shuffles, the rescale of 64 accumulators per
# thread. The ninth session's SASS count put the second part near half of a 16-key tile's instructions. **v3** pays
# it once per 32 keys: `mla_attention._tiled_kernel(kt, sp_stride, name)` compiles the kernel of section 5 with the
# tile height `kt` (16 for v2, 32 for v3) as a constant (numba freezes a closure's variables at compile time, so
# every `range(kt)` unrolls as a literal would), and each warp then runs 12 independent score MMA chains instead of
# 6.
# Two things change around it:
#
# * a 32-row tile is 74 KB, past numba's 48 KB of static shared memory: both tiled variants now keep the key tile
#   in **dynamic** shared memory, the staged query rows after it. numba gives dynamic shared memory as one 1-D
#   array, and its `reshape` on the device calls a runtime helper the CUDA target does not link, so
#   `_intrinsics.view2d(dyn, offset, rows, cols)` builds the 2-D view directly (data pointer + offset, shape,
#   strides; the simulator slices and reshapes);
# * P (the scores after the softmax, `sp[0]`) is read as A fragments: lane (g, t) loads row g, column t. With rows
#   of 32 floats all eight rows of a column fall in one bank (8-way conflicts); v3 pads the rows to 36 floats.
#
# The launcher checks the device: v3's 167 KB (static + tile + staged rows) fit the H100 / H200 (227 KB per block),
# v3 without the staged rows (91 KB) fits the 99 KB of sm_86 / sm_89, and a 64 KB GPU (sm_75) runs v2.

# %%
section("v3: budget, bank conflicts and MMAs per key")
budget = []
for v in ("v2", "v3"):
    kt_v = mla.TILE_ROWS[v]
    st, tile, stage = mla.STATIC_BYTES[v], mla.tile_bytes(kt_v), mla.Q_BYTES2
    budget.append((v, kt_v, st, tile, stage, st + tile + stage))
table(budget, ("variant", "keys per tile", "static bytes", "key tile", "staged rows", "bytes per block"))
check_true("v2 = 8,768 + 37,120 + 74,240 bytes; v3 fits the H200's 232,448 bytes per block, and 99 KB without its "
           "staged rows", budget[0][5] == 8768 + 37120 + 74240 and budget[1][5] <= 232448
           and budget[1][2] + budget[1][3] <= 101376, f"{budget}")


def p_bank_ways(stride):
    """Most lanes of a warp on one bank for the P A-fragment load p[g, t] (g = lane // 4, t = lane % 4)."""
    banks = [(stride * (lane // 4) + lane % 4) % 32 for lane in range(32)]
    return max(banks.count(b) for b in set(banks))


ways = {st: p_bank_ways(st) for st in (16, 32, mla.SP_STRIDE3)}
print("lanes per bank for P's A-fragment loads at row stride 16 (v2) / 32 / 36 (v3): "
      + ", ".join(f"{st}: {w}" for st, w in ways.items()))
check_true("stride 36 = 4 mod 32 puts the 32 lanes on 32 banks (32 would put 8 on one)",
           ways[mla.SP_STRIDE3] == 1 and ways[32] == 8, f"{ways}")
steps_gpu = (mla.MAX_D // 8) // KPARTS
for v in ("v2", "v3"):
    kt_v = mla.TILE_ROWS[v]
    mmas = steps_gpu * (kt_v // 8) * 3 + (kt_v // 8) * FRAGS * 3
    print(f"{v}: per warp and tile of {kt_v} keys {mmas} MMAs = {mmas / kt_v:.1f} per key; "
          f"4 block barriers = {4 / kt_v:.3f} per key")

# %% [markdown]
# v3 against the references, as in section 5 (outputs NaN-poisoned; the causal case with two key splits so the
# combine runs, and the random tree), then which variant a launch with `variant=None` runs: v3, except a causal
# launch whose v2 splits would be single 16-key tiles (`short_splits`: a decode step over a short context, a small
# latency-bound grid where v3's half as many blocks measured slower on the H200).

# %%
section("v3 vs the references (NaN-poisoned outputs)")
out_3 = kd.backend.full((Tc, Nc, Lkv), np.nan, np.float32)                    # [T, N, Lkv] poisoned
with spy() as s3:
    mla.mla_attention(q_b, cache_b, start_b, sc, Lkv, out=out_3, splits=2, variant="v3")
check(f"causal start {start_b}, splits=2: {'v3' if KERNELS else WHO} vs mla_attention_ref", out_3,
      mla.mla_attention_ref(q_b, cache_b, start_b, sc, Lkv), **TOL)
if KERNELS:
    check_true("launched: _attention_v3_kernel, then _combine_kernel",
               [n for n, _, _ in s3.launches][:1] == ["_attention_v3_kernel"], f"{s3.launches}")
out_t3 = kd.backend.full((tree_n + 1, Nt, Lkv), np.nan, np.float32)           # [n+1, N, Lkv] poisoned
tv.tree_attention(q_t, cache_t, start_t, paths, depths, sc, Lkv, out=out_t3, variant="v3")
check(f"tree, {tree_n + 1} nodes: {'v3' if KERNELS else WHO} vs tree_attention_ref", out_t3,
      tv.tree_attention_ref(q_t, cache_t, start_t, parents, sc, Lkv), **TOL)
for rows_, keys_ in ((8, 300), (64, 4097)):
    print(f"{rows_} query rows over {keys_} keys on this backend: short_splits = {mla.short_splits(rows_, keys_)}"
          f" -> variant=None runs {'v2' if GPU and mla.short_splits(rows_, keys_) else mla.default_variant()}")

# %% [markdown]
# Measured on the H200 (docs/PERFORMANCE.md, "Tenth session (2026-12-03): v3", device time of CUDA-graph replays;
# base = v2 at the ninth session's code, same call), **not measured by this tutorial**.

# %%
section("quoted from docs/PERFORMANCE.md (H200, tenth session) - not measured here")
V3 = [  # cell, base v2 ms, v3 ms, SDPA fp32 ms (bench_verify, same day), quoted v3 speedup over SDPA
    ("tree 4096 / 256 / 64", 5.338, 4.970, 4.752, 0.95),
    ("tree 32768 / 256 / 64", 43.714, 38.752, 39.147, 1.02),
    ("tree, default pair 150 / 64 / 8 (D 112)", 0.0357, 0.0294, None, None),
    ("decode, default pair 300 / 8 (D 112)", 0.0220, 0.0277, None, None),
]
table([(c, f"{b:.4f}", f"{v:.4f}", f"{b / v:.2f}x", "" if sd is None else f"{sd:.3f} ({q:.2f}x)")
       for c, b, v, sd, q in V3], ("cell", "base v2 ms", "v3 ms", "v3 vs base", "SDPA fp32 ms (v3 speedup)"))
check_true("quoted ratios consistent: the decode cell is the one v3 loses (hence short_splits)",
           V3[3][2] > V3[3][1] and all(v < b for _, b, v, _, _ in V3[:3]))
print("Same section: bench_verify's tree cells at or above SDPA fp32: 17 of 18 (was 16); the 4096 / 256 / 64 cell "
      "0.95x (bench_verify's own v3 run: 4.992 ms); errors vs float64 unchanged (9.1e-5 on 4096 / 256 / 64).")

# %% [markdown]
# ## 8. v4: the same MMAs, half the splitting (measured: no faster than v3)
#
# In v2 / v3 a warp owns one m16 block of the tile: in the scores the two warps of a k-part (one per block) each
# load and split the same key fragments, and in P V the two warps of a column group each split the same value
# fragments. v4 (`_tiled_kernel(.., wide=True)`, `_v4_scores`, `_v4_accumulate`) gives every warp both m16 blocks:
# warp w takes k-part w of the scores (8 k-parts of 72 dims on the GPU) and the Lkv columns 64 w .. 64 w + 63 of
# P V, so a key or value fragment is split once and feeds both blocks' MMAs. The MMAs per warp and tile stay 408;
# what falls is the work around them (counted below for the GPU's 8 warps, D 576, Lkv 512, a 32-key tile), and
# with it the instructions the SASS shows per k8 step (docs/PERFORMANCE.md, twenty-second session: scores 85 for
# 24 MMAs against 61 for 12, P V ~136 for 48 against ~165). Its cost: twice the partial-score buffers (37 KB of
# static shared memory) and 254 registers with the scores' small products in one accumulator set. On the H200
# (bench_verify, 2026-12-05; docs/PERFORMANCE.md, twenty-third session) it came out within -1 % .. +5 % of v3 cell
# by cell - the same day's v3, whose copies, masks and P V indices had just lost most of their instructions, ran
# 1.30-1.34x faster than the day before, and the splitting v4 saves was no longer what the warps waited on - so
# `variant=None` still runs v3. Below, v4 against the references on this backend.

# %%
section("v4: fragments split per warp and 32-key tile (GPU mapping), and v4 vs the references")
ksteps_gpu = mla.MAX_D // 8                                              # 72 k8 steps of the scores
split_rows = []
for v, warps_per_block_row in (("v3", MB), ("v4", 1)):
    kparts = WARPS // warps_per_block_row                                # v3: 4 k-parts x 2 blocks; v4: 8 x 1
    score_b = (ksteps_gpu // kparts) * (mla.KT3 // 8) * 2                # B values split per warp
    cols = mla.MAX_LKV // (WARPS // warps_per_block_row)                 # v3: 128 columns of one block; v4: 64
    pv_b = (mla.KT3 // 8) * (cols // 8) * 2
    split_rows.append((v, kparts, score_b, cols, pv_b, score_b + pv_b))
table(split_rows, ("variant", "k-parts", "key values split (scores)", "P V columns a warp", "value values split",
                   "B values split a warp"))
check_true("v4 splits half the B values v3 does, for the same 408 MMAs a warp", split_rows[1][5] * 2 ==
           split_rows[0][5])
out_t4 = kd.backend.full((tree_n + 1, Nt, Lkv), np.nan, np.float32)           # [n+1, N, Lkv] poisoned
tv.tree_attention(q_t, cache_t, start_t, paths, depths, sc, Lkv, out=out_t4, variant="v4")
check(f"tree, {tree_n + 1} nodes: {'v4' if KERNELS else WHO} vs tree_attention_ref", out_t4,
      tv.tree_attention_ref(q_t, cache_t, start_t, parents, sc, Lkv), **TOL)
out_4 = kd.backend.full((Tc, Nc, Lkv), np.nan, np.float32)                    # [T, N, Lkv] poisoned
mla.mla_attention(q_b, cache_b, start_b, sc, Lkv, out=out_4, splits=2, variant="v4")
check(f"causal start {start_b}, splits=2: {'v4' if KERNELS else WHO} vs mla_attention_ref", out_4,
      mla.mla_attention_ref(q_b, cache_b, start_b, sc, Lkv), **TOL)

# %% [markdown]
# ## 9. Whole fragments: `ldmatrix` (v5 - v8)
#
# Section 2's fragment table has a second reading. Cut the 16 x 8 A tile into four 8 x 4 blocks (rows 0-7 / 8-15,
# columns 0-3 / 4-7): lane 4g + t holds element (g, t) *of each block* - a0 from the first, a1 from the second,
# and so on. That is exactly what the warp-wide load `ldmatrix.sync.aligned.m8n8.x4.shared.b16` delivers: it reads
# four 8 x 16-byte matrices whose 32 row addresses the 32 lanes supply (lanes 8j .. 8j + 7 name matrix j's rows)
# and hands lane 4g + t the 4-byte word t of row g of each matrix. The instruction is specified for 16-bit
# elements, but a pair of them is one float, so for TF32 it is a fragment load: one instruction where a lane
# issued four loads (`mma.frag_a_base` / `frag_a_at`). The keys' B fragments of a score are the same picture with
# rows = keys (B[k][n] = key n, dim k): one ldmatrix.x4 gives the B pairs of two n8 blocks (`frag_b2_base` /
# `frag_b2_at`). A score k8 step of v3 loads 12 floats a lane one by one; v5 issues 3 ldmatrix. (P V's value
# fragments need the transposed picture - B[k][n] = value row k, column n - which ldmatrix offers only for 16-bit
# elements: those stay 4-byte loads.) v6 and v7 combine this with v4's mapping; v8 also hands the key tile to the
# copy engine (one `cp.async.bulk` a row, completing on an mbarrier). Timed on an H200 (docs/PERFORMANCE.md,
# 2026-12-05, twenty-seventh session): v5 is 0.3-7 % faster than v3 on every tree and causal cell of bench_verify,
# so it is the default on a GPU; v8 is 4-6 % faster than v5 on the largest tree cells (256 nodes x 64 heads over
# 4096+ keys) and ~10 % slower on the smallest. Fewer instructions did not buy proportionally less time: the
# SASS estimate was 14 % (v5) to 28 % (v7) fewer a tile. The emulation below follows the PTX description lane by
# lane.

# %%
section("ldmatrix.x4 emulated: the row each lane names, the words each lane receives")


def ldmatrix_x4(flat, addr):
    """What each lane receives [32, 4] when lane L names row address addr[L] (float offsets into ``flat``)."""
    words = np.empty((32, 4), flat.dtype)
    for j in range(4):
        rows = addr[8 * j: 8 * j + 8]                                          # matrix j's 8 row starts
        words[:, j] = flat[rows[g_l] + t_l]                                    # lane 4g + t: word t of row g
    return words


S_T = ROW_T                                                                    # the tiles' row stride (580)
tile = np.arange(16 * S_T, dtype=np.float32)                                   # [16 * S_T] flat shared tile
A_t = tile.reshape(16, S_T)[:, 40:48]                                          # a 16 x 8 tile at column 40
lane_a = 40 + (lane % 16) * S_T + (lane // 16) * 4                             # frag_a_base's row per lane
got_a = ldmatrix_x4(tile, lane_a)                                              # [32, 4]
check_true("A: ldmatrix.x4 with lane L naming row L % 16 at column 4 (L // 16) gives a0..a3 of every lane",
           np.array_equal(got_a, fragments(A_t, np.zeros((8, 8)), np.zeros((16, 8)))[0]))
K_t = tile.reshape(16, S_T)[:, 40:48]                                          # 16 keys (rows) x 8 dims
lane_b = 40 + (lane % 8 + (lane // 16) * 8) * S_T + (lane // 8 % 2) * 4        # frag_b2_base's row per lane
got_b = ldmatrix_x4(tile, lane_b)
want_b = np.concatenate([fragments(np.zeros((16, 8)), K_t[:8].T, np.zeros((16, 8)))[1],       # keys 0-7
                         fragments(np.zeros((16, 8)), K_t[8:].T, np.zeros((16, 8)))[1]], 1)   # keys 8-15
check_true("B: one ldmatrix.x4 gives the (b0, b1) pairs of two n8 blocks of keys (B[k][n] = key n, dim k)",
           np.array_equal(got_b, want_b))
banks = [sorted({int(a + w) % 32 for a in lane_a[8 * j: 8 * j + 8] for w in range(4)}) for j in range(4)]
check_true(f"bank-conflict free at stride {S_T} = {S_T % 32} mod 32: each matrix's 8 rows x 4 words hit 32 banks",
           all(b == list(range(32)) for b in banks))
table([("v3", 12, 0, "4-byte loads, one per float a lane"),
       ("v5 / v6", 0, 3, "frag_a_at (queries) + 2 x frag_b2_at (keys 0-15, 16-31)"),
       ("v7", 0, 4, "both m16 blocks' queries + the keys: 24 MMAs a step")],
      ("variant", "4-byte loads a score k8 step", "ldmatrix.x4", "what"))
for v in ("v5", "v6", "v7", "v8"):
    out_v = kd.backend.full((tree_n + 1, Nt, Lkv), np.nan, np.float32)        # [n+1, N, Lkv] poisoned
    tv.tree_attention(q_t, cache_t, start_t, paths, depths, sc, Lkv, out=out_v, variant=v)
    check(f"tree, {tree_n + 1} nodes: {v if KERNELS else WHO} vs tree_attention_ref", out_v,
          tv.tree_attention_ref(q_t, cache_t, start_t, parents, sc, Lkv), **TOL)

# %% [markdown]
# ## 10. The other way: two GEMMs ("gemm", `kernels/mla_gemm_attention.py`)
#
# Section 1's observation - every head of every token scores the same latent rows - taken to its end: for a
# launch of many query rows (a 256-node x 64-head verify has 16448) the scores are one dense product
# `S [T N, K] = Q C^T` and the output another, `P V`. Those are exactly what cuBLAS runs near the tensor cores'
# peak, where a numba kernel's own MMAs (v5) are latency-bound at ~40 % of what 3xTF32 can issue. The cost: S is
# written to memory and read back (the streaming kernels never materialise it), so this pays only for big
# launches - `variant=None` picks it for tree verifies from 1024 query rows with a host start
# (`mla_gemm_attention.pays`).
#
# 3xTF32 with cuBLAS: cuBLAS cannot split operands inside its kernels, so a numba kernel splits them once and the
# three products become ONE GEMM with the inner dimension tripled - `[q_hi | q_lo | q_hi] . [k_lo | k_hi | k_hi]`
# is `q_hi k_lo + q_lo k_hi + q_hi k_hi` (small cross terms first in K: they sum before the big terms join). A
# numba softmax kernel (one warp a row; the tree's visible keys read from the token's path) writes P split the
# same way beside its scores, `[P_hi | P_lo | P_hi]`, so P V is one tripled GEMM too (over many keys two GEMMs of
# `[P_hi | P_lo]`: the third copy's write costs more than it saves). On the simulator the GEMMs run in NumPy on
# TF32-truncated operands - the same arithmetic.

# %%
section("gemm: the operand split, one tripled GEMM = 3xTF32, the whole variant vs the references")
if KERNELS:                                                                     # the split is a kernel
    x_g = (R.standard_normal((4, Dc)) * 10.0 ** R.integers(-6, 6, (4, Dc))).astype(np.float32)       # [4, D]
    q3_g = host(mg._split3(kd.backend.asarray(x_g), 4, mg.QUERIES))            # [4, 3D] = [hi | lo | hi]
    check_true("split: hi has its 13 low mantissa bits clear and hi + lo == x exactly",
               not (q3_g[:, :Dc].view(np.uint32) & np.uint32(0x1FFF)).any()
               and np.array_equal(q3_g[:, :Dc] + q3_g[:, Dc:2 * Dc], x_g))
    a_g = R.standard_normal((16, 64)).astype(np.float32)                           # [16, 64]
    b_g = R.standard_normal((24, 64)).astype(np.float32)                           # [24, 64]: rows are keys
    want_g = a_g.astype(np.float64) @ b_g.T.astype(np.float64)
    three_g = host(mg._gemm_tf32(mg._split3(kd.backend.asarray(a_g), 16, mg.QUERIES),
                                 mg._split3(kd.backend.asarray(b_g), 24, mg.KEYS).T, kd.backend.empty((16, 24))))
    one_g = host(mg._gemm_tf32(kd.backend.asarray(a_g), kd.backend.asarray(b_g).T, kd.backend.empty((16, 24))))
    err3, err1 = (float(np.abs(g - want_g).max() / np.abs(want_g).max()) for g in (three_g, one_g))
    print(f"  max error / max |S| vs float64: one tripled GEMM (3xTF32) {err3:.1e}, one TF32 GEMM {err1:.1e}")
    check_true("the tripled GEMM is fp32-grade (< 1e-5), a plain TF32 one is not (> 1e-4)", err3 < 1e-5 < 1e-4 < err1)
    out_g = kd.backend.full((tree_n + 1, Nt, Lkv), np.nan, np.float32)        # [n+1, N, Lkv] poisoned
    tv.tree_attention(q_t, cache_t, start_t, paths, depths, sc, Lkv, out=out_g, variant="gemm", splits=2)
    check(f"tree, {tree_n + 1} nodes, 2 row chunks: gemm vs tree_attention_ref", out_g,
          tv.tree_attention_ref(q_t, cache_t, start_t, parents, sc, Lkv), **TOL)
table([("512 / 256 / 64", "0.566", "0.418", "0.930", "2.24x"),
       ("4096 / 256 / 64", "3.922", "1.770", "4.944", "2.80x"),
       ("32768 / 256 / 64", "30.332", "14.083", "40.847", "2.91x")],
      ("context / nodes / heads", "v5 ms", "gemm ms", "SDPA fp32 ms", "variant=None vs SDPA"))
print("  (quoted from docs/PERFORMANCE.md: H100, bench_verify, 2026-12-06 - not measured here)")

# %%
finish()
