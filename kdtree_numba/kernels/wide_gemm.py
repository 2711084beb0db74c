"""Wide GEMM: ``x @ w.T`` for a few dozen rows and thousands of columns - the weight read once, K split over warps.

    out[i, j] = sum_k x[i, k] * w[j, k]            (or out[i, j] += ..., ``accumulate``)

A DDTree-32 verify runs its LM head as 33 rows x 256 -> 4096 columns. cuBLAS answers that as a strided batch of
three 11-row blocks - each block reads the whole 4 MB weight - at ~11 us on an H100, against ~7.4 us for the
chain's 16 rows in one call; the skinny kernel works in 8 x 4 patches and re-reads the weight for every 8 rows
(18 us). The arithmetic is 35 MFLOP and the weight 4 MB: a few us of an H100's FP32 lanes and L2. This kernel
stages a panel of x and a tile of w in shared memory once and splits K over the warps of a block:

Mapping: block (b_x, b_y) owns columns [NT b_x, NT b_x + NT) (NT = CG CT = 32) of the row panel [PANEL b_y,
PANEL b_y + PANEL) (PANEL = RG RT = 36 rows). Per chunk of KC = 256 k's its KS = 8 warps first copy the panel's
rows and the tile's columns into shared memory (a warp per row, its lanes along k: 16-byte ``cp.async`` copies,
coalesced; a row past M copies row M - 1 and a column past N column N - 1 - their sums are never written - and k's
past K are zero-filled), one barrier; then warp s multiplies its slice of the chunk (ks = 4 ceil(chunk / (4 KS))
k's from s ks). Lane l = CG rg + cg (cg = l % CG, rg = l // CG) holds an RT x CT register tile: rows rg + RG i,
columns cg + CG j. Per step of U = 4 k's it loads each of its rows' and columns' 4 k's as one 16-byte LDS.128
(``_intrinsics.lds4``) - lanes of one rg read the same x words (a broadcast), the 8 column groups hit 8 different
bank quads (LD = KC + 4 floats a row) - then makes its 4 RT CT multiply-adds. At the end the KS warps' partial sums
go through the same shared memory and each thread adds the KS slices of a few outputs, slice 0 first - always that
order: the same bits every run.
Shapes: x [M, K] float32 (k contiguous, rows may be strided), w [N, K] float32 (HF's [out, in]; k contiguous),
out [M, N] float32 (columns contiguous). Grid: (ceil(N / NT), ceil(M / PANEL)), KS * 32 threads, SHARED_BYTES (70
KB) of dynamic shared memory. One-float copies where K, a row stride or a start is not 16-byte aligned.
Example: x = [[1, 2]], w = [[3, 4], [5, 6]] -> out = [[11, 17]]: one block; lane 0 (rg 0, cg 0) holds row 0 x
column 0 and lane 1 (cg 1) row 0 x column 1; warp 0's slice is k = 0..3 (k = 2, 3 zero-filled), the other warps'
slices are empty: out[0, 0] = 1*3 + 2*4 = 11, out[0, 1] = 1*5 + 2*6 = 17.

Where it runs: a candidate of kernels/gemm_choice.py, which times it against cuBLAS and the skinny kernel per
shape wherever ``reads`` holds. Measured on an H100 (docs/PERFORMANCE.md, forty-third session; graph replays of one
product, us): the LM head (256 -> 4096) at 33 rows 8.45 against cuBLAS's 11.07, at 65 rows 15.82 against 16.35.
It loses where N is a few hundred (8-12 blocks: ~7 us against ~3), at K = 768 (16.6 against 5.3) and at 16 rows
(a 36-row panel of 16: the LM head 11.44 against 7.40).
Variants measured and dropped (same run): x and w read straight from global memory, no staging (the LM head at
33 rows 11.99 us: a warp's loads touch 4-8 lines each); KS = 4 (8.78); 16-column tiles (12.29); 8 columns a lane
(9.13); 20-row panels (10.38 at 33 rows; but 6.78 at 16 rows, and the dense gate/up at 33 rows in two panels 5.95
against cuBLAS's 6.77 - a second compiled kernel; the panel height as a launch argument instead, with the loops
tested against it, ran the LM head at 33 rows in 10.72 us and was dropped).
ptxas (sm_90): 160 registers, no spills; the inner loop 144 FFMA, 13 LDS.128 and ~40 other instructions a step.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32

from .. import backend
from . import _checks
from .skinny_gemm import skinny_ref
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
KC = 256                                 # the k's of one chunk in shared memory
LD = KC + 4                              # a shared row's floats (= 4 mod 8: no bank conflicts; 16-byte rows)
SHARED_BYTES = 4 * (PANEL + NT) * LD     # the x panel's and the w tile's chunk (the partial sums reuse it)
ALIGN = None if SIM else 16              # dynamic shared memory's alignment (16-byte copies)
assert 4 * KS * _OUT <= SHARED_BYTES     # the KS slices' partial sums fit where the chunk was


def reads(a, b, out) -> bool:
    """Whether ``out (+)= a @ b`` has the layout this kernel reads - a [m, k] and w = b.T along k, out along its
    columns (float32 strides of 4 bytes) - and this GPU lets a block opt into SHARED_BYTES of shared memory (sm_75
    gives 64 KB: not there). Example: b = w.T of a row-major w [n, k] fits; a row-major b [k, n] does not
    (b.strides[0] = 4 n)."""
    return (a.strides[1] == 4 and b.strides[0] == 4 and out.strides[1] == 4
            and backend.shared_optin() >= SHARED_BYTES)


@cuda.jit
def _wide_kernel(xf, ldx, M, wf, ldw, N, K, out, accumulate, vec):
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


wide_ref = skinny_ref                    # NumPy reference: the same product, ``x @ w.T`` (+ ``out``), float32


def wide_linear(x, w, out=None, accumulate: bool = False):
    """``out = x @ w.T`` (``out += x @ w.T`` with ``accumulate``) on the current backend, whatever its shape: x [M, K]
    (rows may be strided, k contiguous on the GPU), w [N, K], out [M, N] (allocated when None), float32. Bad arguments
    raise ValueError naming them. Returns ``out``."""
    x, w, out = _checks.linear_operands(x, w, out, accumulate)
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
        vec = K % 4 == 0 and ldx % 4 == 0 and ldw % 4 == 0 and _aligned(x) and _aligned(w)
        backend.launch(_wide_kernel, grid, 32 * KS, xf, ldx, M, wf, ldw, N, K, out, bool(accumulate), vec,
                       shared=SHARED_BYTES)
    return out
