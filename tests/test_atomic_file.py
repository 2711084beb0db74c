"""Files appear whole or not at all (kdtree_numba/atomic_file.py): a failed write keeps the old file and leaves no
temporary; the writers that use it (a trace, a figure) do the same."""
import os

import pytest

import kdtree_numba as kd
from kdtree_numba.atomic_file import write_atomic, write_text_atomic


def test_a_write_replaces_the_file_whole(tmp_path):
    p = tmp_path / "t.json"
    write_text_atomic(p, "old")
    write_text_atomic(p, "new")
    assert p.read_text() == "new" and os.listdir(tmp_path) == ["t.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_nothing(tmp_path):
    p = tmp_path / "t.json"
    p.write_text("old")
    seen = []

    def half_then_fail(tmp):
        seen.append(tmp)
        with open(tmp, "w") as f:
            f.write("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(p, half_then_fail)
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["t.json"]
    # the temporary sat beside the file and kept its extension (matplotlib picks the format from it)
    assert os.path.dirname(seen[0]) == str(tmp_path) and seen[0].endswith(".json") and seen[0] != str(p)


def test_a_trace_that_fails_to_serialise_leaves_the_old_file(tmp_path, monkeypatch):
    with kd.backend.use("numpy"):                                       # the references: fast anywhere
        t = kd.tiny_target(0)
        g = kd.generate(t, [1, 2, 3], 4, drafter=kd.RandomDrafter(t.config.vocab_size, 3), budget=4)
    p = tmp_path / "trace.json"
    g.to_json(p)
    good = p.read_text()
    assert kd.Generation.from_json(str(p)).tokens == g.tokens

    def fail(tmp, text):
        with open(tmp, "w") as f:
            f.write(text[:10])
        raise KeyboardInterrupt

    monkeypatch.setattr("kdtree_numba.atomic_file._write_text", fail)
    with pytest.raises(KeyboardInterrupt):
        g.to_json(p)
    assert p.read_text() == good and os.listdir(tmp_path) == ["trace.json"]


def test_a_figure_is_written_in_its_extensions_format(tmp_path):
    from matplotlib.figure import Figure

    from kdtree_numba.viz.trees import save

    fig = Figure()
    fig.add_subplot().plot([0, 1], [1, 0])
    save(fig, tmp_path / "f.svg")
    save(fig, tmp_path / "f.png")
    assert (tmp_path / "f.svg").read_text().lstrip().startswith("<?xml")
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(tmp_path)) == ["f.png", "f.svg"]
