"""A self-contained HTML page that steps through the rounds of one generation.

``write_html(gen, "trace.html")`` writes ONE file: inline CSS, inline JavaScript and the trace as JSON, no
network access, no external files; open it in any browser. What the page shows, for the round selected with
Prev / Next, the slider or the arrow keys (Home / End jump to the first / last round; ``page.html#round=3``
opens round 3, counting from 1 as the page does):
  * the round's draft tree, drawn with the conventions of ``viz.trees.plot_tree`` (depth left to right, siblings
    top to bottom by rank, fill = cumulative draft probability on the same blue log scale, edge width =
    conditional draft probability, the accepted path thick orange, the bonus token a dashed orange circle,
    rejected drafts greyed). Every node is drawn (the page scrolls; "fit" shrinks the tree to the window).
    Hover a node for its token, rank among its siblings, depth, conditional draft probability and
    cumulative weight ``logw``;
  * the text so far: the prompt greyed, earlier output plain, this round's accepted tokens highlighted in orange
    and its bonus token outlined;
  * the round's stage times (draft / build / verify / accept / compact) as one stacked bar.
Tokens read as in the PNG figures: decoded text when ``tokenizer=`` is given (``target.tokenizer``), else bytes
(``vocab_size=256``) or ids.

Markup a test can rely on: tree nodes are ``<circle class="node ...">`` (the root too; ``accepted`` on the
accepted path, root included), the bonus is ``<circle class="bonus">``, edges are ``<line class="edge ...">``;
``#tree`` (the SVG) carries ``data-round`` (0-based) and ``data-nodes`` (tree nodes of that round, root and
bonus excluded); the trace is in ``<script type="application/json" id="kd-data">``.
The page's markup, style and script are plain files in ``viz/assets/`` (viewer.html with ``%FIELD%`` slots,
viewer.css, viewer.js), inlined into each page written.
"""
from __future__ import annotations

import html as _html
import json
import math
import os
import re

import numpy as np
from matplotlib.colors import to_hex

from ..atomic_file import write_text_atomic
from ..decode.trace import STAGES
from ..kernels import _checks
from . import _args
from .labels import token_label, token_piece
from .rounds import STAGE_COLOURS
from .trees import (ACCENT, CMAP, FADE_TO, GRID, MUTED_TEXT, NORM, REJECTED_EDGE, REJECTED_LINE, edge_width,
                    layout_tree, node_fill, node_label, text_colour)

_ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")


def _num(x, nd: int = 6):
    """A JSON-safe float (NaN / inf -> None), rounded to keep the file small."""
    x = float(x)
    return round(x, nd) if math.isfinite(x) else None


def _round_data(rt, vocab_size: int, prompt_len: int, tokenizer=None) -> dict:
    lay = layout_tree(rt, None)
    tokens = rt.tree.tokens
    nodes = []
    for i in range(lay.n + 1):
        tok = int(rt.root) if i == 0 else int(tokens[i - 1])
        acc = bool(lay.on_path[i])
        fill = node_fill(lay.cum[i], acc)
        nodes.append({"x": _num(lay.x[i], 3), "y": _num(lay.y[i], 3), "tok": tok,
                      "label": token_label(tok, vocab_size, tokenizer),
                      "short": node_label(tok, vocab_size, tokenizer, limit=12), "p": int(lay.parents[i]),
                      "d": int(lay.x[i]), "rank": int(lay.rank[i]), "nsib": int(lay.n_sib[i]),
                      "cond": _num(lay.cond[i]), "logw": _num(lay.logw[i]), "acc": acc, "fill": fill,
                      "tc": text_colour(fill, acc), "w": _num(edge_width(lay.cond[i], acc), 3)})
    m = len(rt.accepted)
    dp = rt.draft_probs[m - 1] if len(rt.draft_probs) >= m > 0 else math.nan
    bx, by = lay.bonus_xy
    return {"start": int(rt.start), "first": int(rt.start) - prompt_len, "n": lay.n, "slots": int(lay.slots),
            "maxx": _num(lay.max_x, 3), "accepted": [int(a) for a in rt.accepted], "nodes": nodes,
            "bonus": {"x": _num(bx, 3), "y": _num(by, 3), "tok": int(rt.bonus),
                      "label": token_label(int(rt.bonus), vocab_size, tokenizer),
                      "short": node_label(int(rt.bonus), vocab_size, tokenizer, limit=12),
                      "p": int(rt.accepted[-1]) if m else 0,
                      "draft_p": _num(dp)},
            "times": {s: _num(rt.times.get(s, 0.0), 4) for s in STAGES}}


def _data(gen, vocab_size: int, tokenizer=None) -> dict:
    P = len(gen.prompt)
    pieces = lambda toks: [[token_piece(int(t), vocab_size, tokenizer),
                            tokenizer is None and token_label(int(t), vocab_size).startswith("\\x")] for t in toks]
    ramp = [to_hex(CMAP(NORM(10 ** e))) for e in np.linspace(-3, 0, 9)]
    s = dict(gen.settings or {})
    return {"settings": {k: (_num(v) if isinstance(v, float) else v) for k, v in s.items()},
            "vocab_size": int(vocab_size), "prompt": pieces(gen.prompt), "tokens": pieces(gen.tokens),
            "target_forwards": int(gen.target_forwards), "tau": _num(gen.acceptance_length, 4),
            "fpt": _num(gen.forwards_per_token, 4),
            "rounds": [_round_data(r, vocab_size, P, tokenizer) for r in gen.rounds],
            "style": {"accent": ACCENT, "rejected_edge": REJECTED_EDGE, "rejected_line": REJECTED_LINE,
                      "muted": MUTED_TEXT, "grid": GRID, "fade_to": FADE_TO, "ramp": ramp,
                      "stages": {k: STAGE_COLOURS[k] for k in STAGES}}}


def _json_for_script(obj) -> str:
    """JSON that can sit inside <script>: no '<', '>' or '&' characters (they are \\u-escaped)."""
    text = json.dumps(obj, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def write_html(result, path, vocab_size: int = 256, tokenizer=None) -> str:
    """Write the round-by-round viewer of ``result`` (a ``Generation``) to ``path``; return the path.

    vocab_size: 256 shows tokens as characters (byte-level), other sizes as ids; tokenizer (``target.tokenizer``):
    show decoded tokens instead (nodes show up to 12 characters, the tooltip the whole token). The file is
    self-contained (inline CSS, JS and data; nothing is fetched). A generation without rounds (autoregressive)
    still gets a page, with its text and a note instead of a tree."""
    from ..decode.trace import Generation

    if not isinstance(result, Generation):
        raise ValueError(f"result: expected a Generation (what kd.generate returns), got {type(result).__name__}")
    _checks.integer(vocab_size, "vocab_size", lo=1)
    _args.tokenizer(tokenizer)
    data = _data(result, vocab_size, tokenizer)
    s = data["settings"]
    title = "DDTree trace"
    bits = [f"{k} {s[k]}" for k in ("method", "budget", "drafter", "depth", "temperature") if k in s]
    summary = " \u00b7 ".join(bits)
    n_r = len(result.rounds)
    tau = "n/a" if not n_r else f"{result.acceptance_length:.2f}"
    rounds = "1 round" if n_r == 1 else f"{n_r} rounds"
    stats = (f"{len(result.tokens)} new tokens \u00b7 {rounds} \u00b7 \u03c4 = {tau} \u00b7 "
             f"{result.target_forwards} target forwards ({result.forwards_per_token:.2f} per token)")
    fills = {"TITLE": _html.escape(title), "SUMMARY": _html.escape(summary), "STATS": _html.escape(stats),
             "MAXR": str(max(n_r - 1, 0)), "CSS": _asset("viewer.css"), "JS": _asset("viewer.js"),
             "DATA": _json_for_script(data)}
    page = re.sub(r"%([A-Z]+)%", lambda m: fills[m.group(1)], _asset("viewer.html"))     # one pass: no re-substitution
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    write_text_atomic(path, page)
    return os.fspath(path)


# ------------------------------------------------------------------------------------------------ the page
def _asset(name: str) -> str:
    """One of the page's files in ``viz/assets/`` (package data: viewer.html with %FIELD% slots, .css, .js)."""
    with open(os.path.join(_ASSETS, name), encoding="utf-8") as f:
        return f.read()
