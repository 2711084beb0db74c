"""``python -m kdtree_numba figures``: every figure the README and the docs show, from real runs of the engine.

All runs use the embedded default model (``model.presets.default_target``) with the oracle drafter, greedy, on the
active backend; the outputs are deterministic for a backend.
"""
from __future__ import annotations

import os

from . import generate, viz
from .model import presets

PROMPT = list(b"DDTree drafts a whole tree of continuations, then the target checks them all at once. ")


def make_all(out: str = "figures", progress=None) -> list[str]:
    os.makedirs(out, exist_ok=True)
    target = presets.default_target()
    V = target.config.vocab_size
    paths = []

    def save(name):
        paths.append(os.path.join(out, name))
        return paths[-1]

    steps = 6
    tick = (lambda i: progress(i, steps)) if progress else (lambda i: None)
    gen = generate(target, PROMPT, 96, drafter=presets.default_drafter(target, noise=0.3), budget=64)
    tick(1)
    viz.plot_tree(gen.rounds[1], vocab_size=V, path=save("tree_round.png"))
    viz.plot_rounds(gen, vocab_size=V, n=3, path=save("rounds.png"))
    tick(2)
    big = generate(target, PROMPT, 48, drafter=presets.default_drafter(target, noise=0.3), budget=256)
    viz.plot_tree(big.rounds[0], vocab_size=V, path=save("tree_256.png"))
    tick(3)
    gens = [generate(target, PROMPT, 96, drafter=presets.default_drafter(target, noise=n), budget=64)
            for n in (0.0, 0.3, 1.0, 3.0)]
    viz.acceptance_histogram(gens, labels=[f"noise {n}" for n in (0.0, 0.3, 1.0, 3.0)],
                             path=save("acceptance.png"))
    tick(4)
    viz.tree_shape(gen, path=save("tree_shape.png"))
    viz.stage_times(gen, path=save("stage_times.png"))
    tick(5)
    rows = viz.sweep_rows(target, lambda: presets.default_drafter(target, noise=0.3), PROMPT,
                          [1, 2, 4, 8, 16, 32, 64, 128, 256], 64)
    viz.budget_sweep(rows, path=save("budget_sweep.png"))
    tick(6)
    return paths
