"""Plots over many rounds: how much each round accepts, what shape the trees take, what a bigger budget buys,
and where the time goes.

How to read them:
  * ``acceptance_histogram``: for every round, the tokens it committed (accepted drafts + the bonus token, so
    at least 1); the dashed line is tau, the mean. More mass to the right = fewer target forwards per token.
  * ``tree_shape``: left, how many of the budget's nodes sit at each depth (a best-first tree is wide near the
    root and thins out); right, the mean number of children of a node at each depth (its branching factor).
  * ``budget_sweep``: tau and target forwards per generated token against the tree budget (log-2 axis). The
    tree (solid) should beat the single draft chain of the same drafter (dashed) and approach 1/tau forwards
    per token; autoregressive decoding is the dotted line at 1.
  * ``stage_times``: per round, the milliseconds of the six stages (draft, topk, build, verify, accept, compact:
    ``decode.trace.STAGES``) stacked; right, their totals over the generation, with shares.

Every function returns a matplotlib Figure and saves it when ``path`` is given (.png / .svg / .pdf).
The rows a ``budget_sweep`` plots come from ``kdtree_numba.decode.sweep`` (which runs the generations); nothing
here decodes.
"""
from __future__ import annotations

from collections.abc import Sequence

import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator, PercentFormatter

from ..decode.trace import STAGES
from . import _args
from .trees import ACCENT, GRID, MUTED_TEXT, save

TREE_COLOUR = "#2767b0"     # DDTree (the blue of the tree pictures)
CHAIN_COLOUR = ACCENT       # the single chain baseline
SERIES = [TREE_COLOUR, ACCENT, "#2b9348", "#7b2cbf", "#c9184a", "#6c757d"]
STAGE_COLOURS = {"draft": "#4c8bd6", "topk": "#c7a4e8", "build": "#9b6fc4", "verify": "#f08c3a", "accept": "#2b9348",
                 "compact": "#e6b800"}


def _style(ax, grid_axis: str = "y") -> None:
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)
    for s in ("left", "bottom"):
        ax.spines[s].set_color("#b0b4b9")
    ax.tick_params(colors=MUTED_TEXT, labelsize=8)
    ax.grid(axis=grid_axis, color=GRID, lw=0.9)
    ax.set_axisbelow(True)


def _label(ax, xlabel: str, ylabel: str, title: str | None = None) -> None:
    ax.set_xlabel(xlabel, fontsize=8.5, color=MUTED_TEXT)
    ax.set_ylabel(ylabel, fontsize=8.5, color=MUTED_TEXT)
    if title:
        ax.set_title(title, fontsize=9.5, loc="left", color="#202124")


def _empty(ax, msg: str) -> None:
    ax.text(0.5, 0.5, msg, ha="center", va="center", color=MUTED_TEXT, fontsize=9, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _name(gen) -> str:
    s = getattr(gen, "settings", {}) or {}
    method = s.get("method", "ddtree")
    if method == "chain":
        return f"single chain (depth {s.get('depth', '?')})"
    if "budget" in s:
        return f"{method} B={s['budget']}"
    return method


def _new(ncols: int, size, axes, ratios=None):
    if axes is not None:
        axes = list(np.atleast_1d(axes))
        if len(axes) != ncols:
            raise ValueError(f"axes: expected {ncols} matplotlib Axes, got {len(axes)}")
        return axes[0].figure, axes
    fig = Figure(figsize=size, layout="constrained")
    return fig, list(fig.subplots(1, ncols, squeeze=False, width_ratios=ratios)[0])


# ---------------------------------------------------------------------------------------------- acceptance
def _round_tokens_of(item) -> list[int]:
    """Tokens per round (``Generation.round_tokens``) of one histogram series: a Generation, or a list of
    Generations pooled together."""
    gens = [item] if hasattr(item, "rounds") else list(item)
    return [n for g in gens for n in g.round_tokens]


def acceptance_histogram(gen_or_gens, labels=None, path=None, ax=None, title: str | None = None) -> Figure:
    """Histogram of tokens committed per round (``Generation.round_tokens``: accepted drafts + bonus, the last
    round's cut to what it emitted), tau marked.

    gen_or_gens: one ``Generation`` (bars count rounds) or a list of series, each a ``Generation`` or a list of
    Generations whose rounds are pooled (e.g. one run per prompt); several series are drawn as grouped bars,
    one colour each, as percentages of their rounds (the axis stops at 100 %) so runs of different lengths
    compare. labels: legend names (default from each series' settings, e.g. ``ddtree B=64``); title: the axes
    title (default: what is counted, and for one run its name and rounds); ax: draw into this Axes; path: save
    there."""
    from ..decode.trace import Generation

    single = isinstance(gen_or_gens, Generation)
    if not single and (not isinstance(gen_or_gens, Sequence) or isinstance(gen_or_gens, (str, bytes))):
        raise ValueError(f"gen_or_gens: expected a Generation or a list of them, got {type(gen_or_gens).__name__}")
    series = [gen_or_gens] if single else list(gen_or_gens)
    for i, g in enumerate(series):
        for x in ([g] if isinstance(g, Generation) else g if isinstance(g, Sequence) else [g]):
            _args.generation(x, f"gen_or_gens[{i}]")
    if not series:
        raise ValueError("gen_or_gens: expected a Generation or a non-empty list of them, got an empty list")
    if labels is None:
        labels = [_name(g if hasattr(g, "rounds") else (list(g) or [None])[0]) for g in series]
    if len(labels) != len(series):
        raise ValueError(f"labels: {len(labels)} labels for {len(series)} generations")
    if ax is None:
        fig = Figure(figsize=(7.6, 3.9), layout="constrained")
        ax = fig.add_subplot()
    fig = ax.figure
    _style(ax)
    lengths = [np.array(_round_tokens_of(g), int) for g in series]
    top = max([int(x.max()) for x in lengths if x.size] + [1])
    xs = np.arange(1, top + 1)
    k = len(series)
    width = 0.84 / max(k, 1)
    shares = k > 1
    ymax = 0.0
    for j, (x, lab) in enumerate(zip(lengths, labels)):
        c = SERIES[j % len(SERIES)]
        if not x.size:
            ax.bar([], [], color=c, label=f"{lab}: no rounds (autoregressive)")
            continue
        counts = np.bincount(x, minlength=top + 1)[1:]
        h = counts / x.size * 100 if shares else counts
        ymax = max(ymax, float(h.max()))
        ax.bar(xs + (j - (k - 1) / 2) * width, h, width=width * 0.92, color=c, alpha=0.88,
               label=f"{lab}  (\u03c4 = {x.mean():.2f}, {x.size} rounds)")
    for j, x in enumerate(lengths):
        if x.size:
            tau = float(x.mean())
            c = SERIES[j % len(SERIES)]
            ax.axvline(tau, color=c, ls=(0, (4, 2)), lw=1.5, zorder=3)
            if k == 1:                                  # several runs: tau is in the legend
                ax.annotate(f"\u03c4 = {tau:.2f}", (tau, 1.0), xycoords=("data", "axes fraction"),
                            xytext=(4, -4), textcoords="offset points", ha="left", va="top", fontsize=9,
                            color=c, fontweight="bold")
    ax.set_xticks(xs)
    ax.set_xlim(0.4, top + 0.6)
    if shares:
        ax.set_ylim(0, min(100.0, max(ymax * (1.12 + 0.08 * k), 1.0)))
        ax.yaxis.set_major_formatter(PercentFormatter(100, decimals=0))
    else:
        ax.set_ylim(0, max(ymax * 1.15, 1))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if title is None:
        title = "Tokens committed per round"
        if k == 1:
            title += f": {labels[0]}, {lengths[0].size} rounds"
    _label(ax, "tokens committed per round (accepted drafts + bonus)", "share of rounds" if shares else "rounds",
           title)
    if k > 1 or not lengths[0].size:
        ax.legend(fontsize=8, frameon=False, loc="upper right", title="dashed lines: \u03c4 (mean)",
                  title_fontsize=7.5, alignment="right")
    save(fig, path)
    return fig


# ---------------------------------------------------------------------------------------------- tree shape
def _shape_stats(gen):
    """(depths 1..L, mean nodes per depth, depths 0..L-1, mean children per node at that depth)."""
    L = max([int(r.tree.depths.max(initial=0)) for r in gen.rounds] + [1])
    nodes = np.zeros(L + 1)
    kids = np.zeros(L + 1)
    parents_at = np.zeros(L + 1)
    for r in gen.rounds:
        t = r.tree
        d = np.concatenate([[0], t.depths]).astype(int)
        nodes += np.bincount(d, minlength=L + 1)[:L + 1]
        ch = np.bincount(t.parents[1:], minlength=t.n + 1)
        kids += np.bincount(d, weights=ch, minlength=L + 1)[:L + 1]
        parents_at += np.bincount(d, minlength=L + 1)[:L + 1]
    R = max(len(gen.rounds), 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        branch = kids / parents_at
    return np.arange(1, L + 1), nodes[1:] / R, np.arange(0, L), branch[:L]


def tree_shape(gen, path=None, axes=None) -> Figure:
    """Two panels over all rounds of ``gen``: mean nodes per depth, mean branching factor per depth.

    The branching factor at depth d is the mean number of children of a node at depth d (depth 0 = the root),
    leaves included. axes: two Axes to draw into; path: save there."""
    _args.generation(gen)
    fig, (a1, a2) = _new(2, (9.0, 3.6), axes)
    for a in (a1, a2):
        _style(a)
    if not gen.rounds:
        _empty(a1, "no DDTree rounds (autoregressive decoding)")
        _empty(a2, "")
        save(fig, path)
        return fig
    d, nodes, d0, branch = _shape_stats(gen)
    a1.bar(d, nodes, color=TREE_COLOUR, alpha=0.85, width=0.7, label="nodes at this depth")
    acc_depth = np.array([len(r.accepted) - 1 for r in gen.rounds])
    reach = [(acc_depth >= k).mean() for k in d]
    ax_r = a1.twinx()
    ax_r.plot(d, reach, color=ACCENT, marker="o", lw=1.8, ms=4, label="share of rounds accepting this deep")
    h1, l1 = a1.get_legend_handles_labels()
    h2, l2 = ax_r.get_legend_handles_labels()
    ax_r.legend(h1 + h2, l1 + l2, fontsize=7.5, frameon=False, loc="upper right")
    ax_r.set_ylim(0, 1.05)
    ax_r.set_ylabel("share of rounds", fontsize=8, color=ACCENT)
    ax_r.tick_params(colors=ACCENT, labelsize=7.5)
    for s in ("top", "left", "bottom"):
        ax_r.spines[s].set_visible(False)
    ax_r.spines["right"].set_color(ACCENT)
    a1.set_xticks(d)
    a1.set_ylim(0, nodes.max() * 1.18 if nodes.size else 1)
    s = gen.settings or {}
    _label(a1, "depth", "mean nodes per round",
           f"Nodes per depth (budget {s.get('budget', '?')}, {len(gen.rounds)} rounds)")
    b2 = a2.bar(d0, np.nan_to_num(branch), color="#5b9bd5", alpha=0.9, width=0.7)
    a2.bar_label(b2, fmt="%.2f", fontsize=7, color=MUTED_TEXT, padding=2)
    a2.set_xticks(d0)
    a2.set_xticklabels(["root"] + [str(k) for k in d0[1:]])
    a2.set_ylim(0, max(np.nanmax(branch) if np.isfinite(branch).any() else 1, 1) * 1.18)
    _label(a2, "depth of the parent", "mean children per node", "Branching factor per depth")
    save(fig, path)
    return fig


# ---------------------------------------------------------------------------------------------- budget sweep
def budget_sweep(rows, path=None, axes=None, chain_label: str = "single draft chain",
                 title: str | None = None) -> Figure:
    """Tau and target forwards per token vs the tree budget, DDTree vs the single draft chain.

    rows: list of dicts ``{"budget", "tree_tau", "tree_fpt", "chain_tau", "chain_fpt"}`` (as ``sweep_rows``
    returns; the chain values are the same in every row, the first finite one is drawn). DDTree is a solid line
    with filled circles; the chain a dashed line with hollow squares at the same budgets, so neither hides the
    other where they meet. chain_label: the chain's legend name; title: a figure title (the fpt panel says
    what was averaged when rows carry ``"prompts"``). axes: two Axes to draw into; path: save there."""
    need = ("budget", "tree_tau", "tree_fpt", "chain_tau", "chain_fpt")
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, dict) and all(k in r for k in need)
                                                      for r in rows):
        raise ValueError(f"rows: expected a list of dicts with {', '.join(need)} (as sweep_rows returns), got "
                         f"{str(rows)[:80]}")
    rows = sorted(rows, key=lambda r: r["budget"])
    fig, (a1, a2) = _new(2, (9.6, 3.9), axes)
    if not any(r["budget"] > 0 for r in rows):           # the budget axis is logarithmic: budget 0 has no place
        _empty(a1, "no rows with a budget > 0" if rows else "no rows")
        _empty(a2, "")
        save(fig, path)
        return fig
    b = np.array([float(r["budget"]) for r in rows])
    positive = b > 0
    bp = b[positive]
    for ax, key, ylabel, title_ in ((a1, "tau", "mean tokens per round (\u03c4)", "Acceptance length \u03c4"),
                                    (a2, "fpt", "target forwards per generated token", "Target forwards per token")):
        _style(ax, "both")
        tree = np.array([float(r[f"tree_{key}"]) for r in rows])
        chain = [float(r.get(f"chain_{key}", math.nan)) for r in rows]
        chain = next((c for c in chain if math.isfinite(c)), math.nan)
        if key == "fpt":
            ax.axhline(1.0, color="#80868b", ls=":", lw=1.4, label="autoregressive (1 per token)", zorder=1)
        tp = tree[positive]
        if math.isfinite(chain):
            ax.plot(bp, np.full(bp.size, chain), color=CHAIN_COLOUR, ls=(0, (5, 3)), lw=1.8, marker="s", ms=6.5,
                    markerfacecolor="white", markeredgewidth=1.5, label=chain_label, zorder=2)
            # the chain's value: between two middle markers, on the side away from the DDTree line
            m = max(bp.size // 2 - 1, 0)
            xm = math.sqrt(bp[m] * bp[min(m + 1, bp.size - 1)])
            above = bp.size == 0 or float(np.interp(math.log2(xm), np.log2(bp), tp)) <= chain
            ax.annotate(f"{chain:.2f}", (xm, chain), xytext=(0, 5 if above else -5), textcoords="offset points",
                        ha="center", va="bottom" if above else "top", fontsize=7.5, color=CHAIN_COLOUR,
                        fontweight="bold")
        ax.plot(bp, tp, color=TREE_COLOUR, marker="o", lw=2.2, ms=5, label="DDTree", zorder=3)
        for x, y in zip(bp, tp):
            up = y >= chain if math.isfinite(chain) else key == "tau"       # DDTree labels away from the chain
            ax.annotate(f"{y:.2f}", (x, y), xytext=(0, 6 if up else -6), textcoords="offset points",
                        ha="center", va="bottom" if up else "top", fontsize=7, color=TREE_COLOUR)
        if key == "fpt":
            ax.set_ylim(0, max(1.08, float(np.nanmax(tree)) * 1.1, chain * 1.1 if math.isfinite(chain) else 0))
        else:
            top = max(float(np.nanmax(tree)), chain if math.isfinite(chain) else 0, 1.0)
            ax.set_ylim(0, top * 1.2)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(bp))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(round(v))}"))
        if positive.any():
            ax.set_xlim(bp.min() / 1.35, bp.max() * 1.35)
        _label(ax, "tree budget (nodes per round, log\u2082 scale)", ylabel, title_)
    if title:
        fig.suptitle(title, fontsize=10, x=0.01, ha="left", color="#202124")
    handles, names = a2.get_legend_handles_labels()
    order = [names.index(n) for n in ("DDTree", chain_label, "autoregressive (1 per token)") if n in names]
    handles, names = [handles[k] for k in order], [names[k] for k in order]
    if axes is None:
        fig.legend(handles, names, loc="outside lower center", ncol=len(names), frameon=False, fontsize=8.5)
    else:
        a2.legend(handles, names, fontsize=8, frameon=False)
    save(fig, path)
    return fig


# ---------------------------------------------------------------------------------------------- stage times
def stage_times(gen, path=None, axes=None, note: str | None = None) -> Figure:
    """Per-round stacked bars of the stage times (ms), plus the total per stage with its share.

    Stages, bottom to top: draft, topk, build, verify, accept, compact (``RoundTrace.times``: device clock stamps
    on a GPU, kernels/stamp.py; the host clock on the NumPy backend). note: appended to the
    left panel's title in parentheses (e.g. the backend the times were taken on); axes: two Axes to draw into;
    path: save there."""
    R = len(_args.generation(gen).rounds)
    fig, (a1, a2) = _new(2, (10.5, 3.8), axes, ratios=[2.6, 1])
    for a in (a1, a2):
        _style(a)
    if not R:
        _empty(a1, "no DDTree rounds (autoregressive decoding)")
        _empty(a2, "")
        save(fig, path)
        return fig
    x = np.arange(1, R + 1)
    bottom = np.zeros(R)
    for s in STAGES:
        v = np.array([r.times.get(s, 0.0) for r in gen.rounds])
        a1.bar(x, v, bottom=bottom, color=STAGE_COLOURS[s], width=0.8 if R < 60 else 1.0, label=s,
               edgecolor="white" if R < 60 else "none", linewidth=0.4)
        bottom += v
    a1.set_xlim(0.3, R + 0.7)
    a1.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=12))
    a1.legend(fontsize=8, frameon=False, ncol=len(STAGES), loc="upper center", bbox_to_anchor=(0.5, 1.0))
    a1.set_ylim(0, bottom.max() * 1.22 if bottom.max() > 0 else 1)
    _label(a1, "round", "milliseconds", f"Stage times per round ({R} rounds" + (f"; {note})" if note else ")"))
    tot = gen.stage_totals()
    vals = np.array([tot[s] for s in STAGES])
    total = vals.sum()
    y = np.arange(len(STAGES))[::-1]
    a2.barh(y, vals, color=[STAGE_COLOURS[s] for s in STAGES], height=0.65)
    a2.set_yticks(y)
    a2.set_yticklabels(STAGES, fontsize=8.5)
    a2.grid(axis="y", visible=False)
    a2.grid(axis="x", color=GRID)
    for yy, v in zip(y, vals):
        share = v / total * 100 if total > 0 else 0.0
        a2.annotate(f"{v:.1f} ms  ({share:.0f}%)", (v, yy), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=7.5, color=MUTED_TEXT)
    a2.set_xlim(0, vals.max() * 1.6 if vals.max() > 0 else 1)
    _label(a2, "milliseconds (all rounds)", "", f"Total {total:.1f} ms")
    save(fig, path)
    return fig
