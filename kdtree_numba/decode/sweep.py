"""Budget sweeps: run DDTree at several budgets and the single chain on the same prompts, and pool the runs into
the rows ``kd.viz.budget_sweep`` plots.

Row: ``{"budget", "tree_tau", "tree_fpt", "chain_tau", "chain_fpt", "prompts"}``; pooled over the prompts,
tau = tokens committed / rounds and fpt = target forwards / generated tokens (prefills included).
Example: two prompts whose budget-16 runs took 2 and 4 rounds committing 4 and 8 tokens with 3 and 5 forwards
-> tree_tau = 12 / 6 = 2.0, tree_fpt = 8 / 12 = 0.667.
"""
from __future__ import annotations

import math

import numpy as np

from .generate import generate


def rows_from_runs(tree_runs: dict, chain_runs) -> list[dict]:
    """Rows for ``budget_sweep`` from finished runs, pooled over prompts.

    tree_runs: ``{budget: [Generation, ...]}`` (one per prompt); chain_runs: the chain's Generations (same
    prompts). Pooled over the runs: tau = tokens committed / rounds, fpt = target forwards / generated tokens
    (prefills included). Each row also says how many prompts it pools (``"prompts"``)."""
    def stats(gens):
        per_round = [n for g in gens for n in g.round_tokens]                  # the last round's cut to its output
        tau = sum(per_round) / len(per_round) if per_round else math.nan
        fpt = sum(g.target_forwards for g in gens) / max(sum(len(g.tokens) for g in gens), 1)
        return float(tau), float(fpt)

    chain_runs = list(chain_runs)
    c_tau, c_fpt = stats(chain_runs) if chain_runs else (math.nan, math.nan)
    rows = []
    for b in sorted(tree_runs):
        gens = list(tree_runs[b])
        t_tau, t_fpt = stats(gens)
        rows.append({"budget": int(b), "tree_tau": t_tau, "tree_fpt": t_fpt, "chain_tau": c_tau, "chain_fpt": c_fpt,
                     "prompts": len(gens)})
    return rows


def sweep_rows(target, make_drafter, prompt_ids, budgets, max_new_tokens: int, temperature: float = 0.0,
               seed: int = 0, progress=None) -> list[dict]:
    """Run DDTree once per budget and the single chain once (per prompt); return rows for ``budget_sweep``.

    target: a Target; make_drafter: a zero-argument callable returning a drafter (called once per run; it may
    return the same object, every generation resets it); prompt_ids: one prompt (a list of ids) or a list of
    prompts (the rows then pool all of them, as ``rows_from_runs``); max_new_tokens / temperature / seed: as in
    ``kd.generate``; budgets: tree budgets to try; progress(done, total): called after every run.
    Each row: ``{"budget", "tree_tau", "tree_fpt", "chain_tau", "chain_fpt", "prompts"}`` where fpt = target
    forwards / generated tokens (the prefill included) and tau = mean tokens committed per round."""
    first = prompt_ids[0] if len(prompt_ids) else None
    prompts = [list(p) for p in prompt_ids] if isinstance(first, (list, tuple, np.ndarray)) else [list(prompt_ids)]
    total, done = len(prompts) * (len(budgets) + 1), 0

    def run(p, **kw):
        nonlocal done
        g = generate(target, p, max_new_tokens, drafter=make_drafter(), temperature=temperature, seed=seed, **kw)
        done += 1
        if progress is not None:
            progress(done, total)
        return g

    chain = [run(p, chain=True) for p in prompts]
    tree = {int(b): [run(p, budget=int(b)) for p in prompts] for b in budgets}
    return rows_from_runs(tree, chain)
