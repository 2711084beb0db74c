"""Drafters: given the committed context and the root token, per-depth draft logits ``[L, V]`` for depths 1..L.

Depth d is the drafter's guess for position ``start + d`` (the root sits at ``start``). DDTree turns these
per-position distributions into a tree; the drafter never sees the tree.

What a drafter must provide (the ``Drafter`` interface the decode loop uses):
- ``depth`` (L) and ``vocab_size`` (the target's V), fixed; a ``name`` for traces;
- ``feature_layers``: the target decoder layers whose residual stream (after the layer; HF's
  ``hidden_states[k + 1]``) the drafter reads, in order; ``()`` for drafters that need no target features;
- ``reset()``: forget everything (called before every generation);
- ``observe(features, start)``: the concatenated features ``[T, len(feature_layers) * H]`` (device arrays) of the
  committed positions ``start .. start + T - 1``. The loop calls it with the prompt's rows after the prefill and,
  after every round, with the accepted path's rows taken from the verify forward (root included; the bonus token's
  row arrives with the next round). A drafter without features ignores it;
- ``draft(context, root)``: ``[L, V]`` float32 logits (a device or host array) after ``context + [root]``, where
  ``context`` holds the ``start`` committed token ids (host) and every one of them has been observed.
``draft_logits(context_ids, root)`` is the standalone form for users and tests: reset, prefill the target on
``context_ids`` (features to ``observe``), draft, and return host ``np.float32 [L, V]``.

Drafters here:
- ``DFlashDrafter`` (model/dflash.py): the block-diffusion drafter DDTree was designed for; reads target features.
- ``OracleDrafter(target, noise, seed)``: a controlled-quality stand-in derived from the target itself, for tests
  and tutorials. It follows the target's greedy continuation after the root and returns, at depth d, the target's
  own logits after d - 1 greedy tokens, plus Gaussian noise scaled to each row's spread:
      draft[d] = target_logits[d] + noise * std(target_logits[d]) * z,   z ~ N(0, 1) seeded by (seed, start, d)
  noise 0 ranks the target's greedy continuation first at every depth (at T = 0 every round accepts the whole
  top-1 chain the tree holds: L + 1 tokens when the budget is large enough to hold the chain);
  noise 1 keeps a useful signal; noise >= 10 is close to random. It keeps its own KV cache and reuses the
  continuation it computed last round, so a round costs about as many target steps as the round commits.
  It is as slow as the target, so it shows acceptance, not wall-clock speed.
- ``RandomDrafter(vocab_size, depth, seed)``: standard-normal logits, the worst case.
"""
from __future__ import annotations

import numpy as np

from .. import backend
from ..kernels import _checks


class Drafter:
    """Interface (module docstring). ``depth`` (L) and ``vocab_size`` are fixed; ``draft`` returns float32
    ``[L, V]`` logits."""
    depth: int
    vocab_size: int
    name: str = "drafter"
    feature_layers: tuple = ()
    target = None                 # the target whose features the drafter reads (needed by draft_logits)

    def reset(self) -> None:
        """Forget any state (called at the start of every generation)."""

    def observe(self, features, start: int) -> None:
        """Take the features ``[T, len(feature_layers) * H]`` of committed positions ``start .. start + T - 1``."""

    def draft(self, context: np.ndarray, root: int) -> np.ndarray:
        raise NotImplementedError

    def draft_logits(self, context_ids, root: int) -> np.ndarray:
        """A fresh draft after ``context_ids + [root]``: host ``np.float32 [L, V]`` for depths 1..L."""
        if self.target is None and self.feature_layers:
            raise ValueError(f"{self.name}: draft_logits needs the drafter's target")
        if self.target is not None:
            context = self.target.check_ids(context_ids, "context_ids")
            root = int(self.target.check_ids([root], "root")[0])
            limit = self.target.config.max_position_embeddings
            if len(context) + 1 + self.depth > limit:       # the root at len(context), depth positions after it
                raise ValueError(f"context_ids: {len(context)} tokens + the root + draft depth {self.depth} = "
                                 f"{len(context) + 1 + self.depth} positions exceed the context limit of {limit} "
                                 f"(max_position_embeddings)")
        else:
            from .target import token_ids_host

            context = token_ids_host(context_ids, self.vocab_size, "context_ids")
            root = _checks.integer(root, "root", lo=0, hi=self.vocab_size - 1)
        self.reset()
        if self.feature_layers:
            with backend.use(self.target.backend):
                _, hid = self.target.forward(context, self.target.new_cache(len(context)), 0,
                                             hidden_layers=self.feature_layers, check_ids=False)
                self.observe(concat_features(hid, self.feature_layers), 0)
        with backend.use(self.target.backend if self.target is not None else backend.name):
            return np.asarray(backend.to_host(self.draft(context, root)), np.float32)


def concat_features(hiddens: dict, layers) -> object:
    """``[T, len(layers) * H]``: the residual streams ``hiddens[k]`` for k in ``layers``, side by side. A target
    forward's ``Hiddens`` for the same layers already holds them so (``stacked``): no copy, no launch."""
    if getattr(hiddens, "layers", None) == tuple(layers):
        return hiddens.stacked
    return backend.xp.concatenate([hiddens[k] for k in layers], axis=1)


class RandomDrafter(Drafter):
    """Standard-normal draft logits (seeded by (seed, start)): acceptance close to the minimum."""
    name = "random"

    def __init__(self, vocab_size: int, depth: int = 8, seed: int = 0):
        self.vocab_size = _checks.integer(vocab_size, "vocab_size", lo=1)
        self.depth = _checks.integer(depth, "depth", lo=1)
        self.seed = _checks.integer(seed, "seed", lo=0)

    def draft(self, context, root):
        rng = np.random.default_rng([self.seed, len(context)])
        return rng.standard_normal((self.depth, self.vocab_size)).astype(np.float32)


class OracleDrafter(Drafter):
    """Controlled-quality drafts derived from the target (module docstring). ``noise`` >= 0 dials acceptance
    down. A stand-in for tests and tutorials, not a real drafter: it runs the target itself."""
    name = "oracle"

    def __init__(self, target, noise: float = 0.5, seed: int = 0, depth: int = 8):
        from .target import Target

        if not isinstance(target, Target):
            raise ValueError(f"target: expected a kdtree_numba Target (it drafts from the target's own logits), got "
                             f"{type(target).__name__}")
        self.target = target
        self.noise = _checks.real(noise, "noise", lo=0.0)
        self.seed = _checks.integer(seed, "seed", lo=0)
        self.depth = _checks.integer(depth, "depth", lo=1)
        self.vocab_size = target.config.vocab_size
        self.reset()

    def reset(self) -> None:
        self._seq: list[int] = []          # tokens whose logits are known (their KV is in the cache)
        self._logits: list[np.ndarray] = []  # _logits[i] = target logits after _seq[:i + 1]
        self._cache = None

    def _extend(self, tokens: list[int]) -> None:
        """Run the target over ``tokens`` appended to ``_seq`` (one chunk) and record their logits."""
        t = self.target
        need = len(self._seq) + len(tokens)
        if self._cache is None or self._cache.capacity < need:
            cap = max(2 * need, 64)
            old = self._seq
            self._cache, self._seq, self._logits = t.new_cache(cap), [], []
            tokens = old + tokens
        logits, _ = t.forward(np.asarray(tokens, np.int32), self._cache, len(self._seq), check_ids=False)
        self._seq += tokens
        self._logits += list(backend.to_host(logits))

    def draft(self, context, root):
        seq = [int(x) for x in context] + [int(root)]
        keep = 0
        limit = min(len(seq), len(self._seq))
        while keep < limit and self._seq[keep] == seq[keep]:
            keep += 1
        del self._seq[keep:], self._logits[keep:]
        if keep < len(seq):
            self._extend(seq[keep:])
        while len(self._seq) < len(seq) + self.depth - 1:            # greedy continuation after the root
            self._extend([int(np.argmax(self._logits[-1]))])
        start = len(context)
        rows = np.stack(self._logits[start:start + self.depth]).astype(np.float32)   # [L, V]
        if self.noise > 0:
            rng = np.random.default_rng([self.seed, start])
            z = rng.standard_normal(rows.shape).astype(np.float32)
            rows = rows + np.float32(self.noise) * rows.std(axis=1, keepdims=True) * z
        return rows
