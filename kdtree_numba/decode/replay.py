"""Graph-replayed decoding: one autoregressive step captured once as a CUDA graph, replayed with its state on the
device, so a step costs its kernels' device time instead of its host launches (178 kernels a plain step of the
default target by ncu, 2026-12-02: numba's, CuPy's and cuBLAS's).

A decode step's only inputs live in four device int32 arrays (the *state*), never in launch arguments:

    tok  [1]   the token fed to the target (the last emitted one, clamped to >= 0)
    pos  [1]   its position = the cache row it writes (prompt length + tokens emitted - 1)
    step [1]   tokens emitted so far = the row of ``out`` the next choice goes to
    out  [n]   the emitted tokens (-1 where a row of logits held NaN)
    T, seed    the sampler's settings (sampling.settings: float64 [1], uint32 [2]), written when they change

    step():  logits = target.forward(tok, cache, start=pos)       # [1, V]; kernels read pos on the device
             choice = choose_tokens(logits, T, seed, stream=pos)    # argmax or seeded Gumbel-max, drawn at
                                                                    # pos (sampling's position keys)
             out[step] = choice;  tok = max(choice, 0);  pos += 1;  step += 1

Replaying the same graph n times therefore decodes n tokens. The host reads ``out`` once every ``sync_every``
steps (default 16) to test stop tokens and NaN; steps run past a stop token are discarded, so the tokens equal
plain decoding's (``autoregressive.py``), stop token included. The capture: the first step runs directly
(numba compiles every kernel, CuPy's pool gets every block the step allocates), the second is captured on the
backend stream with an allocator that keeps each block it hands out alive for the graph's lifetime (the graph
replays those addresses; nothing else may reuse them), then replayed.

The captured program - cache, state arrays, graphs - is kept between generations (``program``): a later
generation of the same capacity reuses it (prefill, then replays from its first step) whatever its temperature and
seed, as a server captures its graphs once at start-up. It is rebuilt when a weight array it captured has been
replaced. The prefill is replayed too: padded to a power-of-two bucket of rows, one graph per bucket
(prefill_replay.py; longer prompts prefill directly).
On the NumPy and simulator backends there is no graph: the same ``step`` runs directly (and the program is kept
the same way), so the device-side bookkeeping is the same code there and the tests of those backends test it.
Example: prompt [5, 9], greedy, n = 3 -> out = [a, b, c] with a = argmax(prefill logits), b from
forward(a at pos 2), c from forward(b at pos 3) - the same three tokens ``autoregressive`` emits.
"""
from __future__ import annotations

import time

import numpy as np

from .. import backend
from ..kernels import sampling
from .autoregressive import nan_error
from .capture import CapturedStep
from .prefill_replay import Prefill
from .trace import Generation


# ------------------------------------------------------------------------------------------------ programs
KEEP = 4                                   # programs kept per model object (the most recently used)


def capacity_for(rows: int) -> int:
    """Cache rows of a kept program: a power of two >= rows (>= 256), so nearby lengths share one program."""
    cap = 256
    while cap < rows:
        cap *= 2
    return cap


def weight_arrays(*models) -> list:
    """Every array a model object holds directly or in a dict / list of dicts attribute (what a captured graph
    reads by address)."""
    out = []
    for m in models:
        for v in vars(m).values():
            items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else [v]
            for x in items:
                for y in (x.values() if isinstance(x, dict) else [x]):
                    if hasattr(y, "shape") and hasattr(y, "dtype"):
                        out.append(y)
    return out


class Program:
    """Buffers and captured graphs of one decode configuration, reused by later generations. ``valid()``: every
    array it captured (``held``, taken by ``hold()`` once the buffers exist, and kept alive here) is still the one
    its model holds."""

    def __init__(self, *models):
        self.models = models
        self.held: list = []
        self.sampler = sampling.settings(0.0, 0)                            # (T [1], seed [2]): set_sampler
        self._sampler_values = (0.0, 0)

    def set_sampler(self, temperature: float, seed: int) -> None:
        """The sampler's device settings for this generation, written only when they differ from the last ones
        (two host-to-device writes a generation saved where the settings repeat, as a benchmark's do)."""
        if (temperature, seed) != self._sampler_values:
            sampling.settings(temperature, seed, out=self.sampler)
            self._sampler_values = (temperature, seed)

    def hold(self) -> None:
        self.held = weight_arrays(*self.models)

    def valid(self) -> bool:
        now = weight_arrays(*self.models)
        return len(now) == len(self.held) and all(a is b for a, b in zip(now, self.held))


def program(owner, key, make):
    """The program ``make()`` built for ``owner`` under ``key``, kept between generations (the last KEEP per
    owner, in the owner's ``_programs``: they live and go with the model object); built again when its captured
    arrays were replaced."""
    progs = vars(owner).setdefault("_programs", {})
    p = progs.pop(key, None)
    if p is None or not p.valid():
        p = make()
    progs[key] = p                                                     # most recently used last
    while len(progs) > KEEP:
        progs.pop(next(iter(progs)))
    return p


def drop_programs(*owners) -> None:
    """Forget the programs kept for these model objects: the next replayed generation captures again. For code
    that changes what a capture records without replacing a weight array - e.g. a kernel-selection constant that
    benchmarks/ab_replay.py switches between configurations."""
    for owner in owners:
        vars(owner).get("_programs", {}).clear()


# ------------------------------------------------------------------------------------------------ plain decoding
class _StepProgram(Program):
    """One decode step over device-side state (module docstring), for prompts + tokens <= ``capacity``."""

    def __init__(self, target, capacity: int):
        super().__init__(target)
        self.target = target
        self.cache = target.new_cache(capacity)
        self.out = backend.full((capacity,), -1, np.int32)                   # [capacity] emitted tokens
        self.choice = backend.empty((1,), np.int32)
        self.tok = backend.empty((1,), np.int32)                             # state [1] each; pos and step are
        self.counters = backend.empty((2,), np.int32)                        # views of one array: one upload
        self.pos, self.step = self.counters[0:1], self.counters[1:2]
        self.run = self._step
        self.prefill = Prefill(target, self.cache, (), self._first)
        self.hold()

    def begin(self, prompt, temperature: float, seed: int) -> None:
        """The sampler's settings; the prefill (padded and replayed per length bucket: prefill_replay.py) and the
        first token: out[0], then tok, pos = len(prompt), step = 1."""
        self.set_sampler(temperature, seed)
        self.prefill(prompt)
        backend.upload(self.counters, np.array([len(prompt), 1], np.int32))      # pos, step

    def _first(self, logits, _hiddens, last) -> None:
        sampling.choose_tokens(logits, *self.sampler, last, out=self.choice)               # logits [1, V]
        self.out[:1] = self.choice
        backend.xp.maximum(self.choice, 0, out=self.tok)

    def _step(self) -> None:
        lg, _ = self.target.forward(self.tok, self.cache, self.pos, check_ids=False)          # [1, V]
        sampling.choose_tokens(lg, *self.sampler, self.pos, out=self.choice)
        self.out[self.step] = self.choice
        backend.xp.maximum(self.choice, 0, out=self.tok)
        self.pos[...] += 1
        self.step[...] += 1

    def advance(self) -> None:
        """One step: direct the first time, then (cuda) captured once and replayed."""
        self.run()
        if self.run == self._step and backend.name == "cuda":
            self.run = CapturedStep(self._step).replay


def autoregressive_replay(target, prompt: np.ndarray, max_new_tokens: int, temperature: float, seed: int,
                          stop_tokens=(), sync_every: int = 16) -> Generation:
    """Plain decoding with the step's state on the device (captured and replayed on cuda); same tokens as
    ``autoregressive``."""
    n = max_new_tokens
    cap = capacity_for(len(prompt) + n)
    p = program(target, ("step", cap), lambda: _StepProgram(target, cap))
    p.begin(prompt, temperature, seed)
    t0 = time.perf_counter()
    done, tokens = 1, []
    while True:
        for t in backend.to_host(p.out[len(tokens):done]).tolist():                # one host read per chunk
            if t < 0:
                raise nan_error()
            tokens.append(t)
            if t in stop_tokens:
                return _result(prompt, tokens, t0, temperature, seed, sync_every)
        if done >= n:
            return _result(prompt, tokens, t0, temperature, seed, sync_every)
        for _ in range(min(sync_every, n - done)):
            p.advance()
            done += 1


def _result(prompt, tokens, t0, temperature, seed, sync_every) -> Generation:
    return Generation([int(x) for x in prompt], tokens, [], len(tokens), time.perf_counter() - t0,
                      {"method": "autoregressive", "temperature": temperature, "seed": seed,
                       "replay": "cuda graph" if backend.name == "cuda" else "direct (device-side state)",
                       "sync_every": sync_every})
