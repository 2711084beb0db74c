"""Grouped-query attention on the v2 tensor-core tiles: keys and values in their own arrays, causal or not.

    score[t, h, s] = scale * q[t, h] . k[s, g]          g = h // G, the kv head of query head h (G = Nq / Nkv)
    out[t, h]      = sum_s softmax_s(score[t, h, :])[s] * v[s, g]     over the rows t may see:
causal: token t of a chunk that starts at ``start`` sees rows 0 .. start + t (the chunk's own rows are
start .. start + T - 1 of k and v); not causal: every token sees rows 0 .. start + T - 1.

Two users:
  * the target's **prefill in MLA's decompressed form** (model/target.py): per head, keys [k_nope (P) ; k_rot (R)]
    and values v (Vd), decompressed from the latent cache rows by two batched GEMMs, G = 1. For Kimi a (query,
    key) pair costs 2 (P + R + Vd) = 640 FLOPs per head here against 2 (Lkv + R + Lkv) = 2176 in the absorbed
    form that decode and the tree verify use (kernels/mla_attention.py; there the latent's bytes are the cost,
    here the FLOPs are). The decompression costs 2 Lkv (P + Vd) N FLOPs per key row - every chunk redoes it for
    the whole prefix - so by FLOPs alone it pays from ~170 queries per key at Kimi's shape (48 for the default
    pair); measured on the H200 the decompressed path was already 1.57x faster at a 128-token chunk (the absorbed
    kernel runs at a lower rate), hence target.DECOMPRESSED_PREFILL_TOKENS = 128.
  * the **DFlash drafter's block attention** (kernels/block_attention.py, its variant "v2" calls ``attention_v2``
    directly): not causal, G = 2 - its 16 tokens x 2 heads are exactly one 32-row v2 tile per kv head, where a
    128-row v3 block would be three-quarters padding.

Variants (``variant=``; None -> ``default_variant(Dk, Dv)``: the fastest one the head fits - v4, v3, else v2):
  v2  mla_attention's ``_attention_v2_kernel`` (absorbed MLA is its case Nkv = 1, G = Nq, values = the key rows'
      first Lkv columns; its docstring and tutorial 14 walk through it). Grid (ceil(T G / 32), key splits, kv
      heads); block (x, z, b) takes the 32 tile rows r = 32 x .. 32 x + 31 of kv head b, r = t G + j standing for
      token t and query head b G + j, and streams b's key rows in tiles of 16 through shared memory: keys in tile
      columns 0 .. Dk - 1, values in columns vo = Dk rounded up to 8 .. vo + Dv - 1 of the same tile rows (two
      cp.async row copies); 8 warps split each tile's scores into k-parts and its P V into column groups, the
      online softmax runs on 8 lanes per row, four barriers per tile. Limits: vo + Dv <= 576, Dv <= 512.
  v3  ``_gqa_v3_kernel`` (below), FlashAttention-2's mapping for heads of Dk <= 256, Dv <= 128: a block of 8 warps
      takes 128 tile rows, warp w its 16 rows with all of their Dk score dims and Dv output columns (64
      accumulators per thread). Per tile of 16 keys: keys -> ``ks`` (row stride 260) and values -> ``vs`` (136)
      by cp.async, a barrier; S [16, 16] = Q K^T per warp (3xTF32, query fragments from global q); the online
      softmax in registers - lane 4 g + t holds rows g and g + 8, keys 2t, 2t + 1, 8 + 2t, 9 + 2t, and a row's max
      and sum are shuffles over its quad (``_v3_row_softmax``); P goes through the warp's own shared buffer (row
      stride 20), because the MMA's C fragment layout is not its A layout; O = alpha O + P V; a barrier. Two
      barriers per tile instead of v2's four, and each key tile serves 128 query rows instead of 32.
  v4  ``_gqa_v4_kernel``, v3's mapping for Dk <= 192 (DeepSeek-V3 / Kimi: 128 + 64), Dv <= 128, three changes
      (measured on the H200, one Kimi layer of 4096 tokens: v3 15.4 ms -> v4 7.9 ms, torch SDPA fp32 7.8):
      * tiles of 32 keys, and P never leaves the registers: the P V step's key order is permuted so that the
        scores' C fragment (row g: keys 2t, 2t + 1 of each n8 block) *is* its A fragment (``_v4_pv_step``);
        the value tile's rows are read in the same order (row stride 132, 4 mod 32: conflict-free). One
        accumulator set per n8 block of scores (v3 had three), the softmax in base 2 (one ex2 per score);
      * the block's 128 query rows copied once into 100 KB of dynamic shared memory (stride 196) instead of being
        re-read from global memory, with 64-bit address arithmetic, at every k8 step of every key tile;
      * blocks taken heaviest first (causal: the last query tiles see the most keys).
All: several key splits are merged by mla_attention's combine.
Shapes: q [T, Nq, Dk], k [S, Nkv, Dk], v [S, Nkv, Dv] float32, C-contiguous, S >= start + T -> out [T, Nq, Dv].
Example: one head, Dk = Dv = 1, scale 1, k = [[[0]], [[0]]] (equal scores), v = [[[1]], [[3]]], start 0, T = 2:
causal -> token 0 sees row 0: out 1, token 1 sees both: out 2; not causal -> out 2 for both.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, uint64

from .. import backend
from . import _checks
from ._intrinsics import copy_async_wait, ex2, fmax
from .mla_attention import (MAX_D, MAX_LKV, NEG_INF, TILE_ALIGN, _v2_pv_frags,
                            _v2_pv_tile, _v2_qrow, _v2_rescale, _v2_score_step, _v2_stage_q, _v2_store, attention_v2,
                            check_splits, copy_row, copy_width, launch_split, row_share)
from .mma import SCRATCH_SHAPE, SIM, mma_m16n8k8_3xtf32, split_tf32_fast
from .primitives import GROUP_BUF, group_max, group_sum

VARIANTS = ("v2", "v3", "v4")
# v3: a warp per 16 query rows (FlashAttention-2's mapping), for heads of <= 256 key and <= 128 value dims
QT = 16           # query rows per warp: one m16 MMA block
KT3 = 16          # key rows per tile
MAX_DK3 = 256     # widest key (and query) row
MAX_DV3 = 128     # widest value row: 16 n8 fragments per warp
FRAGS3 = 16       # (mla_attention's FRAGS: the P V step is its _v2_pv_tile)
ACC3 = 64         # FRAGS3 * 4 output accumulators per thread
K_STRIDE = 260    # key tile row stride, 4 mod 32: a warp's score B-fragment loads ks[key g, dim t] hit 32 banks
V_STRIDE = 136    # value tile row stride, 8 mod 32: the P V B-fragment loads vs[key t, column g] hit 32 banks
P_STRIDE = 20     # a warp's P rows, 4 mod 32: the A-fragment loads P[row g, key t] hit 32 banks
WARPS3 = 8        # warps per block on the GPU: 128 query rows
V3_JIT = {} if SIM else {"launch_bounds": (32 * WARPS3, 1)}


def value_column(dk: int) -> int:
    """The key tile column where the values start: Dk rounded up to a multiple of 8 (the score's last k8 step then
    reads zeros past Dk, never a value)."""
    return -(-dk // 8) * 8


def visible_rows(T: int, start: int, causal: bool) -> np.ndarray:
    """[T, start + T] bool: which key rows each token sees."""
    rows = np.arange(start + T)[None, :]
    return rows <= start + np.arange(T)[:, None] if causal else np.ones((T, start + T), bool)


def _attention_numpy(q, k, v, start: int, scale: float, causal: bool, dtype):
    """The spec in ``dtype`` math (float64: the reference the kernel is tested against; float32: the numpy
    backend's path, BLAS matmuls)."""
    T, Nq, Dk = q.shape
    Nkv = k.shape[1]
    g = np.arange(Nq) // (Nq // Nkv)                                               # kv head of each query head
    kk = np.asarray(k, dtype)[:start + T][:, g]                                    # [S, Nq, Dk]
    vv = np.asarray(v, dtype)[:start + T][:, g]                                    # [S, Nq, Dv]
    s = np.einsum("thd,shd->hts", np.asarray(q, dtype), kk) * dtype(scale)        # [Nq, T, S]
    s = np.where(visible_rows(T, start, causal)[None], s, dtype(-np.inf))
    p = np.exp(s - s.max(axis=2, keepdims=True))
    p /= p.sum(axis=2, keepdims=True)
    return np.matmul(p, vv.transpose(1, 0, 2)).transpose(1, 0, 2).astype(np.float32)   # [T, Nq, Dv]


def gqa_attention_ref(q, k, v, start: int, scale: float, causal: bool = True):
    """The spec in float64 NumPy (tests)."""
    return _attention_numpy(q, k, v, start, scale, causal, np.float64)


# ------------------------------------------------------------------------------------------------ v3 kernel
@cuda.jit(device=True)
def _v3_warps():
    """Warps per v3 block: the constant WARPS3 on the GPU, the launch's count on the simulator."""
    return cuda.blockDim.x // 32 if SIM else WARPS3


@cuda.jit(device=True)
def _v3_load(src, k0, k_hi, tile, D, width, stride, base, tile_stride):
    """Issue the copies of rows k0 .. k0 + R - 1 (those < k_hi; zeros for the rest) of ``src`` into ``tile`` (R =
    its rows: KT3 for v3, KT4 for v4): tile[j, :D] = the D floats at flat offset (k0 + j) * stride + base
    (``_v2_load_keys`` over a row range instead of a row table: a group of threads per row)."""
    R = tile.shape[0]
    j0, dj, u, tpr = row_share(R, 32 * _v3_warps())
    for j in range(j0, R, dj):
        ok = k0 + j < k_hi
        copy_row(tile, uint64(j * tile_stride), src, uint64(k0 + j if ok else 0) * uint64(stride) + uint64(base),
                 D, width, u, tpr, ok)


@cuda.jit(device=True)
def _v3_row_softmax(s0, s1, s2, s3, k_first, lim, scale, m_run, l_run, buf):
    """One query row's online-softmax step over this lane's four scores of the tile (keys k_first + 0, 1, 8, 9 of
    the lane's quad layout, visible while < lim), the row's max and sum over the quad's four lanes (shuffles).
    Returns (p0, p1, p2, p3, m, l, alpha): P = exp(s - m) (0 for hidden keys), the new running max and sum, and
    the factor the row's accumulators are rescaled by. A row with no visible key so far keeps m = -inf, l = 0."""
    v0 = s0 * scale if k_first < lim else float32(NEG_INF)
    v1 = s1 * scale if k_first + 1 < lim else float32(NEG_INF)
    v2 = s2 * scale if k_first + 8 < lim else float32(NEG_INF)
    v3 = s3 * scale if k_first + 9 < lim else float32(NEG_INF)
    mx = group_max(max(max(m_run, v0), max(v1, max(v2, v3))), 4, buf)
    p0 = p1 = p2 = p3 = float32(0.0)
    a = float32(1.0)
    if mx != NEG_INF:
        p0 = float32(math.exp(v0 - mx))
        p1 = float32(math.exp(v1 - mx))
        p2 = float32(math.exp(v2 - mx))
        p3 = float32(math.exp(v3 - mx))
        a = float32(math.exp(m_run - mx))
    lsum = group_sum((p0 + p1) + (p2 + p3), 4, buf)
    return p0, p1, p2, p3, mx, l_run * a + lsum, a


@cuda.jit(device=True)
def _v3_lane_rows(r0, rows, n, group, nq, b, T, start, causal, z, split_len):
    """This lane's two tile rows ta, tb (rows g and g + 8 of its warp's 16, in the block's ``rows`` from r0), their
    q rows ra, rb (``_v2_qrow``), the end of the keys each may see (lim_a, lim_b, exclusive) and the block's key
    range k_lo .. k_hi - 1 in split z (v3 and v4)."""
    tid = cuda.threadIdx.x
    ta = r0 + QT * (tid // 32) + tid % 32 // 4
    tb = ta + 8
    lim_a = start + (min(ta, n - 1) // group + 1 if causal else T)
    lim_b = start + (min(tb, n - 1) // group + 1 if causal else T)
    t_last = (min(r0 + rows, n) - 1) // group if causal else T - 1
    k_lo = z * split_len
    k_hi = min(start + t_last + 1, k_lo + split_len)
    return ta, tb, _v2_qrow(ta, n, group, nq, b), _v2_qrow(tb, n, group, nq, b), lim_a, lim_b, k_lo, k_hi


@cuda.jit(device=True)
def _v3_clear(ks, acc, Dk, ksteps):
    """The accumulators zeroed, and the key tile's columns Dk .. 8 ksteps - 1 (the last k8 step reads them; no
    copy writes them) set to zeros once."""
    pad = ksteps * 8 - Dk
    for i in range(cuda.threadIdx.x, ks.shape[0] * pad, cuda.blockDim.x):
        ks[i // pad, Dk + i % pad] = float32(0.0)
    for i in range(ACC3):
        acc[i] = float32(0.0)


@cuda.jit(device=True)
def _v3_end(acc, frags, t, ta, tb, ra, rb, n, m_a, l_a, m_b, l_b, z, direct, out, o_part, m_part, l_part):
    """This lane's two output rows (tile rows ta, tb < n, q rows ra, rb; columns 8 f + 2 t, + 1): O / l into
    ``out`` (one split), or split z's (O, m, l) for the combine."""
    ia = float32(1.0) / l_a if direct and ta < n else float32(1.0)
    ib = float32(1.0) / l_b if direct and tb < n else float32(1.0)
    for f in range(FRAGS3):
        c = f * 8 + 2 * t
        if f < frags:
            if ta < n:
                _v2_store(out, o_part, z, direct, ra, c, acc[4 * f] * ia, acc[4 * f + 1] * ia)
            if tb < n:
                _v2_store(out, o_part, z, direct, rb, c, acc[4 * f + 2] * ib, acc[4 * f + 3] * ib)
    if not direct and t == 0:
        if ta < n:
            m_part[z, ra] = m_a
            l_part[z, ra] = l_a
        if tb < n:
            m_part[z, rb] = m_b
            l_part[z, rb] = l_b


@cuda.jit(**V3_JIT)
def _gqa_v3_kernel(q, k, v, start0, start_dev, scale, group, causal, width, split_len, direct, out, o_part, m_part,
                   l_part):
    """v3: q [T*Nq, Dk] (rows token-major), k [S, B, Dk], v [S, B, Dv] C-contiguous, out [T*Nq, Dv], partials as
    mla_attention's v2; grid (ceil(T G / (16 warps)), splits, B). Warp w owns tile rows r0 + 16 w .. + 15 of kv
    head b (``_v2_qrow``): all of their Dk score dims and Dv output columns."""
    ks = cuda.shared.array((KT3, K_STRIDE), float32, alignment=TILE_ALIGN)   # the key tile
    vs = cuda.shared.array((KT3, V_STRIDE), float32, alignment=TILE_ALIGN)   # the value tile
    ps = cuda.shared.array((WARPS3, QT, P_STRIDE), float32)  # each warp's P, from its C layout to its A layout
    scratch = cuda.shared.array(SCRATCH_SHAPE, float32)  # the simulator's MMA exchange (GPU: unused)
    buf = cuda.shared.array(GROUP_BUF, float32)          # the simulator's group scratch (GPU: unused)
    acc = cuda.local.array(ACC3, float32)                # rows g, g + 8 x 16 n8 fragments (registers)
    s = cuda.local.array(24, float32)                    # scores: [product][n8 block][c0..c3]
    tid = cuda.threadIdx.x
    w = tid // 32
    g = tid % 32 // 4
    t = tid % 4
    B = k.shape[1]
    Dk = q.shape[1]
    Dv = out.shape[1]
    nq = B * group
    T = q.shape[0] // nq
    n = T * group                                        # kv head b's tile rows
    rows = QT * _v3_warps()
    r0 = cuda.blockIdx.x * rows
    z = cuda.blockIdx.y
    b = cuda.blockIdx.z
    start = start0 + start_dev[0]                        # the host part + the device part (graph replay)

    ta, tb, ra, rb, lim_a, lim_b, k_lo, k_hi = _v3_lane_rows(r0, rows, n, group, nq, b, T, start, causal, z,
                                                              split_len)
    ksteps = (Dk + 7) // 8
    frags = (Dv + 7) // 8
    _v3_clear(ks, acc, Dk, ksteps)
    m_a = m_b = float32(NEG_INF)
    l_a = l_b = float32(0.0)
    for k0 in range(k_lo, k_hi, KT3):
        _v3_load(k, k0, k_hi, ks, Dk, width, B * Dk, b * Dk, K_STRIDE)
        _v3_load(v, k0, k_hi, vs, Dv, width, B * Dv, b * Dv, V_STRIDE)
        copy_async_wait()
        cuda.syncthreads()
        for i in range(24):
            s[i] = float32(0.0)
        for kk in range(ksteps):                         # S [16, 16] = Q K^T, 3xTF32 in three accumulator sets
            _v2_score_step(q, ks, ra, rb, kk * 8 + t, Dk, g, s, scratch, 2)
        kf = k0 + 2 * t                                  # this lane's keys: kf, kf + 1, kf + 8, kf + 9
        lim = min(lim_a, k_hi)
        pa0, pa1, pa2, pa3, m_a, l_a, xa = _v3_row_softmax(
            (s[0] + s[8]) + s[16], (s[1] + s[9]) + s[17], (s[4] + s[12]) + s[20], (s[5] + s[13]) + s[21],
            kf, lim, scale, m_a, l_a, buf)
        lim = min(lim_b, k_hi)
        pb0, pb1, pb2, pb3, m_b, l_b, xb = _v3_row_softmax(
            (s[2] + s[10]) + s[18], (s[3] + s[11]) + s[19], (s[6] + s[14]) + s[22], (s[7] + s[15]) + s[23],
            kf, lim, scale, m_b, l_b, buf)
        ps[w, g, 2 * t] = pa0                            # P in the scores' C layout, read back as A fragments
        ps[w, g, 2 * t + 1] = pa1
        ps[w, g, 8 + 2 * t] = pa2
        ps[w, g, 9 + 2 * t] = pa3
        ps[w, g + 8, 2 * t] = pb0
        ps[w, g + 8, 2 * t + 1] = pb1
        ps[w, g + 8, 8 + 2 * t] = pb2
        ps[w, g + 8, 9 + 2 * t] = pb3
        if SIM:
            cuda.syncthreads()
        else:
            cuda.syncwarp()
        _v2_pv_tile(ps[w], uint64(g), uint64(g + 8), t, vs, uint64(g), acc, frags, xa, xb, scratch, 2)   # O += P V
        cuda.syncthreads()                               # the tiles and P are rewritten next
    _v3_end(acc, frags, t, ta, tb, ra, rb, n, m_a, l_a, m_b, l_b, z, direct, out, o_part, m_part, l_part)


# ------------------------------------------------------------------------------------------------ v4 kernel
KT4 = 32          # v4: key rows per tile: four n8 blocks of scores, four k8 steps of P V
MAX_DK4 = 192     # v4: widest key row (DeepSeek-V3 / Kimi: 128 + 64): key and value tiles fit 48 KB of static
                  # shared memory (numba's static arrays cannot go above it)
K_STRIDE4 = 196   # 4 mod 32: the score B-fragment loads ks[key 8 nb + g, dim d + t] hit 32 banks
V_STRIDE4 = 132   # 4 mod 32: the P V B-fragment loads vs[key 8 kk + 2 t (+ 1), column 8 f + g] hit 32 banks
Q_STRIDE4 = 196   # 4 mod 32: the staged query rows; the A-fragment loads qs[row g, dim t] hit 32 banks
V4_STATIC_BYTES = 41984   # v4's static shared memory (the key and value tiles), besides the staged query rows
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


@cuda.jit(device=True)
def _v4_row_softmax(s0, s1, s2, s3, s4, s5, s6, s7, k_first, lim, scale2, m_run, l_run, buf):
    """One query row's online-softmax step over this lane's eight scores of the tile, in base 2: s(2 nb),
    s(2 nb + 1) are keys k_first + 8 nb and k_first + 8 nb + 1 (n8 block nb; visible while < lim), x = s scale2
    with scale2 = scale log2(e), so P = 2^(x - m) = e^(s scale - m ln 2) with one ex2 each; m_run and the returned
    m are in these units (log2). The row's max and sum over the quad's four lanes are shuffles. Returns (p0 .. p7,
    m, l, alpha): P (0 for hidden keys), the new running max and sum, and the accumulators' rescale factor. A row
    with no visible key so far keeps m = -inf and l = 0 (its exponents are taken against 0 then, so every P and
    alpha is 2^-inf = 0, never NaN)."""
    x0 = s0 * scale2 if k_first < lim else float32(NEG_INF)
    x1 = s1 * scale2 if k_first + 1 < lim else float32(NEG_INF)
    x2 = s2 * scale2 if k_first + 8 < lim else float32(NEG_INF)
    x3 = s3 * scale2 if k_first + 9 < lim else float32(NEG_INF)
    x4 = s4 * scale2 if k_first + 16 < lim else float32(NEG_INF)
    x5 = s5 * scale2 if k_first + 17 < lim else float32(NEG_INF)
    x6 = s6 * scale2 if k_first + 24 < lim else float32(NEG_INF)
    x7 = s7 * scale2 if k_first + 25 < lim else float32(NEG_INF)
    mx = group_max(fmax(fmax(fmax(m_run, x0), fmax(x1, x2)), fmax(fmax(x3, x4), fmax(fmax(x5, x6), x7))), 4, buf)
    ms = mx if mx != NEG_INF else float32(0.0)
    p0 = ex2(x0 - ms)
    p1 = ex2(x1 - ms)
    p2 = ex2(x2 - ms)
    p3 = ex2(x3 - ms)
    p4 = ex2(x4 - ms)
    p5 = ex2(x5 - ms)
    p6 = ex2(x6 - ms)
    p7 = ex2(x7 - ms)
    a = ex2(m_run - ms)
    lsum = group_sum(((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)), 4, buf)   # every lane calls: shuffles
    return p0, p1, p2, p3, p4, p5, p6, p7, mx, l_run * a + lsum, a


@cuda.jit(device=True)
def _v4_pv_step(a0, a1, a2, a3, kk, t, g, vs, acc, frags, scratch):
    """One k8 step of O += P V over keys 8 kk .. 8 kk + 7 of the tile, with P straight from the scores' registers:
    the k8 step's key order is permuted (its column t is key 8 kk + 2 t, column t + 4 key 8 kk + 2 t + 1), so the
    A fragment (P[g][t], P[g + 8][t], P[g][t + 4], P[g + 8][t + 4]) is the lane's own C fragment of n8 block kk
    in the order c0, c2, c1, c3 (a0..a3 here), and the B fragments read the value rows in the same order:
    vs[8 kk + 2 t (+ 1), 8 f + g]."""
    ah0, al0 = split_tf32_fast(a0)
    ah1, al1 = split_tf32_fast(a1)
    ah2, al2 = split_tf32_fast(a2)
    ah3, al3 = split_tf32_fast(a3)
    _v2_pv_frags(ah0, ah1, ah2, ah3, al0, al1, al2, al3, vs, uint64(8 * kk + 2 * t), uint64(8 * kk + 2 * t + 1),
                 uint64(g), acc, frags, scratch)


@cuda.jit(device=True)
def _v4_score_step(qs, ks, qa, qb, d, g, s, scratch):
    """One k8 step of a warp's scores S [16 query rows, 32 keys] at dims d = 8 kk + t: the A fragments from the
    staged query rows (qs[qa], qs[qb] = rows g, g + 8 at dim d; 4 dims on), split once for the four n8 blocks of
    keys, each a 3xTF32 MMA chain (small products first) into its accumulators s[4 nb .. 4 nb + 3]."""
    ah0, al0 = split_tf32_fast(qs[qa])
    ah1, al1 = split_tf32_fast(qs[qb])
    ah2, al2 = split_tf32_fast(qs[qa + uint64(4)])
    ah3, al3 = split_tf32_fast(qs[qb + uint64(4)])
    for nb in range(4):                                  # B[k][n] = K^T[dim][key] = ks[8 nb + n, dim]
        bh0, bl0 = split_tf32_fast(ks[uint64(nb * 8 + g), uint64(d)])
        bh1, bl1 = split_tf32_fast(ks[uint64(nb * 8 + g), uint64(d + 4)])
        i = 4 * nb
        s[i], s[i + 1], s[i + 2], s[i + 3] = mma_m16n8k8_3xtf32(
            ah0, ah1, ah2, ah3, al0, al1, al2, al3, bh0, bh1, bl0, bl1, s[i], s[i + 1], s[i + 2], s[i + 3], scratch)


@cuda.jit(**V3_JIT)
def _gqa_v4_kernel(q, k, v, start0, start_dev, scale, group, causal, width, split_len, direct, out, o_part, m_part,
                   l_part):
    """v4: v3's mapping (warp w: 16 query rows, all Dk <= 192 score dims and Dv output columns) with three
    changes, each measured faster on the H200: tiles of 32 keys with P kept in registers (``_v4_pv_step``; one
    accumulator set per n8 block of scores); the block's query rows copied once into dynamic shared memory (``qs``,
    rows of Q_STRIDE4 floats, zeros past Dk: ``_v2_stage_q``) for the score A fragments, instead of global loads
    at every key tile; blocks taken heaviest first (the linear block id counts kv heads fastest, then splits, then
    query tiles from the last: under a causal mask the last query tiles see the most keys, and the light ones
    then fill the tail). Grid and arguments as v3's; launched with QT * warps * Q_STRIDE4 * 4 bytes of dynamic
    shared memory (100 KB on the GPU: above 48 KB, backend.launch opts the kernel in)."""
    ks = cuda.shared.array((KT4, K_STRIDE4), float32, alignment=TILE_ALIGN)  # the key tile
    vs = cuda.shared.array((KT4, V_STRIDE4), float32, alignment=TILE_ALIGN)  # the value tile
    scratch = cuda.shared.array(SCRATCH_SHAPE, float32)  # the simulator's MMA exchange (GPU: unused)
    buf = cuda.shared.array(GROUP_BUF, float32)          # the simulator's group scratch (GPU: unused)
    acc = cuda.local.array(ACC3, float32)                # rows g, g + 8 x 16 n8 fragments (registers)
    s = cuda.local.array(16, float32)                    # scores, then P: [n8 block][c0..c3]
    qs = cuda.shared.array(0, float32)                   # dynamic: the block's query rows [rows, Q_STRIDE4]
    tid = cuda.threadIdx.x
    w = tid // 32
    g = tid % 32 // 4
    t = tid % 4
    B = k.shape[1]
    Dk = q.shape[1]
    Dv = out.shape[1]
    nq = B * group
    T = q.shape[0] // nq
    n = T * group                                        # kv head b's tile rows
    rows = QT * _v3_warps()
    lin = cuda.blockIdx.x + cuda.gridDim.x * (cuda.blockIdx.y + cuda.gridDim.y * cuda.blockIdx.z)
    b = lin % B
    z = lin // B % cuda.gridDim.y
    r0 = (cuda.gridDim.x - 1 - lin // (B * cuda.gridDim.y)) * rows
    start = start0 + start_dev[0]                        # the host part + the device part (graph replay)

    ta, tb, ra, rb, lim_a, lim_b, k_lo, k_hi = _v3_lane_rows(r0, rows, n, group, nq, b, T, start, causal, z,
                                                              split_len)
    ksteps = (Dk + 7) // 8
    frags = (Dv + 7) // 8
    _v3_clear(ks, acc, Dk, ksteps)
    _v2_stage_q(q, qs, r0, rows, Q_STRIDE4, n, group, nq, b, Dk, width)
    qa = uint64((QT * w + g) * Q_STRIDE4 + t)            # this lane's A-fragment rows in qs (column t)
    qb = qa + uint64(8 * Q_STRIDE4)
    scale2 = scale * float32(LOG2E)                      # the softmax in base 2 (``_v4_row_softmax``)
    m_a = m_b = float32(NEG_INF)
    l_a = l_b = float32(0.0)
    for k0 in range(k_lo, k_hi, KT4):
        _v3_load(k, k0, k_hi, ks, Dk, width, B * Dk, b * Dk, K_STRIDE4)
        _v3_load(v, k0, k_hi, vs, Dv, width, B * Dv, b * Dv, V_STRIDE4)
        copy_async_wait()
        cuda.syncthreads()
        for i in range(16):
            s[i] = float32(0.0)
        for kk in range(ksteps):                         # S [16, 32] = Q K^T (3xTF32)
            _v4_score_step(qs, ks, qa + uint64(kk * 8), qb + uint64(kk * 8), kk * 8 + t, g, s, scratch)
        kf = k0 + 2 * t                                  # this lane's keys: kf + 8 nb, kf + 8 nb + 1
        pa0, pa1, pa2, pa3, pa4, pa5, pa6, pa7, m_a, l_a, xa = _v4_row_softmax(
            s[0], s[1], s[4], s[5], s[8], s[9], s[12], s[13], kf, min(lim_a, k_hi), scale2, m_a, l_a, buf)
        pb0, pb1, pb2, pb3, pb4, pb5, pb6, pb7, m_b, l_b, xb = _v4_row_softmax(
            s[2], s[3], s[6], s[7], s[10], s[11], s[14], s[15], kf, min(lim_b, k_hi), scale2, m_b, l_b, buf)
        _v2_rescale(acc, frags, xa, xb)                  # O = alpha O + P V, P in registers
        _v4_pv_step(pa0, pb0, pa1, pb1, 0, t, g, vs, acc, frags, scratch)
        _v4_pv_step(pa2, pb2, pa3, pb3, 1, t, g, vs, acc, frags, scratch)
        _v4_pv_step(pa4, pb4, pa5, pb5, 2, t, g, vs, acc, frags, scratch)
        _v4_pv_step(pa6, pb6, pa7, pb7, 3, t, g, vs, acc, frags, scratch)
        cuda.syncthreads()                               # the tiles are rewritten next
    _v3_end(acc, frags, t, ta, tb, ra, rb, n, m_a * float32(LN2), l_a, m_b * float32(LN2), l_b, z, direct, out,
            o_part, m_part, l_part)                      # the combine takes m in natural units


def v3_warps() -> int:
    """Warps per v3 block: WARPS3 on the GPU, 2 on the simulator (its tests use a few blocks of 32 rows; the numpy
    backend launches nothing)."""
    return WARPS3 if backend.name == "cuda" else 2


def _launch_v3(q, k, v, start0, start_dev, scale, causal, out, max_keys, splits, v4: bool):
    """Launch ``_gqa_v3_kernel`` (``_gqa_v4_kernel`` when ``v4``, with its staged query rows' dynamic shared
    memory) on grid (ceil(T G / rows per block), splits, B), then the combine."""
    T, Nq, _ = q.shape
    B = k.shape[1]
    kernel, tile = (_gqa_v4_kernel, KT4) if v4 else (_gqa_v3_kernel, KT3)
    shared = v4_shared_bytes() - V4_STATIC_BYTES if v4 else 0       # the staged query rows
    width = copy_width(q, k, v) if v4 else copy_width(k, v)
    return launch_split(kernel, -(-(T * (Nq // B)) // (QT * v3_warps())), B, 32 * v3_warps(), tile, q, out,
                        max_keys, splits, (k, v, start0, start_dev, np.float32(scale), Nq // B, bool(causal), width),
                        shared=shared)


# ------------------------------------------------------------------------------------------------ launcher
def v4_shared_bytes() -> int:
    """The shared memory one v4 block needs: its tiles (static) and its staged query rows (dynamic), ~139 KB on
    the GPU - more than sm_86 / sm_89 (99 KB) or sm_75 (64 KB) give a block."""
    return V4_STATIC_BYTES + 4 * QT * v3_warps() * Q_STRIDE4


def default_variant(dk: int, dv: int) -> str:
    """The fastest variant the head and the device fit: v4 (Dk <= 192, Dv <= 128, ``v4_shared_bytes()`` of shared
    memory per block), v3 (Dk <= 256, Dv <= 128), else v2."""
    if dv > MAX_DV3 or dk > MAX_DK3:
        return "v2"
    return "v4" if dk <= MAX_DK4 and backend.shared_optin() >= v4_shared_bytes() else "v3"


def check_gqa(q, k, v, out):
    """(q, k, v, out) checked: q [T, Nq, Dk], k [S, Nkv, Dk] with Nkv dividing Nq, v [S, Nkv, Dv], out [T, Nq, Dv]."""
    q = _checks.array(q, "q", dtype=np.float32, ndim=3)
    T, Nq, Dk = q.shape
    if Dk < 1:
        raise ValueError(f"q: expected a key dim (last axis) >= 1, got shape {tuple(q.shape)}")
    k = _checks.array(k, "k", dtype=np.float32, ndim=3, shape=(None, None, Dk))
    S, Nkv = k.shape[0], k.shape[1]
    if Nkv == 0 or Nq % Nkv:
        raise ValueError(f"k: expected a number of kv heads that divides q's {Nq} query heads, got shape "
                         f"{tuple(k.shape)}")
    v = _checks.array(v, "v", dtype=np.float32, ndim=3, shape=(S, Nkv, None))
    if v.shape[2] < 1:
        raise ValueError(f"v: expected a value dim (last axis) >= 1, got shape {tuple(v.shape)}")
    out = _checks.out_array(out, "out", (T, Nq, v.shape[2]), np.float32)
    if backend.name != "numpy" and (value_column(Dk) + v.shape[2] > MAX_D or v.shape[2] > MAX_LKV):
        raise ValueError(f"v: key dim {Dk} and value dim {v.shape[2]} exceed the kernel's tile (key dim rounded up "
                         f"to 8 + value dim <= {MAX_D}, value dim <= {MAX_LKV}); use the numpy backend")
    return q, k, v, out


def gqa_attention(q, k, v, start, scale: float, causal: bool = True, out=None, splits: int | None = None,
                  variant: str | None = None):
    """Grouped-query attention of ``q [T, Nq, Dk]`` over rows of ``k [S, Nkv, Dk]`` / ``v [S, Nkv, Dv]``: causal
    (token t sees rows 0 .. start + t) or not (every token sees rows 0 .. start + T - 1).

    ``start``: an int, or a device int32 [1] array the kernel reads (graph replay; the grid then covers all S
    rows). ``splits`` asks for that many key splits (tests), as in ``mla_attention``. ``variant``: "v2" | "v3" |
    None (``default_variant(Dk, Dv)``); the numpy backend runs the reference for any."""
    q, k, v, out = check_gqa(q, k, v, out)
    splits = check_splits(splits)
    variant = default_variant(q.shape[2], v.shape[2]) if variant is None else variant
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected 'v2', 'v3', 'v4' or None, got {variant!r}")
    if variant == "v4" and (q.shape[2] > MAX_DK4 or v.shape[2] > MAX_DV3):
        raise ValueError(f"variant: v4 takes key dims <= {MAX_DK4} and value dims <= {MAX_DV3}, got {q.shape[2]} "
                         f"and {v.shape[2]}; use 'v2'")
    if variant == "v4" and backend.name != "numpy" and backend.shared_optin() < v4_shared_bytes():
        raise ValueError(f"variant: v4 needs {v4_shared_bytes()} bytes of shared memory per block, this GPU gives "
                         f"{backend.shared_optin()}; use 'v3'")
    if variant == "v3" and (q.shape[2] > MAX_DK3 or v.shape[2] > MAX_DV3):
        raise ValueError(f"variant: v3 takes key dims <= {MAX_DK3} and value dims <= {MAX_DV3}, got {q.shape[2]} "
                         f"and {v.shape[2]}; use 'v2'")
    T = q.shape[0]
    S = k.shape[0]
    start0, start_dev = _checks.device_int(start, "start")
    device_start = hasattr(start, "shape")
    if not device_start and start0 + T > S:
        raise ValueError(f"start: {start0} + {T} query rows exceed the {S} rows of k")
    scale = _checks.real(scale, "scale", lo=0.0, lo_open=True)
    causal = bool(causal)
    if backend.name == "numpy":
        out[...] = _attention_numpy(q, k, v, _checks.host_int(start), scale, causal, np.float32)
        return out
    if T == 0:
        return out
    max_keys = S if device_start else start0 + T
    if variant in ("v3", "v4"):
        return _launch_v3(q, k, v, start0, start_dev, scale, causal, out, max_keys, splits, variant == "v4")
    return attention_v2(q, k, v, start0, start_dev, scale, causal, out, max_keys, splits, device_keys=device_start)
