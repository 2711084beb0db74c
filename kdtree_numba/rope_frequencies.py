"""RoPE inverse frequencies, plain and YaRN, in NumPy: what a config's rope settings mean, computed once at load.

    plain: inv_freq[i] = base ** (-2i / dim)                       i < dim / 2, float32 as HF computes it
    YaRN:  a ramp between extrapolated (base) and interpolated (base / factor) frequencies, plus the amplitude
           m(scale) = 0.1 * mscale * ln(scale) + 1
Here, not in the rope kernel module, so that the config (which turns rope settings into frequencies) needs no
kernel module; ``kernels/rope.py`` uses them under the same names.
Example: rope_inv_freq(4, 10000.0) -> [1.0, 0.01].
"""
from __future__ import annotations

import math

import numpy as np


def rope_inv_freq(dim: int, base: float) -> np.ndarray:
    """Plain RoPE: inv_freq[i] = base ** (-2i / dim), float32 like HF."""
    exps = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)          # [dim/2]
    return (np.float32(1.0) / (np.float32(base) ** exps)).astype(np.float32)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's m(scale) = 0.1 * mscale * ln(scale) + 1 (1 when scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(dim: int, base: float, factor: float, original_max_position: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0, truncate: bool = True) -> np.ndarray:
    """YaRN inverse frequencies: a ramp between extrapolated (base) and interpolated (base / factor) frequencies.

    corr(r) = dim * ln(orig / (2 pi r)) / (2 ln base); low = max(floor(corr(beta_fast)), 0);
    high = min(ceil(corr(beta_slow)), dim - 1); ramp[i] = clamp((i - low) / (high - low), 0, 1);
    inv_freq = inv_inter * ramp + inv_extra * (1 - ramp).
    """
    pos_freqs = np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))   # [dim/2]
    inv_extra = np.float32(1.0) / pos_freqs
    inv_inter = np.float32(1.0) / (np.float32(factor) * pos_freqs)

    def corr(rot):
        return dim * math.log(original_max_position / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr(beta_fast), corr(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extra_weight = np.float32(1.0) - ramp
    return (inv_inter * (np.float32(1.0) - extra_weight) + inv_extra * extra_weight).astype(np.float32)
