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
"""
from __future__ import annotations

import html as _html
import json
import math
import os
import re

import numpy as np
from matplotlib.colors import to_hex

from ..decode.trace import STAGES
from .labels import token_label, token_piece
from .rounds import STAGE_COLOURS
from .trees import (ACCENT, CMAP, FADE_TO, GRID, MUTED_TEXT, NORM, REJECTED_EDGE, REJECTED_LINE, edge_width,
                    layout_tree, node_fill, node_label, text_colour)


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
             "MAXR": str(max(n_r - 1, 0)), "CSS": _CSS, "JS": _JS, "DATA": _json_for_script(data)}
    page = re.sub(r"%([A-Z]+)%", lambda m: fills[m.group(1)], _TEMPLATE)     # one pass: no re-substitution
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return os.fspath(path)


# ------------------------------------------------------------------------------------------------ the page
_CSS = """
:root { --accent: #e8590c; --muted: #5f6368; --line: #dadce0; --bg: #ffffff; --panel: #f8f9fa; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
       color: #202124; background: var(--bg); }
header { padding: 12px 20px 8px; border-bottom: 1px solid var(--line); }
h1 { font-size: 18px; margin: 0 0 2px; font-weight: 600; }
.sub { color: var(--muted); font-size: 13px; }
main { padding: 10px 20px 24px; }
.controls { display: flex; align-items: center; gap: 10px; flex-wrap: wrap; margin: 4px 0 8px; }
button { font: inherit; padding: 4px 12px; border: 1px solid var(--line); background: var(--panel);
         border-radius: 6px; cursor: pointer; }
button:hover:not(:disabled) { border-color: var(--accent); }
button:disabled { opacity: .45; cursor: default; }
input[type=range] { width: 280px; accent-color: var(--accent); }
#round-label { font-weight: 600; min-width: 110px; }
#round-info { color: var(--muted); }
.fit { color: var(--muted); font-size: 13px; user-select: none; }
.legend { display: flex; gap: 18px; align-items: center; flex-wrap: wrap; color: var(--muted); font-size: 12.5px;
          margin: 2px 0 6px; }
.legend svg { vertical-align: middle; }
.ramp { display: inline-block; width: 140px; height: 10px; border-radius: 2px; vertical-align: middle;
        margin: 0 4px; border: 1px solid var(--line); }
#tree-wrap { border: 1px solid var(--line); border-radius: 8px; overflow: auto; max-height: 72vh;
             background: #fff; position: relative; }
#tree { display: block; }
#tree line.edge { stroke-linecap: round; }
#tree line.edge.rejected { stroke: #c3c7cc; }
#tree line.edge.accepted { stroke: var(--accent); }
#tree line.edge.to-bonus { stroke: var(--accent); stroke-dasharray: 6 4; stroke-width: 2; }
#tree line.edge.hl { stroke: #202124; }
#tree line.grid { stroke: #eef0f2; stroke-width: 1; }
#tree circle.node { stroke: #9aa0a6; stroke-width: 0.8; cursor: pointer; }
#tree circle.node.accepted { stroke: var(--accent); stroke-width: 2.4; }
#tree circle.node:hover, #tree circle.bonus:hover { stroke: #202124; stroke-width: 2.4; }
#tree circle.bonus { fill: #fff; stroke: var(--accent); stroke-width: 1.8; stroke-dasharray: 3 2;
                     cursor: pointer; }
#tree text { pointer-events: none; font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace;
             dominant-baseline: central; text-anchor: middle; }
#tree text.acc { font-weight: 700; }
#tree text.halo { paint-order: stroke; stroke: #fff; stroke-width: 2.6px; stroke-linejoin: round; }
#tree text.bonus-label { fill: var(--accent); font-weight: 700; }
#tree text.caption { fill: var(--accent); font-family: system-ui, sans-serif; text-anchor: start; font-size: 10px; }
#tree text.axis { fill: var(--muted); font-family: system-ui, sans-serif; font-size: 11px; }
#tip { position: fixed; pointer-events: none; background: #202124; color: #fff; padding: 7px 10px;
       border-radius: 6px; font-size: 12.5px; line-height: 1.5; display: none; z-index: 10; max-width: 340px;
       box-shadow: 0 2px 8px rgba(0,0,0,.25); }
#tip b { color: #ffd8a8; }
#tip .mono { font-family: "DejaVu Sans Mono", Menlo, monospace; }
.row { display: flex; gap: 20px; flex-wrap: wrap; margin-top: 12px; }
.panel { flex: 1 1 420px; background: var(--panel); border: 1px solid var(--line); border-radius: 8px;
         padding: 10px 12px; }
.panel h2 { font-size: 13px; margin: 0 0 6px; color: var(--muted); font-weight: 600; text-transform: uppercase;
            letter-spacing: .04em; }
#text { white-space: pre-wrap; word-break: break-all; font-family: "DejaVu Sans Mono", Menlo, monospace;
        font-size: 14px; line-height: 1.7; max-height: 220px; overflow: auto; }
#text .prompt { color: #a0a4a8; }
#text .esc { font-size: 11px; color: #80868b; }
#text .root { text-decoration: underline; text-decoration-color: var(--accent); text-underline-offset: 3px; }
#text .acc { background: #ffe0c7; color: #7a2e06; border-radius: 3px; box-shadow: 0 0 0 1px #ffc9a3; }
#text .bonus { outline: 1.5px dashed var(--accent); outline-offset: 1px; border-radius: 3px; color: #7a2e06; }
#stage-bar { display: flex; height: 18px; border-radius: 4px; overflow: hidden; background: #e8eaed; }
#stage-bar div { height: 100%; }
#stage-legend { display: flex; gap: 14px; flex-wrap: wrap; font-size: 12.5px; color: var(--muted);
                margin-top: 6px; }
#stage-legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px;
                  vertical-align: -1px; }
.note { color: var(--muted); padding: 24px; }
"""

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>%TITLE%</title>
<style>%CSS%</style>
</head>
<body>
<header>
  <h1>%TITLE%</h1>
  <div class="sub">%SUMMARY%</div>
  <div class="sub">%STATS%</div>
</header>
<main>
  <div class="controls">
    <button id="prev" title="previous round (&larr;)">&#9664; Prev</button>
    <input id="slider" type="range" min="0" max="%MAXR%" value="0" step="1" aria-label="round">
    <button id="next" title="next round (&rarr;)">Next &#9654;</button>
    <span id="round-label"></span>
    <span id="round-info"></span>
    <label class="fit"><input id="fit" type="checkbox" checked> fit tree to window</label>
  </div>
  <div class="legend" id="legend"></div>
  <div id="tree-wrap"><svg id="tree" data-round="0" data-nodes="0"></svg></div>
  <div class="row">
    <div class="panel"><h2>Text so far</h2><div id="text"></div></div>
    <div class="panel" style="flex: 0 1 420px"><h2>Stage times this round</h2>
      <div id="stage-bar"></div><div id="stage-legend"></div></div>
  </div>
</main>
<div id="tip"></div>
<script type="application/json" id="kd-data">%DATA%</script>
<script>%JS%</script>
</body>
</html>
"""

_JS = r"""
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("kd-data").textContent);
  var R = D.rounds, S = D.style;
  var svg = document.getElementById("tree"), tip = document.getElementById("tip");
  var NS = svg.namespaceURI;              // the SVG namespace, as the HTML parser gave it to <svg>
  var COL = 100, SLOT = 26, PADL = 34, PADT = 18, PADB = 34, PADR = 130;
  var slider = document.getElementById("slider"), fit = document.getElementById("fit");
  var cur = 0;

  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function h(tag, cls, text, parent) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmt(p) {
    if (p === null || p === undefined) return "n/a";
    if (p === 0) return "0";
    return p >= 0.001 ? p.toFixed(4) : p.toExponential(2);
  }
  function px(x) { return PADL + x * COL; }
  function py(y) { return PADT + y * SLOT; }

  // legend: same conventions as the PNG figures
  (function legend() {
    var L = document.getElementById("legend");
    function sample(draw, text) {
      var span = h("span", null, null, L);
      var s = el("svg", {width: 34, height: 18}, null); span.appendChild(s); draw(s);
      span.appendChild(document.createTextNode(" " + text));
    }
    sample(function (s) {
      el("line", {x1: 2, y1: 9, x2: 32, y2: 9, stroke: S.accent, "stroke-width": 4}, s);
      el("circle", {cx: 17, cy: 9, r: 6, fill: "#2767b0", stroke: S.accent, "stroke-width": 2}, s);
    }, "accepted path");
    sample(function (s) {
      el("circle", {cx: 17, cy: 9, r: 6.5, fill: "#fff", stroke: S.accent, "stroke-width": 1.6,
                    "stroke-dasharray": "3 2"}, s);
    }, "bonus (the target's token)");
    sample(function (s) {
      el("line", {x1: 2, y1: 9, x2: 32, y2: 9, stroke: S.rejected_edge, "stroke-width": 2.5}, s);
      el("circle", {cx: 17, cy: 9, r: 6, fill: "#c9d7e8", stroke: S.rejected_line, "stroke-width": 0.8}, s);
    }, "rejected drafts");
    var span = h("span", null, "cumulative draft probability  0.001", L);
    var ramp = h("span", "ramp", null, span);
    ramp.style.background = "linear-gradient(to right, " + S.ramp.join(", ") + ")";
    span.appendChild(document.createTextNode("1  (log scale) \u00b7 edge width = conditional probability"));
  })();

  function pathOf(r, i) {
    var out = [];
    while (i > 0) { out.push(i); i = r.nodes[i].p; }
    return out.reverse();
  }

  function showTip(ev, lines) {
    tip.textContent = "";
    lines.forEach(function (ln) {
      var div = h("div", null, null, tip);
      if (ln[0]) h("b", null, ln[0] + " ", div);
      h("span", ln[2] || null, ln[1], div);
    });
    tip.style.display = "block";
    moveTip(ev);
  }
  function moveTip(ev) {
    var x = ev.clientX + 14, y = ev.clientY + 14;
    var w = tip.offsetWidth, hh = tip.offsetHeight;
    if (x + w > window.innerWidth - 4) x = ev.clientX - w - 14;
    if (y + hh > window.innerHeight - 4) y = ev.clientY - hh - 14;
    tip.style.left = x + "px"; tip.style.top = y + "px";
  }
  function hideTip() { tip.style.display = "none"; }

  function highlight(r, i, on) {
    pathOf(r, i).forEach(function (k) {
      var e = svg.querySelector('line[data-child="' + k + '"]');
      if (e) e.classList.toggle("hl", on);
    });
  }

  function nodeTip(r, i) {
    var nd = r.nodes[i];
    var lines = [["token", "\u201c" + nd.label + "\u201d  (id " + nd.tok + ")", "mono"]];
    if (i === 0) {
      lines.push(["root", "the last committed token (previous bonus), position " + r.start]);
      return lines;
    }
    lines.push(["node", i + "  \u00b7  depth " + nd.d + "  \u00b7  rank " + (nd.rank + 1) + " of " + nd.nsib +
                " siblings"]);
    lines.push(["draft p", fmt(nd.cond) + "  (conditional on its parent)"]);
    lines.push(["cumulative", fmt(Math.exp(nd.logw)) + "  (logw = " + nd.logw.toFixed(3) + ")"]);
    var path = pathOf(r, i).map(function (k) { return r.nodes[k].label; }).join("");
    lines.push(["path", path, "mono"]);
    lines.push(["", nd.acc ? "accepted by the target" : "rejected"]);
    return lines;
  }

  function drawTree(r, idx) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    svg.setAttribute("data-round", String(idx));
    svg.setAttribute("data-nodes", String(r.n));
    // fit: squeeze the rows (never below a legible size) and spread the columns over the window
    var wrap = document.getElementById("tree-wrap");
    var availW = Math.max(wrap.clientWidth - 2, 300), availH = Math.max(window.innerHeight * 0.68, 260);
    if (fit.checked) {
      SLOT = Math.max(15, Math.min(26, (availH - PADT - PADB) / Math.max(r.slots - 0.5, 1)));
      COL = Math.max(70, Math.min(170, (availW - PADL - PADR) / (r.maxx + 0.5)));
    } else { SLOT = 26; COL = 100; }
    var W = PADL + (r.maxx + 0.5) * COL + PADR, H = PADT + (r.slots - 0.5) * SLOT + PADB;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    svg.setAttribute("width", String(Math.round(W)));
    svg.setAttribute("height", String(Math.round(H)));
    var rad = Math.min(11, SLOT * 0.46);
    // labels inside the circles when they fit, else (long ids) over them with a white halo, as in the PNGs
    var longest = 1;
    function shown(nd) { return nd.short || nd.label; }
    r.nodes.forEach(function (nd) { longest = Math.max(longest, shown(nd).length); });
    longest = Math.max(longest, shown(r.bonus).length);
    var inside = Math.min(11, 2 * rad * 0.92 / (0.62 * Math.max(longest, 1.6)));
    var halo = inside < 6.5;
    var font = halo ? Math.min(10.5, SLOT * 0.6, 0.8 * COL / (0.62 * longest)) : inside;
    function fontFor(label) {
      return halo ? font : Math.min(11, 2 * rad * 0.92 / (0.62 * Math.max(label.length, 1.6)));
    }
    var gGrid = el("g", {}, svg), gE = el("g", {}, svg), gN = el("g", {}, svg), gT = el("g", {}, svg);
    for (var d = 0; d <= r.maxx; d++) {
      el("line", {"class": "grid", x1: px(d), y1: 4, x2: px(d), y2: H - PADB + 8}, gGrid);
      var t = el("text", {"class": "axis", x: px(d), y: H - 12}, gGrid);
      t.textContent = d === 0 ? "root" : "depth " + d;
    }
    var nodes = r.nodes, i, nd;
    // edges: rejected under accepted
    var order = [];
    for (i = 1; i < nodes.length; i++) order.push(i);
    order.sort(function (a, b) { return (nodes[a].acc ? 1 : 0) - (nodes[b].acc ? 1 : 0); });
    order.forEach(function (k) {
      var c = nodes[k], p = nodes[c.p];
      el("line", {"class": "edge " + (c.acc ? "accepted" : "rejected"), "data-child": k,
                  x1: px(p.x), y1: py(p.y), x2: px(c.x), y2: py(c.y), "stroke-width": c.w}, gE);
    });
    var b = r.bonus, last = nodes[b.p];
    el("line", {"class": "edge to-bonus", x1: px(last.x), y1: py(last.y), x2: px(b.x), y2: py(b.y)}, gE);
    // nodes
    for (i = 0; i < nodes.length; i++) {
      nd = nodes[i];
      var cls = "node" + (i === 0 ? " root" : "") + (nd.acc ? " accepted" : " rejected");
      var c = el("circle", {"class": cls, cx: px(nd.x), cy: py(nd.y), r: rad, fill: nd.fill,
                            "data-node": i}, gN);
      (function (k) {
        c.addEventListener("mouseenter", function (ev) { showTip(ev, nodeTip(r, k)); highlight(r, k, true); });
        c.addEventListener("mousemove", moveTip);
        c.addEventListener("mouseleave", function () { hideTip(); highlight(r, k, false); });
      })(i);
      if (fontFor(shown(nd)) >= 5) {
        var tx = el("text", {x: px(nd.x), y: py(nd.y), fill: halo ? "#1d1f21" : nd.tc,
                             "class": (nd.acc ? "acc" : "") + (halo ? " halo" : ""),
                             "font-size": fontFor(shown(nd)).toFixed(1)}, gT);
        tx.textContent = shown(nd);
      }
    }
    var bc = el("circle", {"class": "bonus", cx: px(b.x), cy: py(b.y), r: rad}, gN);
    bc.addEventListener("mouseenter", function (ev) {
      showTip(ev, [["bonus", "\u201c" + b.label + "\u201d  (id " + b.tok + ")", "mono"],
                   ["", "the target's own token after the accepted path"],
                   ["draft p", b.draft_p === null ? "not in the drafter's top-K" : fmt(b.draft_p)]]);
    });
    bc.addEventListener("mousemove", moveTip);
    bc.addEventListener("mouseleave", hideTip);
    if (fontFor(shown(b)) >= 5) {
      var bt = el("text", {"class": "bonus-label" + (halo ? " halo" : ""), x: px(b.x), y: py(b.y),
                           "font-size": fontFor(shown(b)).toFixed(1)}, gT);
      bt.textContent = shown(b);
    }
    var capx = Math.max(rad, halo ? 0.31 * font * shown(b).length : 0) + 4;
    var cap = el("text", {"class": "caption", x: px(b.x) + capx, y: py(b.y)}, gT);
    cap.textContent = "bonus" + (b.draft_p === null ? "" : "  draft p=" + fmt(b.draft_p));
    // a tall tree scrolls: bring the end of the accepted path into view
    if (H > wrap.clientHeight) wrap.scrollTop = Math.max(0, py(b.y) - wrap.clientHeight / 2);
  }

  function drawText(r) {
    var T = document.getElementById("text");
    T.textContent = "";
    D.prompt.forEach(function (pc) { h("span", "prompt" + (pc[1] ? " esc" : ""), pc[0], T); });
    var m = r ? r.accepted.length : 0;
    var end = r ? Math.min(D.tokens.length, r.first + m + 1) : D.tokens.length;
    for (var k = 0; k < end; k++) {
      var cls = D.tokens[k][1] ? "esc" : "";
      if (r) {
        if (k === r.first) cls += " root";
        else if (k > r.first && k < r.first + m) cls += " acc";
        else if (k === r.first + m) cls += " bonus";
      }
      h("span", cls.trim(), D.tokens[k][0], T);
    }
    var hl = T.querySelector(".bonus") || T.lastChild;
    if (hl && hl.scrollIntoView) T.scrollTop = Math.max(0, hl.offsetTop - T.offsetTop - 80);
  }

  function drawStages(r) {
    var bar = document.getElementById("stage-bar"), leg = document.getElementById("stage-legend");
    bar.textContent = ""; leg.textContent = "";
    var names = Object.keys(S.stages), tot = 0;
    names.forEach(function (s) { tot += r.times[s] || 0; });
    names.forEach(function (s) {
      var v = r.times[s] || 0;
      var seg = h("div", null, null, bar);
      seg.style.width = (tot > 0 ? 100 * v / tot : 0) + "%";
      seg.style.background = S.stages[s];
      seg.title = s + ": " + v.toFixed(2) + " ms";
      var item = h("span", null, null, leg);
      h("i", null, null, item).style.background = S.stages[s];
      item.appendChild(document.createTextNode(s + " " + v.toFixed(2) + " ms"));
    });
    h("span", null, "total " + tot.toFixed(2) + " ms", leg).style.fontWeight = "600";
  }

  function show(idx) {
    if (!R.length) {
      svg.setAttribute("data-round", "-1");
      svg.setAttribute("data-nodes", "0");
      svg.setAttribute("width", "520"); svg.setAttribute("height", "60");
      var t = el("text", {x: 16, y: 34, "class": "axis"}, svg);
      t.textContent = "No DDTree rounds: this generation was autoregressive.";
      ["prev", "next"].forEach(function (id) { document.getElementById(id).disabled = true; });
      slider.disabled = true;
      document.getElementById("round-label").textContent = "no rounds";
      drawText(null);
      return;
    }
    idx = Math.max(0, Math.min(R.length - 1, idx));
    cur = idx;
    var r = R[idx];
    slider.value = String(idx);
    document.getElementById("prev").disabled = idx === 0;
    document.getElementById("next").disabled = idx === R.length - 1;
    document.getElementById("round-label").textContent = "Round " + (idx + 1) + " / " + R.length;
    document.getElementById("round-info").textContent = "position " + r.start + " \u00b7 " + r.n +
      " drafted nodes \u00b7 " + (r.accepted.length - 1) + " accepted + bonus = " + r.accepted.length +
      " tokens";
    drawTree(r, idx);
    drawText(r);
    drawStages(r);
    try { history.replaceState(null, "", "#round=" + (idx + 1)); } catch (e) { /* some file:// setups */ }
  }

  document.getElementById("prev").addEventListener("click", function () { show(cur - 1); });
  document.getElementById("next").addEventListener("click", function () { show(cur + 1); });
  slider.addEventListener("input", function () { show(parseInt(slider.value, 10)); });
  fit.addEventListener("change", function () { show(cur); });
  window.addEventListener("resize", function () { if (fit.checked) show(cur); });
  document.addEventListener("keydown", function (ev) {
    if (ev.target && ev.target.tagName === "INPUT" && ev.target.type !== "checkbox") return;  // the slider
                                                                                             // steps itself
    if (ev.key === "ArrowLeft") { show(cur - 1); ev.preventDefault(); }
    else if (ev.key === "ArrowRight") { show(cur + 1); ev.preventDefault(); }
    else if (ev.key === "Home") { show(0); ev.preventDefault(); }
    else if (ev.key === "End") { show(R.length - 1); ev.preventDefault(); }
  });
  // "#round=3" in the address opens round 3 (1-based, as the label counts); navigating keeps it current
  var m = /round=(\d+)/.exec(window.location.hash || "");
  show(m ? parseInt(m[1], 10) - 1 : 0);
})();
"""
