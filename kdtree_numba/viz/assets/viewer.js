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
