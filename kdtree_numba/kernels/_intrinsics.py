"""GPU instructions numba-cuda does not spell plainly, with stand-ins for numba's CUDA simulator.

- ``ex2(t)`` = 2^t as one ``ex2.approx.ftz.f32`` (MUFU.EX2; relative error < 2^-22, results below 2^-126 flush
  to 0). libdevice's ``fast_expf`` adds a range test and two multiplies for subnormal results; the softmax sums
  here only ever need exp(x - max) <= 1, where a flushed 1e-38 changes nothing.
- ``fmax(a, b)`` / ``fmin(a, b)``: one FMNMX (numba's ``max`` on floats is a compare and a select). A NaN operand
  is ignored (the other one is returned), as in C's fmaxf.
- ``copy_async(dst, dst_off, src, src_off, width, keep)``: ``dst.flat[dst_off : dst_off + width] =
  src.flat[src_off : ...]`` if ``keep`` else zeros, for float32 arrays (dst in shared memory, src in global memory,
  ``width`` 4 or 1 floats, a compile-time constant in practice) as one ``cp.async`` (LDGSTS): the copy goes from
  L2 to shared memory without passing through registers, so a thread issues all its copies of a tile back to back
  with no register buffer and no index math between a load and its store. ``keep`` false zero-fills (src-size 0:
  nothing is read). The offsets are flat element offsets (any ndim: the array's data pointer + offset), so the
  caller pays one add per copy instead of numba's per-axis index arithmetic. Width 4 needs both addresses 16-byte
  aligned. ``copy_async_wait()`` (``cp.async.wait_all``) waits for this thread's copies; a block barrier after it
  makes every thread's copies visible to the block.
- ``view2d(a, off, rows, cols)``: ``a[off : off + rows * cols].reshape(rows, cols)`` for a 1-D float32 array (a
  tile carved out of dynamic shared memory, which numba gives as one 1-D array); no copy, no bounds check.
- ``shared_address(a)``: the 32-bit shared-memory address of a shared array's first element.
- ``lds4(a, off)``: ``a.flat[off : off + 4]`` of a float32 shared array as a 4-tuple, one ``ld.shared.v4.f32``
  (LDS.128; ``off`` a multiple of 4 from a 16-byte aligned array): a quarter of the load instructions of four
  scalar loads, which numba's compiler does not merge.
- ``ldmatrix_x4(addr)``: the warp-wide ``ldmatrix.sync.aligned.m8n8.x4.shared.b16``, ``addr`` this lane's row
  address (a ``shared_address`` + 4 x a float offset, 16-byte aligned): lanes 8 i .. 8 i + 7 name the 8 rows
  (16 bytes = 4 floats each) of matrix i, and lane 4 g + t receives word t of row g of each of the four matrices -
  exactly an m16n8k8 TF32 fragment's layout (kernels/mma.py ``frag_a`` / ``frag_b2``). GPU only: the simulator
  has no warp-wide load (mma.py's fragment loads read element by element there).
- Bulk copies (sm_90): ``bulk_copy(dst, dst_off, src, src_off, nbytes, mbar)`` = one
  ``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes``: ``nbytes`` (a multiple of 16, both
  addresses 16-byte aligned) from global ``src.flat[src_off ..]`` to shared ``dst.flat[dst_off ..]`` by the copy
  engine, one instruction for a whole row, completing on the shared mbarrier ``mbar`` (an int64 [1] shared
  array): ``mbar_init(mbar, 1)`` once (then a block barrier), per use one thread's
  ``mbar_expect_tx(mbar, total bytes)`` (its arrival), the copies, and every reader's
  ``while not mbar_try_wait(mbar, phase)`` with the phase bit flipping each use. ``fence_proxy_async()`` orders
  this thread's earlier ordinary shared-memory accesses before later copy-engine ones. The simulator copies at
  once and its waits return True.
- ``globaltimer()``: the GPU's global nanosecond clock (PTX ``%globaltimer``, int64), read where the instruction
  runs - a device-side time stamp that a CUDA graph replays (kernels/stamp.py); the simulator reads the host's
  ``time.perf_counter_ns()``.

The simulator's libdevice stubs return NaN, so there each is plain Python (ex2 rounded once to float32, without
the flush to zero). ``SIM`` says which one runs. Warp and block collectives (shuffles, reductions, scans, the
bitonic sort) and the streaming-softmax step live in kernels/primitives.py.
Example: ex2(float32(-1.0)) = 0.5; fmax(float32(nan), float32(2.0)) = 2.0;
copy_async(tile, 8, cache, 576 * r, 4, r >= 0), then copy_async_wait() and a barrier: tile.flat[8:12] =
cache[r, 0:4] for a row r >= 0, else zeros.
"""
from __future__ import annotations

import math
import time

import numba
from llvmlite import ir
from numba import cuda, float32, types
from numba.cuda.extending import intrinsic

LOG2E = 1.4426950408889634
SIM = bool(numba.config.ENABLE_CUDASIM)

if SIM:
    @cuda.jit(device=True)
    def ex2(t):
        return float32(2.0 ** min(float(t), 127.0)) if t == t else float32(math.nan)

    @cuda.jit(device=True)
    def fmax(a, b):
        return b if a != a or b > a else a

    @cuda.jit(device=True)
    def fmin(a, b):
        return b if a != a or b < a else a

    @cuda.jit(device=True)
    def copy_async(dst, dst_off, src, src_off, width, keep):
        d = dst.reshape(-1)
        s = src.reshape(-1)
        for i in range(width):
            d[dst_off + i] = s[src_off + i] if keep else float32(0.0)

    @cuda.jit(device=True)
    def copy_async_wait():
        pass

    @cuda.jit(device=True)
    def lds4(a, off):
        return a[off], a[off + 1], a[off + 2], a[off + 3]

    def view2d(a, off, rows, cols):
        return a[off:off + rows * cols].reshape(rows, cols)

    @cuda.jit(device=True)
    def globaltimer():
        return time.perf_counter_ns()

    @cuda.jit(device=True)
    def bulk_copy(dst, dst_off, src, src_off, nbytes, mbar):
        d = dst.reshape(-1)
        s = src.reshape(-1)
        for i in range(nbytes // 4):
            d[dst_off + i] = s[src_off + i]

    @cuda.jit(device=True)
    def mbar_init(mbar, count):
        pass

    @cuda.jit(device=True)
    def mbar_expect_tx(mbar, nbytes):
        pass

    @cuda.jit(device=True)
    def mbar_try_wait(mbar, phase):
        return True

    @cuda.jit(device=True)
    def fence_proxy_async():
        pass
else:
    def unary_f32(text):
        """An intrinsic (x: float32) -> float32 emitting the PTX statement ``text`` ($0 the result, $1 x)."""
        @intrinsic
        def impl(typingctx, x):
            if x != types.float32:
                return None

            def codegen(context, builder, sig, args):
                fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType()])
                return builder.call(ir.InlineAsm(fnty, text, "=f,f"), args)
            return types.float32(types.float32), codegen
        return impl

    _ex2_approx = unary_f32("ex2.approx.ftz.f32 $0, $1;")

    def _binary_f32(inst):
        """An intrinsic (a: float32, b: float32) -> float32 emitting the one PTX instruction ``inst``."""
        @intrinsic
        def impl(typingctx, a, b):
            if a != types.float32 or b != types.float32:
                return None

            def codegen(context, builder, sig, args):
                fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType(), ir.FloatType()])
                return builder.call(ir.InlineAsm(fnty, inst + " $0, $1, $2;", "=f,f,f"), args)
            return types.float32(types.float32, types.float32), codegen
        return impl

    _max_f32 = _binary_f32("max.f32")
    _min_f32 = _binary_f32("min.f32")

    def _element_address(context, builder, aryty, ary, off, offty):
        """The i64 address of element ``off`` (flat) of a float32 array: its data pointer + off (no index checks)."""
        data = context.make_array(aryty)(context, builder, value=ary).data
        return builder.ptrtoint(builder.gep(data, [context.cast(builder, off, offty, types.int64)]),
                                ir.IntType(64))

    def _cp_async(nbytes, cache_op):
        """An intrinsic (dst, dst_off, src, src_off, keep) emitting one ``cp.async.<cache_op>`` of ``nbytes``."""
        @intrinsic
        def impl(typingctx, dst, dst_off, src, src_off, keep):
            if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.dtype == types.float32
                    and src.dtype == types.float32):
                return None

            def codegen(context, builder, sig, args):
                i64, i32 = ir.IntType(64), ir.IntType(32)
                dst_a = _element_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
                src_a = _element_address(context, builder, sig.args[2], args[2], args[3], sig.args[3])
                keep = context.cast(builder, args[4], sig.args[4], types.boolean)
                size = builder.select(keep, ir.Constant(i32, nbytes), ir.Constant(i32, 0))
                asm = ("{ .reg .u64 sa; cvta.to.shared.u64 sa, $0; "
                       f"cp.async.{cache_op}.shared.global [sa], [$1], {nbytes}, $2; }}")
                fnty = ir.FunctionType(ir.VoidType(), [i64, i64, i32])
                builder.call(ir.InlineAsm(fnty, asm, "l,l,r,~{memory}", side_effect=True), [dst_a, src_a, size])
                return context.get_dummy_value()
            return types.void(dst, dst_off, src, src_off, keep), codegen
        return impl

    _cp_async16 = _cp_async(16, "cg")          # 16 bytes: L2 only (.cg), the tile is read once per block
    _cp_async4 = _cp_async(4, "ca")            # 4 bytes (.ca: the only cache op for sizes under 16)

    @intrinsic
    def _cp_async_wait_all(typingctx):
        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.VoidType(), [])
            builder.call(ir.InlineAsm(fnty, "cp.async.wait_all;", "~{memory}", side_effect=True), [])
            return context.get_dummy_value()
        return types.void(), codegen

    @cuda.jit(device=True)
    def copy_async(dst, dst_off, src, src_off, width, keep):
        if width == 4:
            _cp_async16(dst, dst_off, src, src_off, keep)
        else:
            _cp_async4(dst, dst_off, src, src_off, keep)

    @cuda.jit(device=True)
    def copy_async_wait():
        _cp_async_wait_all()

    @intrinsic
    def view2d(typingctx, a, off, rows, cols):
        """A C-contiguous [rows, cols] view of a 1-D float32 array from flat element ``off`` (numba's reshape on
        the device calls a runtime helper the CUDA target does not link)."""
        if not (isinstance(a, types.Array) and a.ndim == 1 and a.dtype == types.float32):
            return None
        ret = types.Array(types.float32, 2, "C")

        def codegen(context, builder, sig, args):
            src = context.make_array(sig.args[0])(context, builder, value=args[0])
            view = context.make_array(ret)(context, builder)
            data = builder.gep(src.data, [context.cast(builder, args[1], sig.args[1], types.int64)])
            r = context.cast(builder, args[2], sig.args[2], types.intp)
            c = context.cast(builder, args[3], sig.args[3], types.intp)
            item = context.get_constant(types.intp, 4)
            context.populate_array(view, data=data, shape=[r, c], strides=[builder.mul(c, item), item],
                                   itemsize=item, meminfo=None)
            return view._getvalue()
        return ret(a, off, rows, cols), codegen

    @intrinsic
    def ldmatrix_x4(typingctx, addr):
        if not isinstance(addr, types.Integer):
            return None
        ret = types.UniTuple(types.float32, 4)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            a32 = args[0] if args[0].type.width == 32 else builder.trunc(args[0], i32)
            fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32])
            asm = "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];"
            # volatile, with a memory clobber: it reads shared memory that barriers order (a pure asm could be
            # hoisted out of the key-tile loop or across the barrier that publishes the tile); convergent: warp-wide
            res = builder.call(ir.InlineAsm(fnty, asm, "=r,=r,=r,=r,r,~{memory}", side_effect=True), [a32],
                               attrs=("convergent",))
            return context.make_tuple(builder, ret, [builder.bitcast(builder.extract_value(res, i), ir.FloatType())
                                                     for i in range(4)])
        return ret(addr), codegen

    def _shared32(context, builder, aryty, ary):
        """The 32-bit shared-window address of a shared array's data (inline ``cvta.to.shared``)."""
        data = context.make_array(aryty)(context, builder, value=ary).data
        fnty = ir.FunctionType(ir.IntType(64), [ir.IntType(64)])
        sa = builder.call(ir.InlineAsm(fnty, "cvta.to.shared.u64 $0, $1;", "=l,l"),
                          [builder.ptrtoint(data, ir.IntType(64))])
        return builder.trunc(sa, ir.IntType(32))

    def _void_asm(builder, text, constraints, args):
        fnty = ir.FunctionType(ir.VoidType(), [a.type for a in args])
        clobber = constraints + "," if constraints else ""       # volatile, ordered with memory accesses
        builder.call(ir.InlineAsm(fnty, text, clobber + "~{memory}", side_effect=True), args)

    @intrinsic
    def shared_address(typingctx, a):
        """The 32-bit shared-window address of a shared array's data (``cvta.to.shared``): computed once, so the
        loads built on it add 32-bit offsets (a 64-bit generic address costs an add-with-carry pair per load)."""
        if not isinstance(a, types.Array):
            return None

        def codegen(context, builder, sig, args):
            return _shared32(context, builder, sig.args[0], args[0])      # pure: LLVM may hoist it
        return types.uint32(a), codegen

    @intrinsic
    def lds4(typingctx, a, off):
        if not (isinstance(a, types.Array) and a.dtype == types.float32 and isinstance(off, types.Integer)):
            return None
        ret = types.UniTuple(types.float32, 4)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            off32 = builder.trunc(context.cast(builder, args[1], sig.args[1], types.int64), i32)
            addr = builder.add(_shared32(context, builder, sig.args[0], args[0]),
                               builder.mul(off32, ir.Constant(i32, 4)))
            fnty = ir.FunctionType(ir.LiteralStructType([ir.FloatType()] * 4), [i32])
            # volatile, with a memory clobber: it reads what copies and barriers publish (a pure asm could be
            # hoisted across the barrier)
            res = builder.call(ir.InlineAsm(fnty, "ld.shared.v4.f32 {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,r,~{memory}",
                                            side_effect=True), [addr])
            return context.make_tuple(builder, ret, [builder.extract_value(res, i) for i in range(4)])
        return ret(a, off), codegen

    @intrinsic
    def bulk_copy(typingctx, dst, dst_off, src, src_off, nbytes, mbar):
        if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and isinstance(mbar, types.Array)):
            return None

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            d = builder.add(_shared32(context, builder, sig.args[0], args[0]),
                            builder.mul(builder.trunc(context.cast(builder, args[1], sig.args[1], types.int64), i32),
                                        ir.Constant(i32, 4)))
            s = _element_address(context, builder, sig.args[2], args[2], args[3], sig.args[3])
            n = builder.trunc(context.cast(builder, args[4], sig.args[4], types.int64), i32)
            m = _shared32(context, builder, sig.args[5], args[5])
            _void_asm(builder, "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
                      "r,l,r,r", [d, s, n, m])
            return context.get_dummy_value()
        return types.void(dst, dst_off, src, src_off, nbytes, mbar), codegen

    def _mbar_op(text):
        """An intrinsic (mbar, n) -> None emitting ``text`` with $0 = mbar's shared address and $1 = n (32-bit)."""
        @intrinsic
        def impl(typingctx, mbar, n):
            def codegen(context, builder, sig, args):
                n32 = builder.trunc(context.cast(builder, args[1], sig.args[1], types.int64), ir.IntType(32))
                _void_asm(builder, text, "r,r", [_shared32(context, builder, sig.args[0], args[0]), n32])
                return context.get_dummy_value()
            return types.void(mbar, n), codegen
        return impl

    mbar_init = _mbar_op("mbarrier.init.shared::cta.b64 [$0], $1;")                 # n: the arrival count
    mbar_expect_tx = _mbar_op("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;")   # n: the bytes

    @intrinsic
    def mbar_try_wait(typingctx, mbar, phase):
        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            ph = builder.trunc(context.cast(builder, args[1], sig.args[1], types.int64), i32)
            fnty = ir.FunctionType(i32, [i32, i32])
            asm = ("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; "
                   "selp.u32 $0, 1, 0, p; }")
            r = builder.call(ir.InlineAsm(fnty, asm, "=r,r,r,~{memory}", side_effect=True),
                             [_shared32(context, builder, sig.args[0], args[0]), ph])
            return builder.icmp_unsigned("!=", r, ir.Constant(i32, 0))
        return types.boolean(mbar, phase), codegen

    @intrinsic
    def fence_proxy_async(typingctx):
        def codegen(context, builder, sig, args):
            _void_asm(builder, "fence.proxy.async.shared::cta;", "", [])
            return context.get_dummy_value()
        return types.void(), codegen

    @intrinsic
    def globaltimer(typingctx):
        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(64), [])      # volatile: every call reads the clock again
            return builder.call(ir.InlineAsm(fnty, "mov.u64 $0, %globaltimer;", "=l", side_effect=True), [])
        return types.int64(), codegen

    @cuda.jit(device=True)
    def ex2(t):
        return _ex2_approx(float32(t))

    @cuda.jit(device=True)
    def fmax(a, b):
        return _max_f32(float32(a), float32(b))

    @cuda.jit(device=True)
    def fmin(a, b):
        return _min_f32(float32(a), float32(b))
