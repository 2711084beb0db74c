"""Graph-replayed decoding: one autoregressive step captured once as a CUDA graph, replayed with its state on the
device, so a step costs its kernels' device time instead of ~50 host launches.

A decode step's only inputs live in four device int32 arrays (the *state*), never in launch arguments:

    tok  [1]   the token fed to the target (the last emitted one, clamped to >= 0)
    pos  [1]   its position = the cache row it writes (prompt length + tokens emitted - 1)
    step [1]   tokens emitted so far = the RNG stream of the next choice (as plain decoding numbers them)
    out  [n]   the emitted tokens (-1 where a row of logits held NaN)

    step():  logits = target.forward(tok, cache, start=pos)       # [1, V]; kernels read pos on the device
             choice = choose_tokens(logits, T, seed, stream=step)   # argmax or seeded Gumbel-max
             out[step] = choice;  tok = max(choice, 0);  pos += 1;  step += 1

Replaying the same graph n times therefore decodes n tokens. The host reads ``out`` once every ``sync_every``
steps (default 16) to test stop tokens and NaN; steps run past a stop token are discarded, so the tokens equal
plain decoding's (``autoregressive.py``), stop token included. The capture: the first step runs directly
(numba compiles every kernel, CuPy's pool gets every block the step allocates), the second is captured on the
backend stream with an allocator that keeps each block it hands out alive for the graph's lifetime (the graph
replays those addresses; nothing else may reuse them), then replayed.

On the NumPy and simulator backends there is no graph: the same ``step`` runs directly, so the device-side
bookkeeping is the same code there and the tests of those backends test it.
Example: prompt [5, 9], greedy, n = 3 -> out = [a, b, c] with a = argmax(prefill logits), b from
forward(a at pos 2), c from forward(b at pos 3) - the same three tokens ``autoregressive`` emits.
"""
from __future__ import annotations

import time

import numpy as np

from .. import backend
from ..kernels import sampling
from .autoregressive import nan_error
from .trace import Generation


class CapturedStep:
    """``fn`` captured once as a CUDA graph on the backend stream; ``replay()`` launches it (cuda only)."""

    def __init__(self, fn):
        cp = backend.cp
        pool = cp.get_default_memory_pool()
        self._blocks = []                       # every block the capture allocated: alive as long as the graph

        def keep(nbytes):
            block = pool.malloc(nbytes)
            self._blocks.append(block)
            return block

        stream = backend.stream
        try:
            with cp.cuda.using_allocator(keep):
                stream.begin_capture()
                try:
                    fn()
                finally:
                    graph = stream.end_capture()
        except Exception as e:
            raise RuntimeError(f"replay: capturing the decode step as a CUDA graph failed ({type(e).__name__}: "
                               f"{e}); generate with replay=False") from e
        self.graph = graph

    def replay(self) -> None:
        self.graph.launch(backend.stream)


def autoregressive_replay(target, prompt: np.ndarray, max_new_tokens: int, temperature: float, seed: int,
                          stop_tokens=(), sync_every: int = 16) -> Generation:
    """Plain decoding with the step's state on the device (captured and replayed on cuda); same tokens as
    ``autoregressive``."""
    xp = backend.xp
    n = max_new_tokens
    cache = target.new_cache(len(prompt) + n)
    logits, _ = target.forward(prompt, cache, 0, check_ids=False)                 # prefill (direct)
    t0 = time.perf_counter()
    out = backend.full((n,), -1, np.int32)                                         # [n] emitted tokens
    choice = backend.empty((1,), np.int32)
    sampling.choose_tokens(logits[-1:], temperature, seed, 0, out=choice)
    out[:1] = choice
    tok = xp.maximum(choice, 0)                                                    # [1] state
    pos = backend.full((1,), len(prompt), np.int32)
    step = backend.full((1,), 1, np.int32)

    def one_step():
        lg, _ = target.forward(tok, cache, pos, check_ids=False)                   # [1, V]
        sampling.choose_tokens(lg, temperature, seed, step, out=choice)
        out[step] = choice
        xp.maximum(choice, 0, out=tok)
        pos[...] += 1
        step[...] += 1

    run = one_step
    done, tokens = 1, []
    while True:
        for t in backend.to_host(out[len(tokens):done]).tolist():                  # one host read per chunk
            if t < 0:
                raise nan_error()
            tokens.append(t)
            if t in stop_tokens:
                return _result(prompt, tokens, t0, temperature, seed, sync_every)
        if done >= n:
            return _result(prompt, tokens, t0, temperature, seed, sync_every)
        for _ in range(min(sync_every, n - done)):
            run()
            done += 1
            if run is one_step and backend.name == "cuda":
                run = CapturedStep(one_step).replay                                # after one direct step


def _result(prompt, tokens, t0, temperature, seed, sync_every) -> Generation:
    return Generation([int(x) for x in prompt], tokens, [], len(tokens), time.perf_counter() - t0,
                      {"method": "autoregressive", "temperature": temperature, "seed": seed,
                       "replay": "cuda graph" if backend.name == "cuda" else "direct (device-side state)",
                       "sync_every": sync_every})
