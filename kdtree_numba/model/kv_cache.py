"""The latent KV cache: one preallocated buffer ``[layers, capacity, Lkv + R]`` (capacity fixed at creation).

Row s of layer l is token s's ``[normed c_kv ; roped k_rot]`` - 576 floats per token and layer for Kimi, shared by
all heads. One buffer for all layers lets DDTree's compaction move the accepted rows of every layer in one launch.
``length`` counts the committed rows; rows past it are scratch (a prefill chunk or a verify tree is written there
before its attention runs, by kernels/mla_latent.py's ``write_latent`` straight from the kv_a projection).
"""
from __future__ import annotations

import numpy as np

from .. import backend
from ..kernels import _checks, kv_compaction


class LatentCache:
    def __init__(self, n_layers: int, capacity: int, width: int):
        self.n_layers = _checks.integer(n_layers, "n_layers", lo=1)
        self.capacity = _checks.integer(capacity, "capacity", lo=1)
        self.width = _checks.integer(width, "width", lo=1)
        self.data = backend.zeros((n_layers, capacity, width), np.float32)   # [layers, capacity, Lkv + R]
        self.length = 0

    def layer(self, i: int):
        """Layer i's rows ``[capacity, width]`` (a contiguous view)."""
        return self.data[i]

    def compact(self, start: int, accepted, n_accepted=None, gather=None) -> None:
        """DDTree commit: the accepted tree rows ``start + accepted[j]`` (ascending) move to ``start + j`` in every
        layer; the committed length becomes ``start + len(accepted)`` (see kernels/kv_compaction.py, which also
        takes ``gather = (src, dst)``: the accepted rows of another array copied in the same launch)."""
        kv_compaction.compact(self.data, start, accepted, n_accepted, gather)
