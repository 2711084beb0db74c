"""``kd.generate``: validate everything up front, then run DDTree (a drafter given) or plain decoding."""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping

from .. import backend
from ..kernels import _checks
from ..kernels.tree_build import MAX_BUDGET
from ..model.drafters import Drafter
from .autoregressive import autoregressive
from .ddtree import ddtree
from .ddtree_replay import ddtree_replay, require_device_drafter
from .replay import autoregressive_replay
from .trace import Generation


DEFAULT_BUDGET = 32   # the fastest DDTree of the default pair: budgets 16 / 32 / 64 on all 164 held-out prompts,
#                       replayed, drafter G, H100: 6279 / 6632 / 6489 tokens/s (docs/PERFORMANCE.md, 2026-12-05)


def generate(target, prompt_ids, max_new_tokens: int, drafter: Drafter | None = None, budget: int | None = None,
             temperature: float = 0.0, seed: int = 0, stop_tokens=(), chain: bool = False,
             progress=None, replay: bool = False) -> Generation:
    """Generate ``max_new_tokens`` tokens after ``prompt_ids``.

    drafter None: autoregressive (one target forward per token). Otherwise DDTree with a tree of ``budget``
    nodes (0..1024, default DEFAULT_BUDGET = 32; 0 = one token per round) per round. temperature 0: greedy; > 0:
    sampling, reproducible from ``seed``. Generation stops early after a token in ``stop_tokens``. ``chain=True``
    drafts a single chain instead of a tree (the drafter's top-1 token per depth, DFlash-style: its length is the
    drafter's depth), the baseline a tree is compared with. A ``budget`` where no tree is built (drafter None, or
    chain=True) and chain=True without a drafter are refused rather than ignored. ``progress(done, total)`` is
    called after every DDTree round.
    ``replay=True``: the decode step (plain decoding) or the DDTree round keeps its state on the device and, on
    the cuda backend, is captured once as CUDA graphs and replayed (decode/replay.py, decode/ddtree_replay.py;
    DDTree needs a device-side drafter: DFlash); same tokens as ``replay=False``.
    Bad arguments raise ValueError before any work is done."""
    from ..model.target import Target

    if not isinstance(target, Target):
        raise ValueError(f"target: expected a kdtree_numba Target, got {type(target).__name__}")
    with backend.use(target.backend):          # every stage runs where the target's weights live
        return _generate(target, prompt_ids, max_new_tokens, drafter, budget, temperature, seed, stop_tokens, chain,
                         progress, replay)


def _generate(target, prompt_ids, max_new_tokens, drafter, budget, temperature, seed, stop_tokens, chain, progress,
              replay):
    prompt = target.check_ids(prompt_ids, "prompt_ids")
    max_new_tokens = _checks.integer(max_new_tokens, "max_new_tokens", lo=1)
    if not isinstance(chain, bool):
        raise ValueError(f"chain: expected True or False, got {chain!r}")
    if drafter is None and chain:
        raise ValueError("chain: chain=True drafts with a drafter, got drafter=None")
    if budget is not None and (drafter is None or chain):
        raise ValueError(f"budget: {budget!r} does not apply " + ("without a drafter (plain decoding builds no tree)"
                         if drafter is None else "with chain=True (the chain's length is the drafter's depth)"))
    budget = _checks.integer(DEFAULT_BUDGET if budget is None else budget, "budget", lo=0, hi=MAX_BUDGET)
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or math.isnan(temperature):
        raise ValueError(f"temperature: expected a number >= 0, got {temperature!r}")
    temperature = _checks.real(temperature, "temperature", lo=0.0)
    seed = _checks.integer(seed, "seed", lo=0, hi=2 ** 64 - 1)
    if isinstance(stop_tokens, (str, bytes, Mapping)) or not isinstance(stop_tokens, Iterable) \
            or getattr(stop_tokens, "ndim", 1) != 1:
        raise ValueError(f"stop_tokens: expected a collection of token ids (e.g. [0] for one), got {stop_tokens!r}")
    stop = {_checks.integer(t, "stop_tokens", lo=0, hi=target.config.vocab_size - 1) for t in stop_tokens}
    if progress is not None and not callable(progress):
        raise ValueError(f"progress: expected a function progress(done, total) or None, got {progress!r}")
    limit = target.config.max_position_embeddings
    if len(prompt) + max_new_tokens > limit:
        raise ValueError(f"max_new_tokens: prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) = "
                         f"{len(prompt) + max_new_tokens} exceeds the context limit of {limit} "
                         f"(max_position_embeddings)")
    if not isinstance(replay, bool):
        raise ValueError(f"replay: expected True or False, got {replay!r}")
    if drafter is None:
        run = autoregressive_replay if replay else autoregressive
        return run(target, prompt, max_new_tokens, temperature, seed, stop)
    if not isinstance(drafter, Drafter):
        raise ValueError(f"drafter: expected a kdtree_numba Drafter, got {type(drafter).__name__}")
    if drafter.vocab_size != target.config.vocab_size:
        raise ValueError(f"drafter: vocabulary of {drafter.vocab_size} tokens does not match the target's "
                         f"{target.config.vocab_size}")
    if drafter.feature_layers and drafter.target is not target:
        raise ValueError(f"drafter: a {drafter.name} drafter reads the features of the target it was loaded for, "
                         f"and that is another Target object (load it with kd.load_drafter(path, target))")
    depth = getattr(drafter, "depth", None)
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"drafter: depth {depth!r} is not a positive integer")
    which = "max_position_embeddings"
    own = getattr(getattr(drafter, "config", None), "max_position_embeddings", None)   # a DFlash drafter's own
    if isinstance(own, int) and own < limit:
        limit, which = own, "the drafter's max_position_embeddings"
    if len(prompt) + max_new_tokens + depth > limit:       # the last round's tree reaches depth positions further
        raise ValueError(f"drafter: prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) + draft depth "
                         f"({depth}) = {len(prompt) + max_new_tokens + depth} exceeds the context limit of {limit} "
                         f"({which})")
    if replay:
        require_device_drafter(drafter)
    run = ddtree_replay if replay else ddtree
    if chain:
        return run(target, prompt, max_new_tokens, drafter, depth, temperature, seed, stop, top_k=1,
                   progress=progress)
    return run(target, prompt, max_new_tokens, drafter, budget, temperature, seed, stop, progress=progress)
