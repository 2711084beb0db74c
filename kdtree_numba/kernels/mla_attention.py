"""MLA attention in the absorbed form: multi-query attention of every head over the shared latent cache rows.

Each cache row (one per token and layer) is ``[c_kv (Lkv) ; k_rot (R)]``, shared by all heads. The model absorbs
W_UK into the query, so head h's query is ``q[t, h] = [q_nope[h] @ W_UK[h] (Lkv) ; roped q_rot[h] (R)]`` and

    score[h, s] = scale * (q[t, h] . cache[s])                    one 576-wide dot for Kimi (512 + 64)
    out[t, h]   = sum_s softmax_s(score[h, :])[s] * cache[s, :Lkv]  values = the latent itself
(W_UV and o_proj are applied by the model afterwards). Token t of a chunk that starts at ``start`` sees rows
``0 .. start + t`` (causal); the rows of the chunk itself must already be in the cache. One kernel path serves a
prefill chunk (T tokens) and a single-token decode step (T = 1); the tree-verify stage reuses it with another key
list (``tree_verify.py``).

Mapping: grid (token t, head group of HG heads, key split z). A block walks its split of t's key list in tiles of
BK rows: the tile is loaded into shared memory (row stride padded to an odd length so column reads do not
conflict), each of the HG x BK scores is summed by ``threads / 32`` threads over interleaved slices of the 576
dims, the HG heads' running max / sum are updated (online softmax) and every thread updates its share of the
HG x Lkv accumulators. With one split the block writes the normalised output; with several (decode: few tokens,
long context) each writes (o, m, l) partials and ``_combine_kernel`` merges them:
    M = max_z m_z;  out = sum_z exp(m_z - M) o_z / sum_z exp(m_z - M) l_z
Shapes: q [T, N, D] float32, cache [C, D] float32 (D = Lkv + R <= 576) -> out [T, N, Lkv] float32.
Example: one head, D = 2, Lkv = 1, scale 1, cache [[1, 0], [0, 1]], start 0, q [[[0, 0]], [[ln 3, 0]]]:
token 0 sees row 0 -> out 1; token 1 sees rows 0, 1 with weights 3/4, 1/4 -> out 0.75.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32

from .. import backend
from . import _checks
from ._intrinsics import online_softmax_row

HG = 4            # heads per block
BK = 8            # cache rows per tile
MAX_D = 576       # widest cache row the kernel supports (Kimi / DeepSeek: 512 + 64)
MAX_LKV = 512
ROW = MAX_D + 1   # padded shared row stride
MAX_SUBS = 8      # threads per score (blockDim / 32)
PAIRS = 32        # HG * BK (head, row) scores per tile; a literal: numba types shared shapes from constants
NEG_INF = -math.inf
assert PAIRS == HG * BK and ROW == MAX_D + 1


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


# ------------------------------------------------------------------------------------------------ kernels
@cuda.jit
def _attention_kernel(q, cache, start0, start_dev, scale, paths, depths, tree, split_len, direct, out, o_part,
                      m_part, l_part):
    t = cuda.blockIdx.x
    h0 = cuda.blockIdx.y * HG
    z = cuda.blockIdx.z
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    N = q.shape[1]
    D = q.shape[2]
    lkv = out.shape[2]
    hn = min(HG, N - h0)

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

    # the key list of token t: rows [0, n_prefix) then, in tree mode, its root-to-node path
    if tree:
        n_prefix = start
        n_keys = start + depths[t] + 1
    else:
        n_prefix = start + t + 1
        n_keys = n_prefix
    k_lo = z * split_len
    k_hi = min(n_keys, k_lo + split_len)

    for i in range(tid, hn * D, nthreads):               # queries of the group, pre-scaled
        qs[i // D, i % D] = q[t, h0 + i // D, i % D] * scale
    for i in range(tid, hn * lkv, nthreads):
        o[i // lkv, i % lkv] = float32(0.0)
    if tid < HG:
        m_run[tid] = float32(NEG_INF)
        l_run[tid] = float32(0.0)
    cuda.syncthreads()

    subs = nthreads // 32                                 # threads summing one score
    pair = tid % 32
    sub = tid // 32
    for k0 in range(k_lo, k_hi, BK):
        nk = min(BK, k_hi - k0)
        if tid < nk:
            kk = k0 + tid
            rows[tid] = kk if kk < n_prefix else start + paths[t, kk - n_prefix]
        cuda.syncthreads()
        for i in range(tid, nk * D, nthreads):            # tile of cache rows -> shared
            ks[i // D, i % D] = cache[rows[i // D], i % D]
        cuda.syncthreads()

        # scores: pair = (head, row); `subs` threads each sum every subs-th dim
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

    for i in range(tid, hn * lkv, nthreads):
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
def _combine_kernel(o_part, m_part, l_part, out):
    T = out.shape[0]
    N = out.shape[1]
    lkv = out.shape[2]
    idx = cuda.grid(1)
    if idx >= T * N * lkv:
        return
    c = idx % lkv
    h = (idx // lkv) % N
    t = idx // (lkv * N)
    mx = float32(NEG_INF)
    for z in range(m_part.shape[0]):
        mx = max(mx, m_part[z, t, h])
    num = float32(0.0)
    den = float32(0.0)
    for z in range(m_part.shape[0]):
        if l_part[z, t, h] > 0:
            w = float32(math.exp(m_part[z, t, h] - mx))
            num += w * o_part[z, t, h, c]
            den += w * l_part[z, t, h]
    out[t, h, c] = num / den


# ------------------------------------------------------------------------------------------------ launchers
def _check_qkv(q, cache, lkv, out):
    q = _checks.array(q, "q", dtype=np.float32, ndim=3)
    T, N, D = q.shape
    cache = _checks.array(cache, "cache", dtype=np.float32, ndim=2, shape=(None, D))
    lkv = _checks.integer(lkv, "lkv", lo=1, hi=D)
    out = _checks.out_array(out, "out", (T, N, lkv), np.float32)
    return q, cache, lkv, out


def launch_attention(q, cache, start, scale, lkv, out, paths=None, depths=None, max_keys=None, splits=None):
    """Launch the attention kernel over each token's key list (causal, or tree when ``paths`` is given).

    ``start``: an int, or a device int32 [1] array read by the kernel (``_checks.device_int``); the grid then
    covers ``max_keys`` (default: every cache row) and splits past a token's last key contribute nothing."""
    start0, start_dev = _checks.device_int(start, "start")
    T, N, D = q.shape
    if D > MAX_D or lkv > MAX_LKV:
        raise ValueError(f"q: latent width {D} (Lkv {lkv}) exceeds the kernel's {MAX_D} ({MAX_LKV}); "
                         f"use the numpy backend for wider models")
    if T == 0:
        return out
    tree = paths is not None
    if not tree:
        paths = backend.zeros((1, 1), np.int32)
        depths = backend.zeros((1,), np.int32)
        max_keys = cache.shape[0] if hasattr(start, "shape") else start0 + T
    groups = (N + HG - 1) // HG
    if splits is None:
        splits = 1
        if backend.name == "cuda":
            splits = max(1, min(-(-264 // (T * groups)), -(-max_keys // (BK * 16))))
    split_len = -(-max_keys // splits)
    split_len = -(-split_len // BK) * BK
    splits = -(-max_keys // split_len)
    threads = backend.block_size(128, 32)            # a multiple of 32, at most 32 * MAX_SUBS
    direct = splits == 1
    if direct:                                         # unused placeholders
        o_part = backend.zeros((1, 1, 1, 1), np.float32)
        m_part = l_part = backend.zeros((1, 1, 1), np.float32)
    else:
        o_part = backend.empty((splits, T, N, lkv), np.float32)
        m_part = backend.empty((splits, T, N), np.float32)
        l_part = backend.empty((splits, T, N), np.float32)
    backend.launch(_attention_kernel, (T, groups, splits), threads, q, cache, start0, start_dev, np.float32(scale),
                   paths, depths, tree, int(split_len), direct, out, o_part, m_part, l_part)
    if not direct:
        n = T * N * lkv
        t2 = backend.block_size(256, 32)
        backend.launch(_combine_kernel, (n + t2 - 1) // t2, t2, o_part, m_part, l_part, out)
    return out


def mla_attention(q, cache, start, scale: float, lkv: int, out=None, splits: int | None = None):
    """Causal absorbed-MLA attention of ``q [T, N, D]`` over ``cache [C, D]`` rows ``0 .. start + T - 1``.

    ``lkv``: the latent width (values are ``cache[:, :lkv]``); ``splits`` forces the number of key splits (tests).
    ``start``: an int, or a device int32 [1] array the kernel reads (graph replay: decode/replay.py).
    """
    q, cache, lkv, out = _check_qkv(q, cache, lkv, out)
    T = q.shape[0]
    start0, _ = _checks.device_int(start, "start")
    if not hasattr(start, "shape") and start0 + T > cache.shape[0]:
        raise ValueError(f"start: {start0} + {T} new rows exceed the cache's {cache.shape[0]} rows")
    scale = _checks.real(scale, "scale", lo=0.0, lo_open=True)
    if backend.name == "numpy":
        start = _checks.host_int(start)
        visible = np.arange(start + T)[None, :] <= start + np.arange(T)[:, None]      # [T, start+T]
        out[...] = masked_attention_fast(q, np.asarray(cache)[:start + T], visible, scale, lkv)
        return out
    return launch_attention(q, cache, start, scale, lkv, out, splits=splits)

