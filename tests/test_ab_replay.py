"""benchmarks/ab_replay.py: configurations of module constants, alternating pass by pass, bad ones
refused in one line (the timing itself is for a GPU; --quick runs the whole script on any backend)."""
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "ab_replay.py")


def ab(tmp_path, *argv):
    env = dict(os.environ, OUT=str(tmp_path), KDTREE_BACKEND="numpy")     # the simulator would take minutes
    return subprocess.run([sys.executable, SCRIPT, "--quick", *argv], capture_output=True, text=True, env=env,
                          timeout=600)


def test_two_configurations_alternate_pass_by_pass_with_identical_tokens(tmp_path):
    r = ab(tmp_path, "--config", "as-is", "--config", "v3:kdtree_numba.kernels.tree_verify.V3_MIN_HEADS=0,"
           "kdtree_numba.kernels.gemm_choice.CANDIDATES=('rows', 'blocks 16'),"     # a value with its own comma
           # @MODULE.NAME: an object in place of the package's (here the NumPy reference of the gather)
           "kdtree_numba.kernels.moe_routing.gather_rows=@kdtree_numba.kernels.moe_routing.gather_rows_ref",
           "--rounds", "2", "--passes", "1", "--budgets", "8")
    assert r.returncode == 0, r.stderr[-2000:]
    runs = json.load(open(tmp_path / "ab_replay.json"))["runs"]
    assert [x["config"] for x in runs] == ["as-is", "v3"]
    assert all(x["mismatches"] == 0 and set(x["rates"]) == {"AR", "chain", "DDTree-8"} for x in runs)
    assert all(len(rates) == 2 for x in runs for rates in x["rates"].values())       # rounds x passes each
    passes = [line for line in r.stdout.splitlines() if line.startswith("[pass ")]
    assert len(passes) == 2 and all("as-is:" in line and "v3:" in line for line in passes)   # A B, A B
    assert "| v3 " in r.stdout and "DDTree-8 / AR / chain" in r.stdout and "vs as-is" in r.stdout


def test_bad_configurations_are_one_line_errors(tmp_path):
    for argv, msg in [(["--config", "x:kdtree_numba.kernels.tree_verify.NOPE=1"], "has no attribute 'NOPE'"),
                      (["--config", "x:no_such_module.A=1"], "cannot import 'no_such_module'"),
                      (["--config", "x:kdtree_numba.kernels.tree_verify.V3_MIN_HEADS=two"], "is not a Python literal"),
                      (["--config", "x:V3_MIN_HEADS"], "expected MODULE.ATTR=VALUE"),
                      (["--config", "x:kdtree_numba.kernels.moe_routing.gather_rows=@no_such_module.f"],
                       "cannot import 'no_such_module'"),
                      (["--config", "x:kdtree_numba.kernels.moe_routing.gather_rows=@kdtree_numba.backend.nope"],
                       "kdtree_numba.backend has no attribute 'nope'"),
                      (["--config", "x:kdtree_numba.kernels.moe_routing.gather_rows=@f"], "expected @MODULE.NAME"),
                      (["--passes", "0"], "argument --passes: expected a whole number >= 1, got 0"),
                      (["--budgets", "8,x"], "argument --budgets: expected comma-separated whole numbers")]:
        r = ab(tmp_path, *argv)
        assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, (argv, r.stderr)
