"""Wide GEMM: ``x @ w.T`` for a few dozen rows and thousands of columns - the weight read once, K split over warps.

    out[i, j] = sum_k x[i, k] * w[j, k]            (or out[i, j] += ..., ``accumulate``)

A DDTree-32 verify runs its LM head as 33 rows x 256 -> 4096 columns. cuBLAS answers that as a strided batch of
three 11-row blocks - each block reads the whole 4 MB weight - at ~11 us on an H100, against ~7.5 us for the
chain's 16 rows in one call (docs/PERFORMANCE.md, forty-second session); the skinny kernel reads x and w in 8 x 4
patches and re-reads the weight for every 8 rows (18 us). The arithmetic is 35 MFLOP and the weight 4 MB: a few us
of an H100's FP32 lanes and L2. This kernel reads every weight element from memory once for all the rows of a panel
and splits K over the warps of a block, so that even a few hundred columns give every SM a few warps:

Mapping: block b_x owns the column tile [NT b_x, NT b_x + NT) (NT = CG * CT = 32 columns) of the row panel
[PANEL b_y, PANEL b_y + PANEL) (PANEL = RG * RT = 36 rows); its KS warps take one slice of K each (slices of ks =
4 ceil(K / (4 KS)), warp s the slice [s ks, (s + 1) ks)). Lane l = CG rg + cg (cg = l % CG, rg = l // CG) holds an
RT x CT register tile: rows r_i = rg + RG i, columns c_j = cg + CG j (i < RT, j < CT) - lanes of one rg read the
same x values (one L1 broadcast), lanes of one cg the same w values. Per step of U = 4 k's a lane issues its
U (RT + CT) loads before the first of its U RT CT multiply-adds (a slice's last ks % U k's one at a time). A row
past M reads row M - 1 and a column past N column N - 1 instead of testing every load: their sums are never
written. Then the KS warps' partial sums go through shared
memory and each thread of the block adds the KS partials of a few outputs, slice 0 first - always that order, so
the same bits every run - and writes them.
Shapes: x [M, K] float32 (k contiguous, rows may be strided), w [N, K] float32 (HF's [out, in]; k contiguous),
out [M, N] float32 (columns contiguous). Grid: (ceil(N / NT), ceil(M / PANEL)), KS * 32 threads.
Example: x = [[1, 2]], w = [[3, 4], [5, 6]] -> out = [[11, 17]]: one block; lane 0 (rg 0, cg 0) holds row 0 x
column 0 and lane 1 (cg 1) row 0 x column 1; warp 0's slice is k = 0..3 (K = 2: k = 0, 1), the other warps' slices
are empty (zeros): out[0, 0] = 1*3 + 2*4 + 0 = 11, out[0, 1] = 1*5 + 2*6 + 0 = 17.

Where it runs: a candidate of kernels/gemm_choice.py (which times it against cuBLAS and the skinny kernel per shape)
wherever ``reads`` holds.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32, uint64

from .. import backend
from . import _checks
from ._intrinsics import SIM, copy_async, copy_async_wait, lds4

CG = 8                                   # column groups of a warp's lanes (lane % CG)
RG = 32 // CG                            # row groups (lane // CG)
CT = 4                                   # columns of a lane's register tile, CG apart
RT = 9                                   # rows of a lane's register tile, RG apart
NT = CG * CT                             # columns of a block's tile
PANEL = RG * RT                          # rows of a block's panel
U = 4                                    # k steps whose loads are issued together
KS = 2 if SIM else 8                     # warps of a block, each one slice of K (the simulator: two)
_XN, _WN, _AN = U * RT, U * CT, RT * CT  # load buffers and accumulators (numba wants constant sizes)
_OUT = 32 * _AN                          # outputs of a block's tile
_PART = KS * _OUT                        # the partial sums of a block's KS slices
KC = 256                                 # staged: the k's of one chunk in shared memory
LD = KC + 4                              # staged: a shared row's floats (= 4 mod 8: no bank conflicts, 16-byte rows)
STAGED_BYTES = 4 * (PANEL + NT) * LD     # staged: the x panel's and the w tile's chunk (the sums reuse it)
ALIGN = None if SIM else 16              # staged: dynamic shared memory's alignment (16-byte copies)
STAGED = True                            # run the staged kernel (False: the plain one)
assert 4 * _PART <= STAGED_BYTES          # the staged kernel's sums fit where its chunk was


def reads(a, b, out) -> bool:
    """Whether ``out (+)= a @ b`` has the layout this kernel reads: a [m, k] and w = b.T along k, out along its
    columns (float32 strides of 4 bytes). Example: b = w.T of a row-major w [n, k] fits; a row-major b [k, n]
    does not (b.strides[0] = 4 n)."""
    return a.strides[1] == 4 and b.strides[0] == 4 and out.strides[1] == 4


@cuda.jit
def _wide_kernel(xf, ldx, M, wf, ldw, N, K, out, accumulate):
    part = cuda.shared.array(_PART, float32)          # [slice, t * 32 + lane]: every warp's partial sums
    warp = cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    row0 = cuda.blockIdx.y * PANEL + lane // CG         # this lane's rows: row0 + RG i
    col0 = cuda.blockIdx.x * NT + lane % CG             # and columns: col0 + CG j
    ks = -(-K // (U * KS)) * U                          # a warp's slice of K: whole steps of U
    k_lo = min(K, warp * ks)
    k_hi = min(K, k_lo + ks)
    k_mid = k_lo + (k_hi - k_lo) // U * U
    xo = cuda.local.array(RT, uint64)                   # where row i starts in xf; a row past M reads row M - 1
    for i in range(RT):                                 # (its sums are never written: no test per load)
        xo[i] = uint64(min(row0 + RG * i, M - 1) * ldx)
    wo = cuda.local.array(CT, uint64)                   # where column j starts in wf; past N: column N - 1
    for j in range(CT):
        wo[j] = uint64(min(col0 + CG * j, N - 1) * ldw)
    acc = cuda.local.array(_AN, float32)                # acc[i * CT + j]: rows row0 + RG i, columns col0 + CG j
    for t in range(_AN):
        acc[t] = float32(0.0)
    xv = cuda.local.array(_XN, float32)                 # [U, RT] x values of U k steps
    wv = cuda.local.array(_WN, float32)                 # [U, CT] w values of U k steps
    for k0 in range(k_lo, k_mid, U):
        for u in range(U):                              # every load first ...
            ku = uint64(k0 + u)                         # unsigned: no negative-index test and select per load
            for i in range(RT):
                xv[u * RT + i] = xf[xo[i] + ku]
            for j in range(CT):
                wv[u * CT + j] = wf[wo[j] + ku]
        for u in range(U):                              # ... then the U RT CT multiply-adds
            for i in range(RT):
                for j in range(CT):
                    acc[i * CT + j] += xv[u * RT + i] * wv[u * CT + j]
    for k in range(k_mid, k_hi):                        # a slice's last k's, one at a time
        for i in range(RT):
            xv[i] = xf[xo[i] + uint64(k)]
        for j in range(CT):
            wv[j] = wf[wo[j] + uint64(k)]
        for i in range(RT):
            for j in range(CT):
                acc[i * CT + j] += xv[i] * wv[j]
    for t in range(_AN):
        part[warp * _OUT + t * 32 + lane] = acc[t]
    cuda.syncthreads()
    _write_sums(part, out, M, N, accumulate)


@cuda.jit
def _staged_kernel(xf, ldx, M, wf, ldw, N, K, out, accumulate, vec):
    dyn = cuda.shared.array(0, float32, alignment=ALIGN)  # [PANEL + NT, LD]: x rows, then w columns, one chunk
    warp = cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    rg = lane // CG
    cg = lane % CG
    acc = cuda.local.array(_AN, float32)                # acc[i * CT + j]: rows rg + RG i, columns cg + CG j
    for t in range(_AN):
        acc[t] = float32(0.0)
    xv = cuda.local.array(_XN, float32)                 # [U, RT] x values of U k steps
    wv = cuda.local.array(_WN, float32)                 # [U, CT] w values of U k steps
    for c0 in range(0, K, KC):
        n = min(KC, K - c0)
        npad = -(-n // U) * U                           # k's past n are zero-filled: whole U steps below
        for q in range(warp, PANEL + NT, KS):           # a warp per shared row, its lanes along k (coalesced)
            if q < PANEL:
                src = min(cuda.blockIdx.y * PANEL + q, M - 1) * ldx + c0
                f = xf
            else:
                src = min(cuda.blockIdx.x * NT + q - PANEL, N - 1) * ldw + c0
                f = wf
            if vec:                                     # 16-byte copies (host: rows and K 16-byte aligned)
                for k in range(4 * lane, npad, 128):
                    copy_async(dyn, q * LD + k, f, src + k, 4, True)
            else:
                for k in range(lane, npad, 32):
                    copy_async(dyn, q * LD + k, f, src + k, 1, k < n)
        copy_async_wait()
        cuda.syncthreads()
        ks = -(-npad // (U * KS)) * U                   # this warp's slice of the chunk
        k_lo = min(npad, warp * ks)
        k_hi = min(npad, k_lo + ks)
        for k0 in range(k_lo, k_hi, U):                 # U = 4 k's: one 16-byte load per row and per column
            for i in range(RT):                         # every load first ...
                a0, a1, a2, a3 = lds4(dyn, (rg + RG * i) * LD + k0)
                xv[i] = a0
                xv[RT + i] = a1
                xv[2 * RT + i] = a2
                xv[3 * RT + i] = a3
            for j in range(CT):
                b0, b1, b2, b3 = lds4(dyn, (PANEL + cg + CG * j) * LD + k0)
                wv[j] = b0
                wv[CT + j] = b1
                wv[2 * CT + j] = b2
                wv[3 * CT + j] = b3
            for u in range(U):                          # ... then the U RT CT multiply-adds
                for i in range(RT):
                    for j in range(CT):
                        acc[i * CT + j] += xv[u * RT + i] * wv[u * CT + j]
        cuda.syncthreads()                              # the chunk read before the next overwrites it
    for t in range(_AN):
        dyn[warp * _OUT + t * 32 + lane] = acc[t]       # the sums reuse the staging: [slice, t * 32 + lane]
    cuda.syncthreads()
    _write_sums(dyn, out, M, N, accumulate)


@cuda.jit(device=True, inline=True)
def _write_sums(part, out, M, N, accumulate):
    """Each thread adds the KS slices' partial sums of every KS * 32-th output of the block's tile, slice 0 first
    (the same bits every run), and writes it: part.flat[s * _OUT + t * 32 + l] is slice s's sum for lane l's
    value t."""
    for o in range(cuda.threadIdx.x, _OUT, KS * 32):
        v = part[o]
        for s in range(1, KS):
            v += part[s * _OUT + o]
        ln = o % 32
        t = o // 32
        r = cuda.blockIdx.y * PANEL + ln // CG + RG * (t // CT)
        c = cuda.blockIdx.x * NT + ln % CG + CG * (t % CT)
        if r < M and c < N:
            if accumulate:
                out[r, c] += v
            else:
                out[r, c] = v


def wide_ref(x, w, out=None, accumulate: bool = False):
    """NumPy reference: ``x @ w.T`` (added onto ``out`` when ``accumulate``), float32."""
    y = np.matmul(x, w.T, dtype=np.float32)
    if out is None:
        return y
    if accumulate:
        out += y
    else:
        out[...] = y
    return out


def wide_linear(x, w, out=None, accumulate: bool = False):
    """``out = x @ w.T`` (``out += x @ w.T`` with ``accumulate``) on the current backend, whatever its shape: x [M, K]
    (rows may be strided, k contiguous on the GPU), w [N, K], out [M, N] (allocated when None), float32. Bad arguments
    raise ValueError naming them. Returns ``out``."""
    x = _checks.array(x, "x", dtype=np.float32, ndim=2, strided=True)
    w = _checks.array(w, "w", dtype=np.float32, ndim=2, shape=(None, x.shape[1]), strided=True)
    if accumulate and out is None:
        raise ValueError("out: accumulate=True adds onto out, expected an array, got None")
    out = _checks.out_array(out, "out", (x.shape[0], w.shape[0]), np.float32, strided=True)
    return run(x, w, out, accumulate)


def _flat(a, n: int):
    """The n elements from a's first one as a 1-d array (a's rows with the gaps between them): the kernel indexes
    rows by their start, one 64-bit add per load instead of a row x stride product."""
    lib = np if isinstance(a, np.ndarray) else backend.cp
    return lib.lib.stride_tricks.as_strided(a, shape=(n,), strides=(4,))


def _aligned(a) -> bool:
    """Whether a's first element sits on 16 bytes (numpy arrays on the simulator: always taken as aligned)."""
    return isinstance(a, np.ndarray) or a.data.ptr % 16 == 0


def run(x, w, out, accumulate: bool = False):
    """wide_linear without the checks: for gemm_choice, which has checked its arguments already."""
    M = x.shape[0]
    N = w.shape[0]
    if backend.name == "numpy":
        return wide_ref(x, w, out, accumulate)
    if M and N:
        K = x.shape[1]
        ldx, ldw = x.strides[0] // 4, w.strides[0] // 4
        grid = (-(-N // NT), -(-M // PANEL))
        xf, wf = _flat(x, (M - 1) * ldx + K), _flat(w, (N - 1) * ldw + K)
        if STAGED:
            vec = K % 4 == 0 and ldx % 4 == 0 and ldw % 4 == 0 and _aligned(x) and _aligned(w)
            backend.launch(_staged_kernel, grid, 32 * KS, xf, ldx, M, wf, ldw, N, K, out, bool(accumulate), vec,
                           shared=STAGED_BYTES)
        else:
            backend.launch(_wide_kernel, grid, 32 * KS, xf, ldx, M, wf, ldw, N, K, out, bool(accumulate))
    return out
