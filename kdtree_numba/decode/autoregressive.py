"""Plain decoding: prefill once, then one target forward per token (the baseline DDTree is measured against)."""
from __future__ import annotations

import time

import numpy as np

from .. import backend
from ..kernels import sampling
from .trace import Generation


def nan_error() -> ValueError:
    return ValueError("logits: the target produced NaN logits (check the checkpoint's weights)")


def autoregressive(target, prompt: np.ndarray, max_new_tokens: int, temperature: float, seed: int,
                   stop_tokens=()) -> Generation:
    """Greedy (T = 0) or sampled decoding with a preallocated cache; token j is drawn with the RNG stream of the
    position it follows, len(prompt) - 1 + j (``sampling``'s position keys, which DDTree's accept shares)."""
    cache = target.new_cache(len(prompt) + max_new_tokens)
    logits, _ = target.forward(prompt, cache, 0, check_ids=False, logits_to_keep=1)   # prefill
    chosen = backend.empty((1,), np.int32)
    t0 = time.perf_counter()
    tokens: list[int] = []
    while True:
        sampling.choose_tokens(logits[-1:], temperature, seed, len(prompt) - 1 + len(tokens), out=chosen)
        tok = int(backend.to_host(chosen)[0])                                     # one host read per token
        if tok < 0:
            raise nan_error()
        tokens.append(tok)
        if len(tokens) >= max_new_tokens or tok in stop_tokens:
            break
        pos = len(prompt) + len(tokens) - 1
        logits, _ = target.forward(chosen, cache, pos, check_ids=False)           # decode step
    return Generation([int(x) for x in prompt], tokens, [], len(tokens), time.perf_counter() - t0,
                      {"method": "autoregressive", "temperature": temperature, "seed": seed})
