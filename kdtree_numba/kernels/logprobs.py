"""Draft log-probabilities: the top K of every row of draft logits, as log-probs, sorted.

    lse = max + log(sum(exp(x - max)))        (fp32, like torch.log_softmax on fp32)
    ids[r] = the r-th largest logit's token (equal logits: lower token id first),  lp[r] = x[ids[r]] - lse
One row per depth of a request; draft logits are never divided by the temperature. A row holding NaN or +inf, or
no finite value, raises on the host backends (``check_rows``); on the GPU (no host check, no sync) a NaN / +inf
row comes back as -1 ids and NaN log-probs.
Mapping: two algorithms, chosen by the row length (``topk_logprobs`` dispatches):
  one block per row - ``kernels/topk_block.py``: a fold, a histogram threshold, one collecting pass and a sort;
  split rows, V >= 2 x SPLIT_CHUNK (draft vocabularies) - ``kernels/topk_split.py``: a request has too few rows to
  fill the GPU with one block each, so every row is spread over ceil(V / SPLIT_CHUNK) blocks (a streaming scan
  launch, then a select launch per row; the logits are read once).
Both order elements by one packed unsigned key and bound the k-th largest with a histogram of the threads' tops
(``kernels/topk_common.py``). How the kernels got to their form, measured: docs/PERFORMANCE.md ("Top-K: how the
kernels got here"). The token choice at the target's logits is ``kernels/sampling.py``.
Shapes: logits [R, V] float32 (rows = requests x depths), K <= 1024 -> lp [R, K] float32, ids [R, K] int32.
Example: logits [[0, 2, 2, -1]], K 3 -> ids [[1, 2, 0]], lp = [2, 2, 0] - log(1 + 2 e^2 + e^-1)
"""
from __future__ import annotations

import numpy as np

from .. import backend
from . import _checks
from .topk_block import _launch_block
from .topk_split import SPLIT_CHUNK, _launch_split

MAX_K = 1024               # the largest k


# ------------------------------------------------------------------------------------------------ references
def topk_logprobs_ref(logits, k: int):
    """Plain NumPy: (lp [R, K] float32, ids [R, K] int32), ids sorted by (logit desc, id asc)."""
    x = np.asarray(logits, np.float32)
    m = x.max(axis=-1, keepdims=True)
    lse = m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True, dtype=np.float32))     # [R, 1]
    ids = np.argsort(-x, axis=-1, kind="stable")[..., :k].astype(np.int32)               # [R, K]
    lp = (np.take_along_axis(x, ids, axis=-1) - lse).astype(np.float32)
    return lp, ids


def topk_logprobs_host(logits, k: int):
    """``topk_logprobs_ref``'s result, faster on the host (the NumPy backend's path): a partition finds the k-th
    largest logit t of each row, the row's k winners are the logits > t and then the lowest ids among those == t,
    and only they are sorted - k log k per row, not V log V (15 x 4096 logits, k 64: 0.6 against 4.0 ms on one
    core; the CPU demo's DDTree round spent 4 of its 27 ms in the full sort)."""
    x = np.asarray(logits, np.float32)
    R, V = x.shape
    if k >= V:
        return topk_logprobs_ref(x, k)
    m = x.max(axis=-1, keepdims=True)
    lse = m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True, dtype=np.float32))     # [R, 1]
    kth = -np.partition(-x, k - 1, axis=-1)[:, k - 1]                                    # [R] k-th largest
    ids = np.empty((R, k), np.int32)                                                      # [R, K]
    for r in range(R):
        row = x[r]
        above = np.flatnonzero(row > kth[r])
        sel = np.concatenate([above, np.flatnonzero(row == kth[r])[:k - above.size]])     # [K] the winners
        ids[r] = sel[np.lexsort((sel, -row[sel]))]                                        # logit desc, id asc
    lp = (np.take_along_axis(x, ids, axis=-1) - lse).astype(np.float32)
    return lp, ids


# ------------------------------------------------------------------------------------------------ host checks
def check_rows(x: np.ndarray, arg: str) -> None:
    """ValueError naming the first row with a NaN or +inf, or without any finite value."""
    for bad, what in ((np.isnan(x).any(axis=1), "NaN"), ((x == np.inf).any(axis=1), "+inf")):
        if bad.any():
            raise ValueError(f"{arg}: row {int(np.flatnonzero(bad)[0])} contains {what}")
    empty = ~(x > -np.inf).any(axis=1)
    if empty.any():
        raise ValueError(f"{arg}: row {int(np.flatnonzero(empty)[0])} has no finite value (all -inf)")


# ------------------------------------------------------------------------------------------------ launchers
def topk_logprobs(logits, k: int, out=None, arg: str = "logits"):
    """Top-``k`` draft log-probs per row of ``logits [R, V]``: (lp [R, k] float32, ids [R, k] int32) sorted by
    (logit desc, id asc). A row containing NaN raises (host check on host backends, its error naming ``arg``;
    -1 ids on the GPU)."""
    x = _checks.array(logits, "logits", dtype=np.float32, ndim=2)
    R, V = x.shape
    k = _checks.integer(k, "k", lo=1, hi=min(V, MAX_K))
    if out is None:
        lp, ids = backend.empty((R, k), np.float32), backend.empty((R, k), np.int32)
    else:
        lp = _checks.out_array(out[0], "out[0]", (R, k), np.float32)
        ids = _checks.out_array(out[1], "out[1]", (R, k), np.int32)
    if backend.name != "cuda" and R:
        check_rows(np.asarray(x), arg)
    if backend.name == "numpy":
        lp[...], ids[...] = topk_logprobs_host(x, k)
        return lp, ids
    if R:
        if V >= 2 * SPLIT_CHUNK:
            _launch_split(x, k, lp, ids, SPLIT_CHUNK)
        else:
            _launch_block(x, k, lp, ids)
    return lp, ids
