"""The DFlash drafter's per-head norm + RoPE in one launch: the k/v cache write, the query, or both at once.

    k[t, g] = NeoX RoPE over all D of  kv[t, gD : gD + D] / sqrt(mean(kv[t, gD : gD + D]**2) + eps) * w
    v[t, g] = kv[t, Nkv D + gD : Nkv D + gD + D]
    k_cache[start + t, g] = k[t, g];   v_cache[start + t, g] = v[t, g]          t < T, kv head g < Nkv
    q[t, h] = NeoX RoPE over all D of  y[t, hD : hD + D] / sqrt(mean(y[t, hD : hD + D]**2) + eps) * w_q   (h < Nq)

(Qwen3's per-head ``k_norm`` / ``q_norm``, then RoPE at positions[t]: kernels/rmsnorm.py's and kernels/rope.py's
formulas.) The drafter did this with two projections, RMSNorm, RoPE and two scatters into the cache rows per
layer, twice a DDTree round (the newly committed context rows, then the block), and RMSNorm + RoPE for the
block's query; on the default pair every launch costs ~2.5 us of device time whatever its work. The block's
q, k and v come from one GEMM over the fused ``[q; k; v]`` weight, so ``kv`` and ``y`` may be column views of it.

One kernel (``_norm_rope_kernel``) serves ``write_draft_kv`` (the observed context rows: kv heads only),
``draft_query`` (query heads only) and ``draft_qkv`` (the draft block: its query heads and its kv heads from the
one fused product, in one launch - the block had a query launch and a cache launch per layer).
Mapping: grid (token t, head: query heads first, then kv heads); a block of P threads, P the power of two >= D/2
(on the GPU at least 32: a whole warp). Thread j < D/2 owns the rope pair (j, j + D/2) (``_norm_rope_pair``):
it loads both values, their squares go through a block tree sum (primitives.smem_sum), then it scales and rotates
them; a kv head's block stores k and copies the same two columns of v, a query head's block stores q. ``start`` is an
int or a device int32 [1] (graph replay: the kernel reads it); rows at or past the cache's end are not written.
``positions=None``: token t sits at position start + t (the drafter's rows always do), computed by the kernel -
a captured round then launches no ``start + arange`` first (an empty positions array tells the kernel so).
``norm_rows=(x [T, H], eps)``: y is the product of raw rows x with an RMSNorm weight folded into the projection
(rmsnorm.folded_norm; the drafter's input_layernorm and hidden_norm), so every block first scales its values by
r = 1 / sqrt(mean(x[t]**2) + eps) (rmsnorm.row_inv_rms: the block sums x[t]'s squares) - the norm's launch saved.
Shapes: kv [T, 2 Nkv D] float32 (k heads, then v heads; strided rows allowed), w [D], positions [T] int or None,
inv_freq [D/2] float32, k_cache / v_cache [C, Nkv, D] float32 (one layer's rows; written in place);
y [T, Nq D] (strided rows allowed) -> q [T, Nq, D]; draft_qkv's y [T, (Nq + 2 Nkv) D]. D even, D <= 256.
Example: Nkv 1, D 2, w [1, 1], eps 0, kv [[3, 4, 5, 6]], position pi/2 (inv_freq [1]), start 0: k = [3, 4] scaled by
1 / sqrt(12.5) = [0.8485, 1.1314], turned by 90 degrees -> k_cache[0, 0] = [-1.1314, 0.8485]; v_cache[0, 0] = [5, 6].
(The query of y = [[3, 4]] with the same w and position is the same [-1.1314, 0.8485].)
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from .. import backend
from . import _checks
from .primitives import smem_sum
from .rmsnorm import norm_rows_args, rmsnorm_ref, row_inv_rms, scale_rows_ref
from .rope import cos_sin, rope_ref, rotate

MAX_HALF = 128      # rope pairs per head (D <= 256, block_attention's MAX_D); also the reduction buffer


def draft_kv_ref(kv, w, eps: float, positions, inv_freq, amp: float = 1.0):
    """(k [T, Nkv, D], v [T, Nkv, D]) in plain NumPy: per-head RMSNorm of k, then RoPE over the whole head."""
    kv = np.asarray(kv, np.float32)
    D = np.asarray(w).shape[0]
    T, n_kv = kv.shape[0], kv.shape[1] // (2 * D)
    k = draft_query_ref(kv[:, :n_kv * D], w, eps, positions, inv_freq, amp)          # k is normed like a query
    return k, kv[:, n_kv * D:].reshape(T, n_kv, D).copy()


def draft_query_ref(y, w, eps: float, positions, inv_freq, amp: float = 1.0):
    """q [T, Nq, D] in plain NumPy: per-head RMSNorm of the query projection y [T, Nq D], then RoPE."""
    y = np.asarray(y, np.float32)
    D = np.asarray(w).shape[0]
    T, n_q = y.shape[0], y.shape[1] // D
    return rope_ref(rmsnorm_ref(y.reshape(T * n_q, D), w, eps).reshape(T, n_q, D), positions, inv_freq, amp)


@cuda.jit(device=True)
def _norm_rope_pair(x, t, col0, r, w, eps, position, inv_freq, amp, red):
    """Thread j's rope pair (j, j + D/2) of the head whose D columns start at x[t, col0], scaled by the row scale r,
    RMS-normalised by w and rotated; (0, 0) for threads j >= D/2. Every thread of the block calls it (block sum)."""
    j = cuda.threadIdx.x
    half = inv_freq.shape[0]
    a = float32(0.0)
    b = float32(0.0)
    if j < half:
        a = x[t, col0 + j] * r
        b = x[t, col0 + j + half] * r
    ssq = smem_sum(a * a + b * b, red)               # every thread calls (barriers)
    if j >= half:
        return float32(0.0), float32(0.0)
    inv = float32(1.0) / float32(math.sqrt(ssq / float32(2 * half) + eps))
    c, s = cos_sin(position, inv_freq[j], amp)
    return rotate(a * inv * w[j], b * inv * w[j + half], c, s)


@cuda.jit(device=True)
def _position(positions, t, start0, start_dev):
    """Token t's position: positions[t], or start + t when ``positions`` is empty (``positions=None``)."""
    return positions[t] if positions.shape[0] else start0 + start_dev[0] + t


@cuda.jit
def _norm_rope_kernel(y, q_w, k_w, eps, positions, inv_freq, amp, q, k_cache, v_cache, n_q, start0, start_dev,
                      norm_src, src_eps):
    """Block (t, h): h < n_q - query head h of y -> q[t, h] (``q_w``); else kv head g = h - n_q: k -> k_cache[row,
    g] (``k_w``), its v columns -> v_cache[row, g], row = start + t. y's columns: n_q query heads, then the kv
    heads' k, then their v (the fused product; n_q = 0: a [k; v] view). ``norm_src`` with rows: y[t] is first
    scaled by 1 / rms(norm_src[t]) (module docstring)."""
    t = cuda.blockIdx.x
    h = cuda.blockIdx.y
    j = cuda.threadIdx.x
    half = inv_freq.shape[0]
    D = 2 * half
    red = cuda.shared.array(MAX_HALF, float32)
    r = float32(1.0)                                 # no row scale: x * 1 is x, bit for bit
    if norm_src.shape[0]:                            # the whole grid takes the same branch (barriers inside)
        r = row_inv_rms(norm_src, t, src_eps, red)
    position = _position(positions, t, start0, start_dev)
    if h < n_q:                                      # the branch is the block's: _norm_rope_pair's barriers agree
        q0, q1 = _norm_rope_pair(y, t, h * D, r, q_w, eps, position, inv_freq, amp, red)
        if j < half:
            q[t, h, j] = q0
            q[t, h, j + half] = q1
        return
    g = h - n_q
    n_kv = k_cache.shape[1]
    k0, k1 = _norm_rope_pair(y, t, (n_q + g) * D, r, k_w, eps, position, inv_freq, amp, red)
    row = start0 + start_dev[0] + t
    if j >= half or row >= k_cache.shape[0]:
        return
    k_cache[row, g, j] = k0
    k_cache[row, g, j + half] = k1
    vc = (n_q + n_kv + g) * D
    v_cache[row, g, j] = y[t, vc + j] * r
    v_cache[row, g, j + half] = y[t, vc + j + half] * r


def _positions(positions, T: int, start):
    """(positions for the reference [T] host ints, what the kernel gets): a checked ``positions [T]``, or for None
    start + t (the kernel: an empty array, it adds start itself)."""
    if positions is not None:
        positions = _checks.array(positions, "positions", kinds="iu", shape=(T,))
        return positions, positions
    host = None
    if backend.name == "numpy":
        host = np.arange(T, dtype=np.int64) + _checks.host_int(start)
    return host, backend.placeholder((0,), np.int32)


def _unused():
    """The [1, 1, 2] float32 stand-in for the outputs a launch does not write (q, or the caches)."""
    return backend.placeholder((1, 1, 2))


def _launch(y, q_w, k_w, eps, positions, inv_freq, amp, q, k_cache, v_cache, n_q, n_kv, start0, start_dev,
            src, src_eps):
    """One ``_norm_rope_kernel`` launch over T x (n_q + n_kv) blocks of P threads, P the power of two >= D/2;
    (src, src_eps): ``norm_rows_args``'s."""
    T, half = y.shape[0], inv_freq.shape[0]
    if T == 0 or n_q + n_kv == 0:
        return
    threads = 1
    while threads < half:
        threads *= 2
    backend.launch(_norm_rope_kernel, (T, n_q + n_kv), backend.block_size(max(threads, 32), threads), y, q_w, k_w,
                   np.float32(eps), positions, inv_freq, np.float32(amp), q, k_cache, v_cache, n_q, start0, start_dev,
                   src, np.float32(src_eps))


def _head_args(w, eps, inv_freq, amp, D=None, arg="w"):
    """The per-head norm weight [D] (D even, <= 2 MAX_HALF), eps, inv_freq [D/2], amp, checked."""
    w = _checks.array(w, arg, dtype=np.float32, ndim=1, shape=None if D is None else (D,))
    D = w.shape[0]
    if D % 2 or D // 2 > MAX_HALF:
        raise ValueError(f"{arg}: head dim {D}; expected an even number <= {2 * MAX_HALF}")
    return (w, _checks.real(eps, "eps", lo=0.0), _checks.array(inv_freq, "inv_freq", dtype=np.float32,
            shape=(D // 2,)), _checks.real(amp, "amp", lo=0.0, lo_open=True))


def _cache_args(k_cache, v_cache):
    """(k_cache, v_cache [C, Nkv, D]) checked: float32, the same shape, D even and <= 2 MAX_HALF."""
    k_cache = _checks.array(k_cache, "k_cache", dtype=np.float32, ndim=3)
    C, n_kv, D = k_cache.shape
    v_cache = _checks.array(v_cache, "v_cache", dtype=np.float32, shape=(C, n_kv, D))
    if D % 2 or D // 2 > MAX_HALF:
        raise ValueError(f"k_cache: head dim {D}; expected an even number <= {2 * MAX_HALF}")
    return k_cache, v_cache


def _rows_start(start, T: int, C: int) -> tuple:
    """device_int(start), a host start checked: rows start .. start + T - 1 within the C cache rows."""
    start0, start_dev = _checks.device_int(start, "start")
    if not hasattr(start, "shape") and start0 + T > C:
        raise ValueError(f"start: rows {start0}..{start0 + T - 1} exceed the cache's {C} rows")
    return start0, start_dev


def _write_kv_ref(kv, w, eps, host_positions, inv_freq, amp, k_cache, v_cache, start) -> None:
    """The NumPy backend's cache write (rows past the cache dropped, as the kernel drops them)."""
    s, C = _checks.host_int(start), k_cache.shape[0]
    k, v = draft_kv_ref(kv, w, eps, host_positions, inv_freq, amp)                  # [T, Nkv, D] each
    keep = min(kv.shape[0], C - s)
    k_cache[s:s + keep] = k[:keep]
    v_cache[s:s + keep] = v[:keep]


def write_draft_kv(kv, w, eps: float, positions, inv_freq, amp: float, k_cache, v_cache, start,
                   norm_rows=None) -> None:
    """Write the k/v rows of ``kv [T, 2 Nkv D]`` (k heads, then v heads: the fused projection) into rows
    ``start .. start + T - 1`` of ``k_cache`` / ``v_cache [C, Nkv, D]``: k per-head RMS-normalised by ``w [D]`` and
    RoPE'd at ``positions`` (None: start + t), v as it is. ``start``: an int (checked against C) or a device int32
    [1] array read by the kernel (graph replay; rows past C are dropped there, unchecked). ``norm_rows=(x [T, H],
    eps)``: kv is a product of x with an RMSNorm weight folded into the projection, so each row is first scaled by
    1 / rms(x[t]) (module docstring)."""
    k_cache, v_cache = _cache_args(k_cache, v_cache)
    C, n_kv, D = k_cache.shape
    kv = _checks.array(kv, "kv", dtype=np.float32, ndim=2, shape=(None, 2 * n_kv * D), strided=True)
    T = kv.shape[0]
    w, eps, inv_freq, amp = _head_args(w, eps, inv_freq, amp, D)
    start0, start_dev = _rows_start(start, T, C)
    host_positions, positions = _positions(positions, T, start)
    src, src_eps = norm_rows_args(norm_rows, T)
    if T and backend.name == "numpy":
        _write_kv_ref(scale_rows_ref(kv, norm_rows, src, src_eps), w, eps, host_positions, inv_freq, amp, k_cache,
                      v_cache, start)
        return
    _launch(kv, w, w, eps, positions, inv_freq, amp, _unused(), k_cache, v_cache, 0, n_kv, start0, start_dev, src,
            src_eps)


def draft_query(y, w, eps: float, positions, inv_freq, amp: float, out=None, start=0, norm_rows=None):
    """The block's query ``q [T, Nq, D]`` from its projection ``y [T, Nq D]`` (a column view of the fused
    ``[q; k; v]`` product is fine): per-head RMSNorm by ``w [D]`` (``q_norm``), then RoPE at ``positions``, or for
    ``positions=None`` at start + t (``start``: an int or a device int32 [1] array the kernel reads);
    ``norm_rows``: as ``write_draft_kv``'s."""
    w, eps, inv_freq, amp = _head_args(w, eps, inv_freq, amp)
    D = w.shape[0]
    y = _checks.array(y, "y", dtype=np.float32, ndim=2, strided=True)
    T, cols = y.shape
    if cols % D:
        raise ValueError(f"y: expected a multiple of the head dim {D} columns, got shape {tuple(y.shape)}")
    out = _checks.out_array(out, "out", (T, cols // D, D), np.float32)
    start0, start_dev = _checks.device_int(start, "start")
    host_positions, positions = _positions(positions, T, start)
    src, src_eps = norm_rows_args(norm_rows, T)
    if backend.name == "numpy":
        out[...] = draft_query_ref(scale_rows_ref(y, norm_rows, src, src_eps), w, eps, host_positions, inv_freq, amp)
        return out
    _launch(y, w, w, eps, positions, inv_freq, amp, out, _unused(), _unused(), cols // D, 0, start0, start_dev, src,
            src_eps)
    return out


def draft_qkv(y, q_w, k_w, eps: float, positions, inv_freq, amp: float, k_cache, v_cache, start, out=None,
              norm_rows=None):
    """``draft_query`` and ``write_draft_kv`` of one fused product in one launch: ``y [T, (Nq + 2 Nkv) D]`` (query
    heads, then the kv heads' k, then their v), Nkv = k_cache's heads; q by ``q_w``, k by ``k_w``, both RoPE'd at
    ``positions`` (None: start + t); the k/v rows into ``start ..`` of the caches; ``norm_rows``: as
    ``write_draft_kv``'s. Returns q [T, Nq, D].
    Example: the default drafter's block, y [16, 512] (8 query heads + 2 x 4 kv heads of 32): 16 x 12 blocks."""
    k_cache, v_cache = _cache_args(k_cache, v_cache)
    C, n_kv, D = k_cache.shape
    q_w, eps, inv_freq, amp = _head_args(q_w, eps, inv_freq, amp, D, "q_w")
    k_w = _head_args(k_w, eps, inv_freq, amp, D, "k_w")[0]
    y = _checks.array(y, "y", dtype=np.float32, ndim=2, strided=True)
    T, cols = y.shape
    n_q = cols // D - 2 * n_kv
    if cols % D or n_q < 1:
        raise ValueError(f"y: expected (Nq + {2 * n_kv}) x {D} columns (query heads, then k and v of the cache's "
                         f"{n_kv} heads), got shape {tuple(y.shape)}")
    out = _checks.out_array(out, "out", (T, n_q, D), np.float32)
    start0, start_dev = _rows_start(start, T, C)
    host_positions, positions = _positions(positions, T, start)
    src, src_eps = norm_rows_args(norm_rows, T)
    if backend.name == "numpy":
        y = scale_rows_ref(y, norm_rows, src, src_eps)
        out[...] = draft_query_ref(y[:, :n_q * D], q_w, eps, host_positions, inv_freq, amp)
        if T:
            _write_kv_ref(y[:, n_q * D:], k_w, eps, host_positions, inv_freq, amp, k_cache, v_cache, start)
        return out
    _launch(y, q_w, k_w, eps, positions, inv_freq, amp, out, k_cache, v_cache, n_q, n_kv, start0, start_dev, src,
            src_eps)
    return out
