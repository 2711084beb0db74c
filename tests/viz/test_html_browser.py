"""The HTML viewer in a real browser: headless Chromium runs the page's script, and we read back the DOM it
built and a screenshot of it.

Needs ``chromium`` (Debian: ``apt-get install chromium``) on PATH; skipped with the reason otherwise.
"""
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import kdtree_numba as kd
import kdtree_numba.viz as viz

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless browser test needs `chromium` (or "
                                                         "`chromium-browser`) on PATH: apt-get install chromium")


def chromium(tmp_path, *args) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    profile.mkdir()
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def dump_dom(tmp_path, url: str) -> str:
    res = chromium(tmp_path, "--dump-dom", url)
    assert res.returncode == 0 and "<svg" in res.stdout, f"chromium --dump-dom failed:\n{res.stderr[-2000:]}"
    return res.stdout


def tree_counts(dom: str) -> dict:
    svg = re.search(r'<svg id="tree"[^>]*>', dom).group(0)
    return {"round": int(re.search(r'data-round="(-?\d+)"', svg).group(1)),
            "data_nodes": int(re.search(r'data-nodes="(\d+)"', svg).group(1)),
            "nodes": len(re.findall(r'<circle class="node\b', dom)),
            "accepted": len(re.findall(r'<circle class="node\b[^"]*\baccepted\b', dom)),
            "bonus": len(re.findall(r'<circle class="bonus\b', dom)),
            "edges": len(re.findall(r'<line class="edge\b', dom))}


@pytest.fixture(scope="module")
def gen():
    with kd.backend.use("numpy"):
        t = kd.tiny_target(0)
        g = kd.generate(t, list(b"Hello <&> world"), 24, drafter=kd.OracleDrafter(t, noise=0.5, depth=6),
                        budget=32)
    assert len(g.rounds) >= 3
    return g


def test_first_round_rendered_on_load(gen, tmp_path):
    page = viz.write_html(gen, tmp_path / "trace.html")
    dom = dump_dom(tmp_path, "file://" + os.path.abspath(page))
    c = tree_counts(dom)
    r0 = gen.rounds[0]
    assert c["round"] == 0
    assert c["data_nodes"] == r0.tree.n
    assert c["nodes"] == r0.tree.n + 1 == c["data_nodes"] + 1          # every tree node + the root
    assert c["accepted"] == len(r0.accepted) >= 1                      # the accepted path, root included
    assert c["bonus"] == 1
    assert c["edges"] == r0.tree.n + 1                                  # one per node + the bonus edge
    assert "Round 1 / " in dom
    # the text panel: the prompt's "<&>" arrives as text (escaped in the serialized DOM), not as markup
    text = re.sub(r"<[^>]+>", "", re.search(r'<div id="text">(.*?)</div>', dom, re.S).group(1))
    assert text.startswith("Hello &lt;&amp;&gt; world")
    assert len(re.findall(r'<span class="[^"]*\bacc\b', dom)) == len(r0.accepted) - 1


def test_round_from_address(gen, tmp_path):
    """``page.html#round=3`` opens the third round: the same markup, counted for that round."""
    page = viz.write_html(gen, tmp_path / "trace.html")
    k = min(3, len(gen.rounds))
    c = tree_counts(dump_dom(tmp_path, "file://" + os.path.abspath(page) + f"#round={k}"))
    r = gen.rounds[k - 1]
    assert c["round"] == k - 1 and c["nodes"] == r.tree.n + 1 and c["accepted"] == len(r.accepted)


def test_screenshot_not_blank(gen, tmp_path):
    from matplotlib.image import imread

    page = viz.write_html(gen, tmp_path / "trace.html")
    shot = tmp_path / "shot.png"
    res = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,800",
                   "file://" + os.path.abspath(page))
    assert res.returncode == 0 and shot.exists(), f"no screenshot:\n{res.stderr[-2000:]}"
    img = imread(str(shot))[..., :3]                                    # float RGB in [0, 1]
    assert img.shape[:2] == (800, 1200)
    assert img.std() > 0.05
    assert not np.all(img > 0.98)
    accent = np.array([0xE8, 0x59, 0x0C]) / 255                          # the accepted path's orange
    assert (np.abs(img - accent).max(axis=-1) < 0.08).sum() > 50, "accepted path not visible"


def test_autoregressive_page(tmp_path):
    with kd.backend.use("numpy"):
        t = kd.tiny_target(0)
        g = kd.generate(t, list(b"Hi"), 6)
    page = viz.write_html(g, tmp_path / "ar.html")
    c = tree_counts(dump_dom(tmp_path, "file://" + os.path.abspath(page)))
    assert c["round"] == -1 and c["nodes"] == 0 and c["data_nodes"] == 0


def test_navigation_and_tooltip(gen, tmp_path):
    """Drive the page from an extra script: Next, Next, ArrowLeft, End, slider; hover a node."""
    page = open(viz.write_html(gen, tmp_path / "trace.html")).read()
    probe = """<script>
    var log = [];
    function state() { return document.getElementById("tree").getAttribute("data-round"); }
    document.getElementById("next").click(); document.getElementById("next").click(); log.push(state());
    document.dispatchEvent(new KeyboardEvent("keydown", {key: "ArrowLeft"})); log.push(state());
    document.dispatchEvent(new KeyboardEvent("keydown", {key: "End"})); log.push(state());
    var s = document.getElementById("slider"); s.value = "0"; s.dispatchEvent(new Event("input"));
    log.push(state());
    var c = document.querySelector("circle.node.accepted:not(.root)") || document.querySelector("circle.node");
    c.dispatchEvent(new MouseEvent("mouseenter", {clientX: 50, clientY: 50}));
    document.body.setAttribute("data-log", log.join(","));
    </script></body>"""
    (tmp_path / "probe.html").write_text(page.replace("</body>", probe, 1), encoding="utf-8")
    dom = dump_dom(tmp_path, "file://" + str(tmp_path / "probe.html"))
    last = len(gen.rounds) - 1
    assert re.search(r'data-log="([^"]*)"', dom).group(1) == f"2,1,{last},0"
    tip = re.sub(r"<[^>]+>", " ", re.search(r'<div id="tip"[^>]*>(.*?)</div>\s*<script', dom, re.S).group(1))
    assert "depth" in tip and "rank" in tip and "draft p" in tip and "logw" in tip
