"""RMSNorm: y = x / sqrt(mean(x**2) + eps) * w        (variance accumulated in float32, as HF does)

Mapping: one block per token row; the block's threads stride over the hidden dim, each summing the squares of
its elements; a shared-memory tree reduction gives the row's sum; then every thread scales its elements.
Shapes: x [T, H] float32, w [H] float32 -> y [T, H] float32.
Example: rmsnorm([[3, 4]], [1, 1], 0) -> [[0.8485, 1.1314]]   (mean square 12.5, 1/sqrt(12.5) = 0.2828)
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from .. import backend
from . import _checks

MAX_THREADS = 1024  # shared reduction buffer size; launch block sizes are powers of two <= this


def rmsnorm_ref(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """The spec in plain NumPy, float32 throughout."""
    x = np.asarray(x, dtype=np.float32)
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)   # [T, 1]
    return (x / np.sqrt(ms + np.float32(eps))) * w                   # [T, H]


@cuda.jit
def _rmsnorm_kernel(x, w, out, eps):
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    H = x.shape[1]
    partial = cuda.shared.array(MAX_THREADS, float32)

    # each thread: sum of squares over columns tid, tid + nthreads, ...
    acc = float32(0.0)
    for c in range(tid, H, nthreads):
        v = x[row, c]
        acc += v * v
    partial[tid] = acc
    cuda.syncthreads()

    # tree reduction: after the loop partial[0] holds the row's sum of squares
    stride = nthreads // 2
    while stride > 0:
        if tid < stride:
            partial[tid] += partial[tid + stride]
        cuda.syncthreads()
        stride //= 2

    inv = float32(1.0) / float32(math.sqrt(partial[0] / float32(H) + eps))
    for c in range(tid, H, nthreads):
        out[row, c] = x[row, c] * inv * w[c]


def rmsnorm(x, w, eps: float, out=None):
    """Row RMSNorm of ``x [T, H]`` with weight ``w [H]``; returns ``out [T, H]`` (float32, current backend)."""
    x = _checks.array(x, "x", dtype=np.float32, ndim=2)
    w = _checks.array(w, "w", dtype=np.float32, shape=(x.shape[1],))
    eps = _checks.real(eps, "eps", lo=0.0)
    out = _checks.out_array(out, "out", x.shape, np.float32)
    if backend.name == "numpy":
        out[...] = rmsnorm_ref(x, w, eps)
        return out
    if x.shape[0] == 0:
        return out
    threads = backend.block_size(256, 16)
    backend.launch(_rmsnorm_kernel, x.shape[0], threads, x, w, out, np.float32(eps))
    return out
