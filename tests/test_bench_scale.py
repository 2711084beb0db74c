"""benchmarks/bench_scale.py: a round's stage times by model size, each DDTree budget against the chain's round (the
timing itself is for a GPU; --quick runs the whole script on the NumPy backend), bad arguments in one line."""
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_scale.py")


def run(tmp_path, *argv):
    env = dict(os.environ, OUT=str(tmp_path), KDTREE_BACKEND="numpy")
    return subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True, env=env, timeout=600)


def test_quick_run_times_the_chain_and_a_tree_and_divides_by_the_chain(tmp_path):
    r = run(tmp_path, "--quick")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.load(open(tmp_path / "bench_scale.json"))["tables"][0]["rows"]
    assert [row[2] for row in rows] == ["chain", "DDTree-4"]
    assert rows[0][-2] == "1.000"                               # the chain against itself
    for row in rows:
        stages, total = [float(x) for x in row[3:9]], float(row[9])
        # the round is its stages' sum, up to the rounding of 7 printed values to 0.1 us (< 7 x 0.05)
        assert all(x > 0 for x in stages) and abs(sum(stages) - total) < 0.36


def test_bad_arguments_are_one_line_errors(tmp_path):
    for argv, msg in [(["--quick", "--scales", "Z"], "--scales: unknown scale 'Z'"),
                      (["--quick", "--tokens", "2"], "argument --tokens: expected a whole number >= 3, got 2"),
                      (["--quick", "--budgets", "0"], "argument --budgets")]:
        r = run(tmp_path, *argv)
        assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, (argv, r.stderr)
