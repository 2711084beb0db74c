"""Tensor cores from numba: one warp-wide ``mma.sync.m16n8k8`` with TF32 inputs, and 3xTF32 for fp32 accuracy.

numba-cuda has no tensor-core API. ``mma_m16n8k8_tf32`` is a ``numba.cuda.extending.intrinsic`` that emits the PTX
instruction ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`` through llvmlite's ``ir.InlineAsm`` (operands
by the constraint string "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f": four f32 results, six b32 inputs, four f32
accumulators; ``mma_intrinsic(ptx)`` builds such an intrinsic for any MMA text of that operand shape -
benchmarks/bench_mma.py times the m16n8k16 FP16 / BF16 forms with it). The 32 lanes of a warp together compute

    D[16, 8] = A[16, 8] @ B[8, 8] + C[16, 8]        (TF32 products, fp32 accumulation)

each lane holding a fixed part of every matrix in its registers (its "fragment"). With
lane = 4 * g + t  (g = lane // 4 the group 0..7, t = lane % 4 the thread in the group):

    operand  register  element          operand  register  element
    A        a0        A[g    ][t    ]   B        b0        B[t    ][g]
             a1        A[g + 8][t    ]            b1        B[t + 4][g]
             a2        A[g    ][t + 4]   C, D     c0 / d0   C[g    ][2t    ]
             a3        A[g + 8][t + 4]            c1 / d1   C[g    ][2t + 1]
                                                  c2 / d2   C[g + 8][2t    ]
                                                  c3 / d3   C[g + 8][2t + 1]

(A is read row-major, B column-major: "row.col".) Every lane of the warp must make the call together
(warp-uniform control flow); the operands are passed as float32 and handed to the instruction as their bit
patterns. TF32 is fp32 with 10 instead of 23 mantissa bits (unit roundoff u = 2^-11 ~ 4.9e-4): ``to_tf32`` rounds
(``cvt.rna.tf32.f32``: to nearest, ties away from zero); feed the MMA rounded values.

3xTF32 (``split_tf32`` + ``mma_m16n8k8_3xtf32``): split each operand x = hi + lo with hi = tf32(x),
lo = tf32(x - hi) (x - hi is exact in fp32 and |lo| <= u |x|), and accumulate three products into the fp32 C:

    a * b = hi_a hi_b + hi_a lo_b + lo_a hi_b + lo_a lo_b,     the last term dropped: |lo_a lo_b| <= u^2 |a b|

Each TF32 x TF32 product is exact in fp32 (11 x 11 significant bits <= 24), so a product carries a relative error
of about u^2 (dropped term) + 2 u^2 (rounding of the two lo's) ~ 3 * 2^-22 ~ 7e-7, against u ~ 5e-4 for one plain
TF32 product: a 576-long dot product of the attention comes out at fp32-like accuracy (~1e-6 relative to
sum |a_k b_k|; the GPU test holds it to 1e-6 of float64), for three tensor-core MMAs instead of one. Order: the
small products first (lo_a hi_b, hi_a lo_b), then hi_a hi_b, so the small terms are not lost against a large C.

``split_tf32_fast`` is the cheaper split the attention kernels use: hi = x with its 13 low mantissa bits cleared
(truncation: one LOP3 instead of a cvt), lo = x - hi (exact), and lo handed to the MMA unrounded (the tensor core
reads a TF32 operand's top 19 bits). |lo| < 2^-10 |x| and the MMA keeps lo to 2^-10 of itself, so a product
carries ~3 * 2^-20 ~ 3e-6 relative error instead of ~7e-7: measured on the H200, attention outputs moved from
2.6e-5 to 3.1e-5 max error against float64 (tolerance 1e-4), for 12 % less time.

Example (one warp): A = eye(16)[:, :8] (rows 0..7 are e_0..e_7, rows 8..15 zero), B = ones((8, 8)), C = 0.
Lane 4g + t passes a0 = [g == t], a1 = 0, a2 = [g == t + 4], a3 = 0, b0 = b1 = 1, c = 0 and gets back
d0 = d1 = 1 (row g of A @ B is all ones) and d2 = d3 = 0 (row g + 8 is zero). A k-loop accumulates: pass the d's
of one step as the c's of the next (tests/kernels/test_mma.py; gemm.matmul_mma is a whole GEMM on this).

The simulator (``NUMBA_ENABLE_CUDASIM=1``) has no MMA. Its stand-ins keep the same fragment layout: every lane
writes its fragments into ``scratch`` (a shared float32 array ``[warps, 32, 24]`` the caller declares as
``cuda.shared.array(SCRATCH_SHAPE, float32)``; ``SCRATCH_SHAPE`` is ``(1, 1, 1)`` on the GPU, where it is not
touched), one block barrier, and each lane reads the whole warp's A and B and computes its four outputs (TF32
inputs, float64 sums rounded to fp32 after each MMA - what the tensor core does up to the order of its adds).
Consequences on the simulator: blocks are 1-D, every warp of the block makes the same number of calls (the barrier
is block-wide), and two scratch slots alternate per call (a per-thread call count on the simulator's thread) so a
fast lane cannot overwrite fragments a slow lane is still reading.
"""
from __future__ import annotations

import threading

import numba
import numpy as np
from llvmlite import ir
from numba import cuda, float32, types
from numba.cuda.extending import intrinsic

SIM = bool(numba.config.ENABLE_CUDASIM)
SIM_MAX_WARPS = 8                  # warps per block the simulator's scratch has room for
SLOT = 12                          # floats per lane per call: 3xTF32 passes a hi, a lo (4 + 4), b hi, b lo (2 + 2)
if SIM:
    SCRATCH_SHAPE = (SIM_MAX_WARPS, 32, 2 * SLOT)
else:
    SCRATCH_SHAPE = (1, 1, 1)

MMA_PTX = ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
           "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")

if SIM:
    def _trunc_host(x):
        """x with its 13 low mantissa bits cleared (TF32 by truncation)."""
        return (np.float32(x).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)

    def _tf32_host(x):
        """Round a float32 to TF32 (nearest, ties away from zero: add half a TF32 ulp to the magnitude bits and
        clear the 13 low mantissa bits), as ``cvt.rna.tf32.f32`` does."""
        b = int(np.float32(x).view(np.uint32))
        return np.uint32(((b + 0x1000) & 0xFFFFE000) & 0xFFFFFFFF).view(np.float32)

    @cuda.jit(device=True)
    def to_tf32(x):
        return float32(_tf32_host(x))

    @cuda.jit(device=True)
    def trunc_tf32(x):
        return float32(_trunc_host(x))

    def _exchange(vals, scratch):
        """Every lane's fragments -> scratch (slot alternating per call), one barrier: the warp's [32, k] view."""
        th = threading.current_thread()
        n = getattr(th, "_mma_calls", 0)
        th._mma_calls = n + 1
        tid = cuda.threadIdx.x
        buf = scratch[tid // 32, :, (n % 2) * SLOT:(n % 2) * SLOT + len(vals)]
        buf[tid % 32, :] = vals
        cuda.syncthreads()
        return buf

    def _unpack(buf, col):
        """(A [16, 8], B [8, 8]) float64 from the fragments a0..a3 at columns col..col+3, b0, b1 at col2 (below)."""
        a = np.empty((16, 8))
        a[:8, :4] = buf[:, col].reshape(8, 4)               # lane 4g + t holds A[g][t] ...
        a[8:, :4] = buf[:, col + 1].reshape(8, 4)
        a[:8, 4:] = buf[:, col + 2].reshape(8, 4)
        a[8:, 4:] = buf[:, col + 3].reshape(8, 4)
        return a

    def _unpack_b(buf, col):
        b = np.empty((8, 8))
        b[:4, :] = buf[:, col].reshape(8, 4).T              # lane 4g + t holds B[t][g] ...
        b[4:, :] = buf[:, col + 1].reshape(8, 4).T
        return b

    def _lane_mma(a, b, c0, c1, c2, c3):
        """This lane's four outputs of A @ B + C, rounded to fp32."""
        lane = cuda.threadIdx.x % 32
        g, t = lane // 4, lane % 4
        return (float32(c0 + a[g] @ b[:, 2 * t]), float32(c1 + a[g] @ b[:, 2 * t + 1]),
                float32(c2 + a[g + 8] @ b[:, 2 * t]), float32(c3 + a[g + 8] @ b[:, 2 * t + 1]))

    @cuda.jit(device=True)
    def mma_m16n8k8_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, scratch):
        buf = _exchange([_tf32_host(v) for v in (a0, a1, a2, a3, b0, b1)], scratch)
        return _lane_mma(_unpack(buf, 0), _unpack_b(buf, 4), c0, c1, c2, c3)

    @cuda.jit(device=True)
    def mma_m16n8k8_3xtf32(ah0, ah1, ah2, ah3, al0, al1, al2, al3, bh0, bh1, bl0, bl1, c0, c1, c2, c3, scratch):
        buf = _exchange([_tf32_host(v) for v in (ah0, ah1, ah2, ah3, al0, al1, al2, al3, bh0, bh1, bl0, bl1)],
                        scratch)
        ah, al, bh, bl = _unpack(buf, 0), _unpack(buf, 4), _unpack_b(buf, 8), _unpack_b(buf, 10)
        d = _lane_mma(al, bh, c0, c1, c2, c3)               # the same three MMAs, in the same order, as the GPU
        d = _lane_mma(ah, bl, *d)
        return _lane_mma(ah, bh, *d)
else:
    @intrinsic
    def _cvt_tf32(typingctx, x):
        if x != types.float32:
            return None

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(32), [ir.FloatType()])
            bits = builder.call(ir.InlineAsm(fnty, "cvt.rna.tf32.f32 $0, $1;", "=r,f"), args)
            return builder.bitcast(bits, ir.FloatType())
        return types.float32(types.float32), codegen

    def mma_intrinsic(ptx: str):
        """A warp-wide m16n8kK MMA intrinsic for the PTX text ``ptx`` with the operand shape of MMA_PTX: six b32
        fragment registers (passed as float32, handed over as their bit patterns), four f32 accumulators in, four
        out. MMA_PTX gives ``_mma_tf32``; an m16n8k16 f16 / bf16 text (two halves a register) gives what
        benchmarks/bench_mma.py times beside it."""
        @intrinsic
        def _mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            operands = (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
            if any(op != types.float32 for op in operands):
                return None

            def codegen(context, builder, sig, args):
                f32, i32 = ir.FloatType(), ir.IntType(32)
                fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
                asm = ir.InlineAsm(fnty, ptx, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", side_effect=True)
                # convergent + side effect: LLVM may neither drop the warp-wide instruction nor move it into a branch
                res = builder.call(asm, [builder.bitcast(a, i32) for a in args[:6]] + list(args[6:]),
                                   attrs=("convergent",))
                return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, i) for i in range(4)])
            return types.UniTuple(types.float32, 4)(*operands), codegen
        return _mma

    _mma_tf32 = mma_intrinsic(MMA_PTX)

    @cuda.jit(device=True)
    def to_tf32(x):
        return _cvt_tf32(float32(x))

    from ._intrinsics import unary_f32
    _trunc_tf32 = unary_f32("and.b32 $0, $1, -8192;")        # the 13 low mantissa bits cleared

    @cuda.jit(device=True)
    def trunc_tf32(x):
        return _trunc_tf32(float32(x))

    @cuda.jit(device=True)
    def mma_m16n8k8_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, scratch):
        return _mma_tf32(float32(a0), float32(a1), float32(a2), float32(a3), float32(b0), float32(b1),
                         float32(c0), float32(c1), float32(c2), float32(c3))

    @cuda.jit(device=True)
    def mma_m16n8k8_3xtf32(ah0, ah1, ah2, ah3, al0, al1, al2, al3, bh0, bh1, bl0, bl1, c0, c1, c2, c3, scratch):
        d0, d1, d2, d3 = _mma_tf32(al0, al1, al2, al3, bh0, bh1, c0, c1, c2, c3)          # lo_a hi_b
        d0, d1, d2, d3 = _mma_tf32(ah0, ah1, ah2, ah3, bl0, bl1, d0, d1, d2, d3)          # hi_a lo_b
        return _mma_tf32(ah0, ah1, ah2, ah3, bh0, bh1, d0, d1, d2, d3)                    # hi_a hi_b


@cuda.jit(device=True)
def split_tf32(x):
    """(hi, lo): hi = tf32(x), lo = tf32(x - hi); x = hi + lo up to u^2 |x| (module docstring)."""
    hi = to_tf32(x)
    return hi, to_tf32(x - hi)


@cuda.jit(device=True)
def split_tf32_fast(x):
    """(hi, lo): hi = x truncated to TF32, lo = x - hi exactly (the MMA reads lo's TF32 part); two instructions.
    Example: x = 1 + 2^-12 -> hi = 1, lo = 2^-12."""
    hi = trunc_tf32(x)
    return hi, float32(x - hi)


@cuda.jit(device=True)
def mma_fp32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, three, scratch):
    """One m16n8k8 step from plain fp32 fragments (the layout table above): D = A B + C as 3xTF32 (``three``: split
    both operands, three MMAs; fp32-grade) or as one TF32 MMA (operands rounded; ~1e-3 relative). Returns
    (d0, d1, d2, d3). Every lane of the warp calls (warp-uniform ``three``)."""
    if three:
        ah0, al0 = split_tf32(a0)
        ah1, al1 = split_tf32(a1)
        ah2, al2 = split_tf32(a2)
        ah3, al3 = split_tf32(a3)
        bh0, bl0 = split_tf32(b0)
        bh1, bl1 = split_tf32(b1)
        return mma_m16n8k8_3xtf32(ah0, ah1, ah2, ah3, al0, al1, al2, al3, bh0, bh1, bl0, bl1, c0, c1, c2, c3,
                                  scratch)
    return mma_m16n8k8_tf32(to_tf32(a0), to_tf32(a1), to_tf32(a2), to_tf32(a3), to_tf32(b0), to_tf32(b1),
                            c0, c1, c2, c3, scratch)


# ------------------------------------------------------------------------------------------------ fragment loads
# A k-loop over a shared tile names each lane's fragment once (``frag_a_base`` / ``frag_b2_base``: the tile's first
# element at flat offset ``off``, row stride ``stride`` floats) and then moves it along the k axis by whole k8 steps:
# ``FLOAT_UNIT`` per float (GPU: bytes of a 32-bit shared address; simulator: elements), so base + 8 FLOAT_UNIT is
# the next k8 step and base + 8 stride FLOAT_UNIT the next 8 rows. On the GPU a base is this lane's own ldmatrix row
# address, computed once, and every step is one 32-bit add - the loop pays the load and nothing else.
if SIM:
    FLOAT_UNIT = 1

    @cuda.jit(device=True)
    def frag_a_base(s, off, stride):
        return off

    @cuda.jit(device=True)
    def frag_b2_base(s, off, stride):
        return off

    @cuda.jit(device=True)
    def frag_a_at(s, base, stride):
        lane = cuda.threadIdx.x % 32
        o = base + (lane // 4) * stride + lane % 4
        f = s.reshape(-1)
        return f[o], f[o + 8 * stride], f[o + 4], f[o + 8 * stride + 4]

    @cuda.jit(device=True)
    def frag_b2_at(s, base, stride):
        lane = cuda.threadIdx.x % 32
        o = base + (lane // 4) * stride + lane % 4
        f = s.reshape(-1)
        return f[o], f[o + 4], f[o + 8 * stride], f[o + 8 * stride + 4]
else:
    from numba import uint32

    from ._intrinsics import ldmatrix_x4, shared_address
    FLOAT_UNIT = 4

    @cuda.jit(device=True)
    def frag_a_base(s, off, stride):
        """This lane's ldmatrix row address for ``frag_a_at``: matrix j of the x4 load is the 8 x 4 block (rows
        8 (j % 2) .., columns 4 (j // 2) ..) of the 16 x 8 tile, so lane L names row L % 16 at column 4 (L // 16).
        ``off`` and ``stride`` multiples of 4 (16-byte rows); bank-conflict free when the stride is 4 mod 32
        (8 rows of 4 words cover the 32 banks)."""
        lane = cuda.threadIdx.x % 32
        return shared_address(s) + uint32(4 * (off + (lane % 16) * stride + (lane // 16) * 4))

    @cuda.jit(device=True)
    def frag_b2_base(s, off, stride):
        """This lane's row address for ``frag_b2_at``: matrix j = rows 8 (j // 2) .., columns 4 (j % 2) .., so lane
        L names row L % 8 + 8 (L // 16) at column 4 (L // 8 % 2). Same conditions as ``frag_a_base``."""
        lane = cuda.threadIdx.x % 32
        return shared_address(s) + uint32(4 * (off + (lane % 8 + (lane // 16) * 8) * stride + (lane // 8 % 2) * 4))

    @cuda.jit(device=True)
    def frag_a_at(s, base, stride):
        """(a0, a1, a2, a3): the A fragment (module docstring) of the 16 x 8 tile A[i][k] = s.flat[off + i stride + k]
        whose lane address ``frag_a_base`` gave (moved by k8 steps since), as one warp-wide ldmatrix.x4 - four
        loads a lane otherwise. Every lane calls with its own base of the same tile. The simulator loads the four
        elements one by one (it has no warp-wide load; its base is the tile's element offset)."""
        return ldmatrix_x4(base)

    @cuda.jit(device=True)
    def frag_b2_at(s, base, stride):
        """(b0, b1, c0, c1): the B fragments of two neighbouring n8 blocks when B is stored n-major - B[k][n] =
        s.flat[off + n stride + k], k < 8, n < 16 (the key tile of a score Q K^T: keys are rows) - b for n 0..7
        and c for n 8..15, as one ldmatrix.x4 at ``frag_b2_base``'s address."""
        return ldmatrix_x4(base)
