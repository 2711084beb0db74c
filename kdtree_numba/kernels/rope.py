"""NeoX RoPE ("rotate half") with an explicit position per token, and the load-time permutation of interleaved
(GPT-J) rope rows into NeoX order. The inverse frequencies (plain and YaRN) are computed in rope_frequencies.py.

    angle[t, i] = pos[t] * inv_freq[i]                        i < R/2, float32 as HF computes it
    y[t, h, i]       = amp * (x[t, h, i] * cos - x[t, h, i + R/2] * sin)
    y[t, h, i + R/2] = amp * (x[t, h, i + R/2] * cos + x[t, h, i] * sin)

Tree nodes share positions (siblings sit at ``start + depth``), so positions are an input array, never ``arange``.
``amp`` is YaRN's cos/sin amplitude (1.0 for DeepSeek and Kimi, whose mscale == mscale_all_dim).

Mapping: one block per token; thread j owns pair i = j mod R/2 (its cos/sin computed once) and heads
h = j div (R/2), stepping by threads / (R/2) - no division in the loop, two heads (four loads) per step. Each
thread reads its inputs before writing its outputs, so ``out`` may be ``x`` itself (in place). (A thread per
(token, head, pair) with 64-bit index division reached 20 % of the copy bandwidth.)
Shapes: x [T, N, R] float32, positions [T] int32/int64, inv_freq [R/2] float32 -> y [T, N, R] float32.
Example: R = 2, inv_freq = [1], pos = [pi/2]: x = [1, 0] -> [cos, sin] = [0, 1] (rotated by 90 degrees).

DeepSeek/Kimi checkpoints store rope dims as interleaved pairs (x0, x1), (x2, x3), ...; permuting those rows once
at load to [0, 2, 4, .., R-2, 1, 3, .., R-1] makes NeoX on the permuted layout equal GPT-J on the raw layout.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from .. import backend
from ..rope_frequencies import rope_inv_freq, yarn_inv_freq, yarn_mscale  # noqa: F401  (rope.* for callers)
from . import _checks


# ------------------------------------------------------------------------------------------- row permutation
def neox_order(rope_dim: int) -> np.ndarray:
    """[0, 2, 4, .., R-2, 1, 3, .., R-1]: interleaved pair layout -> NeoX half layout."""
    if rope_dim <= 0 or rope_dim % 2:
        raise ValueError(f"rope_dim: expected a positive even number, got {rope_dim}")
    return np.concatenate([np.arange(0, rope_dim, 2), np.arange(1, rope_dim, 2)])


def permute_rope_rows(weight: np.ndarray, starts, rope_dim: int, inverse: bool = False) -> np.ndarray:
    """Copy of ``weight`` whose rows ``[s, s + R)`` for every s in ``starts`` are put in NeoX order
    (``inverse=True`` undoes it, for saving in the checkpoint's raw interleaved order)."""
    order = neox_order(rope_dim)
    if inverse:
        order = np.argsort(order)
    out = np.array(weight, copy=True)
    for s in starts:
        if s < 0 or s + rope_dim > weight.shape[0]:
            raise ValueError(f"starts: rope rows [{s}, {s + rope_dim}) outside a weight of {weight.shape[0]} rows")
        out[s:s + rope_dim] = weight[s:s + rope_dim][order]
    return out


# ------------------------------------------------------------------------------------------- references
def _angles(positions, inv_freq):
    return np.asarray(positions).astype(np.float32)[:, None] * np.asarray(inv_freq, np.float32)[None, :]  # [T, R/2]


def rope_ref(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, amp: float = 1.0) -> np.ndarray:
    """NeoX rotate-half RoPE in plain NumPy (float32)."""
    ang = _angles(positions, inv_freq)
    cos = (np.cos(ang) * np.float32(amp)).astype(np.float32)[:, None, :]    # [T, 1, R/2]
    sin = (np.sin(ang) * np.float32(amp)).astype(np.float32)[:, None, :]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(np.float32)


def rope_gptj_ref(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, amp: float = 1.0) -> np.ndarray:
    """GPT-J RoPE: rotate interleaved pairs (x[2i], x[2i+1]) in place - the layout checkpoints store."""
    ang = _angles(positions, inv_freq)
    cos = (np.cos(ang) * np.float32(amp)).astype(np.float32)[:, None, :]
    sin = (np.sin(ang) * np.float32(amp)).astype(np.float32)[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    out[..., 1::2] = x[..., 1::2] * cos + x[..., 0::2] * sin
    return out


# ------------------------------------------------------------------------------------------- kernel
@cuda.jit(device=True)
def cos_sin(position, inv_freq_i, amp):
    """(amp cos, amp sin) of the angle position * inv_freq_i in float32: every RoPE kernel's (rope, mla_latent,
    draft_kv), so their rotations agree bit for bit."""
    ang = float32(position) * inv_freq_i
    return float32(math.cos(ang)) * amp, float32(math.sin(ang)) * amp


@cuda.jit(device=True)
def rotate(a1, a2, c, s):
    """The pair (x[i], x[i + R/2]) turned by the angle of (c, s): (a1 c - a2 s, a2 c + a1 s)."""
    return a1 * c - a2 * s, a2 * c + a1 * s


@cuda.jit
def _rope_kernel(x, positions, inv_freq, amp, out, base0, base_dev):
    t = cuda.blockIdx.x
    half = inv_freq.shape[0]
    n_heads = x.shape[1]
    i = cuda.threadIdx.x % half             # this thread's pair within the rope dims
    h = cuda.threadIdx.x // half            # its first head
    step = cuda.blockDim.x // half
    c, s = cos_sin(base0 + base_dev[0] + positions[t], inv_freq[i], amp)
    while h + step < n_heads:
        a1 = x[t, h, i]
        a2 = x[t, h, i + half]
        b1 = x[t, h + step, i]
        b2 = x[t, h + step, i + half]
        out[t, h, i], out[t, h, i + half] = rotate(a1, a2, c, s)
        out[t, h + step, i], out[t, h + step, i + half] = rotate(b1, b2, c, s)
        h += 2 * step
    if h < n_heads:
        a1 = x[t, h, i]
        a2 = x[t, h, i + half]
        out[t, h, i], out[t, h, i + half] = rotate(a1, a2, c, s)


def apply_rope(x, positions, inv_freq, amp: float = 1.0, out=None, base=0):
    """NeoX RoPE of ``x [T, N, R]`` at ``base + positions [T]``; ``out`` may be ``x`` (in place). Both may be
    strided views (e.g. the rope columns of q, written into the rope columns of the absorbed query: no copies).
    ``base``: an int or a device int32 [1] array the kernel adds (a tree verify's start + depth: no add launch)."""
    x = _checks.array(x, "x", dtype=np.float32, ndim=3, strided=True)
    T, N, R = x.shape
    if R % 2:
        raise ValueError(f"x: expected an even rope dim (last axis), got shape {tuple(x.shape)}")
    positions = _checks.array(positions, "positions", kinds="iu", shape=(T,))
    inv_freq = _checks.array(inv_freq, "inv_freq", dtype=np.float32, shape=(R // 2,))
    amp = _checks.real(amp, "amp", lo=0.0, lo_open=True)
    out = _checks.out_array(out, "out", x.shape, np.float32, strided=True)
    base0, base_dev = _checks.device_int(base, "base")
    if backend.name == "numpy":
        out[...] = rope_ref(x, np.asarray(positions, np.int64) + _checks.host_int(base), inv_freq, amp)
        return out
    half = R // 2
    if T * N * half == 0:
        return out
    if half > 1024:
        raise ValueError(f"x: rope dim {R} exceeds the kernel's 2048")
    threads = half * max(1, min(N, backend.block_size(256, 32) // half))   # a multiple of R/2
    backend.launch(_rope_kernel, T, threads, x, positions, inv_freq, np.float32(amp), out, base0, base_dev)
    return out
