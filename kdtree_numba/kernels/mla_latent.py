"""The MLA latent write: one launch turns the kv_a projection's output rows into latent cache rows.

    c[t]     = ckv[t, :Lkv] / sqrt(mean(ckv[t, :Lkv]**2) + eps) * w            (kv_a_layernorm, kernels/rmsnorm.py)
    k_rot[t] = NeoX RoPE of ckv[t, Lkv:] at positions[t]                        (kernels/rope.py's formula)
    cache[start + t] = [c[t] ; k_rot[t]]                                         t < T

The model did this in six launches per layer (two copies of the column slices, RMSNorm, RoPE, two scatters into
the cache rows); on the default pair every launch costs ~2.5 us of device time whatever its work, so a decode step
paid ~15 us a layer for it.

Mapping: one block per token, rmsnorm's threads and device functions (``row_sum_squares``, ``write_scaled_row``:
the same per-thread sums and tree, so ``c`` is bit-identical to ``rmsnorm.rmsnorm`` of the slice): the threads
stride over the Lkv columns (four loads in flight) keeping them in a shared copy, reduce the sum of squares
(primitives.smem_sum), then write the scaled row; thread j < R/2 also rotates pair j of the rope part (rope's
``cos_sin`` / ``rotate``). ``start`` is an int or a device int32 [1] (graph replay: the kernel reads it); rows at
or past the cache's end are not written.
Shapes: ckv [T, Lkv + R] float32, w [Lkv] float32, positions [T] int, inv_freq [R/2] float32, cache [C, Lkv + R]
float32 (one layer's rows; written in place).
Example: Lkv 2, R 2, w [1, 1], eps 0, ckv [[3, 4, 1, 0]], position pi/2 (inv_freq [1]), start 5:
cache[5] = [0.8485, 1.1314, 0, 1]  (mean square 12.5; [1, 0] rotated by 90 degrees).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from .. import backend
from . import _checks
from .primitives import smem_sum
from .rmsnorm import MAX_THREADS, rmsnorm_ref, row_sum_squares, write_scaled_row
from .rope import cos_sin, rope_ref, rotate

STAGE = 1024        # latent columns kept in shared memory between the two passes (Kimi / DeepSeek: Lkv = 512)


def latent_rows_ref(ckv, w, eps: float, positions, inv_freq, amp: float = 1.0) -> np.ndarray:
    """The rows the kernel writes, in plain NumPy: [rmsnorm(c) ; rope(k_rot)]  [T, Lkv + R]."""
    ckv = np.asarray(ckv, np.float32)
    lkv = np.asarray(w).shape[0]
    k_rot = rope_ref(ckv[:, None, lkv:], positions, inv_freq, amp)[:, 0]        # [T, R]
    return np.concatenate([rmsnorm_ref(ckv[:, :lkv], w, eps), k_rot], axis=1)   # [T, Lkv + R]


@cuda.jit
def _latent_kernel(ckv, w, eps, positions, inv_freq, amp, cache, start0, start_dev, base0, base_dev):
    t = cuda.blockIdx.x
    lkv = w.shape[0]
    half = inv_freq.shape[0]
    red = cuda.shared.array(MAX_THREADS, float32)
    buf = cuda.shared.array(STAGE, float32)         # the latent's first STAGE columns, read from DRAM once
    ssq = smem_sum(row_sum_squares(ckv, t, buf, lkv), red)   # every thread calls (barriers; they publish buf)
    row = start0 + start_dev[0] + t
    if row >= cache.shape[0]:
        return
    inv = float32(1.0) / float32(math.sqrt(ssq / float32(lkv) + eps))
    write_scaled_row(ckv, t, buf, w, inv, cache, row, lkv)
    j = cuda.threadIdx.x
    position = base0 + base_dev[0] + positions[t]
    while j < half:                                  # rope pair j: (j, j + R/2)
        c, s = cos_sin(position, inv_freq[j], amp)
        cache[row, lkv + j], cache[row, lkv + j + half] = rotate(ckv[t, lkv + j], ckv[t, lkv + j + half], c, s)
        j += cuda.blockDim.x


def write_latent(ckv, w, eps: float, positions, inv_freq, amp: float, cache, start, base=0) -> None:
    """Write ``[rmsnorm(ckv[:, :Lkv], w) ; rope(ckv[:, Lkv:])]`` into ``cache`` rows ``start .. start + T - 1``
    (``cache [C, Lkv + R]``: one layer's rows, a contiguous view; ``ckv`` may be a strided view, e.g. the kv_a
    columns of the fused q_a / kv_a projection), RoPE at ``base + positions``. ``start`` / ``base``: ints (start
    checked against C) or device int32 [1] arrays read by the kernel (graph replay; rows past C are dropped
    there, unchecked; a tree verify's base is its start, its positions the depths: no add launch)."""
    ckv = _checks.array(ckv, "ckv", dtype=np.float32, ndim=2, strided=True)
    T, width = ckv.shape
    w = _checks.array(w, "w", dtype=np.float32, ndim=1)
    lkv = w.shape[0]
    if not 0 < lkv < width or (width - lkv) % 2:
        raise ValueError(f"w: {lkv} latent columns leave {width - lkv} rope columns of ckv's {width}; expected a "
                         f"positive even number")
    half = (width - lkv) // 2
    eps = _checks.real(eps, "eps", lo=0.0)
    positions = _checks.array(positions, "positions", kinds="iu", shape=(T,))
    inv_freq = _checks.array(inv_freq, "inv_freq", dtype=np.float32, shape=(half,))
    amp = _checks.real(amp, "amp", lo=0.0, lo_open=True)
    cache = _checks.array(cache, "cache", dtype=np.float32, shape=(None, width))
    start0, start_dev = _checks.device_int(start, "start")
    base0, base_dev = _checks.device_int(base, "base")
    if not hasattr(start, "shape") and start0 + T > cache.shape[0]:
        raise ValueError(f"start: rows {start0}..{start0 + T - 1} exceed the cache's {cache.shape[0]} rows")
    if T == 0:
        return
    if backend.name == "numpy":
        s = _checks.host_int(start)
        rows = latent_rows_ref(ckv, w, eps, np.asarray(positions, np.int64) + _checks.host_int(base), inv_freq,
                               amp)                                                  # [T, Lkv + R]
        keep = min(T, cache.shape[0] - s)
        cache[s:s + keep] = rows[:keep]
        return
    backend.launch(_latent_kernel, T, backend.block_size(256, 16), ckv, w, np.float32(eps), positions, inv_freq,
                   np.float32(amp), cache, start0, start_dev, base0, base_dev)
