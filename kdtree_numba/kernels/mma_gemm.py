"""Tensor-core skinny GEMM: ``x @ w.T`` for up to 80 rows on 3xTF32 MMAs, every row in one pass of the weight.

    out[i, j] = sum_k x[i, k] * w[j, k]            (or out[i, j] += ..., ``accumulate``)

Why: a DDTree verify multiplies budget + 1 rows (33 for DDTree-32) where the draft and the chain multiply 16, by
weights that L2 holds. Every fp32 kernel so far (cuBLAS over row blocks, kernels/skinny_gemm.py,
kernels/wide_gemm.py) costs more at 33 rows than at 16: more FMAs a thread, or the weight read once per row block.
On the tensor cores the rows are nearly free: one m16n8k8 MMA multiplies 16 rows, so 33 rows are 3 MMAs where 16
are 1, and the weight's fragments are loaded once for all of them.

Mapping: a block owns one MMA tile of out - 16 rows (m0 = 16 blockIdx.y) by 8 columns (n0 = 8 blockIdx.x) - and its
KW warps split K, CPW chunks of 16 k's each (CPW a compile-time constant of the kernel, ``_kernel(CPW)``: the chunk
loop unrolls and its loads go out together). Lane l = 4 g + t loads, per chunk, 16 bytes of w's row n0 + g and of
x's rows m0 + g and m0 + g + 8 (rows past M read row M - 1; their sums are not written), all at k = k0 + 4 t ..
k0 + 4 t + 3. Two MMA k-steps use them: step s = 0 puts k0 + 4 t in the fragment's k slot t and k0 + 4 t + 1 in
slot t + 4, step s = 1 the next two - the eight slots of a step are eight distinct k's of the chunk, the same in A
and B (kernels/mma.py's fragment table), so the two steps sum the chunk's 16 k's. No shared memory and no barrier
in the loop: every load is one LDG.128 straight into the fragment registers, and each step parity has its own
accumulators (two dependent MMA chains a warp). At the end the parities are added, each warp's 128 partial sums go
to shared memory, one barrier, and each of 128 threads adds the KW warps' sums of one output in warp order (the same
bits every run) and writes it. More rows are more blocks, not longer chains: 33 rows are three m-tile blocks per 8
columns where 16 rows are one (the first form - one block for all rows, the m-tiles in one warp's chain - took
6.1-6.8 us at 33 rows against 2.8-3.7 at 16 for the verify's small products; H100, docs/PERFORMANCE.md).
Grid: (ceil(N / 8), ceil(M / 16)) blocks of 32 KW threads; ``split`` picks KW and CPW from the shape.
3xTF32 (kernels/mma.py: x = hi + lo with hi = tf32(x), lo = tf32(x - hi), both operands; lo lo dropped): about
fp32's accuracy (a product's relative error ~7e-7, against 4.9e-4 for one plain TF32 MMA). A weight that is exact
in TF32 - a bf16 checkpoint's, as every product of the trained pair's target - has lo = 0, so its hi_a lo_b MMA
adds exact zeros: a warp skips it where none of its lanes' chunk of w has a lo part (one vote a chunk), with the
same bits as the three MMAs, 2 MMAs a step instead of 3.
Shapes: x [M, K] float32 (k contiguous, rows may be strided), w [N, K] float32 (HF's [out, in]; k contiguous), out
[M, N] float32 (columns contiguous); M <= MAX_ROWS, K a multiple of 4, rows of x and w 16-byte aligned (``reads``).
Example: x = [[1, 2, 3, 4]], w = [[1, 0, 0, 0], [0, 0, 0, 2]] -> out = [[1, 8]]: one block, one warp, one chunk
(K = 4: only lane t = 0's k's are inside K, the other lanes' fragments are zeros); lane 0 (g = 0) holds rows x[0]
and w[0] and lane 4 (g = 1) w[1]; step 0 multiplies k = 0, 1 and step 1 k = 2, 3.
"""
from __future__ import annotations

from numba import cuda, float32

from .. import backend
from . import _checks
from ._intrinsics import SIM, ldg4
from .mma import SCRATCH_SHAPE, SIM_MAX_WARPS, mma_m16n8k8_3xtf32, mma_m16n8k8_tf32, split_tf32
from .primitives import FULL
from .skinny_gemm import skinny_ref
from .wide_gemm import _aligned, _flat

MAX_ROWS = 80                 # M <= 80 (5 m-tiles): a DDTree-79 verify
MAX_KW = SIM_MAX_WARPS if SIM else 16   # warps a block splits K over (the simulator's MMA scratch has room for 8)
WARPS_TARGET = 512            # warps of a launch that ``split`` aims at
NT = 8                        # output columns of a block (an MMA's n)
PART = 16 * 4 * 32            # shared floats of the warps' partial sums [warp, d_j, lane] (MAX_KW <= 16)

mma_ref = skinny_ref          # NumPy reference: the same product, ``x @ w.T`` (+ ``out``), float32


def split(M: int, K: int, N: int) -> tuple[int, int]:
    """(KW, CPW): the warps that split K and the 16-k chunks each takes. As many warps as bring the grid near
    WARPS_TARGET warps in all (a warp's MMAs are one dependent chain: more, shorter chains finish sooner, until
    the blocks' fixed costs - the barrier and the sums - take over), at most MAX_KW and one chunk each.
    Example: split(33, 256, 240) -> (6, 3) (90 tiles of 16 x 8; 16 chunks); split(33, 256, 4096) -> (1, 16)."""
    chunks = max(1, -(-K // 16))
    tiles = -(-N // NT) * -(-M // 16)
    kw = max(1, min(MAX_KW, chunks, round(WARPS_TARGET / tiles)))
    cpw = -(-chunks // kw)
    return -(-chunks // cpw), cpw


def reads(a, b, out) -> bool:
    """Whether ``out (+)= a @ b`` (b = w.T) has the layout this kernel reads: at most MAX_ROWS rows, a and w along
    k and out along its columns with float32 strides of 4 bytes, K and both row strides multiples of 4 floats, a
    and w starting on 16 bytes (LDG.128). Example: x [33, 256] and b = w.T of a row-major w [4096, 256] fit."""
    M, K = a.shape
    return (M <= MAX_ROWS and K % 4 == 0 and a.strides[1] == 4 and b.strides[0] == 4 and out.strides[1] == 4
            and (a.strides[0] // 4) % 4 == 0 and (b.strides[1] // 4) % 4 == 0 and _aligned(a) and _aligned(b.T))


@cuda.jit(device=True, inline=True)
def _split4(v0, v1, v2, v3):
    """The 3xTF32 split of four values: (hi0, hi1, hi2, hi3, lo0, lo1, lo2, lo3)."""
    h0, l0 = split_tf32(v0)
    h1, l1 = split_tf32(v1)
    h2, l2 = split_tf32(v2)
    h3, l3 = split_tf32(v3)
    return h0, h1, h2, h3, l0, l1, l2, l3


_kernels: dict = {}


def _kernel(CPW: int):
    """The kernel for CPW chunks a warp (a compile-time constant: the chunk loop unrolls, its loads go out
    together)."""
    if CPW in _kernels:
        return _kernels[CPW]

    @cuda.jit
    def kernel(xf, ldx, M, wf, ldw, N, K, out, accumulate):
        part = cuda.shared.array(PART, float32)                # [warp, j, lane] partial sums
        scratch = cuda.shared.array(SCRATCH_SHAPE, float32)   # the simulator's MMA exchange (GPU: unused)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        n0 = cuda.blockIdx.x * NT
        m0 = cuda.blockIdx.y * 16
        wrow = min(n0 + g, N - 1) * ldw
        xrow0 = min(m0 + g, M - 1) * ldx                      # the fragment's rows g and g + 8 (past M: row M - 1,
        xrow1 = min(m0 + g + 8, M - 1) * ldx                  # whose sums are not written)
        e0 = e1 = e2 = e3 = float32(0.0)                      # step 0's accumulators (d0..d3) ...
        f0 = f1 = f2 = f3 = float32(0.0)                      # ... and step 1's: two dependent MMA chains
        kw0 = warp * (16 * CPW) + 4 * t
        for c in range(CPW):
            k = kw0 + 16 * c
            keep = k < K
            kk = k if keep else 0                   # a valid address; w's values zeroed below
            w0, w1, w2, w3 = ldg4(wf, wrow + kk)
            x0, x1, x2, x3 = ldg4(xf, xrow0 + kk)
            y0, y1, y2, y3 = ldg4(xf, xrow1 + kk)
            if not keep:
                w0 = w1 = w2 = w3 = float32(0.0)
            bh0, bh1, bh2, bh3, bl0, bl1, bl2, bl3 = _split4(w0, w1, w2, w3)
            h0, h1, h2, h3, l0, l1, l2, l3 = _split4(x0, x1, x2, x3)
            i0, i1, i2, i3, o0, o1, o2, o3 = _split4(y0, y1, y2, y3)
            # does any lane's w need its lo part? Not where w is exact in TF32 (every bf16 checkpoint's weight):
            # then the hi_a lo_b MMA adds exact zeros, and skipping it gives the same bits (the simulator, whose
            # MMAs meet at block barriers, always runs all three)
            if SIM or cuda.any_sync(FULL, bl0 != 0 or bl1 != 0 or bl2 != 0 or bl3 != 0):
                # step 0: k, k + 1 in slots t, t + 4; step 1: k + 2, k + 3
                e0, e1, e2, e3 = mma_m16n8k8_3xtf32(h0, i0, h1, i1, l0, o0, l1, o1, bh0, bh1, bl0, bl1,
                                                    e0, e1, e2, e3, scratch)
                f0, f1, f2, f3 = mma_m16n8k8_3xtf32(h2, i2, h3, i3, l2, o2, l3, o3, bh2, bh3, bl2, bl3,
                                                    f0, f1, f2, f3, scratch)
            else:                                   # lo_a hi_b, then hi_a hi_b: the three MMAs' order
                e0, e1, e2, e3 = mma_m16n8k8_tf32(l0, o0, l1, o1, bh0, bh1, e0, e1, e2, e3, scratch)
                f0, f1, f2, f3 = mma_m16n8k8_tf32(l2, o2, l3, o3, bh2, bh3, f0, f1, f2, f3, scratch)
                e0, e1, e2, e3 = mma_m16n8k8_tf32(h0, i0, h1, i1, bh0, bh1, e0, e1, e2, e3, scratch)
                f0, f1, f2, f3 = mma_m16n8k8_tf32(h2, i2, h3, i3, bh2, bh3, f0, f1, f2, f3, scratch)
        base = warp * 128 + lane
        part[base] = e0 + f0
        part[base + 32] = e1 + f1
        part[base + 64] = e2 + f2
        part[base + 96] = e3 + f3
        cuda.syncthreads()
        nw = cuda.blockDim.x // 32
        for e in range(tid, 128, cuda.blockDim.x):  # e = j * 32 + lane: warp 0's slot for d_j of that lane
            v = part[e]
            for q in range(1, nw):
                v += part[q * 128 + e]
            ln = e % 32
            j = e // 32
            r = m0 + ln // 4 + 8 * (j // 2)          # d0, d1: row g; d2, d3: row g + 8
            col = n0 + 2 * (ln % 4) + j % 2          # d0, d2: column 2 t; d1, d3: 2 t + 1
            if r < M and col < N:
                if accumulate:
                    out[r, col] += v
                else:
                    out[r, col] = v

    _kernels[CPW] = kernel
    return kernel


def mma_linear(x, w, out=None, accumulate: bool = False):
    """``out = x @ w.T`` (``out += x @ w.T`` with ``accumulate``) on the current backend: x [M, K] (M <= MAX_ROWS),
    w [N, K], out [M, N] (allocated when None), float32, in the layout ``reads`` names on the GPU. Bad arguments
    raise ValueError naming them. Returns ``out``."""
    x, w, out = _checks.linear_operands(x, w, out, accumulate)
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"x: expected at most {MAX_ROWS} rows, got shape {tuple(x.shape)}")
    if backend.name != "numpy" and not reads(x, w.T, out):
        raise ValueError(f"x, w, out: expected k-contiguous, 16-byte aligned rows with K a multiple of 4 and out's "
                         f"columns contiguous, got shapes {tuple(x.shape)}, {tuple(w.shape)}")
    return run(x, w, out, accumulate)


def run(x, w, out, accumulate: bool = False, warps=None):
    """mma_linear without the checks: for gemm_choice, which has checked its arguments and ``reads`` already.
    ``warps``: (KW, CPW) in place of ``split``'s (benchmarks)."""
    M, K = x.shape
    N = w.shape[0]
    if backend.name == "numpy":
        return mma_ref(x, w, out, accumulate)
    if M and N and K:
        kw, cpw = split(M, K, N) if warps is None else warps
        ldx, ldw = x.strides[0] // 4, w.strides[0] // 4
        xf, wf = _flat(x, (M - 1) * ldx + K), _flat(w, (N - 1) * ldw + K)
        backend.launch(_kernel(cpw), (-(-N // NT), -(-M // 16)), 32 * kw, xf, ldx, M, wf, ldw, N, K, out,
                       bool(accumulate))
    elif not accumulate:
        out[...] = 0                                    # K = 0: an empty sum
    return out
