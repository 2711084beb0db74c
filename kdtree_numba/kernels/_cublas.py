"""fp32 GEMMs through cuBLAS that a CUDA graph can capture (cuda backend only).

CuPy refuses every cuBLAS call while a stream is capturing ("calling cuBLAS API during stream capture is currently
unsupported"), so a decode step whose projections went through ``cupy.matmul`` could not become a graph
(decode/replay.py). cuBLAS itself supports capture when its handle has a fixed stream and a user workspace (no
allocation inside the capture). This module calls ``cublasSgemm_v2`` / ``cublasSgemmStridedBatched`` through ctypes
on the library CuPy already loaded, with one handle bound to the backend stream and a 32 MiB workspace (one per
stream it has run on: a ``backend.branch``'s GEMMs run concurrently with the main stream's), and is the
one GEMM path of the cuda backend: captured and direct steps run the same cuBLAS calls, so they give the same bits.

Row-major to cuBLAS's column-major: C = A @ B  <=>  C^T = B^T @ A^T, and a row-major C [M, N] is a column-major
C^T [N, M] with ld = N. A row-major operand X [r, c] with element strides (s0, s1) is, read column-major,
  X^T with ld = s0          when s1 == 1 (op N), or
  X   with ld = s1, op T    when s0 == 1 (a transposed view, e.g. ``w.T`` of an HF weight [out, in]).
Any other layout (or an ld cuBLAS would refuse) is copied contiguous first. Math: pure fp32 (the handle's default
math mode, no TF32), so results agree with CuPy's own fp32 GEMMs to rounding.
Small GEMMs (2 <= M <= SMALL_M rows and K <= SMALL_K: the tiny drafter's 16-row block) go to a second handle
without a workspace. With one, cuBLAS's heuristic picks split-K kernels that cut K = 256 or 768 into 132-264
slices (one or two per SM of the H200) and reduce them serially: 53 us on the H200 for [16, 256] @ [256, 128] -
the drafter's k projection - against <= 25 us (launch-bound) without (2026-12-02, measured by timing both
handles on the same shapes). A long K (a Kimi-sized hidden of 7168) keeps the workspace: there split-K is what
fills the GPU when M is small.
GEMMs of 17-80 rows over a weight L2 holds (a DDTree-16 .. -79 verify's products) can run as one strided batch of
<= 16-row blocks (``_row_blocks``): cuBLAS's 16-row kernel per block instead of split-K; kernels/gemm_choice.py
times that, blocks of <= 8 and of 1 row and the skinny kernel per shape and keeps the fastest.
``gemm(.., tf32=True)`` runs on a third handle in TF32 math mode (CUBLAS_TF32_TENSOR_OP_MATH: the tensor cores,
each operand's low 13 mantissa bits dropped), sharing the first handle's workspace: only for callers that split
their operands so the dropped bits do not matter (kernels/mla_gemm_attention.py's 3xTF32 products).
Example: gemm(a [2, 3], w.T) with w [4, 3] contiguous -> sgemm(op_a=T on w with ld 3, op_b=N on a with ld 3,
m=4, n=2, k=3) writing C^T [4, 2] = C [2, 4] row-major.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

import numpy as np

from .. import backend

WORKSPACE_BYTES = 32 << 20          # cuBLAS's recommended workspace on Hopper
SMALL_M = 32                        # at most this many rows (and 2 or more) and
SMALL_K = 1024                      # at most this K: the handle without a workspace
ROW_BLOCKS = 16                     # a GEMM of ROW_BLOCKS_MIN .. 5 x ROW_BLOCKS rows (a tree verify's 17 .. 80)
ROW_BLOCKS_MIN = ROW_BLOCKS + 1     # over a weight of at most ROW_BLOCKS_WEIGHT floats (8 MB: L2-resident) runs as
ROW_BLOCKS_WEIGHT = 1 << 21         # a strided batch of <= ROW_BLOCKS-row blocks (``_row_blocks``); 0: never
ROW_BLOCKS_OVERLAP = True           # rows equal blocks cannot share (37 = 13 + 12 + 12): blocks that overlap by a row
                                    # or two (``_block_layout``), one call; False, or ``accumulate``: a second call
_OP_N, _OP_T = 0, 1
_TF32_MATH = 3                      # CUBLAS_TF32_TENSOR_OP_MATH
_state: dict = {}                   # the library, the handle, its stream and workspace (one per process)


def _library() -> ctypes.CDLL:
    """The libcublas CuPy loaded (so one copy of cuBLAS serves both), found in the process's memory map."""
    backend.cp.cuda.device.get_cublas_handle()                 # makes CuPy load cuBLAS
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcublas.so" in line and "libcublasLt" not in line}
    except OSError:
        paths = set()
    for path in sorted(paths):
        if os.path.basename(path).startswith("libcublas.so"):
            return ctypes.CDLL(path)
    name = ctypes.util.find_library("cublas")
    if name is None:
        raise RuntimeError("cuBLAS: could not find libcublas (the one CuPy uses); is CuPy's CUDA runtime complete?")
    return ctypes.CDLL(name)


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLAS: {what} failed with status {status}")


def _handle(rows: int = 0, k: int = 0, tf32: bool = False):
    """The process's handle for a GEMM of ``rows`` output rows and inner dimension ``k``, bound to the backend stream
    (set again if the stream changed): with the user workspace, or for small GEMMs (module docstring) the second
    handle, with none; ``tf32``: the third, in TF32 math, with the user workspace."""
    st = _state
    if "lib" not in st:
        lib = _library()
        lib.cublasSgemm_v2.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                       ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                       ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        lib.cublasSgemmStridedBatched.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
            ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong,
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_int]
        handles = [ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()]
        for h in handles:
            _check(lib.cublasCreate_v2(ctypes.byref(h)), "cublasCreate")
        _check(lib.cublasSetMathMode(handles[2], _TF32_MATH), "cublasSetMathMode")
        st.update(lib=lib, handles=handles, stream=None, workspaces={},
                  one=ctypes.c_float(1.0), zero=ctypes.c_float(0.0))
    if st["stream"] != backend.stream.ptr:
        # cublasSetStream resets the workspace to cuBLAS's own pool: set ours (or none) again after it. One
        # workspace per stream: GEMMs on concurrent streams (backend.branch) must not share one.
        ws = st["workspaces"]
        if backend.stream.ptr not in ws:
            ws[backend.stream.ptr] = backend.cp.cuda.alloc(WORKSPACE_BYTES)
        ours = (ws[backend.stream.ptr].ptr, WORKSPACE_BYTES)
        for h, (ptr, size) in zip(st["handles"], (ours, (0, 0), ours)):   # the TF32 handle shares the workspace
            _check(st["lib"].cublasSetStream_v2(h, ctypes.c_void_p(backend.stream.ptr)), "cublasSetStream")
            _check(st["lib"].cublasSetWorkspace_v2(h, ctypes.c_void_p(ptr), ctypes.c_size_t(size)),
                   "cublasSetWorkspace")
        st["stream"] = backend.stream.ptr
    st["handle"] = st["handles"][2 if tf32 else int(2 <= rows <= SMALL_M and k <= SMALL_K)]
    return st


def _operand(x, rows: int, cols: int):
    """(array, op, ld) reading the row-major matrix ``x [..., rows, cols]`` as cuBLAS's op(X^T)."""
    s0, s1 = (s // 4 for s in x.strides[-2:])
    if x.strides[-1] % 4 == 0 and x.strides[-2] % 4 == 0:
        if s1 == 1 and (s0 >= max(1, cols) or rows == 1):
            return x, _OP_N, max(s0, cols, 1)
        if s0 == 1 and (s1 >= max(1, rows) or cols == 1):
            return x, _OP_T, max(s1, rows, 1)
    x = backend.cp.ascontiguousarray(x)
    return x, _OP_N, max(cols, 1)


def gemm(a, b, out, accumulate: bool = False, tf32: bool = False):
    """``out [M, N] = a [M, K] @ b [K, N]``, or ``out += a @ b`` with ``accumulate`` (cuBLAS's beta = 1: one
    launch where a GEMM and an add took two); fp32 (``tf32``: on the tensor cores, operands cut to TF32); a, b any
    strided views; ``out`` written in place when its rows are contiguous (any row stride: ``ldc``), else through a
    contiguous temporary."""
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return out
    if K == 0:
        if not accumulate:
            out[...] = 0
        return out
    if not tf32 and ROW_BLOCKS_MIN <= M <= 5 * ROW_BLOCKS and K * N <= ROW_BLOCKS_WEIGHT and out.flags.c_contiguous:
        return _row_blocks(a, b, out, accumulate)
    st = _handle(M, K, tf32)
    b, op_b, ld_b = _operand(b, K, N)
    a, op_a, ld_a = _operand(a, M, K)
    ld_c = out.strides[0] // 4
    if out.strides[1] == 4 and out.strides[0] % 4 == 0 and (ld_c >= N or M == 1):   # rows contiguous: in place
        target, ld_c = out, max(ld_c, N)
    elif accumulate:
        raise ValueError(f"out: accumulate=True adds in place, expected contiguous rows, got strides "
                         f"{tuple(out.strides)}")
    else:
        target, ld_c = backend.cp.empty((M, N), np.float32), N
    beta = st["one"] if accumulate else st["zero"]
    _check(st["lib"].cublasSgemm_v2(st["handle"], op_b, op_a, N, M, K, ctypes.byref(st["one"]), b.data.ptr, ld_b,
                                    a.data.ptr, ld_a, ctypes.byref(beta), target.data.ptr, ld_c), "cublasSgemm")
    if target is not out:
        out[...] = target
    return out


def _block_layout(M: int, overlap: bool, limit: int = 0) -> tuple:
    """``(nb, m, s)``: nb blocks of m <= limit rows (0: ROW_BLOCKS), block i at rows i s .. i s + m - 1, so that
    they cover rows 0 .. M - 1. Equal disjoint blocks where they fit (s = m; nb = ceil(M / limit), m = ceil(M / nb)
    when m divides M). Else, with ``overlap``, blocks at stride s = M // nb that overlap by M mod nb rows ((nb - 1)
    s + m = M; nb grows until m <= limit). Else the disjoint blocks of m rows that fit (M // m of them): the caller
    multiplies the M - nb m rows left in a second call.
    Examples: 33 -> (3, 11, 11); 37 -> (3, 13, 12): rows 0-12, 12-24, 24-36; 17 -> (2, 9, 8); without overlap
    37 -> (2, 13, 13) and a second call for rows 26-36; limit 8: 33 -> (6, 8, 5) (overlapping), limit 1: (33, 1,
    1)."""
    limit = limit or ROW_BLOCKS
    nb = -(-M // limit)
    m = -(-M // nb)
    if M % m == 0 or not overlap:
        return M // m, m, m
    while M - (nb - 1) * (M // nb) > limit:
        nb += 1
    s = M // nb
    return nb, M - (nb - 1) * s, s


def _row_blocks(a, b, out, accumulate: bool, limit: int = 0):
    """``gemm`` of M rows as one strided batched call over row blocks of <= ROW_BLOCKS rows (``_block_layout``;
    the weight's batch stride 0): 33 = 3 x 11, 65 = 5 x 13 rows (a DDTree-32 / -64 verify), 37 = three blocks of
    13 at rows 0, 12 and 24. Why: cuBLAS answers <= 16 rows with its GEMV-like gemmSN kernel and 17+
    rows with split-K kernels and a reduce, ~2x slower in a graph (ncu). Alone the blocks win only the K = 768
    product at 33 rows (12.7 -> 10.1 us; the LM head 256 -> 4096 loses, 13.3 -> 15.8), yet in the round they
    made DDTree-32 0.7-1.1 % and DDTree-64 0.8 % faster in two A/B runs (H100; blocks for K >= 512 only: no gain),
    so they are on (docs/PERFORMANCE.md, thirtieth session). From 17 rows, not 33, since the thirty-second session:
    at 32 rows cuBLAS's own pick for the dense down (K = 768) was an 8-block kernel of 27.4 us against 7.2 for two
    16-row blocks (ncu, H100), and DDTree-31 ran 2.8 % faster with the blocks, DDTree-16 1.8 %. Only for weights
    that L2 holds: every block reads the weight again. ``out`` C-contiguous.
    Overlapping blocks (fortieth session): an overlapped row is written by two blocks with the same bits (cuBLAS's
    per-row result does not depend on the row's place in its block: tests/kernels/test_gemm_cublas.py), and one
    call replaces the second call for the rows left, which cost 1-6.6 us a product (H100, graph replays; budgets
    36 and 40 ran slower than 32 and 44 for it). ``accumulate`` (out += ..) would add an overlapped row twice: it
    keeps disjoint blocks and the second call. ``limit``: blocks of at most that many rows (0: ROW_BLOCKS;
    kernels/gemm_choice.py times 8 and 1 as well)."""
    M = a.shape[0]
    nb, m, s = _block_layout(M, ROW_BLOCKS_OVERLAP and not accumulate, limit)
    _strided_blocks(a, b, out, accumulate, nb, m, s)
    done = (nb - 1) * s + m
    if done < M:
        gemm(a[done:], b, out[done:], accumulate)
    return out


def _strided_blocks(a, b, out, accumulate: bool, nb: int, m: int, s: int) -> None:
    """One strided batched call: rows i s .. i s + m - 1 of ``out`` (=, or += with ``accumulate``) ``a``'s same
    rows @ ``b``, for i < nb (the weight's batch stride 0)."""
    M, K = a.shape
    N = b.shape[1]
    st = _handle(m, K)
    b, op_b, ld_b = _operand(b, K, N)
    a, op_a, ld_a = _operand(a, M, K)
    row = a.strides[0] // 4 if op_a == _OP_N else 1              # element stride between a's rows
    beta = st["one"] if accumulate else st["zero"]
    _check(st["lib"].cublasSgemmStridedBatched(
        st["handle"], op_b, op_a, N, m, K, ctypes.byref(st["one"]), b.data.ptr, ld_b, 0, a.data.ptr, ld_a, s * row,
        ctypes.byref(beta), out.data.ptr, N, s * N, nb), "cublasSgemmStridedBatched")


def gemm_batched(a, b, out):
    """``out [B, M, N] = a [B, M, K] @ b [B, K, N]`` per batch (strided views allowed for all three; ``out`` is
    written in place when its rows are contiguous - e.g. a head-major view of a token-major buffer - else through
    a contiguous temporary)."""
    Bn, M, K = a.shape
    N = b.shape[2]
    if Bn == 0 or M == 0 or N == 0:
        return out
    if K == 0:
        out[...] = 0
        return out
    st = _handle(M, K)
    b, op_b, ld_b = _operand(b, K, N)
    a, op_a, ld_a = _operand(a, M, K)
    sb, sm, sn = (s // 4 for s in out.strides)
    in_place = all(s % 4 == 0 for s in out.strides) and sn == 1 and (sm >= N or M == 1) and sb > 0
    target = out if in_place else backend.cp.empty((Bn, M, N), np.float32)
    ld_c, stride_c = (max(sm, N), sb) if in_place else (N, M * N)
    _check(st["lib"].cublasSgemmStridedBatched(
        st["handle"], op_b, op_a, N, M, K, ctypes.byref(st["one"]), b.data.ptr, ld_b, b.strides[0] // 4,
        a.data.ptr, ld_a, a.strides[0] // 4, ctypes.byref(st["zero"]), target.data.ptr, ld_c, stride_c, Bn),
        "cublasSgemmStridedBatched")
    if target is not out:
        out[...] = target
    return out
