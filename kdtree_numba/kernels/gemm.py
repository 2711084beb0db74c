"""GEMM: ``matmul`` (cuBLAS on the GPU, NumPy elsewhere) and one educational tiled kernel.

    C[i, j] = sum_k A[i, k] * B[k, j]          linear(x, W) = x @ W.T  (HF weights are [out, in])

The model's GEMMs go to cuBLAS/NumPy: a hand-written fp32 GEMM does not beat the vendor library at sizes where
arithmetic counts, and the project's kernels are the stages around it. On the GPU they call cuBLAS through
``_cublas`` (not ``cupy.matmul``, which refuses to run inside a CUDA-graph capture), so a captured decode step runs
the same GEMMs as a direct one - except where latency is all there is: the products of a draft or a verify (16-80 rows,
a weight L2 holds) run the kernel ``gemm_choice`` timed fastest for their shape - ``skinny_gemm`` (one launch, no
split-K), ``wide_gemm`` (the weight read once per 36-row panel), cuBLAS's one call or cuBLAS over row blocks of
<= 16, 8 or 1 rows in one batched call (``_cublas._row_blocks``) - and other products of 17+ rows and a few
hundred columns go to ``skinny_gemm`` where ``skinny_gemm.pays`` says it measured faster.
``matmul_tiled`` is here to show how a GEMM uses shared memory:

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
from . import _checks, _cublas, gemm_choice, skinny_gemm

TILE = 16


def matmul_ref(a, b):
    return np.matmul(a, b, dtype=np.float32)


def matmul(a, b, out=None):
    """``a @ b`` on the current backend (cuBLAS on the GPU); fp32."""
    a = _checks.array(a, "a", dtype=np.float32, ndim=2)
    b = _checks.array(b, "b", dtype=np.float32, ndim=2, shape=(a.shape[1], None))
    out = _checks.out_array(out, "out", (a.shape[0], b.shape[1]), np.float32)
    return _product(a, b, out)


def linear(x, w, out=None, accumulate: bool = False):
    """``x @ w.T`` for an HF weight ``w [out, in]``: x [T, in] -> [T, out] (no copy of the transpose).

    ``accumulate=True`` adds the product onto ``out`` (``out += x @ w.T``; cuBLAS's beta = 1 on the GPU): a
    residual add without a launch of its own, e.g. ``linear(o, W_o, out=x, accumulate=True)``."""
    x = _checks.array(x, "x", dtype=np.float32, ndim=2)
    w = _checks.array(w, "w", dtype=np.float32, ndim=2, shape=(None, x.shape[1]))
    if accumulate and out is None:
        raise ValueError("out: accumulate=True adds onto out, expected an array, got None")
    out = _checks.out_array(out, "out", (x.shape[0], w.shape[0]), np.float32)
    return _product(x, w.T, out, accumulate)


def _product(a, b, out, accumulate: bool = False):
    """``out = a @ b`` (or ``out += a @ b``; 2-d or batched 3-d): cuBLAS on cuda, NumPy/CuPy matmul elsewhere."""
    if backend.name != "cuda":
        if accumulate:
            out += backend.xp.matmul(a, b)
        else:
            backend.xp.matmul(a, b, out=out)
        return out
    if a.ndim == 2:
        M, K = a.shape
        if gemm_choice.applies(M, K, b.shape[1], out):  # a draft's or a verify's rows: the one timed fastest
            return gemm_choice.run(a, b, out, accumulate)
        if skinny_gemm.pays(M, K, b.shape[1]) and skinny_gemm.reads(a, b, out):
            return skinny_gemm.run(a, b.T, out, accumulate)
        return _cublas.gemm(a, b, out, accumulate)
    return _cublas.gemm_batched(a, b, out)


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
    return _launch_tiles(_matmul_tiled_kernel, TILE, TILE, (TILE, TILE), a, b, out)


def _launch_tiles(kernel, tile_m: int, tile_n: int, block, a, b, out):
    """Check ``a [M, K] @ b [K, N]``, then one block of ``block`` threads per tile_m x tile_n tile of C (the NumPy
    reference on the numpy backend)."""
    a = _checks.array(a, "a", dtype=np.float32, ndim=2)
    b = _checks.array(b, "b", dtype=np.float32, ndim=2, shape=(a.shape[1], None))
    M, N = a.shape[0], b.shape[1]
    out = _checks.out_array(out, "out", (M, N), np.float32)
    if backend.name == "numpy":
        out[...] = matmul_ref(a, b)
        return out
    if M and N:
        backend.launch(kernel, ((N + tile_n - 1) // tile_n, (M + tile_m - 1) // tile_m), block, a, b, out)
    return out


def bmm(a, b, out=None):
    """Batched ``a @ b``: a [B, M, K], b [B, K, N] -> [B, M, N] (strided-batched cuBLAS on the GPU).

    Inputs may be transposed views (the per-head absorption multiplies ``[N, T, P] @ [N, P, Lkv]``), and so may
    ``out`` (a head-major view ``[N, T, Lkv]`` of the token-major query buffer: the product lands in place).
    Batches of ``out`` must not overlap."""
    for arr, arg in ((a, "a"), (b, "b")):
        if getattr(arr, "ndim", None) != 3 or np.dtype(arr.dtype) != np.float32:
            raise ValueError(f"{arg}: expected a 3-d float32 array, got "
                             f"{getattr(arr, 'dtype', type(arr).__name__)} {tuple(getattr(arr, 'shape', ()))}")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"b: expected shape ({a.shape[0]}, {a.shape[2]}, *) to match a {tuple(a.shape)}, "
                         f"got {tuple(b.shape)}")
    out = _checks.out_array(out, "out", (a.shape[0], a.shape[1], b.shape[2]), np.float32, strided=True)
    return _product(a, b, out)


# ------------------------------------------------------------------------------------------------ matmul_mma
# The same product on tensor cores, as a small first example of kernels/mma.py (educational, not a cuBLAS rival):
# one block of 4 warps per MMA_TM x MMA_TN = 32 x 16 tile of C; warp w owns the m16n8 fragment (w // 2, w % 2).
# The block walks K in steps of 8: the 32 x 8 slice of A and the 8 x 16 slice of B go to shared memory (zeros
# outside the matrices), a barrier, every warp loads its fragments (lane 4g + t: a0 = A[g][t], a1 = A[g+8][t],
# a2 = A[g][t+4], a3 = A[g+8][t+4]; b0 = B[t][g], b1 = B[t+4][g]) and adds one 3xTF32 MMA (hi/lo split of each
# operand, three TF32 MMAs: fp32-grade products) into its four accumulators; a barrier before the next slice.
# Example: matmul_mma([[1, 2]], [[3], [4]]) -> [[11]] (one block, one k step; rows 1..31 and columns 1..15 are
# zero padding).
from .mma import SCRATCH_SHAPE, mma_m16n8k8_3xtf32, split_tf32  # noqa: E402

MMA_TM = 32
MMA_TN = 16


@cuda.jit
def _matmul_mma_kernel(a, b, c):
    ta = cuda.shared.array((MMA_TM, 8), float32)         # the block's A slice [32, 8]
    tb = cuda.shared.array((8, MMA_TN), float32)         # the block's B slice [8, 16]
    scratch = cuda.shared.array(SCRATCH_SHAPE, float32)  # the simulator's MMA exchange (GPU: unused)
    tid = cuda.threadIdx.x
    g = tid % 32 // 4                                    # lane = 4 g + t
    t = tid % 4
    mi = tid // 64 * 16                                  # warp w: fragment rows 16 (w // 2), columns 8 (w % 2)
    nj = tid // 32 % 2 * 8
    row0 = cuda.blockIdx.y * MMA_TM
    col0 = cuda.blockIdx.x * MMA_TN
    M, K = a.shape
    N = b.shape[1]
    c0 = c1 = c2 = c3 = float32(0.0)
    for k0 in range(0, K, 8):
        for i in range(tid, MMA_TM * 8, cuda.blockDim.x):   # 128 threads: two A elements and one B element each
            r = i // 8
            k = i % 8
            ta[r, k] = a[row0 + r, k0 + k] if row0 + r < M and k0 + k < K else float32(0.0)
        k = tid // MMA_TN
        n = tid % MMA_TN
        tb[k, n] = b[k0 + k, col0 + n] if k0 + k < K and col0 + n < N else float32(0.0)
        cuda.syncthreads()
        ah0, al0 = split_tf32(ta[mi + g, t])
        ah1, al1 = split_tf32(ta[mi + g + 8, t])
        ah2, al2 = split_tf32(ta[mi + g, t + 4])
        ah3, al3 = split_tf32(ta[mi + g + 8, t + 4])
        bh0, bl0 = split_tf32(tb[t, nj + g])
        bh1, bl1 = split_tf32(tb[t + 4, nj + g])
        c0, c1, c2, c3 = mma_m16n8k8_3xtf32(ah0, ah1, ah2, ah3, al0, al1, al2, al3, bh0, bh1, bl0, bl1,
                                            c0, c1, c2, c3, scratch)
        cuda.syncthreads()
    for half in range(2):                                # d0, d1: row g; d2, d3: row g + 8 (columns 2t, 2t + 1)
        r = row0 + mi + g + 8 * half
        col = col0 + nj + 2 * t
        if r < M and col < N:
            c[r, col] = c0 if half == 0 else c2
        if r < M and col + 1 < N:
            c[r, col + 1] = c1 if half == 0 else c3


def matmul_mma(a, b, out=None):
    """``a @ b`` with the educational tensor-core kernel (3xTF32, fp32-grade; sim or cuda): 4 warps per 32 x 16
    tile of C."""
    return _launch_tiles(_matmul_mma_kernel, MMA_TM, MMA_TN, 128, a, b, out)
