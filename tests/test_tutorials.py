"""Every tutorial runs as a script (a subprocess, as a reader would run it) and passes its own checks.

Each tutorial prints one PASS/FAIL line per check and exits non-zero if any failed. Backends: the numba CUDA
simulator for the stage tutorials (those that show the trained pair run it on NumPy inside), the NumPy references
for the loop tutorial (dozens of generations); set ``KDTREE_TUTORIAL_BACKEND=cuda`` (or sim / numpy) to run them
all on one backend, e.g. on the GPU machine.
A tutorial whose optional dependencies are missing prints ``SKIP:`` and exits 0; the test is then skipped.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))

# measured on the 2-core CI machine: every tutorial but 11 takes <= 30 s on the simulator (07-10 run the trained
# pair on NumPy inside, the simulator only for kernels at tiny shapes); 11 is the whole loop, dozens of generations
NUMPY_TUTORIALS = {"11_ddtree_loop.py"}

# One BLAS thread per tutorial: the suite runs tutorials side by side (pytest -n 2 on 2 cores), and OpenBLAS's
# spinning worker threads on an oversubscribed machine made the trained pair's NumPy forwards up to 20x slower.
SINGLE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def backend_for(path: pathlib.Path) -> str:
    override = os.environ.get("KDTREE_TUTORIAL_BACKEND", "").strip()
    if override:
        return override
    return "numpy" if path.name in NUMPY_TUTORIALS else "sim"


def test_tutorials_found():
    names = [p.name for p in TUTORIALS]
    assert len(names) >= 12, names
    assert names[0].startswith("00_") and (ROOT / "tutorials" / "_common.py").exists()


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial(path, tmp_path):
    backend = backend_for(path)
    env = dict(os.environ, KDTREE_BACKEND=backend, MPLBACKEND="Agg")
    for k, v in SINGLE_THREAD.items():
        env.setdefault(k, v)
    if backend == "sim":
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    else:
        env.pop("NUMBA_ENABLE_CUDASIM", None)      # inherited from a simulator test process
    proc = subprocess.run([sys.executable, str(path), "--out", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stderr[-2000:] + proc.stdout      # stdout last: its FAIL lines and summary survive the cut
    if proc.returncode == 0 and "SKIP:" in proc.stdout and "PASS" not in proc.stdout:
        pytest.skip(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, f"{path.name} exited {proc.returncode} on {backend}:\n{out[-6000:]}"
    assert "PASS" in proc.stdout, f"{path.name} printed no PASS line:\n{out[-3000:]}"
    assert "FAIL" not in proc.stdout + proc.stderr, f"{path.name} reported a failure:\n{out[-6000:]}"
