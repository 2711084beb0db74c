"""MLA attention in the absorbed form: multi-query attention of every head over the shared latent cache rows.

Each cache row (one per token and layer) is ``[c_kv (Lkv) ; k_rot (R)]``, shared by all heads. The model absorbs
W_UK into the query, so head h's query is ``q[t, h] = [q_nope[h] @ W_UK[h] (Lkv) ; roped q_rot[h] (R)]`` and

    score[h, s] = scale * (q[t, h] . cache[s])                    one 576-wide dot for Kimi (512 + 64)
    out[t, h]   = sum_s softmax_s(score[h, :])[s] * cache[s, :Lkv]  values = the latent itself
(W_UV and o_proj are applied by the model afterwards). Token t of a chunk that starts at ``start`` sees rows
``0 .. start + t`` (causal); the rows of the chunk itself must already be in the cache. One kernel per variant
serves a prefill chunk (T tokens) and a single-token decode step (T = 1). The tree-verify stage
(``tree_verify.py``) builds its kernels from this module's device functions with another key list: this module
holds the shared machinery (tiles, scores, online softmax, accumulators, key splits and their combine).

Variants (``variant=`` picks one; None -> ``default_variant()``: v5 on a GPU - v2 for a small decode grid,
``short_splits`` - and v1 on the simulator, where the MMA stand-in costs a block barrier per instruction). Each is
checked against ``masked_attention_ref`` in tests/kernels/test_attention.py before benchmarks/bench_verify.py times
it.
  v1  the readable first version: a block per (token, 4 heads), CUDA-core dot products.
  v2  tiles of 32 (token, head) query rows x 16 key rows on tensor cores (3xTF32, kernels/mma.py): a latent row
      is loaded once into shared memory for 32 query rows instead of 4, and both products run on MMA.
  v3  v2 with key tiles of 32 rows: the same kernel source (``_tiled_kernel(kt, ...)`` compiles it once per tile
      height), so the per-tile work that does not scale with the keys - the key table, five barriers, the
      softmax's shuffles, the 64-accumulator rescale - is paid once per 32 keys, and each warp runs 12
      independent score MMA chains instead of 6. The 74 KB tile no longer fits the 48 KB of static shared memory:
      it lives in dynamic shared memory (``_intrinsics.view2d``), before the staged query rows (167 KB in all).
      H200: tree 4096 / 256 / 64 5.34 -> 4.97 ms, 32768 / 256 / 64 43.7 -> 38.5, decode 1 / 4096 / 64 0.083 ->
      0.079; slower only on a decode over a short context (few blocks: ``short_splits``).
  v4  v3 with every warp on both m16 blocks of the tile (``_tiled_kernel(.., wide=True)``): warp w takes k-part
      w of the scores (72 of 576 dims, ``_v4_scores``) and Lkv columns 64 w .. 64 w + 63 of P V
      (``_v4_accumulate``), so each key and value fragment is loaded and split once for both blocks' MMAs; the
      scores' small 3xTF32 products chain into one accumulator set (two sets, not three: three spilled).
      From the sm_90 SASS (2026-12-05, no GPU): a score k8 step 85 instructions for 24 MMAs (v3: 61 for 12), a
      P V k8 step ~136 for 48 (v3: ~165); 254 registers (tree), 37 KB of static shared memory (8 k-parts of
      partial scores). Timed on the H200 (bench_verify, 2026-12-05): within -1 % .. +5 % of v3 cell by cell -
      faster on the 64-head cells of 32768 keys and on 512 / 256 / 64, slower on 4096 / 256 / 64 and the causal
      512-token chunk - so ``variant=None`` runs v3 (v4 needs 186 KB of shared memory a block).
  v5  v3 with the scores' shared-memory fragments loaded whole (``_tiled_kernel(.., vec=True)``, ``_v5_scores``):
      a k8 step's A fragment (the staged query rows) is one ``ldmatrix.x4`` (mma.frag_a_at) instead of four 4-byte
      loads a lane, and the B fragments of two n8 blocks of keys one more (mma.frag_b2_at) instead of four - the
      fragment layout of an m16n8k8 TF32 MMA is exactly what ldmatrix hands each lane from four 8 x 4 blocks of
      floats. The same products in the same order as v3 (bit for bit on the simulator). From the sm_90 SASS
      (2026-12-05): a score k8 step 48 instructions for 12 HMMA (v3: 61; 3 LDSM for 12 LDS), ~230 fewer a warp
      and tile of 32 keys (~10 %). P V stays v3's: 16-byte value loads (tried) put each value in the wrong
      register of its B pair and cost a move per element, where v3's 4-byte loads land in place.
  v6  v5's scores with v4's P V (``_tiled_kernel(.., wide=True, vec=True)``): both m16 blocks per warp in P V, so
      a value fragment is split once for both (a P V k8 step 97 instructions for 48 HMMA + P's loads, v3 145 +
      P's); 228 registers.
  v7  v4 whole, its score fragments by ldmatrix (``wide_scores=True``, ``_v7_scores``): a k8 step of the scores
      69 instructions for 24 HMMA (v4 85, v5 43.5 for 12); 255 registers, no spills, v4's 37 KB of static shared
      memory. Estimated from the SASS, per warp and 32-key tile: v3 ~2190 instructions, v5 ~1875, v6 ~1730,
      v7 ~1570.
  v8  v7 with the key tile copied by the copy engine (``bulk=True``: ``bulk_begin`` / ``bulk_load_keys``, one
      ``cp.async.bulk`` a row by warp 0, completing on an mbarrier) where every thread issued 18 16-byte cp.async
      copies (~150-200 instructions a warp and tile); absorbed MLA with 16-byte aligned rows only, else v7's
      copies. Rows past the list are not copied: the tile is zeroed once and a stale row is finite and masked.
  gemm  not a streaming kernel: all T x N query rows' scores as one 3xTF32 cuBLAS GEMM, a masked softmax kernel,
      and P V as one or two more (kernels/mla_gemm_attention.py). Memory traffic the others never pay (S is
      written, P written beside it), so ``variant=None`` picks it only for big launches
      (``mla_gemm_attention.pays``), where cuBLAS's GEMMs run at 300-400 TFLOP/s of TF32 products: 1.2-2.2x v5's
      speed there (H100, 2026-12-06). ``splits``: its row chunks.

v1 mapping: grid (token t, head group of HG heads, key split z). A block walks its split of t's key list in tiles
of BK rows: the tile is loaded into shared memory (row stride padded to an odd length so column reads do not
conflict), each of the HG x BK scores is summed by ``threads / 32`` threads over interleaved slices of the 576
dims, the HG heads' running max / sum are updated (online softmax) and every thread updates its share of the
HG x Lkv accumulators. With one split the block writes the normalised output; with several (decode: few tokens,
long context) each writes (o, m, l) partials and ``_combine_kernel`` merges them:
    M = max_z m_z;  out = sum_z exp(m_z - M) o_z / sum_z exp(m_z - M) l_z
(The tiled kernels mark a split that starts past its block's key list - a suffix of the splits - with l = -1, and
write nothing else: the combine stops at the first such split. A replayed decode step's grid is planned for the
cache's capacity, so most of its splits are such.)
Measured on the H200 (issue #14): correct (3.6e-6 vs float64) but 1-3 % of the fp32 roofline; every cache row is
re-read by T x N / 4 blocks.

v2 mapping: the T x N query rows flattened token-major (row r = t * N + h); a block takes a tile of MT = 32
consecutive rows (two m16 MMA blocks: heads of one token, plus the next token's when N is not a multiple of 32)
and one key split z: grid (ceil(T N / 32), splits, 1), 8 warps (the third axis is kernels/gqa_attention.py's
kv heads: the same kernel with per-head keys and separate values). The tile's key list is the union of its tokens'
lists (causal: rows 0 .. start + t_last, row k visible to row (t, h) iff k <= start + t - a mask inside the
tile, needed only in the last key tile or two). Per key tile of KT = 16 cache rows:
  1. rows -> shared ``ks [16, 580]`` (D = 576 padded: stride 580 = 4 mod 32, so the score B-fragment loads
     ks[key g, dim t] of a warp hit 32 different banks) by asynchronous 16-byte copies (cp.async, L2 -> shared
     with no register staging; 4-byte copies when rows are not 16-byte aligned), 256 / 16 = 16 consecutive
     threads a row (``row_share``, ``copy_row``); columns D..575 hold zeros, as do rows past the list
  2. scores S [32, 16] = Q K^T: warp w takes m16 block w // 4 and k-part w % 4 (144 of the 576 dims: 18 k8
     steps x 2 n8 blocks; A fragments from the block's 32 query rows, copied once into dynamic shared memory
     ``qs [32, 580]`` when a split has at least 3 key tiles - else straight from global q -, B from ks;
     ``_v2_stage_q``, ``_v2_scores``); the three TF32 products of
     3xTF32 accumulate separately (six independent MMA chains per warp) and the 4 k-parts' partial tiles go to
     shared ``sp [4, 32, 16]``
  3. online softmax, 8 lanes per query row (2 keys each): the k-parts summed, scaled and masked (-inf) with the
     key list, row max and sum by shuffles; sp[0] becomes P = exp(S - m), one lane updates (m, l, alpha)
  4. O = alpha O + P V: warp w owns m16 block w // 4 and Lkv columns (w % 4) * 128 .. + 127: 16 n8 fragments,
     i.e. 64 fp32 accumulators per thread in registers; 2 k8 steps (the 16 keys) per tile
  Every product is 3xTF32 with the truncating split (mma.split_tf32_fast): ~3e-6 relative per product, fp32-grade
  dot products. Splits and their combine as in v1. Budget: static shared 8,192 (sp) + 384 (m, l, alpha) + 64 (key
  table; tree: 192) + the simulator's 1-float scratch placeholders = 8,640 (tree 8,768) bytes; dynamic 37,120
  (the key tile ks) + 74,240 (the staged query rows, Q_BYTES2, where the device allows: ``stage_bytes``). v3:
  static 18,944 (tree 19,200: sp [4, 32, 36]), dynamic 74,240 + 74,240. Registers (ptxas, sm_90, CUDA 13.0,
  numba-cuda 0.30.4; 2026-12-05): v2 226 per thread (separate values 245, tree 227), v3 221 (tree 223), v4 254 (tree
  254), no spills, the 64 accumulators in registers - so one block (8 warps) per SM. Work per block and key tile:
  32 x 16 x (576 + 512) x 2 = 1.1 MFLOP as 8 x 204 = 1,632 MMA instructions, for one 36 KB read of the tile (v1: 4
  query rows per read).
  What made it 4x faster than its first version (H200, docs/PERFORMANCE.md): the first filled the tile with a
  64-bit division per element and ran ~50 instructions per MMA (ncu: 2.7 G instructions for 54 M MMAs at
  4096 x 64 x 64); the copy plan advances by adds, indices are unsigned, the softmax runs on every lane, the
  block's splits are constants, and the PV loop has no per-fragment guard when all 16 fragments are in use (a
  guard put each fragment's three dependent MMAs in their own basic block). Read from the SASS without a GPU
  (2026-12-05, ``benchmarks/ptxas_report.py --loops``; v3 1.30-1.34x faster on bench_verify's large cells for
  them, H200): a 16-byte tile copy took 52 instructions
  (a (row, column) pair stepped in 64 bits, both copy widths in one body), 18 of them a thread a v3 tile, more
  issue slots than the P V step; it is ~8 now (a group of threads per row, 32-bit counts); the P V fragments'
  column index was signed (a negative-index test and select per fragment: 257 -> 165 instructions a k8 step);
  the tree and causal masks looped over all 32 keys of a tile for the 4 a thread owns; and the next tile's key
  table is now written after the softmax's barrier (nothing reads it from there on), so a tile has four block
  barriers, not five. A second key tile in flight
  (cp.async groups, 74 KB of dynamic shared memory) measured 10-15 % slower and was dropped.
  On the simulator (a thread per CUDA thread) the block is 2 warps (4 or 8 when Lkv > 128 / 256): warp w takes
  m16 block w // (warps / 2) with warps / 2 k-parts and column groups - the same code.
Example (v2): T = 3 tokens, N = 20 heads, start 100 -> 60 query rows, 2 tiles. Tile 0 = rows 0..31 = token 0
(heads 0..19) + token 1 (heads 0..11); its list is rows 0..101 (token 1's): 7 key tiles (6 of 16, one of 6), and
in the last one key 101 is masked (-inf) for token 0's 20 rows. Tile 1 = token 1 (heads 12..19) + token 2: rows
0..102. Kimi decode (T = 1, N = 64, start 32767: 32768 keys, an H200's 132 SMs): 2 tiles x 64 splits of 512 rows,
then the combine (start 32768: 65 splits, the last of one key).
Shapes: q [T, N, D] float32, cache [C, D] float32 (D = Lkv + R <= 576, Lkv <= 512) -> out [T, N, Lkv] float32.
Example: one head, D = 2, Lkv = 1, scale 1, cache [[1, 0], [0, 1]], start 0, q [[[0, 0]], [[ln 3, 0]]]:
token 0 sees row 0 -> out 1; token 1 sees rows 0, 1 with weights 3/4, 1/4 -> out 0.75.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, int64, uint32, uint64

from .. import backend
from . import _checks, mla_gemm_attention
from ._intrinsics import (bulk_copy, copy_async, copy_async_wait, fence_proxy_async, mbar_expect_tx, mbar_init,
                          mbar_try_wait, view2d)
from .primitives import FULL, GROUP_BUF, group_max, group_sum, online_softmax_row
from .mma import (FLOAT_UNIT, SCRATCH_SHAPE, SIM, frag_a_at, frag_a_base, frag_b2_at, frag_b2_base, mma_m16n8k8_3xtf32,
                  mma_m16n8k8_tf32, split_tf32_fast)

VARIANTS = ("v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "gemm")
NEG_INF = -math.inf
MAX_D = 576       # widest cache row the kernels support (Kimi / DeepSeek: 512 + 64)
MAX_LKV = 512

# v1
HG = 4            # heads per block
BK = 8            # cache rows per tile
ROW = MAX_D + 1   # padded shared row stride
MAX_SUBS = 8      # threads per score (blockDim / 32)
PAIRS = 32        # HG * BK (head, row) scores per tile; a literal: numba types shared shapes from constants
assert PAIRS == HG * BK and ROW == MAX_D + 1

# v2
MT = 32           # query rows per tile: two m16 MMA blocks
MB = 2            # m16 blocks per tile
KT = 16           # cache rows per key tile: two n8 blocks of scores, two k8 steps of P @ V
ROW_T = 580       # padded key-tile row stride: 580 = 4 mod 32 (conflict-free score B-fragment loads)
Q_STRIDE2 = 580   # the staged query rows' stride (``_v2_stage_q``), 4 mod 32: conflict-free A-fragment loads
Q_BYTES2 = 4 * MT * Q_STRIDE2   # their dynamic shared memory: 74 KB (above 48 KB: backend.launch opts in)
STAGE_MIN_KEYS = 48       # blocks of at least this many keys per split stage their query rows: staged, a v2
                          # decode split of 2 tiles measured 11 % slower (H200), runs of many tiles 1.2-1.36x faster
# v3: v2's kernels with key tiles of 32 rows (the per-tile barriers, softmax and rescale paid once per 32 keys;
# 12 independent score MMA chains per warp instead of 6), the tile in dynamic shared memory (74 KB)
KT3 = 32
SCORE_ACC = 48    # 3 products x KT3 / 8 n8 blocks x 4: a warp's score accumulators per lane (v2 uses 24 of them)
SP_STRIDE3 = 36   # v3's partial-score row stride: 36 = 4 mod 32, P's A-fragment loads hit 32 banks
# The kernels' static shared memory (ptxas, sm_90), the largest of the causal and tree kernels': the launchers
# check it + the dynamic part (key tile, staged query rows) against the device's per-block limit.
STATIC_BYTES = {"v2": 8768, "v3": 19200, "v4": 37632, "v5": 19200, "v6": 19200, "v7": 37632, "v8": 37648}
KPARTS = 4        # most k-parts of the score (warps per m16 block): sp [KPARTS, MT, KT]
FRAGS = 16        # most n8 output fragments per warp: 16 x 8 = 128 of the Lkv columns
ACC = 64          # FRAGS * 4 accumulators per thread
WARPS = 8         # warps per block on the GPU (MB * KPARTS)
assert MT == 16 * MB and ACC == 4 * FRAGS and WARPS == MB * KPARTS and KT == 16 and ROW_T >= MAX_D
assert KT3 == 32 and SP_STRIDE3 >= KT3 and SCORE_ACC == 3 * KT3 // 2
# v4: v3's tiles with every warp on both m16 blocks: warp w takes k-part w of the scores (so a key's B fragment,
# loaded and split once, feeds both blocks' MMAs) and Lkv column group w of P V (so a value fragment does too)
KPARTS4 = 8       # k-parts of the score, one per warp: sp [KPARTS4, MT, SP_STRIDE3]
FRAGS4 = 8        # n8 output fragments per warp and m16 block: 8 x 8 = 64 of the Lkv columns (ACC = 2 x 8 x 4)
SCORE_ACC4 = 64   # 2 accumulator sets x 2 m16 blocks x KT3 / 8 n8 blocks x 4 (``_v4_score_mma``)
assert KPARTS4 == WARPS and ACC == MB * 4 * FRAGS4 and SCORE_ACC4 == 2 * MB * KT3 // 2
# v5: v3 with the scores' shared fragments loaded whole (ldmatrix.x4: 16-byte rows, strides 4 mod 32)
assert ROW_T % 32 == 4 and Q_STRIDE2 % 32 == 4
TILE_ALIGN = None if SIM else 16  # the key tile's byte alignment: copy_async's 16-byte copies (the simulator
                                  # takes no alignment argument; its arrays are numpy's). Rows: ROW_T * 4 = 16 * 145.
SPLIT_TARGET = 264  # blocks v1's (and gqa_attention's) key splits aim for: two per SM of the H200's 132; the MLA
                    # tiled kernels plan by waves (wave_splits)
MIN_SPLIT_TILES = 1  # v2 key splits down to one tile: a small decode's few blocks each wait for one tile, not four
# Launch bounds (256 threads, V2_MIN_BLOCKS blocks per SM) for ptxas. With 1 (sm_90, CUDA 13.0): 206 registers
# (separate values 221, tree 205), no spills -> one block of 8 warps per SM. With 2: capped at 128 registers for
# 2 blocks (16 warps) per SM and spills (measured on the first v2: 188 B of spill stores / 392 B of loads) - not
# yet timed; the staged query rows' 74 KB of shared memory would also have to fit twice.
# The simulator's jit takes no launch bounds.
V2_MIN_BLOCKS = 1
V2_JIT = {} if SIM else {"launch_bounds": (32 * WARPS, V2_MIN_BLOCKS)}


def default_variant() -> str:
    """The variant ``variant=None`` runs: on a GPU the tiled one ``tiled_default`` picks for its shared memory; v1
    on the simulator, where every MMA of the tiled variants' stand-in is a block barrier (the simulator tests run
    v2 / v3 explicitly)."""
    return tiled_default() if backend.name == "cuda" else "v1"


def tiled_default() -> str:
    """v5 (v3's 32-key tiles, fragments by ldmatrix) where it can stage its query rows (sm_90: 168 KB a block),
    else v2 where v2 can (sm_80: 120 KB; on the H200 staging measured 1.2-1.36x, the longer tiles 1.03-1.13x),
    else v5 without them where it fits (sm_86 / sm_89: 91 KB), else v2 (sm_75: 64 KB). v5 rather than v3: the
    same tiles and shared memory, and faster on every bench_verify cell (H200, 2026-12-05: 0.3-7 %, tree and
    causal); v8 is faster still on the largest tree cells (4-6 % at 4096+ keys x 256 nodes x 64 heads) but 10 %
    slower on the small ones, v6 / v7 lead v5 by at most 3 % on a few cells, and v4 ran within -1 .. +5 % of v3."""
    if stage_bytes("v5") or (not stage_bytes("v2") and tiled_fits("v5")):
        return "v5"
    return "v2"


def check_variant(variant) -> str:
    if variant is None:
        return default_variant()
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {', '.join(map(repr, VARIANTS))} or None, got {variant!r}")
    return variant


def masked_attention_ref(q, keys, visible, scale: float, lkv: int):
    """Softmax attention with an explicit boolean mask (float64 math): q [T, N, D], keys [S, D],
    visible [T, S] -> out [T, N, Lkv]. The plain spec every attention kernel here is checked against."""
    k = np.asarray(keys, np.float64)                                               # [S, D]
    T, N, D = q.shape
    s = (np.asarray(q, np.float64).reshape(T * N, D) @ k.T).reshape(T, N, -1) * scale   # [T, N, S]
    s = np.where(np.asarray(visible)[:, None, :], s, -np.inf)
    p = np.exp(s - s.max(axis=2, keepdims=True))
    p /= p.sum(axis=2, keepdims=True)
    return (p.reshape(T * N, -1) @ k[:, :lkv]).reshape(T, N, lkv).astype(np.float32)   # [T, N, Lkv]


def masked_attention_fast(q, keys, visible, scale: float, lkv: int):
    """``masked_attention_ref`` in float32 (BLAS matmuls, float32 exp): what the NumPy backend runs.
    Measured on the 2-core CPU: a 257-node tree verify of the default model spent 13 of 21 s in the float64
    reference, mostly in float64 exp (8x slower than float32). Scores minus their row max are <= 0, so exp cannot
    overflow; the tests hold it to the float64 reference at 1e-5."""
    T, N, D = q.shape
    k = np.asarray(keys, np.float32)                                               # [S, D]
    s = (np.asarray(q, np.float32).reshape(T * N, D) @ k.T).reshape(T, N, -1)      # [T, N, S]
    s *= np.float32(scale)
    s = np.where(np.asarray(visible)[:, None, :], s, np.float32(-np.inf))
    p = np.exp(s - s.max(axis=2, keepdims=True))
    p /= p.sum(axis=2, keepdims=True, dtype=np.float64).astype(np.float32)
    return (p.reshape(T * N, -1) @ k[:, :lkv]).reshape(T, N, lkv)                  # [T, N, Lkv]


def mla_attention_ref(q, cache, start: int, scale: float, lkv: int):
    """Causal absorbed-MLA attention in plain NumPy: token t sees cache rows 0 .. start + t."""
    T = q.shape[0]
    visible = np.arange(start + T)[None, :] <= start + np.arange(T)[:, None]       # [T, start+T]
    return masked_attention_ref(q, np.asarray(cache)[:start + T], visible, scale, lkv)


# ------------------------------------------------------------------------------------------------ v1 kernels
@cuda.jit(device=True)
def _v1_begin(q, t, h0, hn, scale, lkv, qs, o, m_run, l_run):
    """The block's queries (pre-scaled) -> shared; accumulators and softmax state cleared."""
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    D = q.shape[2]
    for i in range(tid, hn * D, nthreads):
        qs[i // D, i % D] = q[t, h0 + i // D, i % D] * scale
    for i in range(tid, hn * lkv, nthreads):
        o[i // lkv, i % lkv] = float32(0.0)
    if tid < HG:
        m_run[tid] = float32(NEG_INF)
        l_run[tid] = float32(0.0)
    cuda.syncthreads()


@cuda.jit(device=True)
def _v1_tile(cache, rows, nk, hn, lkv, qs, ks, sc, o, red, m_run, l_run, alpha):
    """One tile of ``nk`` key rows (their cache indices in ``rows``, written before a barrier): rows -> shared,
    the HG x nk scores, the online softmax, the accumulators. Ends with a barrier (``rows`` may be rewritten)."""
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    D = cache.shape[1]
    for i in range(tid, nk * D, nthreads):                # tile of cache rows -> shared
        ks[i // D, i % D] = cache[rows[i // D], i % D]
    cuda.syncthreads()

    # scores: pair = (head, row); `subs` threads each sum every subs-th dim
    subs = nthreads // 32
    pair = tid % 32
    sub = tid // 32
    h = pair // BK
    j = pair % BK
    acc = float32(0.0)
    if h < hn and j < nk:
        for d in range(sub, D, subs):
            acc += qs[h, d] * ks[j, d]
    red[sub, pair] = acc
    cuda.syncthreads()
    if tid < HG * BK:
        h = tid // BK
        j = tid % BK
        s = float32(0.0)
        for u in range(subs):
            s += red[u, tid]
        sc[h, j] = s if j < nk else float32(NEG_INF)
    cuda.syncthreads()

    # online softmax, one thread per head
    if tid < hn:
        online_softmax_row(sc, tid, nk, m_run, l_run, alpha)
    cuda.syncthreads()

    # accumulators: o[h, c] = o[h, c] * alpha[h] + sum_j p[h, j] * row_j[c]
    for i in range(tid, hn * lkv, nthreads):
        h = i // lkv
        c = i % lkv
        acc = o[h, c] * alpha[h]
        for j in range(nk):
            acc += sc[h, j] * ks[j, c]
        o[h, c] = acc
    cuda.syncthreads()


@cuda.jit(device=True)
def _v1_end(t, h0, hn, z, lkv, direct, o, m_run, l_run, out, o_part, m_part, l_part):
    """The normalised output (one split), or this split's (o, m, l) for ``_combine_kernel``."""
    tid = cuda.threadIdx.x
    for i in range(tid, hn * lkv, cuda.blockDim.x):
        h = i // lkv
        c = i % lkv
        if direct:
            out[t, h0 + h, c] = o[h, c] / l_run[h]
        else:
            o_part[z, t, h0 + h, c] = o[h, c]
    if not direct and tid < hn:
        m_part[z, t, h0 + tid] = m_run[tid]
        l_part[z, t, h0 + tid] = l_run[tid]


@cuda.jit
def _attention_kernel(q, cache, start0, start_dev, scale, split_len, direct, out, o_part, m_part, l_part):
    t = cuda.blockIdx.x
    h0 = cuda.blockIdx.y * HG
    z = cuda.blockIdx.z
    tid = cuda.threadIdx.x
    hn = min(HG, q.shape[1] - h0)
    lkv = out.shape[2]

    qs = cuda.shared.array((HG, MAX_D), float32)
    ks = cuda.shared.array((BK, ROW), float32)
    sc = cuda.shared.array((HG, BK), float32)
    o = cuda.shared.array((HG, MAX_LKV), float32)
    red = cuda.shared.array((MAX_SUBS, PAIRS), float32)
    m_run = cuda.shared.array(HG, float32)
    l_run = cuda.shared.array(HG, float32)
    alpha = cuda.shared.array(HG, float32)
    rows = cuda.shared.array(BK, int32)
    start = start0 + start_dev[0]                        # the host part + the device part (graph replay)

    n_keys = start + t + 1                               # causal: token t sees cache rows 0 .. start + t
    k_lo = z * split_len
    k_hi = min(n_keys, k_lo + split_len)
    _v1_begin(q, t, h0, hn, scale, lkv, qs, o, m_run, l_run)
    for k0 in range(k_lo, k_hi, BK):
        nk = min(BK, k_hi - k0)
        if tid < nk:
            rows[tid] = k0 + tid                         # the tile's cache rows
        cuda.syncthreads()
        _v1_tile(cache, rows, nk, hn, lkv, qs, ks, sc, o, red, m_run, l_run, alpha)
    _v1_end(t, h0, hn, z, lkv, direct, o, m_run, l_run, out, o_part, m_part, l_part)


# ------------------------------------------------------------------------------------------------ v2 kernels
@cuda.jit(device=True)
def _v2_warps():
    """Warps per v2 block: the constant WARPS on the GPU (so every split of the block below - k-parts, column
    groups, lanes per softmax row - is a shift, not a division by a launch value, repeated for every key tile);
    the launch's count on the simulator (``v2_warps``)."""
    return cuda.blockDim.x // 32 if SIM else WARPS


@cuda.jit(device=True)
def _v2_begin(acc, ks, m_run, l_run, D, kt):
    """Accumulators and softmax state cleared; columns D..MAX_D-1 of the key tile's kt rows zeroed once (never
    loaded: the score's k-parts may step past D there). Ends with a barrier."""
    tid = cuda.threadIdx.x
    for i in range(ACC):
        acc[i] = float32(0.0)
    pad = MAX_D - D
    for i in range(tid, kt * pad, cuda.blockDim.x):
        ks[i // pad, D + i % pad] = float32(0.0)
    if tid < MT:
        m_run[tid] = float32(NEG_INF)
        l_run[tid] = float32(0.0)
    cuda.syncthreads()


@cuda.jit(device=True)
def copy_row(dst, d, src, s, D, width, u, step, keep):
    """Issue one row's asynchronous copies: dst[d + c .. d + c + width - 1] = src[s + c ..] for c = u width,
    (u + step) width, .. < D (zeros where not ``keep``): ``step`` threads share the row, this one taking every
    step-th copy of ``width`` floats. The row's offsets d and s come in once; each copy adds a 32-bit column, so a
    copy is the cp.async and a few adds (with a (row, column) pair advanced per copy in 64 bits and both copy
    widths in one loop body, ptxas gave the tree kernel 52 instructions a copy, 18 copies a thread a tile: more
    issue slots than its P V MMAs took). Example: D 576, width 4, step 8, u 3 -> columns 12, 44, .., 556 (18
    copies of 16 bytes)."""
    if width == 4:
        _copy_run(dst, d, src, s, int32(D) >> 2, 4, u, step, keep)
    else:
        _copy_run(dst, d, src, s, int32(D), 1, u, step, keep)


@cuda.jit(device=True)
def _copy_run(dst, d, src, s, dq, w, u, step, keep):
    """``copy_row``'s loop for one copy width w (a literal at each call, so each loop has one kind of cp.async): copies
    u, u + step, .. < dq of w floats, int32 counts (no 64-bit division by a runtime width per row) and a while
    loop (numba's range keeps a 64-bit count with a sign test per step)."""
    n = (dq - int32(u) + int32(step) - int32(1)) // int32(step)   # this thread's copies (0 when u >= dq)
    inc = uint64(step * w)
    d += uint64(u * w)
    s += uint64(u * w)
    i = int32(0)
    while i < n:
        copy_async(dst, d, src, s, w, keep)
        d += inc
        s += inc
        i += int32(1)


@cuda.jit(device=True)
def row_share(kt, nt):
    """(first row, row step, u, threads a row) of this thread in a tile of kt rows copied by the block's ``nt``
    threads: groups of tpr = nt / kt consecutive threads (at least 1), one row per group and pass; u = this
    thread's place in its group (``copy_row``'s). On the GPU kt and nt are constants (tpr 8 for 32-row tiles of
    256 threads, 16 for 16-row tiles), so the splits are shifts."""
    tid = cuda.threadIdx.x
    tpr = max(nt // kt, 1)
    return tid // tpr, nt // tpr, tid % tpr, tpr


@cuda.jit(device=True)
def _v2_load_keys(src, rows, ks, D, width, stride, base, col, kt):
    """Issue the copies of the key tile's kt rows: ks[j, col .. col + D - 1] = the D floats at flat offset
    rows[j] * stride + base of ``src`` (C-contiguous; a cache [C, D]: stride D, base 0; a kv head b of k [S, B, D]:
    stride B D, base b D), zeros where rows[j] < 0 (past the list, or a skipped slot), as asynchronous copies of
    ``width`` floats (kernels/_intrinsics.copy_async: L2 -> shared with no register staging), a group of
    consecutive threads per row (``row_share``, ``copy_row``). The caller waits for them (copy_async_wait) and its
    barrier publishes them."""
    j0, dj, u, tpr = row_share(kt, 32 * _v2_warps())
    for j in range(j0, kt, dj):
        row = rows[j]
        copy_row(ks, uint64(j * ROW_T + col), src, uint64(max(row, 0)) * uint64(stride) + uint64(base), D, width,
                 u, tpr, row >= 0)


@cuda.jit(device=True)
def bulk_begin(ks, mbar, kt):
    """Before a kernel's first ``bulk_load_keys``: the mbarrier initialised (one arrival a phase) and the whole key
    tile zeroed - rows that are never copied (past the list, skipped slots) keep finite contents, which their
    masks then hide (stale rows of earlier tiles are finite too). The zeros are ordinary stores the copy engine's
    writes must come after (``fence_proxy_async``); the caller's barrier publishes both."""
    tid = cuda.threadIdx.x
    if tid == 0:
        mbar_init(mbar, 1)
    for i in range(tid, kt * MAX_D, cuda.blockDim.x):
        ks[i // MAX_D, i % MAX_D] = float32(0.0)
    fence_proxy_async()


@cuda.jit(device=True)
def bulk_load_keys(src, rows, ks, D, stride, base, mbar, phase, kt):
    """The key tile by the copy engine: lane j < kt of warp 0 copies row j (``rows[j]`` >= 0; D floats from flat
    offset rows[j] * stride + base, 16-byte aligned) with one ``bulk_copy``, lane 0 first announcing the tile's
    bytes on ``mbar`` (a ballot counts the rows); every thread then waits for phase ``phase`` to complete. Where
    ``_v2_load_keys`` issues 18 16-byte copies a thread (D 576), this is one instruction a row. Rows < 0 are left
    as they are (``bulk_begin``). The caller's barrier follows, as after ``_v2_load_keys``."""
    tid = cuda.threadIdx.x
    if tid < 32:
        row = rows[tid] if tid < kt else -1
        if not SIM:                                      # (the simulator's stand-ins copy at once: no count)
            valid = cuda.ballot_sync(FULL, row >= 0)
            if tid == 0:
                mbar_expect_tx(mbar, cuda.popc(valid) * D * 4)
            cuda.syncwarp(FULL)
        if row >= 0:
            fence_proxy_async()                          # this tile's reads of the previous rows came first
            bulk_copy(ks, uint64(tid * ROW_T), src, uint64(row) * uint64(stride) + uint64(base), D * 4, mbar)
    while not mbar_try_wait(mbar, phase):
        pass


@cuda.jit(device=True)
def _v2_qrow(r, n, G, nq, b):
    """The row of the flat query / output arrays ``[T * Nq, .]`` that tile row r of kv head b stands for: a kv
    head's tile rows are its G query heads of each token, token-major (r = t G + j -> token t, query head
    b G + j); r past the head's n = T G rows clamps to the last. Absorbed MLA (one kv head, G = Nq): r itself."""
    r = min(r, n - 1)
    t = r // G
    return uint64(t * nq + b * G + (r - t * G))


@cuda.jit(device=True)
def _v2_score_mma(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ks, d, g, s, scratch, nbs):
    """The MMAs of one k8 step of a warp's scores S [16 query rows, 8 nbs keys] at dims d = 8 kk + t, given the
    split A fragments: the B fragments (keys 8 nb + g of the tile ``ks``, nb < nbs) split for 3xTF32, whose three
    TF32 products add into three accumulator sets of ``s`` [product][n8 block][c0..c3] (12 nbs floats; nbs = 2
    for 16-key tiles, 4 for 32). ``range(nbs)``, not a guarded ``range(4)``: with the guard LLVM no longer
    unrolled v2's k8 loop three times (ptxas: 36 -> 12 score HMMAs in the binary, 205 -> 188 registers; v2 ran
    2-3 % slower on the H200); with nbs folded from the caller's constant, v2's binary has its old shape again."""
    for nb in range(nbs):                                # B[k][n] = K^T[dim][key] = ks[8 nb + n, dim]
        bh0, bl0 = split_tf32_fast(ks[uint64(nb * 8 + g), uint64(d)])
        bh1, bl1 = split_tf32_fast(ks[uint64(nb * 8 + g), uint64(d + 4)])
        _score_mma3(ah0, ah1, ah2, ah3, al0, al1, al2, al3, bh0, bh1, bl0, bl1, s, 4 * nb, 4 * nbs, scratch)


@cuda.jit(device=True)
def _score_mma3(ah0, ah1, ah2, ah3, al0, al1, al2, al3, bh0, bh1, bl0, bl1, s, i, ps, scratch):
    """One n8 block's three 3xTF32 products into three accumulator sets: s[i ..] += lo.hi, s[ps + i ..] += hi.lo,
    s[2 ps + i ..] += hi.hi (each set ``ps`` floats apart; summed small-first at the end)."""
    s[i], s[i + 1], s[i + 2], s[i + 3] = mma_m16n8k8_tf32(
        al0, al1, al2, al3, bh0, bh1, s[i], s[i + 1], s[i + 2], s[i + 3], scratch)
    i += ps
    s[i], s[i + 1], s[i + 2], s[i + 3] = mma_m16n8k8_tf32(
        ah0, ah1, ah2, ah3, bl0, bl1, s[i], s[i + 1], s[i + 2], s[i + 3], scratch)
    i += ps
    s[i], s[i + 1], s[i + 2], s[i + 3] = mma_m16n8k8_tf32(
        ah0, ah1, ah2, ah3, bh0, bh1, s[i], s[i + 1], s[i + 2], s[i + 3], scratch)


@cuda.jit(device=True)
def _v2_score_step(q, ks, ra, rb, d, D, g, s, scratch, nbs):
    """One k8 step of a warp's scores (``_v2_score_mma``) with the A fragments from global q: q rows ra, rb, dims
    d and d + 4, clamped to D - 1 (past D the key tile holds zeros, so any finite q will do)."""
    da = uint64(min(d, D - 1))
    db = uint64(min(d + 4, D - 1))
    ah0, al0 = split_tf32_fast(q[ra, da])
    ah1, al1 = split_tf32_fast(q[rb, da])
    ah2, al2 = split_tf32_fast(q[ra, db])
    ah3, al3 = split_tf32_fast(q[rb, db])
    _v2_score_mma(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ks, d, g, s, scratch, nbs)


@cuda.jit(device=True)
def _v2_stage_q(q, qs, r0, rows, stride, n, G, nq, b, D, width):
    """Copy a block's query rows - tile rows r0 .. r0 + rows - 1 of kv head b as q rows (``_v2_qrow``: past the end
    clamped to the last) - into the dynamic shared ``qs`` [rows, stride], columns D .. D rounded up to 8 zeroed
    (the last k8 step reads them against the key tile's zeros); completed by the first key tile's wait and
    barrier. Every k8 step of every key tile then reads its A fragments from here: from global memory they cost a
    64-bit row x stride product and two clamps per load (measured on gqa_attention's v3: 25 % of the kernel's
    time). The tiled kernels stage MT rows of Q_STRIDE2 only in splits of at least STAGE_MIN_KEYS keys
    (``_v2_scores``; the launch reserves Q_BYTES2 either way, where the device allows); gqa_attention's v4 stages
    its 128 rows always."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    pad = (D + 7) // 8 * 8 - D
    for i in range(tid, rows * pad, nt):
        qs[(i // pad) * stride + D + i % pad] = float32(0.0)
    j0, dj, u, tpr = row_share(rows, nt)
    for j in range(j0, rows, dj):
        copy_row(qs, uint64(j * stride), q, _v2_qrow(r0 + j, n, G, nq, b) * uint64(D), D, width, u, tpr, True)


@cuda.jit(device=True)
def _store_scores3(sp, s, kp, r, t, nbs):
    """A warp's partial scores of one m16 block (three sets, ``_score_mma3``) summed small-first into sp[kp]:
    rows r and r + 8, keys 8 nb + 2t (+ 1)."""
    ps = 4 * nbs
    for nb in range(KT3 // 8):
        if nb < nbs:
            i = 4 * nb
            sp[kp, r, nb * 8 + 2 * t] = (s[i] + s[ps + i]) + s[2 * ps + i]
            sp[kp, r, nb * 8 + 2 * t + 1] = (s[i + 1] + s[ps + i + 1]) + s[2 * ps + i + 1]
            sp[kp, r + 8, nb * 8 + 2 * t] = (s[i + 2] + s[ps + i + 2]) + s[2 * ps + i + 2]
            sp[kp, r + 8, nb * 8 + 2 * t + 1] = (s[i + 3] + s[ps + i + 3]) + s[2 * ps + i + 3]


@cuda.jit(device=True)
def _store_scores_wide(sp, s, kp, g, t, nbs):
    """A warp's partial scores of both m16 blocks (two sets, ``_score_mma_wide``) into sp[kp]."""
    ps = 8 * nbs
    for m in range(MB):
        for nb in range(KT3 // 8):
            if nb < nbs:
                i = 4 * nbs * m + 4 * nb
                r = m * 16 + g
                sp[kp, r, nb * 8 + 2 * t] = s[i] + s[ps + i]
                sp[kp, r, nb * 8 + 2 * t + 1] = s[i + 1] + s[ps + i + 1]
                sp[kp, r + 8, nb * 8 + 2 * t] = s[i + 2] + s[ps + i + 2]
                sp[kp, r + 8, nb * 8 + 2 * t + 1] = s[i + 3] + s[ps + i + 3]


@cuda.jit(device=True)
def _v2_scores(q, qs, staged, ks, sp, r0, n, G, nq, b, D, scratch, kt):
    """Partial scores on tensor cores: warp w -> m16 block mb = w // kparts, k-part kp = w % kparts;
    sp[kp, 16 mb .. 16 mb + 15, 0..kt-1] = Q[rows, dims of kp] @ ks[0..kt-1, dims of kp]^T (unscaled, 3xTF32).
    A fragments (the query rows r0 + 16 mb + g, + 8 of kv head b) from the block's staged rows ``qs`` when
    ``staged`` (``_v2_stage_q``: splits of at least STAGE_MIN_KEYS keys), else straight from global q
    (``_v2_qrow``'s rows: a block of a few dozen keys - a decode step's split - would only pay the staging's
    latency); B fragments
    (the keys, columns 0 .. D - 1 of the tile) from the shared tile; no k8 step starts at or past D.
    The three TF32 products (lo.hi, hi.lo, hi.hi) go to three accumulator sets, summed at the end: six
    independent MMA chains per warp instead of two chains three times as long (an MMA waits for the one before it
    on the same accumulators). Indices are unsigned: numba's negative-index test costs a compare and a select per
    axis of every load."""
    g, t, mb, kp, kk, k_end, steps = _score_part(D, _v2_warps() // MB)
    nbs = kt // 8                                        # n8 blocks of keys
    s = cuda.local.array(SCORE_ACC, float32)             # [product][n8 block][c0..c3] (registers: 12 nbs used)
    for i in range(SCORE_ACC):
        s[i] = float32(0.0)
    if staged:
        qa = uint64((mb * 16 + g) * Q_STRIDE2 + t)       # this lane's A-fragment rows g, g + 8 in qs (column t)
        qb = qa + uint64(8 * Q_STRIDE2)
        while kk < k_end:                                # (numba's range: a 64-bit count, a sign test a step)
            o = uint64(kk * 8)
            ah0, al0 = split_tf32_fast(qs[qa + o])
            ah1, al1 = split_tf32_fast(qs[qb + o])
            ah2, al2 = split_tf32_fast(qs[qa + o + uint64(4)])
            ah3, al3 = split_tf32_fast(qs[qb + o + uint64(4)])
            _v2_score_mma(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ks, kk * 8 + t, g, s, scratch, nbs)
            kk += int32(1)
    else:
        ra = _v2_qrow(r0 + mb * 16 + g, n, G, nq, b)
        rb = _v2_qrow(r0 + mb * 16 + g + 8, n, G, nq, b)
        for kk in range(kk, k_end):
            _v2_score_step(q, ks, ra, rb, kk * 8 + t, D, g, s, scratch, nbs)
    _store_scores3(sp, s, kp, mb * 16 + g, t, nbs)


@cuda.jit(device=True)
def split_range(z, split_len, n_list, kt):
    """(k_lo, k_hi, split_len): split z's run k_lo .. k_hi - 1 of a block's key list of ``n_list`` keys. A planned
    ``split_len`` (whole tiles) is used as it is; 0 means *sized on the device*: the list's own tiles shared out
    over the grid's ``gridDim.y`` splits. A launch whose key count lives on the device (graph replay) plans its
    grid for the cache's capacity; with a planned length, the splits past the real keys would sit idle while the
    first ones each walk a capacity-sized run (H200, the default pair, a 512-row cache at start 120: a 33-token
    tree verify 27.0 us, 19.6 with the plan sized for its real keys). Example: 150 keys, 16-key tiles, 11 splits:
    10 tiles -> runs of one tile; splits 0 .. 9 carry keys (split 9 the last 6), split 10 starts past the list
    (k_lo = 160 >= k_hi = 150: the kernel marks it with ``past_the_list`` and returns)."""
    if split_len == 0:
        split_len = ((n_list + kt - 1) // kt + cuda.gridDim.y - 1) // cuda.gridDim.y * kt
    k_lo = z * split_len
    return k_lo, min(n_list, k_lo + split_len), split_len


@cuda.jit(device=True)
def past_the_list(r0, n, G, nq, b, z, m_part, l_part):
    """Mark split z as past the key list of the block's tile rows r0 .. r0 + 31 (< n): l = -1, m = -inf, no o
    (``_combine_kernel`` stops at the first such split; they are a suffix of the splits: ``split_range``)."""
    tid = cuda.threadIdx.x
    if tid < MT and r0 + tid < n:
        r = _v2_qrow(r0 + tid, n, G, nq, b)
        m_part[z, r] = float32(NEG_INF)
        l_part[z, r] = float32(-1.0)


@cuda.jit(device=True)
def _v2_row(kt):
    """This thread's share of the softmax of a tile of kt keys: (query row r, first key j0, keys per thread). The
    block's threads split into MT groups of G = threads / MT consecutive lanes (8 on the GPU), one group per query
    row, each lane taking kt / G consecutive keys (2 on the GPU for kt = 16, 4 for 32)."""
    tid = cuda.threadIdx.x
    G = 32 * _v2_warps() // MT
    return tid // G, tid % G * (kt // G), kt // G


@cuda.jit(device=True)
def _v2_softmax(sp, vis, scale, m_run, l_run, alpha, buf, kt, parts):
    """The tile's scores and online softmax, every thread of the block (``_v2_row``'s mapping): this lane's keys'
    scores s_j = scale * the sum of the ``parts`` k-parts (warps / MB; v4: warps), or -inf where bit j - j0 of
    ``vis`` is clear (the kernel's mask); the
    row's m = max(m, max_j s_j) and sum over its G lanes (group_max / group_sum: shuffles), alpha = exp(m_old - m),
    sp[0, r, j] = P = exp(s_j - m), l = alpha l + sum_j P. A row whose keys are all hidden so far keeps m = -inf,
    l = 0 and gets alpha = 1, P = 0 (a split past a token's last key, a tree slot of another token).
    ``buf``: primitives.GROUP_BUF floats of shared scratch (the simulator's)."""
    r, j0, kpt = _v2_row(kt)
    G = 32 * _v2_warps() // MT
    s = cuda.local.array(KT3, float32)                   # this lane's scores (registers: kpt <= KT3, unrolled)
    m_old = m_run[r]
    mx = m_old
    for jj in range(KT3):
        if jj < kpt:
            v = float32(0.0)
            for p in range(KPARTS4):
                if p < parts:
                    v += sp[p, r, j0 + jj]
            v = v * scale if (vis >> jj) & 1 else float32(NEG_INF)
            s[jj] = v
            mx = max(mx, v)
    mx = group_max(mx, G, buf)
    a = float32(1.0)
    lsum = float32(0.0)
    for jj in range(KT3):
        if jj < kpt:
            e = float32(0.0) if mx == NEG_INF else float32(math.exp(s[jj] - mx))
            sp[0, r, j0 + jj] = e
            lsum += e
    lsum = group_sum(lsum, G, buf)
    if mx != NEG_INF:
        a = float32(math.exp(m_old - mx))
    if cuda.threadIdx.x % G == 0:
        m_run[r] = mx
        l_run[r] = l_run[r] * a + lsum
        alpha[r] = a


@cuda.jit(device=True)
def _v2_pv(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ks, ka, kb, c, acc, f, scratch):
    """acc fragment f += P V for one k8 step: B = V [keys ka, kb; column c + 8 f] from the key tile."""
    col = c + uint64(f * 8)                              # unsigned: no negative-index test per fragment
    bh0, bl0 = split_tf32_fast(ks[ka, col])
    bh1, bl1 = split_tf32_fast(ks[kb, col])
    acc[4 * f], acc[4 * f + 1], acc[4 * f + 2], acc[4 * f + 3] = mma_m16n8k8_3xtf32(
        ah0, ah1, ah2, ah3, al0, al1, al2, al3, bh0, bh1, bl0, bl1,
        acc[4 * f], acc[4 * f + 1], acc[4 * f + 2], acc[4 * f + 3], scratch)


@cuda.jit(device=True)
def _v2_accumulate(sp, ks, acc, alpha, lkv, vo, scratch, kt):
    """O = alpha O + P V on tensor cores: warp w -> m16 block mb = w // groups and the Lkv columns of column group
    w % groups (``frags`` n8 fragments from column cg * 8 * frags); acc[4 f + i] holds this lane's d_i of fragment
    f (rows g and g + 8, columns 2t and 2t + 1). P comes from sp[0], V from the key tile ks[:, vo .. vo + Lkv - 1]
    (absorbed MLA: vo = 0, the latent itself; separate values: after the keys).
    With all FRAGS fragments in use (Lkv = 512 on the GPU) the loop has no guard: a guard per fragment puts each
    fragment's three dependent MMAs in their own basic block, and ptxas then cannot interleave the fragments."""
    tid = cuda.threadIdx.x
    lane = tid % 32
    g = lane // 4
    t = lane % 4
    groups = _v2_warps() // MB
    mb = tid // 32 // groups
    frags = (lkv + 8 * groups - 1) // (8 * groups)
    col0 = tid // 32 % groups * frags * 8
    _v2_pv_tile(sp[0], uint64(mb * 16 + g), uint64(mb * 16 + g + 8), t, ks, uint64(col0 + g + vo), acc, frags,
                alpha[mb * 16 + g], alpha[mb * 16 + g + 8], scratch, kt // 8)


@cuda.jit(device=True)
def _rescale_needed(pred):
    """Whether any lane of the warp has ``pred`` (a factor other than 1): one vote on the GPU, warp-uniform, so the
    rescale it guards is skipped whole or run whole. Multiplying by 1 changes nothing, and once a row's running
    max has settled - most key tiles of a long context - every factor of the warp's rows is 1. The simulator has no
    vote: it always rescales (the same values)."""
    return True if SIM else cuda.any_sync(FULL, pred)


@cuda.jit(device=True)
def _v2_rescale(acc, frags, xa, xb):
    """The online softmax's rescale of this lane's ``frags`` n8 fragments of accumulators: rows g (c0, c1) by xa,
    rows g + 8 (c2, c3) by xb - skipped when every factor of the warp is 1 (``_rescale_needed``)."""
    if not _rescale_needed(xa != float32(1.0) or xb != float32(1.0)):
        return
    for f in range(FRAGS):
        if f < frags:
            acc[4 * f] *= xa
            acc[4 * f + 1] *= xa
            acc[4 * f + 2] *= xb
            acc[4 * f + 3] *= xb


@cuda.jit(device=True)
def _v2_pv_frags(ah0, ah1, ah2, ah3, al0, al1, al2, al3, vs, ka, kb, c, acc, frags, scratch):
    """One k8 step of O += P V into this lane's ``frags`` n8 fragments (value columns c + 8 f): A = P's split
    fragments, B = vs[keys ka, kb; columns c + 8 f]. With all FRAGS fragments in use the loop has no guard (see
    ``_v2_accumulate``)."""
    if frags == FRAGS:
        for f in range(FRAGS):
            _v2_pv(ah0, ah1, ah2, ah3, al0, al1, al2, al3, vs, ka, kb, c, acc, f, scratch)
    else:
        for f in range(FRAGS):
            if f < frags:
                _v2_pv(ah0, ah1, ah2, ah3, al0, al1, al2, al3, vs, ka, kb, c, acc, f, scratch)


@cuda.jit(device=True)
def _v2_pv_tile(p, pa, pb, t, vs, c, acc, frags, xa, xb, scratch, ksteps):
    """One key tile's O = alpha O + P V for this lane: its ``frags`` n8 fragments of accumulators (rows pa, pb of
    P; value columns c + 8 f) rescaled by xa (row pa) and xb (row pb), then ``ksteps`` k8 steps of P [rows, 8 ksteps
    keys] (A fragments from the shared ``p``) @ V [keys, columns] (B fragments from the shared tile ``vs``, rows =
    keys)."""
    _v2_rescale(acc, frags, xa, xb)
    for kk in range(ksteps):
        ah0, al0 = split_tf32_fast(p[pa, uint64(kk * 8 + t)])            # A = P [rows, keys]
        ah1, al1 = split_tf32_fast(p[pb, uint64(kk * 8 + t)])
        ah2, al2 = split_tf32_fast(p[pa, uint64(kk * 8 + t + 4)])
        ah3, al3 = split_tf32_fast(p[pb, uint64(kk * 8 + t + 4)])
        _v2_pv_frags(ah0, ah1, ah2, ah3, al0, al1, al2, al3, vs, uint64(kk * 8 + t), uint64(kk * 8 + t + 4), c,
                     acc, frags, scratch)                                 # B = V [keys, columns]


@cuda.jit(device=True)
def _v2_end(acc, m_run, l_run, r0, n, G, nq, b, z, direct, out, o_part, m_part, l_part):
    """The normalised rows O / l of tile rows r0 .. r0 + 31 (< n) of kv head b, at their query rows (``_v2_qrow``)
    of ``out`` (one split), or this split's (O, m, l) for ``_combine_kernel``. Same warp -> (m16 block, columns)
    mapping as ``_v2_accumulate``."""
    tid = cuda.threadIdx.x
    groups = _v2_warps() // MB
    frags = (out.shape[1] + 8 * groups - 1) // (8 * groups)
    _v2_end_block(acc, 0, FRAGS, frags, tid // 32 % groups * frags * 8, tid // 32 // groups, l_run, r0, n, G, nq, b,
                  z, direct, out, o_part)
    _v2_end_stats(m_run, l_run, r0, n, G, nq, b, z, direct, m_part, l_part)


@cuda.jit(device=True)
def _v2_end_block(acc, base, nf, frags, col0, mb, l_run, r0, n, G, nq, b, z, direct, out, o_part):
    """One m16 block's share of ``_v2_end``: this lane's ``frags`` fragments (of at most ``nf``, a constant: the
    accumulators' loop must unroll to constant indices or ptxas moves ``acc`` to local memory) at acc[base ..],
    output columns col0 + 8 f + 2 t (+ 1), rows g and g + 8 of block mb."""
    lane = cuda.threadIdx.x % 32
    g = lane // 4
    t = lane % 4
    ta = r0 + mb * 16 + g                                # this lane's tile rows: g and g + 8 of its m16 block
    tb = ta + 8
    ra = _v2_qrow(ta, n, G, nq, b)
    rb = _v2_qrow(tb, n, G, nq, b)
    ia = float32(1.0) / l_run[mb * 16 + g] if direct and ta < n else float32(1.0)
    ib = float32(1.0) / l_run[mb * 16 + g + 8] if direct and tb < n else float32(1.0)
    for f in range(nf):
        c = col0 + f * 8 + 2 * t                         # this lane's columns: c and c + 1
        i = base + 4 * f
        if f < frags:
            if ta < n:
                _v2_store(out, o_part, z, direct, ra, c, acc[i] * ia, acc[i + 1] * ia)
            if tb < n:
                _v2_store(out, o_part, z, direct, rb, c, acc[i + 2] * ib, acc[i + 3] * ib)


@cuda.jit(device=True)
def _v2_end_stats(m_run, l_run, r0, n, G, nq, b, z, direct, m_part, l_part):
    """A split's (m, l) of the tile's rows for ``_combine_kernel`` (nothing when the block writes ``out`` directly)."""
    tid = cuda.threadIdx.x
    if not direct and tid < MT and r0 + tid < n:
        r = _v2_qrow(r0 + tid, n, G, nq, b)
        m_part[z, r] = m_run[tid]
        l_part[z, r] = l_run[tid]


@cuda.jit(device=True)
def _v4_end(acc, m_run, l_run, r0, n, G, nq, b, z, direct, out, o_part, m_part, l_part):
    """``_v2_end`` for ``_v4_accumulate``'s mapping: warp w's columns of both m16 blocks (acc[4 FRAGS4 m ..])."""
    groups = _v2_warps()
    frags = (out.shape[1] + 8 * groups - 1) // (8 * groups)
    col0 = cuda.threadIdx.x // 32 * frags * 8
    for mb in range(MB):
        _v2_end_block(acc, 4 * FRAGS4 * mb, FRAGS4, frags, col0, mb, l_run, r0, n, G, nq, b, z, direct, out, o_part)
    _v2_end_stats(m_run, l_run, r0, n, G, nq, b, z, direct, m_part, l_part)


@cuda.jit(device=True)
def _v2_store(out, o_part, z, direct, r, c, v0, v1):
    """Row r, columns c and c + 1 of the output (direct) or of split z's partial, where they exist."""
    for e in range(2):
        if c + e < out.shape[1]:
            if direct:
                out[r, c + e] = v0 if e == 0 else v1
            else:
                o_part[z, r, c + e] = v0 if e == 0 else v1


# ------------------------------------------------------------------------------------------------ v4 (wide warps)
@cuda.jit(device=True)
def _v4_score_mma(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3, ks, d, g, s,
                  scratch, nbs):
    """``_v2_score_mma`` for both m16 blocks of the tile: A fragments of block 0 (ah*, al*) and block 1 (ch*, cl*),
    each key's B fragment loaded and split once for both blocks. Two accumulator sets, not three: the small
    products lo.hi and hi.lo chain into one, hi.hi has its own (what keeps 3xTF32 fp32-grade is that the small
    terms are not added into the large sum one MMA at a time; with three sets of 2 x nbs x 4 the kernel took 255
    registers and spilled). ``s`` [set][block][n8 block][c0..c3] (16 nbs floats); per n8 block and block one
    chain of two MMAs and one of one - 16 independent chains a warp at nbs = 4."""
    for nb in range(nbs):
        bh0, bl0 = split_tf32_fast(ks[uint64(nb * 8 + g), uint64(d)])
        bh1, bl1 = split_tf32_fast(ks[uint64(nb * 8 + g), uint64(d + 4)])
        _score_mma_wide(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3,
                        bh0, bh1, bl0, bl1, s, nb, nbs, scratch)


@cuda.jit(device=True)
def _score_mma_wide(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3, bh0, bh1, bl0,
                    bl1, s, nb, nbs, scratch):
    """n8 block nb of both m16 blocks (A fragments a*, c*) against one split key fragment: per block the small
    products chained into set 0 and hi.hi into set 1 (``s`` [set][block][n8 block][c0..c3], sets 8 nbs apart)."""
    ps = 8 * nbs                                         # one set's accumulators, both blocks
    i = 4 * nb                                           # block 0
    s[i], s[i + 1], s[i + 2], s[i + 3] = mma_m16n8k8_tf32(
        al0, al1, al2, al3, bh0, bh1, s[i], s[i + 1], s[i + 2], s[i + 3], scratch)
    s[i], s[i + 1], s[i + 2], s[i + 3] = mma_m16n8k8_tf32(
        ah0, ah1, ah2, ah3, bl0, bl1, s[i], s[i + 1], s[i + 2], s[i + 3], scratch)
    i = ps + 4 * nb
    s[i], s[i + 1], s[i + 2], s[i + 3] = mma_m16n8k8_tf32(
        ah0, ah1, ah2, ah3, bh0, bh1, s[i], s[i + 1], s[i + 2], s[i + 3], scratch)
    i = 4 * nbs + 4 * nb                                 # block 1
    s[i], s[i + 1], s[i + 2], s[i + 3] = mma_m16n8k8_tf32(
        cl0, cl1, cl2, cl3, bh0, bh1, s[i], s[i + 1], s[i + 2], s[i + 3], scratch)
    s[i], s[i + 1], s[i + 2], s[i + 3] = mma_m16n8k8_tf32(
        ch0, ch1, ch2, ch3, bl0, bl1, s[i], s[i + 1], s[i + 2], s[i + 3], scratch)
    i = ps + 4 * nbs + 4 * nb
    s[i], s[i + 1], s[i + 2], s[i + 3] = mma_m16n8k8_tf32(
        ch0, ch1, ch2, ch3, bh0, bh1, s[i], s[i + 1], s[i + 2], s[i + 3], scratch)


@cuda.jit(device=True)
def _v4_staged_a(qs, o):
    """One m16 block's A fragments, split for 3xTF32, from the staged rows (flat ``qs``): offsets o, o + 8
    Q_STRIDE2 (rows g, g + 8) and the same + 4 (dims t + 4), where o is the lane's row g at dim t of this k8 step.
    Returns (h0, h1, h2, h3, l0, l1, l2, l3)."""
    h0, l0 = split_tf32_fast(qs[o])
    h1, l1 = split_tf32_fast(qs[o + uint64(8 * Q_STRIDE2)])
    h2, l2 = split_tf32_fast(qs[o + uint64(4)])
    h3, l3 = split_tf32_fast(qs[o + uint64(8 * Q_STRIDE2 + 4)])
    return h0, h1, h2, h3, l0, l1, l2, l3


@cuda.jit(device=True)
def _v4_a_frags(src, ra, rb, da, db):
    """One m16 block's A fragments, split for 3xTF32, from a 2-D array (global q; P in shared memory): rows ra /
    rb (g, g + 8), columns da / db (t, t + 4). Returns (h0, h1, h2, h3, l0, l1, l2, l3)."""
    h0, l0 = split_tf32_fast(src[ra, da])
    h1, l1 = split_tf32_fast(src[rb, da])
    h2, l2 = split_tf32_fast(src[ra, db])
    h3, l3 = split_tf32_fast(src[rb, db])
    return h0, h1, h2, h3, l0, l1, l2, l3


@cuda.jit(device=True)
def _score_part(D, kparts):
    """This lane's share of a tile's scores: (g, t, m16 block, k-part, first k8 step, end step, steps a part) -
    warp w takes k-part w % kparts of m16 block w // kparts (v4 / v7: kparts = warps, every warp block 0 ..)."""
    tid = cuda.threadIdx.x
    lane = tid % 32
    w = tid // 32
    ksteps = (D + 7) // 8
    steps = (ksteps + kparts - 1) // kparts              # k8 steps per k-part (the last part may have fewer)
    kp = w % kparts
    return lane // 4, lane % 4, w // kparts, kp, int32(kp * steps), int32(min(kp * steps + steps, ksteps)), steps


@cuda.jit(device=True)
def _v4_rows(r0, g, n, G, nq, b):
    """The q rows of a wide warp's four A-fragment rows g, g + 8, g + 16, g + 24 of the tile (``_v2_qrow``)."""
    return (_v2_qrow(r0 + g, n, G, nq, b), _v2_qrow(r0 + g + 8, n, G, nq, b), _v2_qrow(r0 + g + 16, n, G, nq, b),
            _v2_qrow(r0 + g + 24, n, G, nq, b))


@cuda.jit(device=True)
def _v4_global_a(q, ra, rb, rc, rd, d, D):
    """Both m16 blocks' split A fragments of one k8 step from global q (rows ``_v4_rows``, dims d, d + 4 clamped
    to D - 1: past D the key tile holds zeros, so any finite q will do)."""
    da = uint64(min(d, D - 1))
    db = uint64(min(d + 4, D - 1))
    ah0, ah1, ah2, ah3, al0, al1, al2, al3 = _v4_a_frags(q, ra, rb, da, db)
    ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3 = _v4_a_frags(q, rc, rd, da, db)
    return ah0, ah1, ah2, ah3, al0, al1, al2, al3, ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3


@cuda.jit(device=True)
def _v4_scores(q, qs, staged, ks, sp, r0, n, G, nq, b, D, scratch, kt):
    """``_v2_scores`` with warp w on k-part w of both m16 blocks: sp[w, 0..31, 0..kt-1] = Q[rows, dims of w] @
    ks[0..kt-1, dims of w]^T (unscaled, 3xTF32, two accumulator sets). Per k8 step a warp loads and splits 8 A
    and 8 B values for 24 MMAs, where v2 / v3's warps (one block each) take 4 A and 8 B for 12: the B side is
    split once for both blocks. A fragments from the staged rows when ``staged``, else from global q."""
    g, t, mb, kp, kk, k_end, steps = _score_part(D, _v2_warps())
    nbs = kt // 8
    s = cuda.local.array(SCORE_ACC4, float32)            # [set][block][n8 block][c0..c3] (registers)
    for i in range(SCORE_ACC4):
        s[i] = float32(0.0)
    if staged:
        qa = uint64(g * Q_STRIDE2 + t)                   # block 0's rows g, g + 8; block 1's 16 + g, 24 + g
        while kk < k_end:
            o = qa + uint64(kk * 8)
            ah0, ah1, ah2, ah3, al0, al1, al2, al3 = _v4_staged_a(qs, o)
            ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3 = _v4_staged_a(qs, o + uint64(16 * Q_STRIDE2))
            _v4_score_mma(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3, ks,
                          kk * 8 + t, g, s, scratch, nbs)
            kk += int32(1)
    else:
        ra, rb, rc, rd = _v4_rows(r0, g, n, G, nq, b)
        while kk < k_end:
            d = kk * 8 + t
            (ah0, ah1, ah2, ah3, al0, al1, al2, al3,
             ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3) = _v4_global_a(q, ra, rb, rc, rd, d, D)
            _v4_score_mma(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3, ks, d, g,
                          s, scratch, nbs)
            kk += int32(1)
    if SIM:                                              # the simulator's MMA is a block barrier: every warp makes
        z = float32(0.0)                                 # as many calls (zero A: adds nothing), or a warp of fewer
        while kk < kp * steps + steps:                   # steps would run ahead into the softmax
            _v4_score_mma(z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, ks, t, g, s, scratch, nbs)
            kk += int32(1)
    _store_scores_wide(sp, s, kp, g, t, nbs)


@cuda.jit(device=True)
def _v4_pv(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3, vs, ka, kb, col, acc, f,
           scratch):
    """One k8 step of fragment f of both m16 blocks: B = V [keys ka, kb; column col] split once, then block 0's
    acc[4 f ..] += P0 V and block 1's acc[4 FRAGS4 + 4 f ..] += P1 V (3xTF32 each)."""
    bh0, bl0 = split_tf32_fast(vs[ka, col])
    bh1, bl1 = split_tf32_fast(vs[kb, col])
    i = 4 * f
    acc[i], acc[i + 1], acc[i + 2], acc[i + 3] = mma_m16n8k8_3xtf32(
        ah0, ah1, ah2, ah3, al0, al1, al2, al3, bh0, bh1, bl0, bl1, acc[i], acc[i + 1], acc[i + 2], acc[i + 3],
        scratch)
    i = 4 * FRAGS4 + 4 * f
    acc[i], acc[i + 1], acc[i + 2], acc[i + 3] = mma_m16n8k8_3xtf32(
        ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3, bh0, bh1, bl0, bl1, acc[i], acc[i + 1], acc[i + 2], acc[i + 3],
        scratch)


@cuda.jit(device=True)
def _v4_accumulate(sp, ks, acc, alpha, lkv, vo, scratch, kt):
    """O = alpha O + P V with warp w on Lkv column group w of both m16 blocks: frags = ceil(Lkv / (8 warps)) n8
    fragments from column 8 frags w (8 at Lkv 512); acc[4 FRAGS4 m + 4 f + i] holds d_i of block m's fragment f.
    P from sp[0] (A fragments of both blocks, split per k8 step), V from the key tile ks[:, vo ..]: a value's
    B fragment is loaded and split once for both blocks' MMAs, where ``_v2_accumulate``'s warps (one block each,
    twice the columns) split every value twice over the block. Same registers: 2 x 8 x 4 accumulators."""
    tid = cuda.threadIdx.x
    lane = tid % 32
    g = lane // 4
    t = lane % 4
    groups = _v2_warps()
    frags = (lkv + 8 * groups - 1) // (8 * groups)
    c = uint64(tid // 32 * frags * 8 + g + vo)           # this lane's B column: fragment f at c + 8 f
    p = sp[0]
    xa, xb, xc, xd = alpha[g], alpha[g + 8], alpha[g + 16], alpha[g + 24]
    one = float32(1.0)
    if _rescale_needed(xa != one or xb != one or xc != one or xd != one):
        for f in range(FRAGS4):                          # unused fragments stay 0 whatever the factor
            i = 4 * f
            acc[i] *= xa
            acc[i + 1] *= xa
            acc[i + 2] *= xb
            acc[i + 3] *= xb
            i += 4 * FRAGS4
            acc[i] *= xc
            acc[i + 1] *= xc
            acc[i + 2] *= xd
            acc[i + 3] *= xd
    ra, rb, rc, rd = uint64(g), uint64(g + 8), uint64(g + 16), uint64(g + 24)
    for kk in range(kt // 8):
        ka = uint64(kk * 8 + t)
        kb = ka + uint64(4)
        ah0, ah1, ah2, ah3, al0, al1, al2, al3 = _v4_a_frags(p, ra, rb, ka, kb)
        ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3 = _v4_a_frags(p, rc, rd, ka, kb)
        if frags == FRAGS4:                              # no guard: see _v2_accumulate
            for f in range(FRAGS4):
                _v4_pv(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3, ks, ka, kb,
                       c + uint64(8 * f), acc, f, scratch)
        else:
            for f in range(FRAGS4):
                if f < frags:
                    _v4_pv(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3, ks, ka,
                           kb, c + uint64(8 * f), acc, f, scratch)


# ------------------------------------------------------------------------------------------------ v5 (wide loads)
@cuda.jit(device=True)
def _v5_score_mma(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ks, kb, s, scratch, nbs):
    """``_v2_score_mma`` with the B fragments of two n8 blocks of keys per ``frag_b2_at`` (one ldmatrix.x4 where a
    lane issued four loads): keys 16 p .. 16 p + 15 of the tile at this k8 step, ``kb`` the lane's address of
    keys 0 .. 15. ``nbs`` even."""
    for p in range(nbs // 2):
        b0, b1, c0, c1 = frag_b2_at(ks, kb + uint32(16 * p * ROW_T * FLOAT_UNIT), ROW_T)
        for h in range(2):
            bh0, bl0 = split_tf32_fast(b0 if h == 0 else c0)
            bh1, bl1 = split_tf32_fast(b1 if h == 0 else c1)
            _score_mma3(ah0, ah1, ah2, ah3, al0, al1, al2, al3, bh0, bh1, bl0, bl1, s, 4 * (2 * p + h), 4 * nbs,
                        scratch)


@cuda.jit(device=True)
def _split4(a0, a1, a2, a3):
    """split_tf32_fast of an A fragment: (h0, h1, h2, h3, l0, l1, l2, l3)."""
    h0, l0 = split_tf32_fast(a0)
    h1, l1 = split_tf32_fast(a1)
    h2, l2 = split_tf32_fast(a2)
    h3, l3 = split_tf32_fast(a3)
    return h0, h1, h2, h3, l0, l1, l2, l3


@cuda.jit(device=True)
def _v5_scores(q, qs, staged, ks, sp, r0, n, G, nq, b, D, scratch, kt):
    """``_v2_scores`` (same warp mapping, same sums) with its shared-memory fragments loaded whole: the staged A
    fragment of a k8 step by one ``frag_a`` (ldmatrix.x4; four loads a lane before) and the keys' B fragments
    by ``_v5_score_mma`` (two n8 blocks an ldmatrix.x4; four loads a lane each). From global q (short splits)
    the A fragment is loaded as in v2."""
    g, t, mb, kp, kk, k_end, steps = _score_part(D, _v2_warps() // MB)
    nbs = kt // 8
    s = cuda.local.array(SCORE_ACC, float32)             # [product][n8 block][c0..c3] (registers)
    for i in range(SCORE_ACC):
        s[i] = float32(0.0)
    kb = frag_b2_base(ks, kk * 8, ROW_T)                 # this lane's key address at the k-part's first k8 step
    if staged:
        qa = frag_a_base(qs, mb * 16 * Q_STRIDE2 + kk * 8, Q_STRIDE2)   # ... and its staged query address
        while kk < k_end:
            a0, a1, a2, a3 = frag_a_at(qs, qa, Q_STRIDE2)
            ah0, ah1, ah2, ah3, al0, al1, al2, al3 = _split4(a0, a1, a2, a3)
            _v5_score_mma(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ks, kb, s, scratch, nbs)
            qa += uint32(8 * FLOAT_UNIT)                 # the next k8 step
            kb += uint32(8 * FLOAT_UNIT)
            kk += int32(1)
    else:
        ra = _v2_qrow(r0 + mb * 16 + g, n, G, nq, b)
        rb = _v2_qrow(r0 + mb * 16 + g + 8, n, G, nq, b)
        while kk < k_end:
            d = kk * 8 + t
            da = uint64(min(d, D - 1))                   # past D the key tile holds zeros: any finite q will do
            db = uint64(min(d + 4, D - 1))
            ah0, ah1, ah2, ah3, al0, al1, al2, al3 = _split4(q[ra, da], q[rb, da], q[ra, db], q[rb, db])
            _v5_score_mma(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ks, kb, s, scratch, nbs)
            kb += uint32(8 * FLOAT_UNIT)
            kk += int32(1)
    _store_scores3(sp, s, kp, mb * 16 + g, t, nbs)


@cuda.jit(device=True)
def _v7_score_mma(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3, ks, kb, s, scratch,
                  nbs):
    """``_v4_score_mma`` (both m16 blocks, two accumulator sets) with the keys' B fragments by ``frag_b2_at``: two
    n8 blocks of keys an ldmatrix.x4 at the lane's key address ``kb`` of this k8 step."""
    for p in range(nbs // 2):
        b0, b1, c0, c1 = frag_b2_at(ks, kb + uint32(16 * p * ROW_T * FLOAT_UNIT), ROW_T)
        for h in range(2):
            bh0, bl0 = split_tf32_fast(b0 if h == 0 else c0)
            bh1, bl1 = split_tf32_fast(b1 if h == 0 else c1)
            _score_mma_wide(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3,
                            bh0, bh1, bl0, bl1, s, 2 * p + h, nbs, scratch)


@cuda.jit(device=True)
def _v7_scores(q, qs, staged, ks, sp, r0, n, G, nq, b, D, scratch, kt):
    """``_v4_scores`` (warp w on k-part w of both m16 blocks) with whole-fragment loads: the staged A fragments of
    both blocks by ``frag_a_at`` and the keys by ``_v7_score_mma``; from global q as v4."""
    g, t, mb, kp, kk, k_end, steps = _score_part(D, _v2_warps())
    nbs = kt // 8
    s = cuda.local.array(SCORE_ACC4, float32)            # [set][block][n8 block][c0..c3] (registers)
    for i in range(SCORE_ACC4):
        s[i] = float32(0.0)
    kb = frag_b2_base(ks, kk * 8, ROW_T)
    if staged:
        qa = frag_a_base(qs, kk * 8, Q_STRIDE2)          # block 0's rows; block 1's 16 rows further
        while kk < k_end:
            a0, a1, a2, a3 = frag_a_at(qs, qa, Q_STRIDE2)
            ah0, ah1, ah2, ah3, al0, al1, al2, al3 = _split4(a0, a1, a2, a3)
            c0, c1, c2, c3 = frag_a_at(qs, qa + uint32(16 * Q_STRIDE2 * FLOAT_UNIT), Q_STRIDE2)
            ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3 = _split4(c0, c1, c2, c3)
            _v7_score_mma(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3, ks, kb,
                          s, scratch, nbs)
            qa += uint32(8 * FLOAT_UNIT)
            kb += uint32(8 * FLOAT_UNIT)
            kk += int32(1)
    else:
        ra, rb, rc, rd = _v4_rows(r0, g, n, G, nq, b)
        while kk < k_end:
            d = kk * 8 + t
            (ah0, ah1, ah2, ah3, al0, al1, al2, al3,
             ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3) = _v4_global_a(q, ra, rb, rc, rd, d, D)
            _v7_score_mma(ah0, ah1, ah2, ah3, al0, al1, al2, al3, ch0, ch1, ch2, ch3, cl0, cl1, cl2, cl3, ks, kb,
                          s, scratch, nbs)
            kb += uint32(8 * FLOAT_UNIT)
            kk += int32(1)
    if SIM:                                              # the simulator's MMA is a block barrier (_v4_scores)
        z = float32(0.0)
        while kk < kp * steps + steps:
            _v7_score_mma(z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, ks, kb, s, scratch, nbs)
            kk += int32(1)
    _store_scores_wide(sp, s, kp, g, t, nbs)


def _named_kernel(fn, name):
    """``fn`` compiled as a v2-family kernel under ``name`` (the name profiles and tutorials show)."""
    fn.__name__ = fn.__qualname__ = name
    return cuda.jit(**V2_JIT)(fn)


def _tiled_kernel(kt, sp_stride, name, wide=False, vec=False, wide_scores=None, bulk=False):
    """The tiled kernel over kv heads with key tiles of ``kt`` rows (v2: 16, v3 / v4: 32) and partial scores at row
    stride ``sp_stride``; ``wide`` (v4): every warp on both m16 blocks (``_v4_scores``, ``_v4_accumulate``); ``vec``
    (v5): v3 with the scores' fragments loaded whole (``_v5_scores``); ``wide`` and ``vec`` (v6): v5's scores, v4's
    P V; ``wide_scores`` (v7): v4's mapping with ldmatrix scores (``_v7_scores``); ``bulk`` (v8): the key tile by
    the copy engine (``bulk_load_keys``). All
    three are compile-time constants of the kernel it returns (closure variables are frozen when numba compiles, so
    every loop over the tile unrolls as if it were written with a literal, and the other mapping's code is not
    compiled in)."""
    wide_scores = wide and not vec if wide_scores is None else wide_scores   # v6: v5's scores, v4's P V
    kparts = KPARTS4 if wide_scores else KPARTS
    def kernel(q, k, v, start0, start_dev, scale, group, causal, width, split_len, direct, out, o_part, m_part,
               l_part, stage):
        """Grid z = kv head b: q [T*Nq, Dk] (rows token-major), k [S, B, Dk] C-contiguous, B kv heads of ``group``
        = G = Nq / B query heads each. Values: v [S, B, Dv] C-contiguous, its rows landing in the tile at column
        vo = Dk rounded up to 8 (the score's k8 steps never reach them); or, for absorbed MLA (B = 1, G = Nq), a
        1-d placeholder: the values are the key rows' first Dv columns, one copy per row (v's number of dimensions
        is part of its type, so this kernel is compiled once per case and the absorbed one carries no value-copy
        code: a runtime flag cost it 10 % on the H200). ``causal``: token t sees rows 0 .. start + t; else every
        token sees rows 0 .. start + T - 1. out [T*Nq, Dv], o_part [splits, T*Nq, Dv], m/l_part [splits, T*Nq];
        ``width``: floats per asynchronous copy of a row (4 when q's, k's and v's rows are 16-byte aligned, else
        1); ``stage``: the launch gave the block Q_BYTES2 of dynamic shared memory after the key tile for its query
        rows (``stage_bytes``)."""
        sp = cuda.shared.array((kparts, MT, sp_stride), float32)   # partial scores per k-part; sp[0]: then P
        m_run = cuda.shared.array(MT, float32)
        l_run = cuda.shared.array(MT, float32)
        alpha = cuda.shared.array(MT, float32)
        rows = cuda.shared.array(kt, int32)              # the key tile's cache rows (-1: none)
        scratch = cuda.shared.array(SCRATCH_SHAPE, float32)   # the simulator's MMA exchange (GPU: unused)
        buf = cuda.shared.array(GROUP_BUF, float32)      # the simulator's group scratch (GPU: unused)
        acc = cuda.local.array(ACC, float32)             # this thread's output accumulators (registers)
        mbar = cuda.shared.array(1, int64)               # v8: the bulk copies' mbarrier
        dyn = cuda.shared.array(0, float32, alignment=TILE_ALIGN)   # dynamic shared memory:
        ks = view2d(dyn, 0, kt, ROW_T)                   # the key tile [kt, ROW_T] (cp.async: 16-byte aligned)
        qs = dyn[kt * ROW_T:]                            # the block's staged query rows [MT, Q_STRIDE2]
        tid = cuda.threadIdx.x
        B = k.shape[1]
        Dk = q.shape[1]
        Dv = out.shape[1]
        nq = B * group
        T = q.shape[0] // nq
        n = T * group                                    # kv head b's tile rows (t, j): token t, query head b G + j
        vo = (Dk + 7) // 8 * 8 if v.ndim == 3 else 0     # the values' first tile column (absorbed: 0)
        r0 = cuda.blockIdx.x * MT                        # the tile's first row
        z = cuda.blockIdx.y
        b = cuda.blockIdx.z
        start = start0 + start_dev[0]                    # the host part + the device part (graph replay)

        t_last = (min(r0 + MT, n) - 1) // group if causal else T - 1
        k_lo, k_hi, split_len = split_range(z, split_len, start + t_last + 1, kt)   # list: rows 0 .. start + t_last
        if k_lo >= k_hi and not direct:
            past_the_list(r0, n, group, nq, b, z, m_part, l_part)
            return
        staged = stage and split_len >= STAGE_MIN_KEYS   # short splits read q from global memory
        if staged:
            _v2_stage_q(q, qs, r0, MT, Q_STRIDE2, n, group, nq, b, Dk, width)
        r, j0, kpt = _v2_row(kt)
        last_key = start + ((r0 + r) // group if causal else T - 1)   # this thread's row sees rows <= last_key
        if tid < kt:                                     # the first tile's key table (_v2_begin's barrier)
            rows[tid] = k_lo + tid if k_lo + tid < k_hi else -1
        by_engine = bulk and width == 4 and v.ndim != 3  # v8: absorbed MLA's aligned rows by the copy engine
        if by_engine:
            bulk_begin(ks, mbar, kt)
        _v2_begin(acc, ks, m_run, l_run, Dk, kt)
        phase = int32(0)
        for k0 in range(k_lo, k_hi, kt):
            if by_engine:
                bulk_load_keys(k, rows, ks, Dk, B * Dk, b * Dk, mbar, phase, kt)
                phase ^= int32(1)
            else:
                _v2_load_keys(k, rows, ks, Dk, width, B * Dk, b * Dk, 0, kt)
                if v.ndim == 3:                          # separate values, after the keys' columns
                    _v2_load_keys(v, rows, ks, Dv, width, B * Dv, b * Dv, vo, kt)
            copy_async_wait()                            # (v8: the staged query rows' copies)
            cuda.syncthreads()
            if wide_scores and vec:
                _v7_scores(q, qs, staged, ks, sp, r0, n, group, nq, b, Dk, scratch, kt)
            elif wide_scores:
                _v4_scores(q, qs, staged, ks, sp, r0, n, group, nq, b, Dk, scratch, kt)
            elif vec:
                _v5_scores(q, qs, staged, ks, sp, r0, n, group, nq, b, Dk, scratch, kt)
            else:
                _v2_scores(q, qs, staged, ks, sp, r0, n, group, nq, b, Dk, scratch, kt)
            cuda.syncthreads()
            vis = 0                                      # causal mask of this thread's keys
            for jj in range(kpt):                        # (kpt: a constant on the GPU, so this unrolls)
                row = rows[j0 + jj]
                if row >= 0 and row <= last_key:
                    vis |= 1 << jj
            _v2_softmax(sp, vis, scale, m_run, l_run, alpha, buf, kt, _v2_warps() if wide_scores else _v2_warps() // MB)
            cuda.syncthreads()
            if tid < kt:                                 # the next tile's key table: nothing reads rows from here
                rows[tid] = k0 + kt + tid if k0 + kt + tid < k_hi else -1    # on (P V's barrier publishes it)
            if wide:
                _v4_accumulate(sp, ks, acc, alpha, Dv, vo, scratch, kt)
            else:
                _v2_accumulate(sp, ks, acc, alpha, Dv, vo, scratch, kt)
            cuda.syncthreads()
        if wide:
            _v4_end(acc, m_run, l_run, r0, n, group, nq, b, z, direct, out, o_part, m_part, l_part)
        else:
            _v2_end(acc, m_run, l_run, r0, n, group, nq, b, z, direct, out, o_part, m_part, l_part)
    return _named_kernel(kernel, name)


_attention_v2_kernel = _tiled_kernel(KT, KT, "_attention_v2_kernel")
_attention_v3_kernel = _tiled_kernel(KT3, SP_STRIDE3, "_attention_v3_kernel")
_attention_v4_kernel = _tiled_kernel(KT3, SP_STRIDE3, "_attention_v4_kernel", wide=True)
_attention_v5_kernel = _tiled_kernel(KT3, SP_STRIDE3, "_attention_v5_kernel", vec=True)
_attention_v6_kernel = _tiled_kernel(KT3, SP_STRIDE3, "_attention_v6_kernel", wide=True, vec=True)
_attention_v7_kernel = _tiled_kernel(KT3, SP_STRIDE3, "_attention_v7_kernel", wide=True, vec=True, wide_scores=True)
_attention_v8_kernel = _tiled_kernel(KT3, SP_STRIDE3, "_attention_v8_kernel", wide=True, vec=True, wide_scores=True,
                                     bulk=True)
TILED_KERNELS = {"v2": _attention_v2_kernel, "v3": _attention_v3_kernel, "v4": _attention_v4_kernel,
                 "v5": _attention_v5_kernel, "v6": _attention_v6_kernel, "v7": _attention_v7_kernel,
                 "v8": _attention_v8_kernel}


# ------------------------------------------------------------------------------------------------ combine
@cuda.jit(device=True)
def _row8(a, z0, Z, r):
    """a[min(z0 + i, Z - 1), r], i < 8: eight splits' loads issued before any is used (clamped, no branch)."""
    return (a[min(z0, Z - 1), r], a[min(z0 + 1, Z - 1), r], a[min(z0 + 2, Z - 1), r], a[min(z0 + 3, Z - 1), r],
            a[min(z0 + 4, Z - 1), r], a[min(z0 + 5, Z - 1), r], a[min(z0 + 6, Z - 1), r], a[min(z0 + 7, Z - 1), r])


@cuda.jit(device=True)
def _col8(a, z0, Z, r, c):
    """a[min(z0 + i, Z - 1), r, c], i < 8 (as _row8)."""
    return (a[min(z0, Z - 1), r, c], a[min(z0 + 1, Z - 1), r, c], a[min(z0 + 2, Z - 1), r, c],
            a[min(z0 + 3, Z - 1), r, c], a[min(z0 + 4, Z - 1), r, c], a[min(z0 + 5, Z - 1), r, c],
            a[min(z0 + 6, Z - 1), r, c], a[min(z0 + 7, Z - 1), r, c])


@cuda.jit(device=True)
def _term(m, l, o, z, Z, mx):
    """Split z's (weight x o, weight x l), weight = exp(m - mx); zero past the splits or for an empty split (l = 0:
    every key masked; l = -1: past the key list, whose o was never written - selected away, not multiplied by 0)."""
    if z < Z and l > 0:
        w = float32(math.exp(m - mx))
        return w * o, w * l
    return float32(0.0), float32(0.0)


@cuda.jit
def _combine_kernel(o_part, m_part, l_part, out):
    """out[r, c] = sum_z exp(m_z - M) o_z[r, c] / sum_z exp(m_z - M) l_z[r], M = max_z m_z (empty splits: l = 0).
    One thread per output (rows flattened: o_part [Z, rows, Lkv], m_part / l_part [Z, rows], out [rows, Lkv]).
    Eight splits' loads go out together (a decode step has up to a few hundred splits, most of them short:
    one load at a time made this 10-13 us a call, ncu 2026-12-02). The splits end at the first eight whose
    first is past the row's key list (l = -1: ``past_the_list``; the rest of those eight weigh 0 in ``_term``)."""
    rows = out.shape[0]
    lkv = out.shape[1]
    Z = m_part.shape[0]
    idx = cuda.grid(1)
    if idx >= rows * lkv:
        return
    c = idx % lkv
    r = idx // lkv
    mx = float32(NEG_INF)
    for z0 in range(0, Z, 8):                          # clamped repeats of the last split leave the max alone
        if l_part[z0, r] < 0:                          # past the list: so are the splits after it
            Z = z0
            break
        m0, m1, m2, m3, m4, m5, m6, m7 = _row8(m_part, z0, Z, r)
        mx = max(mx, max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7))))
    num = float32(0.0)
    den = float32(0.0)
    for z0 in range(0, Z, 8):
        m0, m1, m2, m3, m4, m5, m6, m7 = _row8(m_part, z0, Z, r)
        l0, l1, l2, l3, l4, l5, l6, l7 = _row8(l_part, z0, Z, r)
        o0, o1, o2, o3, o4, o5, o6, o7 = _col8(o_part, z0, Z, r, c)
        for a, b in (_term(m0, l0, o0, z0, Z, mx), _term(m1, l1, o1, z0 + 1, Z, mx),
                     _term(m2, l2, o2, z0 + 2, Z, mx), _term(m3, l3, o3, z0 + 3, Z, mx),
                     _term(m4, l4, o4, z0 + 4, Z, mx), _term(m5, l5, o5, z0 + 5, Z, mx),
                     _term(m6, l6, o6, z0 + 6, Z, mx), _term(m7, l7, o7, z0 + 7, Z, mx)):
            num += a
            den += b
    out[r, c] = num / den


# ------------------------------------------------------------------------------------------------ launchers
def check_splits(splits):
    """``splits`` (the key splits a test asks for): None, or an int >= 1."""
    return None if splits is None else _checks.integer(splits, "splits", lo=1)


def check_qkv(q, cache, lkv, out):
    q = _checks.array(q, "q", dtype=np.float32, ndim=3)
    T, N, D = q.shape
    cache = _checks.array(cache, "cache", dtype=np.float32, ndim=2, shape=(None, D))
    lkv = _checks.integer(lkv, "lkv", lo=1, hi=D)
    out = _checks.out_array(out, "out", (T, N, lkv), np.float32)
    if backend.name != "numpy" and (D > MAX_D or lkv > MAX_LKV):
        raise ValueError(f"q: latent width {D} (Lkv {lkv}) exceeds the kernels' {MAX_D} ({MAX_LKV}); "
                         f"use the numpy backend for wider models")
    return q, cache, lkv, out


def plan_splits(blocks: int, max_keys: int, tile: int, min_len: int, splits: int | None,
                wave: int | None = None) -> tuple[int, int]:
    """(splits, split_len): each block's key list cut into ``splits`` runs of ``split_len`` keys (whole tiles).
    On the GPU, each run at least ``min_len`` keys and: with ``wave`` (blocks that run at once) the count
    ``wave_splits`` picks, else enough splits for about SPLIT_TARGET blocks; ``splits`` forces a count (tests).
    ``max_keys``: the longest list any block may have (the grid is fixed before the kernel reads a device-side
    start). Example: 17 blocks, 512 keys, 32-key tiles, no wave -> 16 splits of 32 keys."""
    if splits is None:
        splits = 1
        if backend.name == "cuda":
            if wave is not None:
                return wave_splits(blocks, max_keys, tile, min_len, wave)
            splits = max(1, min(-(-SPLIT_TARGET // blocks), -(-max_keys // min_len)))
    split_len = -(-max(max_keys, 1) // splits)
    split_len = -(-split_len // tile) * tile
    return -(-max(max_keys, 1) // split_len), split_len


BLOCK_TILES = 2   # a tiled block's fixed cost in key tiles (staging its query rows, the partials, the combine's
                  # share): fitted to the default pair's 65-node verify, where 15 one-tile splits ran slower
                  # than 5 of three tiles


def wave_splits(blocks: int, max_keys: int, tile: int, min_len: int, wave: int) -> tuple[int, int]:
    """(splits, split_len) for ``blocks`` blocks per split when ``wave`` run at once (the tiled kernels: one per
    SM, ``tiled_wave``) and a block costs its key tiles + BLOCK_TILES: among the most splits that fit
    one, two or three waves, the one with the least ceil(blocks splits / wave) x (tiles per split + BLOCK_TILES),
    ties to fewer splits (less to combine). A few blocks past a full wave cost about a whole wave: on the H200,
    ``blocks`` x ceil(132 / blocks) splits ran 1.2-1.6x slower than SPLIT_TARGET's plan wherever that left a few
    blocks for a second wave (tree verify, 4096 ctx / 16 nodes / 64 heads: 34 x 4 blocks of 33 tiles 0.62 ms,
    SPLIT_TARGET's 34 x 8 of 17 0.43, this rule's 34 x 7 of 19 0.42). Against SPLIT_TARGET's plan this rule ran
    the bench_verify tree cells 1.0-1.5x faster (one 2.5 % slower), a Kimi decode step 1.2-1.4x, the default
    pair's 65-node verify 1.1-1.5x (docs/PERFORMANCE.md, eleventh session).
    Example: 2 blocks (a Kimi decode step's 64 heads), 4097 keys, 32-key tiles, wave 132: 65 splits of 64 keys
    (130 blocks, one wave of 2 tiles each)."""
    key_tiles = -(-max(max_keys, 1) // tile)
    most = max(1, -(-max(max_keys, 1) // min_len))
    best = None
    for waves in (1, 2, 3):
        n = max(1, min(waves * wave // blocks, most, key_tiles))
        length = -(-key_tiles // n)                                    # tiles per split
        n = -(-key_tiles // length)                                    # splits once the length is whole tiles
        cost = (-(-(blocks * n) // wave) * (length + BLOCK_TILES), n)
        if best is None or cost < best[0]:
            best = (cost, n, length * tile)
    return best[1], best[2]


def _partials(splits: int, T: int, N: int, lkv: int):
    """(direct, o_part [splits, T, N, Lkv], m_part, l_part [splits, T, N]); 1-element placeholders when direct
    (``backend.placeholder``: a direct launch never touches them)."""
    if splits == 1:
        stats = backend.placeholder((1, 1, 1))
        return True, backend.placeholder((1, 1, 1, 1)), stats, stats
    return (False, backend.empty((splits, T, N, lkv), np.float32), backend.empty((splits, T, N), np.float32),
            backend.empty((splits, T, N), np.float32))


def _combine(o_part, m_part, l_part, out):
    Z, T, N, lkv = o_part.shape
    threads = backend.block_size(256, 32)
    backend.launch(_combine_kernel, (out.size + threads - 1) // threads, threads, o_part.reshape(Z, T * N, lkv),
                   m_part.reshape(Z, T * N), l_part.reshape(Z, T * N), out.reshape(T * N, lkv))


def launch_v1(kernel, q, cache, start, scale, lkv, out, max_keys, splits, *extra):
    """Launch a v1 kernel (``_attention_kernel`` or tree_verify's) on grid (T, ceil(N / HG), splits), then the
    combine when there are several splits. ``extra``: the kernel's own arguments after the shared ones."""
    start0, start_dev = _checks.device_int(start, "start")
    T, N, D = q.shape
    groups = (N + HG - 1) // HG
    splits, split_len = plan_splits(T * groups, max_keys, BK, 16 * BK, splits)
    direct, o_part, m_part, l_part = _partials(splits, T, N, lkv)
    backend.launch(kernel, (T, groups, splits), backend.block_size(128, 32), q, cache, start0, start_dev,
                   np.float32(scale), int(split_len), direct, out, o_part, m_part, l_part, *extra)
    if not direct:
        _combine(o_part, m_part, l_part, out)
    return out


def v2_warps(lkv: int) -> int:
    """Warps per v2 block: WARPS on the GPU; on the simulator the fewest (2, 4 or 8) whose column groups hold Lkv
    in FRAGS fragments per warp (each warp pair adds 128 columns)."""
    if backend.name == "cuda":
        return WARPS
    return next(w for w in (2, 4, 8) if lkv <= 8 * FRAGS * (w // MB))


def copy_width(*arrays) -> int:
    """Floats per asynchronous copy of a key (or value) row: 4 (16 bytes) when every row of every array starts
    16-byte aligned (C-contiguous rows of a multiple of 4 floats from an aligned base), else 1."""
    for a in arrays:
        iface = getattr(a, "__cuda_array_interface__", None) or a.__array_interface__
        if a.shape[-1] % 4 or iface["data"][0] % 16:
            return 1
    return 4


TILE_ROWS = {"v2": KT, "v3": KT3, "v4": KT3, "v5": KT3, "v6": KT3, "v7": KT3, "v8": KT3}   # key rows per tile of the tiled variants


def tile_bytes(kt: int) -> int:
    """A tiled kernel's key tile (kt rows of ROW_T floats) in dynamic shared memory: 37 KB (v2), 74 KB (v3)."""
    return 4 * kt * ROW_T


def tiled_bytes(variant: str) -> int:
    """A tiled variant's shared memory without the staged query rows: STATIC_BYTES + the key tile."""
    return STATIC_BYTES[variant] + tile_bytes(TILE_ROWS[variant])


def stage_bytes(variant: str) -> int:
    """The dynamic shared memory after the key tile for the staged query rows: Q_BYTES2 where the device lets a
    block have tiled_bytes + Q_BYTES2 (v2 ~120 KB, v3 ~168 KB: both on sm_90, v2 on sm_80), else 0 - the kernel
    then reads the query rows from global memory in every block (sm_86 / sm_89 allow 99 KB)."""
    return Q_BYTES2 if backend.shared_optin() >= tiled_bytes(variant) + Q_BYTES2 else 0


def tiled_fits(variant: str) -> bool:
    """Whether this device gives a block the tiled ``variant``'s shared memory without the staged rows."""
    return backend.shared_optin() >= tiled_bytes(variant)


def check_tiled_fits(variant: str) -> None:
    if not tiled_fits(variant):
        raise ValueError(f"variant: {variant} needs {tiled_bytes(variant)} bytes of shared memory per "
                         f"block, this GPU gives {backend.shared_optin()}; use 'v2'")


def short_splits(rows: int, max_keys: int) -> bool:
    """Whether v2's launch for ``rows`` query rows over ``max_keys`` keys has splits of a single 16-key tile: a
    small grid (a decode step over a short context), latency-bound, where v3's half as many blocks of twice the
    keys are slower - the default pair's decode step (8 rows, 300 keys): v2 0.022 ms, v3 0.028 (H200). Causal
    launches with ``variant=None`` run v2 there, not the 32-key default (v5). (A tree verify always has enough
    rows for the 32-key tiles to pay.)"""
    tiles = -(-rows // MT)
    return plan_splits(tiles, max_keys, KT, MIN_SPLIT_TILES * KT, None, tiled_wave())[1] < 2 * KT


def tiled_wave() -> int:
    """Blocks of an MLA tiled kernel that run at once - the ``wave`` of its key-split plan (``wave_splits``): one
    per SM (V2_MIN_BLOCKS): eight warps of 205-225 registers leave no room for a second block, nor do v3's 167 KB
    of shared memory. Example: 132 on an H200."""
    return backend.sm_count() * V2_MIN_BLOCKS


def attention_v2(q, k, v, start0: int, start_dev, scale: float, causal: bool, out, max_keys: int, splits,
                 variant: str = "v2", device_keys: bool = False):
    """Launch the tiled kernel of ``variant`` (``_attention_v2_kernel``: 16-key tiles; ``_attention_v3_kernel``:
    32): q [T, Nq, Dk], k [S, B, Dk], v [S, B, Dv] (or None: absorbed MLA, values = the key rows' first Dv
    columns), out [T, Nq, Dv]; grid (ceil(T G / MT), splits, B) with G = Nq / B, rows flattened (views, no
    copies), then the combine when there are several splits. start = start0 + start_dev[0]
    (``_checks.device_int``'s parts). ``max_keys``: the longest key list any block may have (every row it may
    read: the grid is fixed before a device-side start is read); ``device_keys``: the start lives on the device
    (``start_dev``), so the kernels size their splits themselves (``split_range``)."""
    T, Nq, _ = q.shape
    B = k.shape[1]
    width = copy_width(q, k) if v is None else copy_width(q, k, v)
    v = backend.placeholder((1,)) if v is None else v
    kt = TILE_ROWS[variant]
    kernel = TILED_KERNELS[variant]
    stage = stage_bytes(variant)
    return launch_split(kernel, -(-(T * (Nq // B)) // MT), B, 32 * v2_warps(out.shape[2]), kt, q, out,
                        max_keys, splits, (k, v, start0, start_dev, np.float32(scale), Nq // B, bool(causal), width),
                        (stage > 0,), shared=tile_bytes(kt) + stage, wave=tiled_wave(), device_keys=device_keys)


def launch_split(kernel, tiles: int, heads, threads: int, tile: int, q, out, max_keys: int, splits, args,
                 tail=(), shared: int = 0, wave: int | None = None, device_keys: bool = False):
    """The launch every tiled attention kernel shares: key splits planned for ``tiles`` x ``heads`` blocks (keys
    in whole tiles of ``tile``; ``wave``: as in ``plan_splits``), the kernel on grid (tiles, splits, heads) -
    (tiles, splits) when ``heads`` is None - with arguments ``q`` [T*N, D] (rows flattened: a view), ``*args``,
    split length, direct, ``out`` [T*N, Dv], the split partials [splits, T*N(, Dv)] (1-element placeholders when
    direct), ``*tail``; then the combine when there are several splits. Returns ``out``. ``device_keys``: the key
    count is read on the device (graph replay), so the kernel gets split length 0 and cuts each block's real list
    over the planned splits itself (``split_range``: the MLA / tree tiled kernels only)."""
    T, N, D = q.shape
    Dv = out.shape[2]
    rows = T * N
    splits, split_len = plan_splits(tiles * (heads or 1), max_keys, tile, MIN_SPLIT_TILES * tile, splits, wave)
    direct, o_part, m_part, l_part = _partials(splits, T, N, Dv)
    flat = (o_part.reshape(splits, rows, Dv), m_part.reshape(splits, rows), l_part.reshape(splits, rows)) \
        if not direct else (o_part.reshape(1, 1, 1), m_part.reshape(1, 1), l_part.reshape(1, 1))
    grid = (tiles, splits) if heads is None else (tiles, splits, heads)
    backend.launch(kernel, grid, threads, q.reshape(rows, D), *args, 0 if device_keys else int(split_len), direct,
                   out.reshape(rows, Dv), *flat, *tail, shared=shared)
    if not direct:
        _combine(o_part, m_part, l_part, out)
    return out


def launch_v2(kernel, variant, q, cache, start, scale, lkv, out, max_keys, splits, *extra):
    """Launch a tree_verify tiled kernel of ``variant`` on grid (ceil(T N / MT), splits) with the rows flattened
    (views, no copies), then the combine when there are several splits."""
    start0, start_dev = _checks.device_int(start, "start")
    T, N, _ = q.shape
    kt = TILE_ROWS[variant]
    stage = stage_bytes(variant)
    return launch_split(kernel, -(-(T * N) // MT), None, 32 * v2_warps(lkv), kt, q, out, max_keys, splits,
                        (cache, start0, start_dev, np.float32(scale), N, copy_width(q, cache)), extra + (stage > 0,),
                        shared=tile_bytes(kt) + stage, wave=tiled_wave(), device_keys=hasattr(start, "shape"))


def mla_attention(q, cache, start, scale: float, lkv: int, out=None, splits: int | None = None,
                  variant: str | None = None):
    """Causal absorbed-MLA attention of ``q [T, N, D]`` over ``cache [C, D]`` rows ``0 .. start + T - 1``.

    ``lkv``: the latent width (values are ``cache[:, :lkv]``); ``splits`` asks for that many key splits (tests): the
    launch runs ceil(keys / split_len) of them, split_len rounded up to whole tiles, which can be fewer.
    ``start``: an int, or a device int32 [1] array the kernel reads (graph replay: decode/replay.py); the grid's
    splits are then planned for every cache row, and the tiled kernels (v2 - v8) cut each block's real key list over
    them on the device (``split_range``: the splits past it exit at once, ``past_the_list``); v1 keeps the planned
    length, its splits past a token's last key contributing nothing.
    ``variant``: "v1" - "v8", "gemm" | None (``default_variant()``, or v2 for launches ``short_splits``
    names, or "gemm" where ``mla_gemm_attention.pays``); the numpy backend runs the reference for any.
    """
    auto = variant is None
    variant = check_variant(variant)
    q, cache, lkv, out = check_qkv(q, cache, lkv, out)
    splits = check_splits(splits)
    T = q.shape[0]
    start0, start_dev = _checks.device_int(start, "start")
    device_start = hasattr(start, "shape")
    if not device_start and start0 + T > cache.shape[0]:
        raise ValueError(f"start: {start0} + {T} new rows exceed the cache's {cache.shape[0]} rows")
    scale = _checks.real(scale, "scale", lo=0.0, lo_open=True)
    if backend.name == "numpy":
        start = _checks.host_int(start)
        visible = np.arange(start + T)[None, :] <= start + np.arange(T)[:, None]      # [T, start+T]
        out[...] = masked_attention_fast(q, np.asarray(cache)[:start + T], visible, scale, lkv)
        return out
    if T == 0:
        return out
    max_keys = cache.shape[0] if device_start else start0 + T
    if variant == "gemm" or (auto and splits is None and mla_gemm_attention.pays(T * q.shape[1], max_keys,
                                                                                 device_start, causal=True)):
        return mla_gemm_attention.gemm_attention(q, cache, start, scale, lkv, out, splits)
    if variant == "v1":
        return launch_v1(_attention_kernel, q, cache, start, scale, lkv, out, max_keys, splits)
    if auto and variant != "v2" and splits is None and short_splits(T * q.shape[1], max_keys):
        variant = "v2"                           # the default's 32-key tiles: too few blocks for a short decode
    check_tiled_fits(variant)
    keys = cache.reshape(cache.shape[0], 1, cache.shape[1])                        # [C, 1, D]: one kv head
    return attention_v2(q, keys, None, start0, start_dev, scale, True, out, max_keys, splits, variant,
                        device_keys=device_start)
