"""The DFlash drafter's cache write: one launch turns a layer's fused k/v projection rows into draft-cache rows.

    k[t, g] = NeoX RoPE over all D of  kv[t, gD : gD + D] / sqrt(mean(kv[t, gD : gD + D]**2) + eps) * w
    v[t, g] = kv[t, Nkv D + gD : Nkv D + gD + D]
    k_cache[start + t, g] = k[t, g];   v_cache[start + t, g] = v[t, g]          t < T, kv head g < Nkv

(Qwen3's per-head ``k_norm``, then RoPE at positions[t]: kernels/rmsnorm.py's and kernels/rope.py's formulas.) The
drafter did this with two projections, RMSNorm, RoPE and two scatters into the cache rows per layer, twice a DDTree
round (the newly committed context rows, then the block); on the default pair every launch costs ~2.5 us of
device time whatever its work.

Mapping: grid (token t, kv head g); a block of P threads, P the power of two >= D/2 (on the GPU at least 32: a
whole warp). Thread j < D/2 owns the rope pair (j, j + D/2):
it loads both k values, their squares go through a block tree sum (primitives.smem_sum), then it scales, rotates
and writes them, and copies the same two columns of v. ``start`` is an int or a device int32 [1] (graph replay:
the kernel reads it); rows at or past the cache's end are not written.
Shapes: kv [T, 2 Nkv D] float32 (k heads, then v heads), w [D], positions [T] int, inv_freq [D/2] float32,
k_cache / v_cache [C, Nkv, D] float32 (one layer's rows; written in place). D even, D <= 256.
Example: Nkv 1, D 2, w [1, 1], eps 0, kv [[3, 4, 5, 6]], position pi/2 (inv_freq [1]), start 0: k = [3, 4] scaled by
1 / sqrt(12.5) = [0.8485, 1.1314], turned by 90 degrees -> k_cache[0, 0] = [-1.1314, 0.8485]; v_cache[0, 0] = [5, 6].
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from .. import backend
from . import _checks
from .primitives import smem_sum
from .rmsnorm import rmsnorm_ref
from .rope import cos_sin, rope_ref, rotate

MAX_HALF = 128      # rope pairs per head (D <= 256, block_attention's MAX_D); also the reduction buffer


def draft_kv_ref(kv, w, eps: float, positions, inv_freq, amp: float = 1.0):
    """(k [T, Nkv, D], v [T, Nkv, D]) in plain NumPy: per-head RMSNorm of k, then RoPE over the whole head."""
    kv = np.asarray(kv, np.float32)
    D = np.asarray(w).shape[0]
    T, n_kv = kv.shape[0], kv.shape[1] // (2 * D)
    k = rmsnorm_ref(kv[:, :n_kv * D].reshape(T * n_kv, D), w, eps).reshape(T, n_kv, D)
    return rope_ref(k, positions, inv_freq, amp), kv[:, n_kv * D:].reshape(T, n_kv, D).copy()


@cuda.jit
def _draft_kv_kernel(kv, w, eps, positions, inv_freq, amp, k_cache, v_cache, start0, start_dev):
    t = cuda.blockIdx.x
    g = cuda.blockIdx.y
    j = cuda.threadIdx.x
    half = inv_freq.shape[0]
    D = 2 * half
    n_kv = k_cache.shape[1]
    red = cuda.shared.array(MAX_HALF, float32)
    a = float32(0.0)
    b = float32(0.0)
    if j < half:
        a = kv[t, g * D + j]
        b = kv[t, g * D + j + half]
    ssq = smem_sum(a * a + b * b, red)               # every thread calls (barriers)
    row = start0 + start_dev[0] + t
    if j >= half or row >= k_cache.shape[0]:
        return
    inv = float32(1.0) / float32(math.sqrt(ssq / float32(D) + eps))
    c, s = cos_sin(positions[t], inv_freq[j], amp)
    k_cache[row, g, j], k_cache[row, g, j + half] = rotate(a * inv * w[j], b * inv * w[j + half], c, s)
    v_cache[row, g, j] = kv[t, (n_kv + g) * D + j]
    v_cache[row, g, j + half] = kv[t, (n_kv + g) * D + j + half]


def write_draft_kv(kv, w, eps: float, positions, inv_freq, amp: float, k_cache, v_cache, start) -> None:
    """Write the k/v rows of ``kv [T, 2 Nkv D]`` (k heads, then v heads: the fused projection) into rows
    ``start .. start + T - 1`` of ``k_cache`` / ``v_cache [C, Nkv, D]``: k per-head RMS-normalised by ``w [D]`` and
    RoPE'd at ``positions``, v as it is. ``start``: an int (checked against C) or a device int32 [1] array read
    by the kernel (graph replay; rows past C are dropped there, unchecked)."""
    k_cache = _checks.array(k_cache, "k_cache", dtype=np.float32, ndim=3)
    C, n_kv, D = k_cache.shape
    v_cache = _checks.array(v_cache, "v_cache", dtype=np.float32, shape=(C, n_kv, D))
    if D % 2 or D // 2 > MAX_HALF:
        raise ValueError(f"k_cache: head dim {D}; expected an even number <= {2 * MAX_HALF}")
    kv = _checks.array(kv, "kv", dtype=np.float32, ndim=2, shape=(None, 2 * n_kv * D))
    T = kv.shape[0]
    w = _checks.array(w, "w", dtype=np.float32, shape=(D,))
    eps = _checks.real(eps, "eps", lo=0.0)
    positions = _checks.array(positions, "positions", kinds="iu", shape=(T,))
    inv_freq = _checks.array(inv_freq, "inv_freq", dtype=np.float32, shape=(D // 2,))
    amp = _checks.real(amp, "amp", lo=0.0, lo_open=True)
    start0, start_dev = _checks.device_int(start, "start")
    if not hasattr(start, "shape") and start0 + T > C:
        raise ValueError(f"start: rows {start0}..{start0 + T - 1} exceed the cache's {C} rows")
    if T == 0:
        return
    if backend.name == "numpy":
        s = _checks.host_int(start)
        k, v = draft_kv_ref(kv, w, eps, positions, inv_freq, amp)                   # [T, Nkv, D] each
        keep = min(T, C - s)
        k_cache[s:s + keep] = k[:keep]
        v_cache[s:s + keep] = v[:keep]
        return
    threads = 1
    while threads < D // 2:
        threads *= 2
    backend.launch(_draft_kv_kernel, (T, n_kv), backend.block_size(max(threads, 32), threads), kv, w,
                   np.float32(eps), positions, inv_freq, np.float32(amp), k_cache, v_cache, start0, start_dev)
