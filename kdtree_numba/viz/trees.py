"""Draw one DDTree round: the draft tree, the path the target accepted and the bonus token.

How to read a tree picture (the HTML viewer of ``viz.html`` follows the same conventions):
  * Depth runs left to right: the root (the last committed token, depth 0) sits on the left, a node at depth d
    is a guess for the token d positions after the root.
  * Siblings are stacked top to bottom by rank: the drafter's most probable continuation is on top. Every
    subtree owns its own horizontal band, so nothing overlaps however large the tree.
  * A node's fill is its cumulative draft probability ``exp(logw)`` (the product of the draft probabilities
    along its path; blue, log scale, the colorbar), the quantity the best-first build ranks nodes by. An
    edge's width is the node's own conditional draft probability ``exp(logw[child] - logw[parent])``.
  * The accepted path is drawn thick in orange, from the root to the last node whose token the target also
    chose. The dashed orange circle after it is the bonus token: the target's own choice at the first
    position the tree got wrong (or ran out of depth). Everything else, the rejected drafts, is greyed.
  * Large trees are collapsed: beyond ``max_nodes`` only the most probable nodes and the accepted path are
    drawn; a grey ``+k`` next to a node counts the k less probable nodes hidden below it.

Example::

    fig = viz.plot_tree(gen.rounds[0], vocab_size=256, path="round0.png")      # a byte-level model
    fig = viz.plot_tree(gen.rounds[0], tokenizer=target.tokenizer)          # decoded tokens (default model)
    fig = viz.plot_rounds(gen.rounds, n=4, path="rounds.png")
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import re

import numpy as np
from matplotlib import patheffects
from matplotlib.colors import LinearSegmentedColormap, LogNorm, to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..atomic_file import write_atomic
from ..kernels import _checks
from . import _args
from .labels import shorten, token_label, visible

# ---------------------------------------------------------------------------------------------- conventions
# Shared with viz.html (the HTML viewer draws with exactly these colours and widths).
ACCENT = "#e8590c"          # the accepted path and the bonus token
REJECTED_EDGE = "#c3c7cc"   # edges into rejected nodes
REJECTED_LINE = "#9aa0a6"   # outline of rejected nodes
MUTED_TEXT = "#5f6368"
GRID = "#eef0f2"
FADE_TO = "#f4f5f7"         # rejected nodes' fill is blended halfway to this
FADE = 0.55
PROB_MIN = 1e-3             # colour scale: cumulative draft probability 1e-3 .. 1, log scale
CMAP = LinearSegmentedColormap.from_list(
    "kd_blues", ["#e3eefa", "#a9cbee", "#5b9bd5", "#2767b0", "#0b3a7a"])
NORM = LogNorm(vmin=PROB_MIN, vmax=1.0, clip=True)
DEFAULT_MAX_NODES = 64


def edge_width(cond: float, accepted: bool) -> float:
    """Edge width in points (pixels in the HTML) for a node of conditional draft probability ``cond``."""
    return (2.4 if accepted else 0.6) + 3.4 * float(min(max(cond, 0.0), 1.0))


def node_fill(cum: float, accepted: bool) -> str:
    """Fill colour (hex) of a node of cumulative draft probability ``cum``; rejected nodes are faded.

    Same colour as ``CMAP(NORM(cum))`` (the colormap's lookup-table entry), without the per-call cost of a
    matplotlib norm: trees have thousands of nodes."""
    cum = float(cum)
    t = (math.log10(max(cum, PROB_MIN)) - math.log10(PROB_MIN)) / -math.log10(PROB_MIN) if cum == cum else 0.0
    return _fill(min(int(min(max(t, 0.0), 1.0) * CMAP.N), CMAP.N - 1), bool(accepted))


@functools.lru_cache(maxsize=None)
def _fill(index: int, accepted: bool) -> str:
    rgb = np.array(CMAP(index)[:3])
    if not accepted:
        rgb = (1 - FADE) * rgb + FADE * np.array(to_rgb(FADE_TO))
    return to_hex(rgb)


def text_colour(fill: str, accepted: bool) -> str:
    """Label colour that stays legible on ``fill``."""
    r, g, b = to_rgb(fill)
    if 0.299 * r + 0.587 * g + 0.114 * b < 0.55:
        return "#ffffff"
    return "#1d1f21" if accepted else MUTED_TEXT


def save(fig: Figure, path) -> None:
    """Save ``fig`` to ``path`` (format from the extension: .png, .svg, .pdf, or another that matplotlib writes),
    creating the folder; the file appears whole or not at all (atomic_file)."""
    if path is None:
        return
    ext = os.path.splitext(os.fspath(path))[1].lower().lstrip(".")
    kinds = fig.canvas.get_supported_filetypes()
    if ext not in kinds:
        raise ValueError(f"path: expected a file name ending in .png, .svg, .pdf (or {', '.join(sorted(kinds))}),"
                         f" got {os.fspath(path)!r}")
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=150, bbox_inches="tight", facecolor="white"))


# ---------------------------------------------------------------------------------------------- layout
@dataclasses.dataclass
class TreeLayout:
    """Where every node of one round goes. Arrays are indexed by node (0 = root, 1..n = ``tree.tokens``).

    x = depth; y = vertical slot (0 at the top, increasing downward; a parent sits midway between its first and
    last child). ``shown``: drawn (False = collapsed); ``hidden_under[i]``: collapsed nodes whose nearest drawn
    ancestor is i (drawn as ``+k``; ``more_y[i]`` is its own slot, or NaN when written beside node i);
    ``rank[i]``: 0-based position among its siblings (0 = most probable), ``n_sib[i]``: number of siblings
    including itself; ``cond`` / ``cum``: conditional / cumulative draft probability; ``on_path``: accepted.
    ``bonus_xy``: where the bonus node goes; ``slots``: height of the drawing in slots."""
    n: int
    parents: np.ndarray
    x: np.ndarray
    y: np.ndarray
    shown: np.ndarray
    hidden_under: np.ndarray
    more_y: np.ndarray
    rank: np.ndarray
    n_sib: np.ndarray
    cond: np.ndarray
    cum: np.ndarray
    logw: np.ndarray
    on_path: np.ndarray
    bonus_xy: tuple[float, float]
    slots: int

    @property
    def drawn_nodes(self) -> int:
        """Tree nodes drawn, not counting the root and the bonus."""
        return int(self.shown[1:].sum())

    @property
    def max_x(self) -> float:
        return float(max(self.bonus_xy[0], self.x[self.shown].max(initial=0)))


def layout_tree(rt, max_nodes: int | None = DEFAULT_MAX_NODES) -> TreeLayout:
    """Tidy layout of ``rt.tree`` (a RoundTrace): depth on x, siblings by rank on y, one band per subtree.

    max_nodes: when the tree has more nodes, draw only the ``max_nodes`` most probable (highest ``logw``)
    plus the accepted path; None draws every node."""
    tree = rt.tree
    n = tree.n
    parents = np.asarray(tree.parents, np.int64)
    depth = np.concatenate([[0], np.asarray(tree.depths, np.int64)])
    logw = np.concatenate([[0.0], np.asarray(tree.logw, np.float64)])
    cum = np.exp(logw)
    cond = np.ones(n + 1)
    if n:
        cond[1:] = np.exp(logw[1:] - logw[parents[1:]])
    children: list[list[int]] = [[] for _ in range(n + 1)]
    rank = np.zeros(n + 1, np.int64)
    for i in range(1, n + 1):                       # pop order = rank order among siblings
        rank[i] = len(children[parents[i]])
        children[parents[i]].append(i)
    n_sib = np.ones(n + 1, np.int64)
    for i in range(1, n + 1):
        n_sib[i] = len(children[parents[i]])
    accepted = [int(a) for a in rt.accepted] or [0]
    on_path = np.zeros(n + 1, bool)
    on_path[accepted] = True

    shown = np.ones(n + 1, bool)
    if max_nodes is not None and n > max_nodes:
        shown[:] = False
        best = np.argsort(-logw[1:], kind="stable")[:max(int(max_nodes), 0)] + 1
        for i in list(best) + accepted + [0]:       # close under ancestors (a drawn node's parent is drawn)
            while i >= 0 and not shown[i]:
                shown[i] = True
                i = int(parents[i])
    hidden_under = np.zeros(n + 1, np.int64)
    for i in range(1, n + 1):
        if not shown[i]:
            a = int(parents[i])
            while not shown[a]:
                a = int(parents[a])
            hidden_under[a] += 1

    # children to lay out, top to bottom: the bonus (after the last accepted node), drawn children by rank,
    # then a "+k" slot when the node also has drawn children (a drawn leaf gets "+k" written beside it).
    last = accepted[-1]
    BONUS, MORE = -1, -2
    kids: list[list[tuple[int, int]]] = [[] for _ in range(n + 1)]
    for v in range(n + 1):
        if not shown[v]:
            continue
        ks = [(BONUS, v)] if v == last else []
        ks += [(c, c) for c in children[v] if shown[c]]
        if hidden_under[v] and ks:
            ks.append((MORE, v))
        kids[v] = ks
    y = np.full(n + 1, np.nan)
    more_y = np.full(n + 1, np.nan)
    bonus_y = math.nan
    slot = 0
    stack = [((0, 0), False)]                       # iterative post-order walk (trees can be deep)
    while stack:
        (kind, v), done = stack.pop()
        if kind == BONUS or kind == MORE or not kids[v]:
            if kind == BONUS:
                bonus_y = slot
            elif kind == MORE:
                more_y[v] = slot
            else:
                y[v] = slot
            slot += 1
        elif done:
            ends = [bonus_y if k == BONUS else more_y[p] if k == MORE else y[k] for k, p in (kids[v][0], kids[v][-1])]
            y[v] = (ends[0] + ends[1]) / 2          # midway between the first and the last child
        else:
            stack.append(((kind, v), True))
            stack.extend((kid, False) for kid in reversed(kids[v]))
    return TreeLayout(n, parents, depth.astype(float), y, shown, hidden_under, more_y, rank, n_sib, cond, cum,
                      logw, on_path, (float(depth[last] + 1), float(bonus_y)), max(slot, 1))


# ---------------------------------------------------------------------------------------------- drawing
def _legend_handles(collapsed: bool) -> list:
    h = [Line2D([], [], color=ACCENT, lw=3.2, marker="o", markersize=8, markerfacecolor=CMAP(0.8),
                markeredgecolor=ACCENT, markeredgewidth=2, label="accepted path"),
         Line2D([], [], color="none", marker="o", markersize=9, markerfacecolor="white", markeredgecolor=ACCENT,
                markeredgewidth=1.6, linestyle="none", label="bonus (the target's token)"),
         Line2D([], [], color=REJECTED_EDGE, lw=2, marker="o", markersize=8,
                markerfacecolor=node_fill(0.05, False), markeredgecolor=REJECTED_LINE, label="rejected drafts")]
    if collapsed:
        h.append(Line2D([], [], color="none", marker="$+k$", markersize=14, markeredgewidth=0.3,
                        markerfacecolor=MUTED_TEXT, markeredgecolor=MUTED_TEXT, linestyle="none",
                        label="k collapsed nodes"))
    return h


def node_label(tok: int, vocab_size: int, tokenizer=None, limit: int = 9) -> str:
    """The label a tree node shows: ``token_label`` with long runs of visible spaces counted (``⏎·×8`` for a
    newline and eight spaces of indentation) and cut to ``limit`` characters."""
    lab = token_label(tok, vocab_size, tokenizer)
    if tokenizer is not None:
        lab = re.sub("\u00b7{4,}", lambda m: f"\u00b7\u00d7{len(m.group(0))}", lab)
    return shorten(lab, limit)


def _draw(ax, rt, vocab_size: int, max_nodes, title, tokenizer=None) -> TreeLayout:
    lay = layout_tree(rt, max_nodes)
    n, par = lay.n, lay.parents
    fig = ax.figure
    bx, by = lay.bonus_xy
    ncols = lay.max_x + 1
    # sizes in points from the axes' size: node diameter fits one slot and one column
    pos = ax.get_position()
    w_in, h_in = fig.get_size_inches()
    slot_pt = pos.height * h_in * 72 / (lay.slots + 0.4)
    col_pt = pos.width * w_in * 72 / (ncols + 0.3)
    diam = float(np.clip(min(0.84 * slot_pt, 0.42 * col_pt), 3.0, 26.0))

    for d in range(int(ncols)):
        ax.axvline(d, color=GRID, lw=1.0, zorder=0)

    # edges
    for i in range(1, n + 1):
        if not lay.shown[i]:
            continue
        p = par[i]
        acc = bool(lay.on_path[i])
        ax.plot([lay.x[p], lay.x[i]], [lay.y[p], lay.y[i]], color=ACCENT if acc else REJECTED_EDGE,
                lw=edge_width(lay.cond[i], acc) * (1 if diam > 8 else 0.6), solid_capstyle="round",
                zorder=2.5 if acc else 1)
    last = [a for a in rt.accepted][-1] if len(rt.accepted) else 0
    ax.plot([lay.x[last], bx], [lay.y[last], by], color=ACCENT, lw=2.0, ls=(0, (3, 2)), zorder=2.4)

    # labels: inside the circles when they fit, else (long labels) over them with a halo, else none
    idx = np.nonzero(lay.shown)[0]
    labels = {int(i): node_label(int(rt.tree.tokens[i - 1]) if i else int(rt.root), vocab_size, tokenizer)
              for i in idx}
    blab = node_label(int(rt.bonus), vocab_size, tokenizer)
    longest = max([len(s) for s in labels.values()] + [len(blab), 1])
    font = min(8.5, 0.92 * diam / (0.62 * max(longest, 1.7)))
    halo = font < 5.5
    if halo:
        font = min(8.0, 0.75 * slot_pt, 0.8 * col_pt / (0.62 * longest))

    # "+k" markers for collapsed nodes
    k_font = float(np.clip(diam * 0.42, 5.0, 8.0))
    for v in np.nonzero(lay.hidden_under)[0]:
        k = int(lay.hidden_under[v])
        if np.isnan(lay.more_y[v]):
            half = max(diam, 0.62 * font * len(labels[int(v)]) if halo and font >= 4.6 else 0) / 2
            ax.annotate(f"+{k}", (lay.x[v], lay.y[v]), xytext=(half + 2, 0), textcoords="offset points",
                        ha="left", va="center", fontsize=k_font, color=MUTED_TEXT, style="italic", zorder=4,
                        in_layout=False)
        else:
            my = lay.more_y[v]
            ax.plot([lay.x[v], lay.x[v] + 0.55], [lay.y[v], my], color=REJECTED_EDGE, lw=0.9, ls=":", zorder=1)
            ax.text(lay.x[v] + 0.58, my, f"+{k}", ha="left", va="center", fontsize=k_font, color=MUTED_TEXT,
                    style="italic", zorder=4, in_layout=False)

    # nodes: rejected first, then the accepted path on top
    acc = lay.on_path[idx]
    fills = [node_fill(lay.cum[i], lay.on_path[i]) for i in idx]
    edge_c = [ACCENT if a else REJECTED_LINE for a in acc]
    edge_w = [2.2 if a else 0.8 for a in acc]
    if diam <= 8:
        edge_w = [w * 0.5 for w in edge_w]
    order = np.argsort(acc, kind="stable")
    ax.scatter(lay.x[idx][order], lay.y[idx][order], s=diam ** 2, c=[fills[j] for j in order],
               edgecolors=[edge_c[j] for j in order], linewidths=[edge_w[j] for j in order], zorder=3)
    # the bonus: white, dashed orange outline
    ax.scatter([bx], [by], s=diam ** 2, c="white", edgecolors=ACCENT, linewidths=1.8 if diam > 8 else 1.0,
               linestyle=(0, (2.2, 1.4)), zorder=3)

    label_w = 0.62 * font * len(blab)
    if font >= 4.6:
        fx = [patheffects.withStroke(linewidth=2.2, foreground="white")] if halo else None
        dark_fx = [patheffects.withStroke(linewidth=2.4, foreground="#0b2a55")] if halo else None
        for i in idx:
            f = node_fill(lay.cum[i], lay.on_path[i])
            colour = text_colour(f, bool(lay.on_path[i]))
            dark = colour == "#ffffff"
            if halo:                                # overflowing labels: a halo keeps them legible anywhere
                colour = "#ffffff" if dark else "#1d1f21"
            ax.text(lay.x[i], lay.y[i], labels[int(i)], ha="center", va="center", fontsize=font,
                    family="DejaVu Sans Mono", color=colour, path_effects=dark_fx if dark else fx,
                    fontweight="bold" if lay.on_path[i] else "normal", zorder=5, in_layout=False)
        ax.text(bx, by, blab, ha="center", va="center", fontsize=font, family="DejaVu Sans Mono", color=ACCENT,
                fontweight="bold", zorder=5, path_effects=fx)
    # bonus caption: its draft probability (how likely the drafter thought the target's token was)
    dp = rt.draft_probs[len(rt.accepted) - 1] if len(rt.draft_probs) >= len(rt.accepted) > 0 else math.nan
    cap = "bonus" + ("" if math.isnan(dp) else f"\ndraft p={dp:.2g}")
    if diam >= 7:
        off = max(diam, label_w if font >= 4.6 else 0) / 2 + 3
        ax.annotate(cap, (bx, by), xytext=(off, 0), textcoords="offset points", ha="left",
                    va="center", fontsize=6.5, color=ACCENT, zorder=5, linespacing=0.95)

    # axes dressing
    ax.set_xlim(-0.5, lay.max_x + 0.85)
    ax.set_ylim(lay.slots - 0.4, -0.6)
    ax.set_xticks(range(int(ncols)))
    ax.set_xticklabels(["root"] + [str(d) for d in range(1, int(ncols))], fontsize=8, color=MUTED_TEXT)
    ax.set_xlabel("depth (tokens after the root)", fontsize=8.5, color=MUTED_TEXT)
    ax.set_yticks([])
    ax.tick_params(axis="x", length=0)
    for s in ("left", "right", "top", "bottom"):
        ax.spines[s].set_visible(False)
    if title is None:
        title = (f"round at position {rt.start}: {n} drafted nodes, {len(rt.accepted) - 1} accepted + bonus"
                 + accepted_caption(rt, vocab_size, tokenizer))
    if title:
        ax.set_title(title, fontsize=9.5, loc="left", color="#202124")
    ax.kd_drawn_nodes = lay.drawn_nodes
    ax.kd_hidden_nodes = int(lay.hidden_under.sum())
    return lay


def accepted_caption(rt, vocab_size: int, tokenizer=None, limit: int = 90) -> str:
    """``'\naccepted “…” + bonus “…”'``: the round's accepted text and bonus token, whitespace visible (empty when
    tokens have no text: no tokenizer and not byte-level)."""
    toks = rt.accepted_tokens
    if tokenizer is not None:
        acc = visible(tokenizer.decode(toks))
        bonus = token_label(int(rt.bonus), vocab_size, tokenizer)
    elif vocab_size == 256:
        acc = "".join(token_label(t, vocab_size) for t in toks)
        bonus = token_label(int(rt.bonus), vocab_size)
    else:
        return ""
    return f"\naccepted \u201c{shorten(acc, limit)}\u201d + bonus \u201c{shorten(bonus, 16)}\u201d"


def _colorbar(fig, axes) -> None:
    from matplotlib.cm import ScalarMappable

    sm = ScalarMappable(norm=NORM, cmap=CMAP)
    cb = fig.colorbar(sm, ax=axes, fraction=0.035, pad=0.015, aspect=30)
    cb.set_label("cumulative draft probability exp(logw)", fontsize=8, color=MUTED_TEXT)
    cb.set_ticks([1e-3, 1e-2, 1e-1, 1])
    cb.set_ticklabels(["0.001", "0.01", "0.1", "1"])
    cb.ax.tick_params(labelsize=7.5, colors=MUTED_TEXT, length=2)
    cb.outline.set_visible(False)


def _auto_size(lay_slots: int, ncols: float) -> tuple[float, float]:
    return (float(np.clip(1.9 + 0.95 * ncols, 6.0, 16.0)), float(np.clip(1.8 + 0.22 * lay_slots, 3.6, 15.0)))


def plot_tree(round_trace, vocab_size: int = 256, ax=None, path=None, max_nodes: int | None = None,
              title: str | None = None, tokenizer=None) -> Figure:
    """Draw one round's draft tree with the accepted path and the bonus token (see the module docstring).

    round_trace: a ``RoundTrace`` (``gen.rounds[i]``); vocab_size: 256 labels nodes with their characters,
    other sizes with token ids; tokenizer: label nodes with decoded tokens instead (``target.tokenizer``; long
    tokens are cut to 9 characters, runs of indentation counted: ``⏎·×8``); ax: draw into this matplotlib Axes
    (no colorbar/legend added) instead of a new figure; path: also save the figure there (.png / .svg / .pdf);
    max_nodes: draw at most this many tree nodes plus the accepted path, collapsing the less probable ones into
    ``+k`` markers (None: 64; a number >= the tree size draws everything); title: the axes title (None: a summary
    of the round with its accepted text, "" for none).

    Returns the Figure; ``fig.kd_drawn_nodes`` / ``fig.kd_hidden_nodes`` say how many tree nodes (root and
    bonus excluded) were drawn / collapsed."""
    from ..decode.trace import RoundTrace

    if not isinstance(round_trace, RoundTrace):
        raise ValueError(f"round_trace: expected a RoundTrace (a Generation's rounds[i]), got "
                         f"{type(round_trace).__name__}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size: expected a positive integer (256: byte labels), got {vocab_size!r}")
    _args.axes(ax)
    _args.tokenizer(tokenizer)
    max_nodes = DEFAULT_MAX_NODES if max_nodes is None else max_nodes
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 0:
        raise ValueError(f"max_nodes: expected an integer >= 0 or None, got {max_nodes!r}")
    if ax is None:
        probe = layout_tree(round_trace, max_nodes)
        fig = Figure(figsize=_auto_size(probe.slots, probe.max_x + 1), layout="constrained")
        ax = fig.add_subplot()
        fig.get_layout_engine().execute(fig)       # settle the axes size before sizing the nodes
        _colorbar(fig, ax)
        fig.get_layout_engine().execute(fig)
        _draw(ax, round_trace, vocab_size, max_nodes, title, tokenizer)
        collapsed = ax.kd_hidden_nodes > 0
        fig.legend(handles=_legend_handles(collapsed), loc="outside lower center", ncol=4, frameon=False,
                   fontsize=8)
    else:
        fig = ax.figure
        _draw(ax, round_trace, vocab_size, max_nodes, title, tokenizer)
    fig.kd_drawn_nodes = ax.kd_drawn_nodes
    fig.kd_hidden_nodes = ax.kd_hidden_nodes
    save(fig, path)
    return fig


def showcase_rounds(rounds) -> list[int]:
    """Indices of two rounds worth drawing: a typical one (its accepted length is the median, the one nearest the
    middle of the generation) and the best (the most tokens accepted; the earliest such), in generation order.
    One index when they coincide, none for no rounds. rounds: a Generation or a list of RoundTrace."""
    rounds = _args.rounds(rounds)
    if not rounds:
        return []
    m = np.array([len(r.accepted) for r in rounds])
    best = int(np.argmax(m))
    med = int(np.sort(m)[(len(m) - 1) // 2])
    cands = [i for i in range(len(m)) if m[i] == med and i != best] or [best]
    typical = min(cands, key=lambda i: abs(i - (len(m) - 1) / 2))
    return sorted({typical, best})


MAX_FIG_WIDTH = 12.0        # inches: 1800 px at the 150 dpi ``save`` uses
STRIP_MAX_NODES = 32        # plot_rounds' default collapse: the strip stays compact and its labels legible


def plot_rounds(rounds, vocab_size: int = 256, n: int = 4, path=None, max_nodes: int | None = None,
                tokenizer=None, picks=None) -> Figure:
    """Several rounds in one figure, sharing one colour scale and legend.

    rounds: a list of ``RoundTrace`` or a ``Generation``; n: how many rounds to show (evenly spaced over the
    generation, first and last included); picks: the round indices to show instead (0-based, in this order);
    vocab_size / tokenizer / max_nodes: as in ``plot_tree`` (max_nodes None: 32 per panel). Panels sit side by
    side while they fit in 12 inches (1800 px as saved) and wrap onto more rows when they do not. Titles count
    rounds from 1. path: save there. ``fig.kd_drawn_nodes`` is the list of drawn node counts, one per panel."""
    rounds = _args.rounds(rounds)
    _checks.integer(vocab_size, "vocab_size", lo=1)
    _args.tokenizer(tokenizer)
    if picks is None:
        n = _checks.integer(n, "n", lo=1)
    elif not (isinstance(picks, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool)
                                                       for i in picks)):
        raise ValueError(f"picks: expected a list of round indices, got {picks!r}")
    if not rounds:
        fig = Figure(figsize=(6, 2.5))
        ax = fig.add_subplot()
        ax.text(0.5, 0.5, "no DDTree rounds (autoregressive decoding)", ha="center", va="center",
                color=MUTED_TEXT)
        ax.set_axis_off()
        fig.kd_drawn_nodes = []
        save(fig, path)
        return fig
    if picks is None:
        n = min(n, len(rounds))
        picks = sorted({int(round(x)) for x in np.linspace(0, len(rounds) - 1, n)})
    else:
        picks = [int(i) for i in picks]
        bad = [i for i in picks if not 0 <= i < len(rounds)]
        if bad or not picks:
            raise ValueError(f"picks: round {bad[0] if bad else 'list'} outside [0, {len(rounds)})"
                             if bad else "picks: expected at least one round index")
    mx = max_nodes if max_nodes is not None else STRIP_MAX_NODES
    lays = [layout_tree(rounds[i], mx) for i in picks]
    slots = max(l.slots for l in lays)
    cols = max(l.max_x for l in lays) + 1
    panel_w = float(np.clip(0.52 * cols + 1.0, 3.6, MAX_FIG_WIDTH - 1.0))
    per_row = max(1, min(len(picks), int((MAX_FIG_WIDTH - 1.0) // panel_w)))
    nrows = -(-len(picks) // per_row)
    panel_h = float(np.clip(1.4 + 0.19 * slots, 3.0, 9.0))
    fig = Figure(figsize=(min(panel_w * per_row + 1.0, MAX_FIG_WIDTH), panel_h * nrows + 0.6),
                 layout="constrained")
    grid = fig.subplots(nrows, per_row, squeeze=False)
    axes = list(grid.ravel())
    for ax in axes[len(picks):]:
        ax.set_axis_off()
    axes = axes[:len(picks)]
    fig.get_layout_engine().execute(fig)
    _colorbar(fig, list(grid.ravel()))
    fig.get_layout_engine().execute(fig)
    drawn, collapsed = [], False
    for ax, i in zip(axes, picks):
        r = rounds[i]
        t = (f"round {i + 1}/{len(rounds)}: {len(r.accepted) - 1} of {r.tree.n} drafts accepted + bonus"
             + accepted_caption(r, vocab_size, tokenizer, limit=int(panel_w * 9)))
        _draw(ax, r, vocab_size, mx, t, tokenizer)
        drawn.append(ax.kd_drawn_nodes)
        collapsed |= ax.kd_hidden_nodes > 0
    fig.legend(handles=_legend_handles(collapsed), loc="outside lower center", ncol=4, frameon=False, fontsize=8)
    fig.kd_drawn_nodes = drawn
    save(fig, path)
    return fig
