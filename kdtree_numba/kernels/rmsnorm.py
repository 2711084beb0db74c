"""RMSNorm: y = x / sqrt(mean(x**2) + eps) * w        (variance accumulated in float32, as HF does)

Mapping: one block per token row; the block's threads stride over the hidden dim, each summing the squares of its
elements and keeping them in a shared-memory copy of the row; a shared-memory tree reduction (primitives.smem_sum)
gives the row's sum; then every thread scales its elements from the shared copy, so the row is read from DRAM once
(columns past STAGE = 8192 are read again from global memory). Each thread issues four independent loads per loop
step (elements c, c + n, c + 2n, c + 3n for n threads): with one load in flight per thread the kernel reached 35 %
of the H200's copy bandwidth (latency-bound). Re-reading the row from L2 instead of the shared copy: 65 %; with the
shared copy: 70 % (device time, docs/PERFORMANCE.md). Blocks are 256 threads, 1024 for rows of WIDE_ROW columns
and more (a decode step's single Kimi row of 7168: 11.5 -> 8.6 us on the H200, graph-replayed; 1024 threads walk it
in two loop steps instead of seven). mla_latent's latent norm (512 wide) shares the 256-thread sum order.
Shapes: x [T, H] float32, w [H] float32 -> y [T, H] float32.
Example: rmsnorm([[3, 4]], [1, 1], 0) -> [[0.8485, 1.1314]]   (mean square 12.5, 1/sqrt(12.5) = 0.2828)
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from .. import backend
from . import _checks
from .primitives import smem_sum

MAX_THREADS = 1024  # shared reduction buffer size; launch block sizes are powers of two <= this
WIDE_ROW = 4096     # rows at least this wide get 1024-thread blocks
STAGE = 8192        # row values kept in shared memory between the two passes (32 KB; Kimi/DeepSeek H = 7168)


def rmsnorm_ref(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """The spec in plain NumPy, float32 throughout."""
    x = np.asarray(x, dtype=np.float32)
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)   # [T, 1]
    return (x / np.sqrt(ms + np.float32(eps))) * w                   # [T, H]


def inv_rms_ref(x: np.ndarray, eps: float) -> np.ndarray:
    """1 / sqrt(mean(x**2) + eps) per row of ``x [T, H]``, float32 [T, 1] (``rmsnorm_ref``'s scale)."""
    x = np.asarray(x, dtype=np.float32)
    return np.float32(1.0) / np.sqrt(np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32) + np.float32(eps))


def scale_rows_ref(y, norm_rows, src, eps: float):
    """The NumPy path of a kernel's ``norm_rows``: ``y [T, N]`` as it is when ``norm_rows`` is None, else each row
    times 1 / rms(src[t]) (``inv_rms_ref``; ``src``, ``eps``: ``norm_rows_args``'s). Example: y [[1, 2]], src
    [[2, 2]], eps 0 -> [[0.5, 1]]."""
    return y if norm_rows is None else np.asarray(y, np.float32) * inv_rms_ref(src, eps)


def norm_rows_args(norm_rows, T: int) -> tuple:
    """A kernel's ``norm_rows`` argument checked: None -> (an empty [0, 1] placeholder, 0.0), or ``(x [T, H], eps)``
    -> (x, eps): the rows whose RMS scales a product of them whose RMSNorm weight was folded into the
    weights (``folded_norm``)."""
    if norm_rows is None:
        return backend.placeholder((0, 1)), 0.0
    if not isinstance(norm_rows, tuple) or len(norm_rows) != 2:
        raise ValueError(f"norm_rows: expected None or a pair (rows [T, H], eps), got {type(norm_rows).__name__}")
    x = _checks.array(norm_rows[0], "norm_rows[0]", dtype=np.float32, ndim=2, shape=(T, None), strided=True)
    return x, _checks.real(norm_rows[1], "norm_rows[1]", lo=0.0)


def folded_norm(weight, norm_w):
    """``weight [N, H] * norm_w [H]`` (column j scaled by norm_w[j]): a projection of RMSNorm'd rows as a
    projection of the raw rows x, up to the row scale 1 / rms(x) that the next kernel applies (``norm_rows``):
    rmsnorm(x, w) @ W^T = (x @ (W diag w)^T) / rms(x). Saves the norm's launch. Example: W [[1, 2]], w [3, 4] ->
    [[3, 8]]."""
    return weight * norm_w[None, :]


@cuda.jit(device=True)
def row_inv_rms(x, t, eps, red):
    """1 / sqrt(mean(x[t, :]**2) + eps) to every thread of the block: each thread's share of the squares by
    ``row_sum_squares`` with nothing kept (an empty buffer: its one-load loop, a drafter row being 256 wide),
    smem_sum adds the shares (``red``: shared [>= threads]), and a last barrier frees ``red`` for the caller's next
    sum."""
    H = x.shape[1]
    ssq = smem_sum(row_sum_squares(x, t, red[:0], H), red)
    cuda.syncthreads()
    return float32(1.0) / float32(math.sqrt(ssq / float32(H) + eps))


@cuda.jit(device=True)
def row_sum_squares(x, row, buf, H):
    """This thread's share of the sum of squares of x[row, :H]: columns tid, tid + n, ... (n threads; four loads in
    flight per step), the first ``buf.shape[0]`` of them also kept in ``buf`` (shared) for ``write_scaled_row``.
    Used by mla_latent's kernel too, so its normalised latent equals this kernel's bit for bit."""
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    acc = float32(0.0)
    c = tid
    staged = min(H, buf.shape[0])
    while c + 3 * nthreads < staged:
        v0 = x[row, c]
        v1 = x[row, c + nthreads]
        v2 = x[row, c + 2 * nthreads]
        v3 = x[row, c + 3 * nthreads]
        buf[c] = v0
        buf[c + nthreads] = v1
        buf[c + 2 * nthreads] = v2
        buf[c + 3 * nthreads] = v3
        acc += (v0 * v0 + v1 * v1) + (v2 * v2 + v3 * v3)
        c += 4 * nthreads
    while c < staged:
        v0 = x[row, c]
        buf[c] = v0
        acc += v0 * v0
        c += nthreads
    while c < H:                                      # columns past the shared copy
        v0 = x[row, c]
        acc += v0 * v0
        c += nthreads
    return acc


@cuda.jit(device=True)
def write_scaled_row(x, row, buf, w, inv, out, out_row, H):
    """out[out_row, c] = x[row, c] * inv * w[c] for this thread's columns, from ``buf`` where it holds them (after
    a barrier that published it)."""
    nthreads = cuda.blockDim.x
    c = cuda.threadIdx.x
    staged = min(H, buf.shape[0])
    while c < staged:
        out[out_row, c] = buf[c] * inv * w[c]
        c += nthreads
    while c < H:
        out[out_row, c] = x[row, c] * inv * w[c]
        c += nthreads


@cuda.jit
def _rmsnorm_kernel(x, w, out, eps):
    row = cuda.blockIdx.x
    H = x.shape[1]
    partial = cuda.shared.array(MAX_THREADS, float32)
    row_buf = cuda.shared.array(STAGE, float32)      # the row's first STAGE values, read from DRAM once
    ssq = smem_sum(row_sum_squares(x, row, row_buf, H), partial)   # its barriers also publish row_buf
    inv = float32(1.0) / float32(math.sqrt(ssq / float32(H) + eps))
    write_scaled_row(x, row, row_buf, w, inv, out, row, H)


def rmsnorm(x, w, eps: float, out=None):
    """Row RMSNorm of ``x [T, H]`` with weight ``w [H]``; returns ``out [T, H]`` (float32, current backend). ``x``
    may be a strided view (e.g. the q_a columns of the fused q_a / kv_a projection)."""
    x = _checks.array(x, "x", dtype=np.float32, ndim=2, strided=True)
    w = _checks.array(w, "w", dtype=np.float32, shape=(x.shape[1],))
    eps = _checks.real(eps, "eps", lo=0.0)
    out = _checks.out_array(out, "out", x.shape, np.float32)
    if backend.name == "numpy":
        out[...] = rmsnorm_ref(x, w, eps)
        return out
    if x.shape[0] == 0:
        return out
    threads = backend.block_size(1024 if x.shape[1] >= WIDE_ROW else 256, 16)
    backend.launch(_rmsnorm_kernel, x.shape[0], threads, x, w, out, np.float32(eps))
    return out
