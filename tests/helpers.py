"""Small helpers shared by the tests."""
import numpy as np

import kdtree_numba as kd


def poisoned(shape, dtype="float32"):
    """An output buffer full of NaN (or -7 for integers) on the current backend: unwritten entries show up."""
    fill = np.nan if np.dtype(dtype).kind == "f" else -7
    return kd.backend.full(shape, fill, dtype)


def softmax_logprobs(x: np.ndarray, k: int):
    """Top-k (log-probs, ids) of rows of logits, sorted (value desc, id asc) - test input for tree builds."""
    x = np.asarray(x, np.float64)
    m = x.max(axis=-1, keepdims=True)
    lse = m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True))
    ids = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    return (np.take_along_axis(x, ids, -1) - lse).astype(np.float32), ids.astype(np.int32)
