"""The prompt's forward captured once per length bucket and replayed: a replayed generation's prefill costs its
kernels' device time, not numba's host launches (a direct prefill of the default pair took ~12.6 ms on the
H200, a fifth of a replayed 128-token DDTree-64 generation: docs/PERFORMANCE.md, eleventh session).

A CUDA graph replays fixed shapes, so the prompt is padded to its *bucket*, a power of two:

    Tb = bucket(target, n) = max(PREFILL_MIN, 2^ceil(log2 n))       rows the captured forward runs
    ids  [Tb]  int32    the prompt, then PAD (token 0) up to Tb
    last [1]   int32    n - 1: the one row whose logits are computed (the target reads it on the device)
                        (ids and last: views of one array, written by one host-to-device copy a prefill)

    logits [1, V], hiddens = target.forward(ids, cache, 0, hidden_layers, logits_at=last)
    then(logits, hiddens, last)  the program's follow-up (the first token, drawn at position last; the drafter's
                                 context), captured too

Why the padding changes nothing the decode reads: attention is causal, so prompt row t sees rows 0 .. t and never
a pad row, and every other stage works row by row (the MoE routes each pad row on its own: more rows in the
grouped GEMMs, no other result changed). The pad rows' cache rows n .. Tb - 1 hold garbage that nothing reads
before it is overwritten: a decode step at position p writes row p, then attends to rows 0 .. p; a tree verify
attends to rows 0 .. start - 1 and its own rows, written first; the drafter writes its block at rows
start .. start + B - 1 before it attends to the rows below start + B - as for a DDTree round's rejected rows.
The kept rows can differ from an unpadded prefill's in the last bits (a product of Tb rows may run another GEMM
kernel than one of n rows), like any two GEMM kernels; the tests hold the tokens equal to plain decoding's.

Used where one graph can hold the whole forward: Tb <= PREFILL_MAX and, for a MoE target, Tb x top-k expert rows
<= moe_grouped_gemm.CUBLAS_ROWS (above it the grouped GEMM reads the expert offsets on the host). Longer prompts
prefill directly, unpadded, as before. On cuda a bucket's first prefill runs directly (numba compiles, CuPy's
pool fills), then it is captured (capture.CapturedStep) and later prefills of that bucket replay the graph; on
the NumPy and simulator backends the same padded forward runs directly, so their tests test the padding. A
capture that fails (a host read in some stage would) is a RuntimeWarning, and that bucket then prefills directly:
the prefill is only an optimisation.
Example: a 109-token prompt -> Tb = 128: ids = the prompt + 19 x [0], last = [108]; the logits of row 108 pick
the first token, as the last row of a direct prefill does.
"""
from __future__ import annotations

import warnings

import numpy as np

from .. import backend
from ..kernels import moe_grouped_gemm
from .capture import CapturedStep

PREFILL_MIN = 8                          # the smallest bucket (shorter prompts share one graph)
PREFILL_MAX = 1024                       # the largest; longer prompts prefill directly


def bucket(target, n: int) -> int | None:
    """Rows of the padded prefill of an ``n``-token prompt, or None where the prompt prefills directly (module
    docstring). E.g. n = 109 -> 128; n = 5 -> 8; n = 2000 -> None."""
    rows = PREFILL_MIN
    while rows < n:
        rows *= 2
    cfg = target.config
    top_k = cfg.num_experts_per_tok if cfg.n_routed_experts > 0 else 0
    if rows > PREFILL_MAX or rows * top_k > moe_grouped_gemm.CUBLAS_ROWS:
        return None
    return rows


class _Bucket:
    """One bucket's device inputs and its forward (direct, or the replay of its graph once captured)."""

    def __init__(self, rows: int, forward):
        self.inputs = backend.zeros((rows + 1,), np.int32)                  # [Tb + 1]: ids, then last - one upload
        self.ids = self.inputs[:rows]                                       # [Tb] prompt + PAD
        self.last = self.inputs[rows:]                                      # [1] n - 1
        self.host = np.zeros(rows + 1, np.int32)                            # its host side
        self.forward = lambda: forward(self.ids, self.last)
        self.run = self.forward
        self.direct_only = False                                            # True once a capture failed


class Prefill:
    """A replay program's prefill: ``prefill(prompt)`` runs the target over the prompt into ``cache`` rows from 0
    and calls ``then(logits [1, V], hiddens, last)`` (``hiddens[k]`` of every row run, for k in
    ``hidden_layers``; ``last`` = n - 1, the logits row's position: an int, or a device int32 [1] in a graph),
    padded and captured per bucket where it can be (module docstring), directly otherwise. ``then`` must leave
    its results in the program's own device arrays: inside a graph, its Python side runs once, at the capture."""

    def __init__(self, target, cache, hidden_layers, then):
        self.target, self.cache, self.hidden_layers, self.then = target, cache, tuple(hidden_layers), then
        self.buckets: dict[int, _Bucket] = {}

    def __call__(self, prompt) -> None:
        prompt = np.asarray(prompt, np.int32)                               # [n]
        n = prompt.shape[0]
        rows = bucket(self.target, n)
        if rows is None or rows > self.cache.capacity:
            logits, hid = self.target.forward(prompt, self.cache, 0, hidden_layers=self.hidden_layers,
                                              check_ids=False, logits_to_keep=1)
            self.then(logits, hid, n - 1)
            return
        b = self.buckets.get(rows)
        if b is None:
            b = self.buckets[rows] = _Bucket(rows, self._padded)
        b.host[:n] = prompt                                                 # [Tb] PAD = token 0, then n - 1
        b.host[n:rows] = 0
        b.host[rows] = n - 1
        backend.upload(b.inputs, b.host)
        b.run()
        if b.run == b.forward and backend.name == "cuda" and not b.direct_only:
            try:
                b.run = CapturedStep(b.forward, f"the prefill of {rows} rows").replay
            except RuntimeError as e:                   # an optimisation only: the padded forward stays correct
                b.direct_only = True
                warnings.warn(f"{e}; this bucket's prefills run directly", RuntimeWarning, stacklevel=2)

    def _padded(self, ids, last) -> None:
        logits, hid = self.target.forward(ids, self.cache, 0, hidden_layers=self.hidden_layers, check_ids=False,
                                          logits_at=last)                  # [1, V]
        self.then(logits, hid, last)
