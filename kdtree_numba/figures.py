"""``python -m kdtree_numba figures``: every figure the README and the docs show, from real runs of the engine.

All runs use the embedded trained pair (``kd.load_default()``: the 9.1 M-parameter code model and its DFlash
drafter), greedy, on held-out HumanEval prompts (``FIGURE_TASKS``, each without its final newline, as the demo
uses them), on the active backend; the outputs are deterministic for a backend. One sweep feeds every figure:
per prompt the DFlash chain and DDTree at each budget of ``BUDGETS``, ``NEW_TOKENS`` tokens each.

    tree_round.png       the B = 64 round with the longest accepted path over all prompts, labelled with tokens
    tree_256.png         the same for B = 256 (collapsed to its 64 most probable nodes + the accepted path)
    rounds.png           a typical round and the best round of the demo prompt (B = 64)
    acceptance.png       tokens committed per round: the chain vs DDTree at B = 16, 64, 256 (pooled over prompts)
    budget_sweep.png     tau and target forwards per token vs budget, DDTree vs the chain (pooled over prompts)
    tree_shape.png       nodes and branching per depth of the demo prompt's B = 64 trees
    stage_times.png      where a round's time goes on this backend (demo prompt, B = 64)
    training_curves.png  the pair's training logs (also copied next to the model, for its model card)
"""
from __future__ import annotations

import os
import shutil

from . import backend, generate, viz
from .decode.sweep import rows_from_runs
from .model.presets import DEFAULT_DIR, load_default

FIGURE_TASKS = ("HumanEval/18", "HumanEval/22", "HumanEval/45", "HumanEval/62")   # the first is the demo's
BUDGETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
NEW_TOKENS = 96


def _prompts(target) -> list[tuple[str, list[int]]]:
    from .cli import task_prompt

    return [(t, target.tokenizer.encode(task_prompt(t))) for t in FIGURE_TASKS]


def _best_round(runs) -> tuple[int, int]:
    """(run index, round index) of the round with the most accepted tokens (the first such)."""
    best = (-1, 0, 0)
    for k, g in enumerate(runs):
        for i, r in enumerate(g.rounds):
            if len(r.accepted) > best[0]:
                best = (len(r.accepted), k, i)
    return best[1], best[2]


def make_all(out: str = "figures", progress=None) -> list[str]:
    os.makedirs(out, exist_ok=True)
    target, drafter = load_default()
    tok = target.tokenizer
    prompts = _prompts(target)
    paths = []

    def save(name):
        paths.append(os.path.join(out, name))
        return paths[-1]

    total = len(prompts) * (len(BUDGETS) + 1) + 1
    done = 0

    def tick():
        nonlocal done
        done += 1
        if progress:
            progress(done, total)

    chain, tree = [], {b: [] for b in BUDGETS}
    for _, ids in prompts:
        chain.append(generate(target, ids, NEW_TOKENS, drafter=drafter, chain=True))
        tick()
        for b in BUDGETS:
            tree[b].append(generate(target, ids, NEW_TOKENS, drafter=drafter, budget=b))
            tick()
    where = f"{len(prompts)} held-out HumanEval prompts \u00d7 {NEW_TOKENS} greedy tokens"
    for B, name in ((64, "tree_round.png"), (256, "tree_256.png")):
        k, i = _best_round(tree[B])
        g = tree[B][k]
        r = g.rounds[i]
        title = (f"{prompts[k][0]}, round {i + 1}/{len(g.rounds)} (budget {B}): {len(r.accepted) - 1} of "
                 f"{r.tree.n} drafts accepted + bonus" + viz.trees.accepted_caption(r, target.config.vocab_size, tok))
        viz.plot_tree(r, tokenizer=tok, title=title, path=save(name))
    main = tree[64][0]
    viz.plot_rounds(main, tokenizer=tok, picks=viz.showcase_rounds(main), path=save("rounds.png"))
    series = [chain] + [tree[b] for b in (16, 64, 256)]
    viz.acceptance_histogram(series, labels=["DFlash chain"] + [f"DDTree, budget {b}" for b in (16, 64, 256)],
                             title=f"Tokens committed per round: trained pair, {where}, pooled",
                             path=save("acceptance.png"))
    rows = rows_from_runs(tree, chain)
    viz.budget_sweep(rows, chain_label=f"DFlash chain (top-1 per depth, depth {drafter.depth})",
                     title=f"Trained pair, {where}, pooled", path=save("budget_sweep.png"))
    viz.tree_shape(main, path=save("tree_shape.png"))
    viz.stage_times(main, note=f"{backend.name} backend, {prompts[0][0]}, budget 64", path=save("stage_times.png"))
    viz.training_curves(os.path.join(DEFAULT_DIR, "target_train_log.json"),
                        os.path.join(DEFAULT_DIR, "drafter_train_log.json"), path=save("training_curves.png"))
    shutil.copyfile(paths[-1], os.path.join(DEFAULT_DIR, "training_curves.png"))
    paths.append(os.path.join(DEFAULT_DIR, "training_curves.png"))
    tick()
    return paths
