"""GEMM: ``matmul`` (cuBLAS through CuPy on the GPU, NumPy elsewhere) and one educational tiled kernel.

    C[i, j] = sum_k A[i, k] * B[k, j]          linear(x, W) = x @ W.T  (HF weights are [out, in])

The model's GEMMs go to cuBLAS/NumPy: a hand-written fp32 GEMM does not beat the vendor library, and the
project's kernels are the stages around it. ``matmul_tiled`` is here to show how a GEMM uses shared memory:

Mapping (matmul_tiled): one TILE x TILE block per TILE x TILE tile of C; the block walks the K axis in steps of
TILE, each step loading one tile of A and one of B into shared memory (one element per thread), a barrier, then
every thread accumulating its C element from the two shared tiles; a second barrier before the next load.
Every global element is read K/TILE times instead of K times.
Shapes: a [M, K] float32, b [K, N] float32 -> c [M, N] float32.
Example: [[1, 2]] @ [[3], [4]] -> [[11]]
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32

from .. import backend
from . import _checks

TILE = 16


def matmul_ref(a, b):
    return np.matmul(a, b, dtype=np.float32)


def matmul(a, b, out=None):
    """``a @ b`` on the current backend (cuBLAS on the GPU); fp32."""
    a = _checks.array(a, "a", dtype=np.float32, ndim=2)
    b = _checks.array(b, "b", dtype=np.float32, ndim=2, shape=(a.shape[1], None))
    out = _checks.out_array(out, "out", (a.shape[0], b.shape[1]), np.float32)
    backend.xp.matmul(a, b, out=out)
    return out


def linear(x, w, out=None):
    """``x @ w.T`` for an HF weight ``w [out, in]``: x [T, in] -> [T, out] (no copy of the transpose)."""
    x = _checks.array(x, "x", dtype=np.float32, ndim=2)
    w = _checks.array(w, "w", dtype=np.float32, ndim=2, shape=(None, x.shape[1]))
    out = _checks.out_array(out, "out", (x.shape[0], w.shape[0]), np.float32)
    backend.xp.matmul(x, w.T, out=out)
    return out


@cuda.jit
def _matmul_tiled_kernel(a, b, c):
    ta = cuda.shared.array((TILE, TILE), float32)
    tb = cuda.shared.array((TILE, TILE), float32)
    tx = cuda.threadIdx.x            # column within the tile
    ty = cuda.threadIdx.y            # row within the tile
    row = cuda.blockIdx.y * TILE + ty
    col = cuda.blockIdx.x * TILE + tx
    M, K = a.shape
    N = b.shape[1]
    acc = float32(0.0)
    for k0 in range(0, K, TILE):
        # each thread loads one element of each tile (zeros outside the matrices)
        ta[ty, tx] = a[row, k0 + tx] if row < M and k0 + tx < K else float32(0.0)
        tb[ty, tx] = b[k0 + ty, col] if k0 + ty < K and col < N else float32(0.0)
        cuda.syncthreads()
        for kk in range(TILE):
            acc += ta[ty, kk] * tb[kk, tx]
        cuda.syncthreads()
    if row < M and col < N:
        c[row, col] = acc


def matmul_tiled(a, b, out=None):
    """``a @ b`` with the educational shared-memory tiled kernel (sim or cuda)."""
    a = _checks.array(a, "a", dtype=np.float32, ndim=2)
    b = _checks.array(b, "b", dtype=np.float32, ndim=2, shape=(a.shape[1], None))
    M, N = a.shape[0], b.shape[1]
    out = _checks.out_array(out, "out", (M, N), np.float32)
    if backend.name == "numpy":
        out[...] = matmul_ref(a, b)
        return out
    if M and N:
        grid = ((N + TILE - 1) // TILE, (M + TILE - 1) // TILE)
        backend.launch(_matmul_tiled_kernel, grid, (TILE, TILE), a, b, out)
    return out


def bmm(a, b, out=None):
    """Batched ``a @ b``: a [B, M, K], b [B, K, N] -> [B, M, N] (strided-batched cuBLAS on the GPU).

    Inputs may be transposed views (the per-head absorption multiplies ``[N, T, P] @ [N, P, Lkv]``)."""
    for arr, arg in ((a, "a"), (b, "b")):
        if getattr(arr, "ndim", None) != 3 or np.dtype(arr.dtype) != np.float32:
            raise ValueError(f"{arg}: expected a 3-d float32 array, got "
                             f"{getattr(arr, 'dtype', type(arr).__name__)} {tuple(getattr(arr, 'shape', ()))}")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"b: expected shape ({a.shape[0]}, {a.shape[2]}, *) to match a {tuple(a.shape)}, "
                         f"got {tuple(b.shape)}")
    return backend.xp.matmul(a, b, out=out)
