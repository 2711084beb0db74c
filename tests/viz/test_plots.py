"""kdtree_numba.viz: labels, tree layout and collapse, every figure function, the budget sweep and the HTML file.

Generations run on the NumPy backend (a second or so in all); other trees are built by hand with the heap
reference, so the tests are fast on any backend.
"""
import json
import math
import os
import re

import numpy as np
import pytest
from matplotlib.figure import Figure

import kdtree_numba as kd
import kdtree_numba.viz as viz
from kdtree_numba.decode.trace import STAGES
from kdtree_numba.kernels.tree_build import build_tree_ref
from kdtree_numba.viz import trees as viz_trees

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------------ fixtures
def make_round(budget: int, L: int = 6, K: int = 8, seed: int = 0, accept: int = 3, vocab: int = 256,
               token_pool=None, start: int = 5) -> kd.RoundTrace:
    """A RoundTrace around a random best-first tree of ``budget`` nodes: the accepted path follows each
    node's most probable child for ``accept`` steps (fewer if the tree is shallower)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(L, vocab)) * 2.0
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ids = np.argsort(-lp, axis=-1, kind="stable")[:, :K]
    if token_pool is not None:                      # force particular tokens (escaping tests)
        pool = np.array(token_pool)
        ids = np.stack([rng.permutation(np.resize(pool, K)) for _ in range(L)])
    top = np.take_along_axis(lp, ids, -1).astype(np.float32)
    tree = build_tree_ref(top, ids, budget)
    accepted = [0]
    for _ in range(accept):
        kids = np.nonzero(tree.parents[1:] == accepted[-1])[0] + 1
        if not kids.size:
            break
        accepted.append(int(kids[0]))
    probs = [float(np.exp(tree.logw[a - 1] - (tree.logw[tree.parents[a] - 1] if tree.parents[a] else 0.0)))
             for a in accepted[1:]] + [float("nan")]
    times = {s: float(i + 1) for i, s in enumerate(STAGES)}
    return kd.RoundTrace(start, int(ids[0, 0]), tree, accepted, int(rng.integers(vocab)), probs, times)


@pytest.fixture(scope="module")
def runs():
    """Real generations of the tiny byte-level target (NumPy backend): DDTree, single chain, autoregressive."""
    with kd.backend.use("numpy"):
        t = kd.tiny_target(0)
        prompt = list(b"Hello")
        tree = kd.generate(t, prompt, 24, drafter=kd.OracleDrafter(t, noise=0.5, depth=6), budget=32)
        chain = kd.generate(t, prompt, 24, drafter=kd.OracleDrafter(t, noise=0.5, depth=6), chain=True)
        ar = kd.generate(t, prompt, 8)
    assert tree.rounds and chain.rounds and not ar.rounds
    return {"target": t, "tree": tree, "chain": chain, "ar": ar}


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 2000, f"{path} is not a real PNG ({len(data)} bytes)"


# ------------------------------------------------------------------------------------------------ labels
def test_token_label_byte_vocab():
    assert viz.token_label(ord("H"), 256) == "H"
    assert viz.token_label(ord("<"), 256) == "<"
    assert viz.token_label(32, 256) == "\u2423"
    assert viz.token_label(10, 256) == "\u23ce"
    assert viz.token_label(0, 256) == "\\x00"
    assert viz.token_label(200, 256) == "\\xc8"
    assert viz.token_label(127, 256) == "\\x7f"
    assert all(viz.token_label(t, 256) for t in range(256))


def test_token_label_id_vocab_and_range():
    assert viz.token_label(200, 32000) == "200"
    assert viz.token_label(0, 1000) == "0"
    with pytest.raises(ValueError, match="token"):
        viz.token_label(256, 256)
    with pytest.raises(ValueError, match="token"):
        viz.token_label(-1, 1000)


def test_text_of():
    assert viz.text_of(list(b"Hi there\n"), 256) == "Hi there\n"
    assert viz.text_of(list("é".encode()), 256) == "é"
    assert viz.text_of([0xC3], 256) == "\ufffd"                       # broken UTF-8 is replaced, not raised
    assert viz.text_of([5, 17, 300], 1000) == "5 17 300"
    assert viz.text_of([], 1000) == ""


@pytest.fixture(scope="module")
def tok():
    """The default model's tokenizer (byte-level BPE, 4096 tokens)."""
    import os

    from kdtree_numba.model import tokenizer
    from kdtree_numba.model.presets import DEFAULT_DIR

    return tokenizer.load(os.path.join(DEFAULT_DIR, "target"))


def test_labels_with_a_tokenizer(tok):
    ids = tok.encode("def f(x):\n        return x")
    assert viz.token_label(ids[0], 4096, tokenizer=tok) == tok.token_text(ids[0]) == "def"
    assert viz.token_label(ids[0], 256, tokenizer=tok) == "def"          # the tokenizer decides, not vocab_size
    assert viz.text_of(ids, 4096, tokenizer=tok) == "def f(x):\n        return x"
    pieces = "".join(viz.labels.token_piece(i, 4096, tok) for i in ids)
    assert pieces == "def f(x):\u23ce\n        return x"                   # newlines marked, spaces kept
    assert viz.token_label(5000, 4096, tokenizer=tok) == "#5000"          # beyond the tokenizer: the id
    with pytest.raises(ValueError, match="token"):
        viz.token_label(-1, 4096, tokenizer=tok)
    indent = tok.encode("\n        x")[0]                                  # newline + indentation, one token
    assert viz_trees.node_label(indent, 4096, tok).startswith("\u23ce\u00b7\u00d7")
    assert viz.labels.shorten("abcdefghijkl", 5) == "abcd\u2026" and viz.labels.shorten("ab", 5) == "ab"
    assert viz.labels.visible("a b\n") == "a\u00b7b\u23ce"


def test_plot_tree_and_rounds_with_tokenizer(tok, tmp_path):
    ids = tok.encode("def add(a, b):\n    return a + b\n\n\nclass Foo(object):\n    pass")
    rt = make_round(24, seed=11, vocab=4096, token_pool=ids, accept=3)
    fig = viz.plot_tree(rt, tokenizer=tok, path=tmp_path / "tok.png")
    assert_png(tmp_path / "tok.png")
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert viz_trees.node_label(int(rt.tree.tokens[0]), 4096, tok) in texts
    title = fig.axes[0].get_title(loc="left")
    acc = viz.labels.visible(tok.decode(rt.accepted_tokens))
    assert f"accepted \u201c{acc}" in title
    fig = viz.plot_rounds([rt, rt], tokenizer=tok, n=2)
    assert len(fig.kd_drawn_nodes) == 2


def test_write_html_with_tokenizer(tok, tmp_path):
    ids = tok.encode("    if x is None:\n        return 1")
    rt = make_round(12, seed=9, vocab=4096, token_pool=ids, start=len(ids))
    gen = kd.Generation(ids, [rt.root] + rt.accepted_tokens + [rt.bonus], [rt], 2, 0.1, {"method": "ddtree"})
    data = json.loads(_data_block(open(viz.write_html(gen, tmp_path / "t.html", tokenizer=tok)).read()))
    node = data["rounds"][0]["nodes"][1]
    assert node["label"] == tok.token_text(node["tok"])
    assert node["short"] == viz_trees.node_label(node["tok"], 4096, tok)
    assert "".join(p[0] for p in data["prompt"]) == tok.decode(ids).replace("\n", "\u23ce\n")


def test_training_curves(tmp_path):
    import os

    from kdtree_numba.model.presets import DEFAULT_DIR

    t_log = os.path.join(DEFAULT_DIR, "target_train_log.json")
    d_log = os.path.join(DEFAULT_DIR, "drafter_train_log.json")
    fig = viz.training_curves(t_log, d_log, path=tmp_path / "tc.png")
    assert_png(tmp_path / "tc.png")
    assert len(fig.axes) == 4
    log = json.load(open(d_log))
    a4 = fig.axes[3]
    assert np.allclose(a4.lines[0].get_ydata(), log["steps"][-1]["acc"])  # train accuracy per position, last step
    assert all(0 <= y <= 1 for line in fig.axes[2].lines for y in line.get_ydata())
    for ax in fig.axes[:2]:                    # every loss curve in view (the shipped drafter's held-out losses lie
        lo, hi = ax.get_ylim()                 # above its training loss: it trained on from another's weights)
        assert all(lo <= y <= hi for line in ax.lines for y in line.get_ydata())
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(ValueError, match="not a training log"):
        viz.training_curves(bad, d_log)
    with pytest.raises(ValueError, match="not a readable training log"):
        viz.training_curves(tmp_path / "missing.json", d_log)


# ------------------------------------------------------------------------------------------------ layout
@pytest.mark.parametrize("budget", [1, 16, 256])
def test_layout_is_tidy(budget):
    """Every drawn node gets its own place; a parent sits within its children's band; depth is x."""
    rt = make_round(budget, seed=budget)
    lay = viz_trees.layout_tree(rt, None)
    assert lay.shown.all() and lay.drawn_nodes == budget
    pts = {(lay.x[i], lay.y[i]) for i in range(budget + 1)} | {lay.bonus_xy}
    assert len(pts) == budget + 2                                      # no two nodes overlap
    assert np.array_equal(lay.x[1:], rt.tree.depths)
    for v in range(budget + 1):
        kids = np.nonzero(lay.parents[1:] == v)[0] + 1
        if kids.size:
            assert kids.size == lay.n_sib[kids[0]]
            assert np.all(np.diff(lay.y[kids]) > 0)                   # ranked top to bottom
            assert lay.y[kids].min() <= lay.y[v] <= lay.y[kids].max()
    # subtrees own disjoint vertical bands: the leaves of sibling subtrees do not interleave
    def band(v):
        out, stack = [], [v]
        while stack:
            u = stack.pop()
            out.append(lay.y[u])
            stack.extend((np.nonzero(lay.parents[1:] == u)[0] + 1).tolist())
        return min(out), max(out)
    for v in range(budget + 1):
        kids = np.nonzero(lay.parents[1:] == v)[0] + 1
        bands = [band(k) for k in kids]
        for a, b in zip(bands, bands[1:]):
            assert a[1] < b[0]
    # conditional probabilities: siblings in decreasing order
    for v in range(budget + 1):
        kids = np.nonzero(lay.parents[1:] == v)[0] + 1
        assert np.all(np.diff(lay.cond[kids]) <= 1e-12)


def test_collapse_keeps_accepted_path_and_counts():
    rt = make_round(256, seed=3, accept=4)
    lay = viz_trees.layout_tree(rt, 40)
    assert 40 <= lay.drawn_nodes < 256
    assert lay.shown[rt.accepted].all()
    assert lay.drawn_nodes + int(lay.hidden_under.sum()) == 256
    assert all(lay.shown[lay.parents[i]] for i in range(1, 257) if lay.shown[i])   # drawn set is a tree
    pts = [(lay.x[i], lay.y[i]) for i in np.nonzero(lay.shown)[0]]
    pts += [(lay.x[i] + 1, lay.more_y[i]) for i in range(257) if not math.isnan(lay.more_y[i])]
    assert len(set(pts)) == len(pts)


# ------------------------------------------------------------------------------------------------ trees
def test_plot_tree_16(tmp_path):
    rt = make_round(16, seed=1)
    fig = viz.plot_tree(rt, 256, path=tmp_path / "t16.png")
    assert isinstance(fig, Figure)
    assert fig.kd_drawn_nodes == 16 and fig.kd_hidden_nodes == 0
    assert_png(tmp_path / "t16.png")


def test_plot_tree_256_collapses(tmp_path):
    rt = make_round(256, seed=2, accept=5)
    fig = viz.plot_tree(rt, 256, path=tmp_path / "t256.png")
    assert 64 <= fig.kd_drawn_nodes < 256
    assert fig.kd_drawn_nodes + fig.kd_hidden_nodes == 256
    assert_png(tmp_path / "t256.png")
    full = viz.plot_tree(rt, 256, max_nodes=256, path=tmp_path / "t256.svg", title="")
    assert full.kd_drawn_nodes == 256 and full.kd_hidden_nodes == 0
    assert (tmp_path / "t256.svg").read_text().lstrip().startswith("<?xml")


def test_plot_tree_into_axes_and_id_vocab(tmp_path):
    rt = make_round(24, seed=4, vocab=5000)
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    out = viz.plot_tree(rt, 5000, ax=ax, title="ids")
    assert out is fig and ax.get_title(loc="left") == "ids"
    texts = {t.get_text() for t in ax.texts}
    assert str(int(rt.tree.tokens[0])) in texts                      # nodes are labelled with ids


def test_plot_tree_empty_tree():
    """Budget 0 (one token per round): only the root and the bonus."""
    rt = make_round(0, seed=5)
    fig = viz.plot_tree(rt, 256)
    assert fig.kd_drawn_nodes == 0


def test_plot_tree_real_round(runs, tmp_path):
    gen = runs["tree"]
    fig = viz.plot_tree(gen.rounds[0], 256, path=tmp_path / "r0.png")
    assert fig.kd_drawn_nodes == gen.rounds[0].tree.n
    assert_png(tmp_path / "r0.png")


def test_plot_rounds_width_and_picks(tmp_path):
    """Deep trees wrap onto more rows: the saved strip stays within ~1800 px however many panels."""
    from matplotlib.image import imread

    rounds = [make_round(64, L=16, K=4, seed=s, accept=15) for s in range(4)]
    fig = viz.plot_rounds(rounds, n=4, path=tmp_path / "deep.png")
    h, w = imread(str(tmp_path / "deep.png")).shape[:2]
    assert w <= 1850 and len(fig.kd_drawn_nodes) == 4
    assert max(fig.kd_drawn_nodes) <= 32 + 16                              # collapsed: 32 + the accepted path
    shallow = [make_round(16, L=3, seed=s) for s in range(3)]
    fig = viz.plot_rounds(shallow, n=3, path=tmp_path / "shallow.png")
    assert imread(str(tmp_path / "shallow.png")).shape[1] <= 1850
    fig = viz.plot_rounds(rounds, picks=[3, 1])
    titles = [ax.get_title(loc="left") for ax in fig.axes if ax.get_title(loc="left")]
    assert titles[0].startswith("round 4/4") and titles[1].startswith("round 2/4")
    with pytest.raises(ValueError, match="picks"):
        viz.plot_rounds(rounds, picks=[4])


def test_showcase_rounds():
    g = _gen([1, 2, 2, 5, 2, 1, 5])
    assert viz.showcase_rounds(g) == [2, 3]          # a median (2) round nearest the middle; the first best (5)
    assert viz.showcase_rounds(_gen([2])) == [0]
    assert viz.showcase_rounds([]) == []


def test_plot_rounds(runs, tmp_path):
    gen = runs["tree"]
    fig = viz.plot_rounds(gen.rounds, 256, n=3, path=tmp_path / "strip.png")
    assert isinstance(fig, Figure) and len(fig.kd_drawn_nodes) == min(3, len(gen.rounds))
    assert_png(tmp_path / "strip.png")
    assert len(viz.plot_rounds(gen, n=50).kd_drawn_nodes) == len(gen.rounds)   # a Generation works too
    empty = viz.plot_rounds(runs["ar"].rounds, path=tmp_path / "none.png")
    assert empty.kd_drawn_nodes == []
    assert_png(tmp_path / "none.png")


# ------------------------------------------------------------------------------------------------ rounds
def test_acceptance_histogram_shares_stop_at_100(tmp_path):
    """Several series are drawn as shares: the axis never runs past 100 % (here one series is 100 % in one bin)."""
    all_three = _gen([3, 3, 3, 3])
    mixed = _gen([1, 2, 3, 3])
    fig = viz.acceptance_histogram([all_three, mixed], labels=["a", "b"], title="t", path=tmp_path / "s.png")
    ax = fig.axes[0]
    assert ax.get_ylim()[1] <= 100 and ax.get_title(loc="left") == "t"
    assert max(p.get_height() for p in ax.patches) == pytest.approx(100)
    assert ax.yaxis.get_major_formatter()(50, 0).startswith("50")          # a percentage axis
    pooled = viz.acceptance_histogram([[all_three, mixed], mixed], labels=["pooled", "one"])
    heights = [p.get_height() for p in pooled.axes[0].patches]
    assert sum(heights[:3]) == pytest.approx(100)                          # the pooled series: 8 rounds
    assert heights[2] == pytest.approx(6 / 8 * 100)
    assert "8 rounds" in pooled.axes[0].get_legend().get_texts()[0].get_text()


def test_acceptance_histogram(runs, tmp_path):
    fig = viz.acceptance_histogram(runs["tree"], path=tmp_path / "h1.png")
    assert isinstance(fig, Figure)
    assert_png(tmp_path / "h1.png")
    ax = fig.axes[0]
    tau = runs["tree"].acceptance_length
    assert any(np.allclose(line.get_xdata(), tau) for line in ax.lines)   # tau is marked
    heights = sorted(p.get_height() for p in ax.patches)
    assert sum(heights) == len(runs["tree"].rounds)                       # one count per round
    fig = viz.acceptance_histogram([runs["chain"], runs["tree"], runs["ar"]], labels=["chain", "tree", "ar"],
                                   path=tmp_path / "h3.svg")
    assert (tmp_path / "h3.svg").stat().st_size > 1000
    with pytest.raises(ValueError, match="labels"):
        viz.acceptance_histogram([runs["tree"]], labels=["a", "b"])


def test_tree_shape(runs, tmp_path):
    fig = viz.tree_shape(runs["tree"], path=tmp_path / "shape.png")
    assert_png(tmp_path / "shape.png")
    bars = [p.get_height() for p in fig.axes[0].patches]
    budget = runs["tree"].settings["budget"]
    assert sum(bars) == pytest.approx(budget)                            # mean nodes per depth add up
    viz.tree_shape(runs["ar"], path=tmp_path / "shape_ar.png")
    assert_png(tmp_path / "shape_ar.png")


def test_stage_times(runs, tmp_path):
    gen = runs["tree"]
    fig = viz.stage_times(gen, path=tmp_path / "stages.png")
    assert_png(tmp_path / "stages.png")
    a1, a2 = fig.axes[:2]
    assert len(a1.patches) == len(STAGES) * len(gen.rounds)
    totals = [p.get_width() for p in a2.patches]
    assert sum(totals) == pytest.approx(sum(gen.stage_totals().values()))
    viz.stage_times(runs["ar"])
    fig = viz.stage_times(gen, note="numpy backend")
    assert fig.axes[0].get_title(loc="left").endswith("; numpy backend)")


def test_budget_sweep_hand_rows(tmp_path):
    rows = [{"budget": b, "tree_tau": 1.5 + math.log2(b) / 4, "tree_fpt": 1 / (1.5 + math.log2(b) / 4),
             "chain_tau": 1.8, "chain_fpt": 0.6} for b in (64, 4, 16, 256, 1024)]
    fig = viz.budget_sweep(rows, path=tmp_path / "sweep.png")
    assert_png(tmp_path / "sweep.png")
    a1, a2 = fig.axes[:2]
    assert a1.get_xscale() == "log" and a2.get_xscale() == "log"
    line = a1.lines[0]
    assert list(line.get_xdata()) == [4, 16, 64, 256, 1024]              # sorted by budget
    assert any(np.allclose(l.get_ydata(), 1.8) for l in a1.lines)        # the chain, horizontal
    assert any(np.allclose(l.get_ydata(), 0.6) for l in a2.lines)


def test_budget_sweep_without_a_positive_budget_is_an_empty_figure(tmp_path):
    """Budget 0 (plain decoding) has no place on the log-scale budget axis: rows of budget 0 alone draw the empty
    panels (they raised an IndexError)."""
    rows = [{"budget": 0, "tree_tau": 1.0, "tree_fpt": 1.0, "chain_tau": 1.8, "chain_fpt": 0.6}]
    fig = viz.budget_sweep(rows, path=tmp_path / "zero.png")
    assert_png(tmp_path / "zero.png")
    assert not fig.axes[0].lines and "no rows with a budget > 0" in [t.get_text() for t in fig.axes[0].texts]


def _gen(accepts, prompt=(1, 2), forwards=None, settings=None):
    """A Generation whose rounds commit ``accepts`` tokens each (hand-made trees), after the prefill's token."""
    rounds = [make_round(16, seed=i, accept=a - 1) for i, a in enumerate(accepts)]
    tokens = [t for r in rounds for t in [r.root] + r.accepted_tokens][:sum(accepts) + 1]
    tokens += [0] * (sum(accepts) + 1 - len(tokens))
    return kd.Generation(list(prompt), tokens, rounds, forwards or len(rounds) + 1, 0.1,
                         settings or {"method": "ddtree", "budget": 16})


def test_budget_sweep_lines_stay_visible(tmp_path):
    """The chain is drawn with its own markers at every budget: where it meets DDTree both stay visible."""
    rows = [{"budget": b, "tree_tau": 2.0, "tree_fpt": 0.5, "chain_tau": 2.0, "chain_fpt": 0.5} for b in (1, 4, 16)]
    fig = viz.budget_sweep(rows, chain_label="DFlash chain", title="same values", path=tmp_path / "same.png")
    assert_png(tmp_path / "same.png")
    a1 = fig.axes[0]
    styles = {l.get_label(): (l.get_marker(), l.get_linestyle(), l.get_markerfacecolor()) for l in a1.lines}
    assert styles["DDTree"][0] == "o" and styles["DFlash chain"][0] == "s"
    assert styles["DDTree"][1] != styles["DFlash chain"][1]                # solid vs dashed
    assert styles["DFlash chain"][2] == "white"                            # hollow: DDTree shows through
    chain = next(l for l in a1.lines if l.get_label() == "DFlash chain")
    assert list(chain.get_xdata()) == [1, 4, 16]
    assert fig._suptitle.get_text() == "same values"


# ------------------------------------------------------------------------------------------------ html
def _data_block(page: str) -> str:
    m = re.search(r'<script type="application/json" id="kd-data">(.*?)</script>', page, re.S)
    assert m, "no embedded trace data"
    return m.group(1)


def test_write_html_self_contained(runs, tmp_path):
    gen = runs["tree"]
    out = viz.write_html(gen, tmp_path / "trace.html")
    assert out == str(tmp_path / "trace.html")
    page = (tmp_path / "trace.html").read_text(encoding="utf-8")
    assert "http://" not in page and "https://" not in page
    assert not re.search(r'<(link|img|iframe)\b|<script[^>]*\bsrc=', page)   # nothing loaded from outside
    data = json.loads(_data_block(page))
    assert len(data["rounds"]) == len(gen.rounds)
    for r, rd in zip(gen.rounds, data["rounds"]):
        assert rd["n"] == r.tree.n and len(rd["nodes"]) == r.tree.n + 1
        assert rd["accepted"] == r.accepted and rd["bonus"]["tok"] == r.bonus
        assert [nd["tok"] for nd in rd["nodes"][1:]] == r.tree.tokens.tolist()
    for k in ("Prev", "Next", 'type="range"', 'id="tree"', "data-nodes", "ArrowLeft", "ArrowRight"):
        assert k in page


def test_write_html_escapes_text(tmp_path):
    nasty = [ord(c) for c in "<&\"'>/"]
    rt = make_round(20, seed=7, token_pool=nasty, start=len(b"</script><b>"))
    rt.bonus = ord("<")
    prompt = list(b"</script><b>")
    gen = kd.Generation(prompt, [rt.root] + rt.accepted_tokens + [rt.bonus], [rt], 2, 0.1,
                        {"method": "<ddtree>", "budget": 20, "drafter": "a&b\"c"})
    page = open(viz.write_html(gen, tmp_path / "x.html")).read()
    block = _data_block(page)
    assert not set(block) & set("<>&")                                   # cannot end the script early
    assert page.count("</script>") == 2
    assert "&lt;ddtree&gt;" in page and "a&amp;b&quot;c" in page and "<ddtree>" not in page
    data = json.loads(block)
    assert {nd["label"] for nd in data["rounds"][0]["nodes"]} <= {"<", "&", '"', "'", ">", "/"}
    assert data["prompt"][0][0] == "<"


def test_write_html_autoregressive_and_ids(runs, tmp_path):
    page = open(viz.write_html(runs["ar"], tmp_path / "ar.html")).read()
    assert json.loads(_data_block(page))["rounds"] == []
    rt = make_round(12, seed=8, vocab=5000)
    gen = kd.Generation([1, 2, 3], [rt.root, 7, 9], [rt], 2, 0.1, {})
    data = json.loads(_data_block(open(viz.write_html(gen, tmp_path / "ids.html", vocab_size=5000)).read()))
    assert data["rounds"][0]["nodes"][1]["label"] == str(int(rt.tree.tokens[0]))


def test_json_round_trip_draws_the_same(runs, tmp_path):
    gen = kd.Generation.from_json(runs["tree"].to_json())
    a = viz.plot_tree(gen.rounds[-1]).kd_drawn_nodes
    assert a == viz.plot_tree(runs["tree"].rounds[-1]).kd_drawn_nodes


def test_pictures_of_the_wrong_object_or_vocabulary_say_what_to_pass(tmp_path):
    """plot_tree / write_html of something else raised an AttributeError deep inside; a token past the default
    byte vocabulary (a 4096-token model's trace drawn without tokenizer) now says which argument fixes it."""
    with pytest.raises(ValueError, match="round_trace: expected a RoundTrace .*, got str"):
        viz.plot_tree("round 0")
    with pytest.raises(ValueError, match="result: expected a Generation .*, got list"):
        viz.write_html([], tmp_path / "v.html")
    with pytest.raises(ValueError, match=r"token: 614 is outside the vocabulary 0..255 \(the pictures label bytes "
                                         r"by default, vocab_size 256: pass tokenizer=target.tokenizer"):
        viz.token_label(614, 256)
    with pytest.raises(ValueError, match=r"token: 300 is outside the vocabulary 0..299$"):
        viz.token_label(300, 300)


def test_bad_picture_arguments_are_named(runs, tmp_path):
    """A figure path matplotlib cannot write, a vocabulary or node cap that means nothing, an empty list of runs:
    a ValueError naming the argument before anything is drawn or written (matplotlib's own error, a figure drawn
    anyway, an IndexError before)."""
    rt = runs["tree"].rounds[0]
    with pytest.raises(ValueError, match=r"path: expected a file name ending in \.png, \.svg, \.pdf .*got '.*x\.jpgz'"):
        viz.plot_tree(rt, path=tmp_path / "x.jpgz")
    with pytest.raises(ValueError, match="vocab_size: expected a positive integer .*got 0"):
        viz.plot_tree(rt, vocab_size=0)
    with pytest.raises(ValueError, match="max_nodes: expected an integer >= 0 or None, got -3"):
        viz.plot_tree(rt, max_nodes=-3)
    with pytest.raises(ValueError, match="gen_or_gens: expected a Generation or a non-empty list of them"):
        viz.acceptance_histogram([])
    with pytest.raises(IsADirectoryError, match="is a folder, expected a file path"):
        viz.write_html(runs["tree"], tmp_path)
    assert os.listdir(tmp_path) == []                                   # nothing written, no temporary left
    viz.plot_tree(rt, max_nodes=0, path=tmp_path / "only_path.svg")     # 0: the accepted path alone
    assert os.listdir(tmp_path) == ["only_path.svg"]


@pytest.mark.parametrize("call, msg", [
    (lambda r, rt: viz.plot_tree(rt, tokenizer="x"), r"tokenizer: expected target.tokenizer .* got str"),
    (lambda r, rt: viz.plot_tree(rt, ax="x"), "ax: expected a matplotlib Axes or None, got str"),
    (lambda r, rt: viz.token_label(5, 256, tokenizer=r), r"tokenizer: expected .* got Generation"),
    (lambda r, rt: viz.text_of([1.5], 256), "token: expected an integer, got 1.5"),
    (lambda r, rt: viz.plot_rounds([1, 2]), "rounds: expected a Generation or a list of its RoundTraces, got list"),
    (lambda r, rt: viz.plot_rounds(None), "rounds: expected a Generation .* got NoneType"),
    (lambda r, rt: viz.plot_rounds(r, picks=5), "picks: expected a list of round indices, got 5"),
    (lambda r, rt: viz.plot_rounds(r, n=0), "n: expected an integer >= 1, got 0"),
    (lambda r, rt: viz.plot_rounds(r, n=2.7), "n: expected an integer, got 2.7"),
    (lambda r, rt: viz.showcase_rounds(None), "rounds: expected a Generation"),
    (lambda r, rt: viz.tree_shape(None), "gen: expected a Generation"),
    (lambda r, rt: viz.stage_times([1]), "gen: expected a Generation .* got list"),
    (lambda r, rt: viz.acceptance_histogram(None), "gen_or_gens: expected a Generation or a list of them"),
    (lambda r, rt: viz.acceptance_histogram([r, 3]), r"gen_or_gens\[1\]: expected a Generation"),
    (lambda r, rt: viz.budget_sweep([{}]), "rows: expected a list of dicts with budget, tree_tau"),
    (lambda r, rt: viz.training_curves({}, {}), "log: not a training log"),
    (lambda r, rt: viz.write_html(r, "v.html", vocab_size=0), "vocab_size: expected an integer >= 1, got 0"),
])
def test_wrong_kinds_of_arguments_are_named(runs, call, msg):
    """A wrong kind of argument - a string for the tokenizer or the axes, a list of numbers for the rounds, a
    fractional count, a dict without a sweep's fields - is a ValueError naming it, not an AttributeError or
    KeyError from inside the plot; nothing is written."""
    with pytest.raises(ValueError, match=msg):
        call(runs["tree"], runs["tree"].rounds[0])
