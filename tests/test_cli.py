"""The command line: the demo runs and agrees with plain decoding; bad input prints one line and exits 2."""
import json
import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "KDTREE_BACKEND": "numpy"}


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "kdtree_numba", *args], capture_output=True, text=True, env=ENV,
                          timeout=300, cwd=cwd)


def test_demo_runs_and_writes_its_outputs(tmp_path):
    r = cli("demo", "--max-new-tokens", "40", "--out", str(tmp_path / "demo"))
    assert r.returncode == 0, r.stderr
    assert "DDTree output == plain greedy decoding: yes" in r.stdout
    assert "speedup in target forwards" in r.stdout
    for f in ("rounds.png", "acceptance.png", "viewer.html", "trace.json"):
        assert (tmp_path / "demo" / f).stat().st_size > 0


def test_generate_trace_then_trees(tmp_path):
    trace = tmp_path / "t.json"
    r = cli("generate", "--prompt", "Hello", "--max-new-tokens", "12", "--budget", "8", "--trace", str(trace))
    assert r.returncode == 0, r.stderr
    data = json.loads(trace.read_text())
    assert len(data["tokens"]) == 12 and data["rounds"]
    r = cli("trees", str(trace), "--out", str(tmp_path / "trees"), "--rounds", "0,1")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "trees" / "round001.png").exists() and (tmp_path / "trees" / "viewer.html").exists()
    r = cli("generate", "--ids", "1,2,3", "--max-new-tokens", "5", "--drafter", "none")
    assert r.returncode == 0 and len(r.stdout.split()) == 5


@pytest.mark.parametrize("args, msg", [
    (["generate", "--model", "/no/such/dir"], "--model: /no/such/dir is not a directory"),
    (["generate", "--ids", "1,999"], "--ids: token id 999 is outside the vocabulary"),
    (["generate", "--ids", "1,2,x"], "--ids: expected comma-separated whole numbers"),
    (["generate", "--budget", "-3", "--max-new-tokens", "3"], "budget: expected an integer >= 0, got -3"),
    (["generate", "--temperature", "nan", "--max-new-tokens", "3"], "temperature: expected a number >= 0"),
    (["generate", "--max-new-tokens", "0"], "--max-new-tokens: expected a number >= 1"),
    (["trees", "/no/such/trace.json"], "trace: /no/such/trace.json does not exist"),
    (["demo", "--budget", "x"], "--budget: invalid int value"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["bench", "nonsense"], "unknown benchmark 'nonsense'"),
])
def test_bad_input_is_one_line_and_status_2(args, msg):
    r = cli(*args)
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_not_a_trace(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1}')
    r = cli("trees", str(bad))
    assert r.returncode == 2 and "not a kdtree_numba trace" in r.stderr


def test_tour_and_help():
    r = cli("tour")
    assert r.returncode == 0 and "all stages match their references" in r.stdout
    assert cli("--help").returncode == 0
    assert cli("generate", "--help").returncode == 0
