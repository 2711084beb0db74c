"""Block attention of the DFlash drafter: GQA, non-causal, over the draft cache's context rows and the block.

The drafter's block (``[root, MASK, ..., MASK]``, B tokens at positions start .. start + B - 1) attends to every
cached context row and to the whole block at once - there is no causal mask inside a block: all B positions are
drafted in one pass ("block diffusion"). Query head h reads kv head g = h // (Nq / Nkv) (grouped-query attention):

    score[t, h, s] = scale * q[t, h] . k[s, g]                      s = 0 .. n_keys - 1 (context rows, then block)
    out[t, h]      = sum_s softmax_s(score[t, h, :])[s] * v[s, g]

Variants (``variant=``; None -> ``default_variant()``: v2 on a GPU, v1 on the simulator, where v2's MMA stand-in
costs a block barrier per instruction):
  v1  ``_block_attention_kernel`` below, CUDA-core dot products (the readable version).
  v2  kernels/gqa_attention.py's tiles on tensor cores (mla_attention's ``_attention_v2_kernel``, not causal): a
      block takes 32 (token, head) rows of one kv head - the default drafter's whole block of 16 tokens x 2 heads
      - and streams the keys and values in tiles of 16 rows; the key list is split over blocks and merged.

v1 mapping: one block of threads per (query token t, kv head g) serving the G = Nq / Nkv query heads that share g, so
each key/value row is loaded from global memory once for G heads. The block walks the keys in tiles of
``tile_rows(D)`` rows (as many as TILE_FLOATS floats of shared memory hold: 64 for the default drafter's D = 32,
27 at D = 128) with an online softmax (running max m, sum l, rescale alpha = exp(m_old - m_new)): every thread
issues up to LOADS global loads of the tile before it stores any to shared memory (a store may alias a later load
for the compiler, so load-store pairs would each wait a full memory latency), thread i scores one (head, row) pair
of the tile over all D dims, one thread per head updates m / l, and the threads stride over the G x D
accumulators. n_keys is small for a drafter (context + block), so no key splits; the tile's size sets how many
memory round trips and barriers a call waits for (it was 8 rows: ~28 us a call for ~200 keys on the H200).
Shapes: q [B, Nq, D], k [S, Nkv, D], v [S, Nkv, D] float32 (S >= n_keys; rows past n_keys are ignored)
-> out [B, Nq, D] float32.
Example: one head, D = 1, scale 1, k = [[0], [0]], v = [[1], [3]], n_keys 2: equal scores -> out = 2 for every
query, whatever q is (and with n_keys 1, out = 1).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from .. import backend
from . import _checks
from .gqa_attention import gqa_attention_ref, value_column
from .mla_attention import MAX_D as V2_MAX_D, attention_v2
from .primitives import online_softmax_row

MAX_G = 8         # query heads per kv head (Kimi-K2.5's DFlash drafter: 64 / 8)
MAX_D = 256       # head dim
MAX_BK = 64       # most key rows per tile
TILE_FLOATS = 3584  # shared floats for a tile's keys (rows of D + 1: an odd stride spreads row reads over banks)
LOADS = 8         # global loads a thread keeps in flight while filling a tile
NEG_INF = -math.inf
VARIANTS = ("v1", "v2")


def default_variant() -> str:
    """v2 (tensor cores) on a GPU, v1 on the simulator (tests run v2 there explicitly)."""
    return "v2" if backend.name == "cuda" else "v1"


def tile_rows(D: int) -> int:
    """Key rows per tile for head dim D: as many as TILE_FLOATS floats hold, at most MAX_BK (64 at D = 32, 27 at
    D = 128, 13 at D = 256)."""
    return min(MAX_BK, TILE_FLOATS // (D + 1))


def block_attention_ref(q, k, v, n_keys: int, scale: float):
    """Non-causal GQA attention in float64 NumPy: every query sees key rows 0 .. n_keys - 1 (gqa_attention's
    reference with start = n_keys - B)."""
    return gqa_attention_ref(q, k, v, n_keys - q.shape[0], scale, causal=False)


@cuda.jit(device=True)
def _load_tile(k, v, g, k0, nk, D, ks, vs):
    """Key rows k0 .. k0 + nk - 1 of kv head g into ks (row stride D + 1) and vs (row stride D): element i = j * D + d
    goes to thread i % threads, which issues LOADS of its key and value loads before it stores any."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    n = nk * D
    kb = cuda.local.array(LOADS, float32)                # registers: the loops unroll
    vb = cuda.local.array(LOADS, float32)
    for base in range(0, n, LOADS * nt):
        for u in range(LOADS):
            i = base + u * nt + tid
            if i < n:
                kb[u] = k[k0 + i // D, g, i % D]
                vb[u] = v[k0 + i // D, g, i % D]
        for u in range(LOADS):
            i = base + u * nt + tid
            if i < n:
                ks[i // D * (D + 1) + i % D] = kb[u]
                vs[i] = vb[u]


@cuda.jit
def _block_attention_kernel(q, k, v, n_keys0, n_keys_dev, scale, bk, out):
    n_keys = n_keys0 + n_keys_dev[0]                       # the host part + the device part (graph replay)
    t = cuda.blockIdx.x                                    # query token
    g = cuda.blockIdx.y                                    # kv head
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    D = q.shape[2]
    G = q.shape[1] // k.shape[1]                           # query heads per kv head
    h0 = g * G

    qs = cuda.shared.array((MAX_G, MAX_D), float32)        # the G queries, pre-scaled
    ks = cuda.shared.array(TILE_FLOATS, float32)           # key tile [bk, D + 1] (odd stride: rows over banks)
    vs = cuda.shared.array(TILE_FLOATS, float32)           # value tile [bk, D]
    o = cuda.shared.array((MAX_G, MAX_D), float32)         # running (unnormalised) outputs
    p = cuda.shared.array((MAX_G, MAX_BK), float32)        # scores, then probabilities, of the tile
    m_run = cuda.shared.array(MAX_G, float32)
    l_run = cuda.shared.array(MAX_G, float32)
    alpha = cuda.shared.array(MAX_G, float32)

    for i in range(tid, G * D, nthreads):
        qs[i // D, i % D] = q[t, h0 + i // D, i % D] * scale
        o[i // D, i % D] = float32(0.0)
    if tid < G:
        m_run[tid] = float32(NEG_INF)
        l_run[tid] = float32(0.0)

    for k0 in range(0, n_keys, bk):
        nk = min(bk, n_keys - k0)
        _load_tile(k, v, g, k0, nk, D, ks, vs)             # tile of key and value rows -> shared
        cuda.syncthreads()
        for i in range(tid, G * bk, nthreads):             # one (head, row) score per thread
            h = i // bk
            j = i % bk
            acc = float32(NEG_INF)
            if j < nk:
                acc = float32(0.0)
                for d in range(D):
                    acc += qs[h, d] * ks[j * (D + 1) + d]
            p[h, j] = acc
        cuda.syncthreads()
        if tid < G:                                         # online softmax, one thread per head
            online_softmax_row(p, tid, nk, m_run, l_run, alpha)
        cuda.syncthreads()
        for i in range(tid, G * D, nthreads):              # o[h, d] = o[h, d] * alpha[h] + sum_j p[h, j] v[j, d]
            h = i // D
            d = i % D
            acc = o[h, d] * alpha[h]
            for j in range(nk):
                acc += p[h, j] * vs[j * D + d]
            o[h, d] = acc
        cuda.syncthreads()

    for i in range(tid, G * D, nthreads):
        out[t, h0 + i // D, i % D] = o[i // D, i % D] / l_run[i // D]


def block_attention(q, k, v, n_keys: int, scale: float, out=None, variant: str | None = None):
    """Non-causal GQA attention of ``q [B, Nq, D]`` over rows ``0 .. n_keys - 1`` of ``k, v [S, Nkv, D]``.

    ``n_keys``: an int, or a device int32 [1] array the kernel reads (a captured DDTree round), unchecked, or such
    an array and an int offset as a pair (the kernel adds them: the draft's ``(start, B)``).
    ``variant``: "v1" | "v2" | None (``default_variant()``); the numpy backend runs the reference for any."""
    if variant is None:
        variant = default_variant()
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected 'v1', 'v2' or None, got {variant!r}")
    q = _checks.array(q, "q", dtype=np.float32, ndim=3)
    B, Nq, D = q.shape
    if D < 1:
        raise ValueError(f"q: expected a head dim (last axis) >= 1, got shape {tuple(q.shape)}")
    k = _checks.array(k, "k", dtype=np.float32, ndim=3)
    S, Nkv = k.shape[0], k.shape[1]
    if k.shape[2] != D:
        raise ValueError(f"k: expected head dim {D} (q's last axis), got shape {tuple(k.shape)}")
    if Nq % Nkv:
        raise ValueError(f"k: {Nkv} kv heads do not divide q's {Nq} query heads")
    v = _checks.array(v, "v", dtype=np.float32, shape=(S, Nkv, D))
    n_keys0, n_keys_dev = _checks.device_int(n_keys, "n_keys", lo=1)
    if n_keys0 > S:
        raise ValueError(f"n_keys: expected an integer <= {S} (the rows of k), got {n_keys0}")
    scale = _checks.real(scale, "scale", lo=0.0, lo_open=True)
    out = _checks.out_array(out, "out", (B, Nq, D), np.float32)
    if backend.name == "numpy":
        out[...] = block_attention_ref(q, k, v, _checks.host_int(n_keys), scale)
        return out
    if variant == "v2":
        if value_column(D) + D > V2_MAX_D:
            raise ValueError(f"q: head dim {D} exceeds v2's {V2_MAX_D // 2} (keys and values share a tile row of "
                             f"{V2_MAX_D}); use variant='v1' or the numpy backend")
        if B == 0:
            return out
        # every query sees rows 0 .. n_keys - 1 = start + B - 1: start = n_keys - B
        device_keys = _checks.on_device(n_keys)
        return attention_v2(q, k, v, n_keys0 - B, n_keys_dev, scale, False, out, S if device_keys else n_keys0, None,
                            device_keys=device_keys)
    if Nq // Nkv > MAX_G or D > MAX_D:
        raise ValueError(f"q: {Nq // Nkv} query heads per kv head and head dim {D} exceed the kernel's {MAX_G} "
                         f"and {MAX_D}; use the numpy backend for this drafter")
    if B == 0:
        return out
    backend.launch(_block_attention_kernel, (B, Nkv), backend.block_size(128, 32), q, k, v, n_keys0, n_keys_dev,
                   np.float32(scale), tile_rows(D), out)
    return out
