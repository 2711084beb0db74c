"""benchmarks/ptxas_report.py: the launch capture on the simulator, the report's parsing and formatting, its argument
check (the compile step needs the CUDA toolkit's libNVVM, ptxas and NVRTC: skipped where they are missing)."""
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from numba import typeof

BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks")
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import ptxas_report  # noqa: E402

PTXAS_V = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN6kernel' for 'sm_90'
ptxas info    : Function properties for _ZN6kernel
    8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 46216 bytes smem, 400 bytes cmem[0]
"""


def test_ptxas_numbers_are_read():
    assert ptxas_report._ptxas_lines(PTXAS_V) == {"registers": 255, "smem": 46216, "stack": 8, "spill_st": 12,
                                                   "spill_ld": 16}
    assert ptxas_report._ptxas_lines("ptxas info    : Used 32 registers")["smem"] == 0


def test_argument_types_are_short():
    sig = (typeof(np.zeros((2, 3), np.float32)), typeof(np.zeros((2, 3), np.int32)[:, ::2]), typeof(1))
    assert ptxas_report._sig(sig) == "f32[2d], i32[2d A], int64"


def test_bad_cc_is_one_line_and_exit_2():
    r = subprocess.run([sys.executable, os.path.join(BENCH, "ptxas_report.py"), "--cc", "9"], capture_output=True,
                       text=True, cwd=ROOT, env=dict(os.environ, KDTREE_BACKEND="numpy"))
    assert r.returncode == 2 and "--cc '9'" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_capture_records_each_kernel_and_its_types(tmp_path):
    """Step 1 on the simulator: the tree build's worked example launches the build kernel once, recorded with
    the module, the name and numba's types of its arguments."""
    out = tmp_path / "launches.pkl"
    code = (f"import sys, ptxas_report; sys.exit(ptxas_report.capture({str(out)!r}, "
            "['tests/kernels/test_tree_build.py', '-q', '-p', 'no:cacheprovider', '-k', 'docstring_worked']))")
    env = dict(os.environ, KDTREE_BACKEND="sim", PYTHONPATH=os.pathsep.join([ROOT, BENCH]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with open(out, "rb") as f:
        records = pickle.load(f)
    assert [(m, n) for m, n, _ in records] == [("kdtree_numba.kernels.tree_build", "_build_kernel")]
    assert str(records[0][2][0]) == "array(float32, 2d, C)"             # lp [R, L * K]


def test_compile_step_reports_the_build_kernel(tmp_path):
    """Step 2 where the toolkit is (the GPU machine; a CPU machine with libNVVM, ptxas and NVRTC): the build
    kernel compiles for sm_90 with registers counted and no spills."""
    lp, ids, wtab, itab = (np.zeros((1, 8), np.float32), np.zeros((1, 2, 4), np.int32),
                           np.zeros((2, 1, 9), np.float64), np.zeros((2, 5, 1, 9), np.int32))
    i2, i3 = np.zeros((1, 9), np.int32), np.zeros((2, 1, 9), np.int32)
    sig = tuple(typeof(a) for a in (lp, ids, 4, 8, wtab, itab, i3, i3, np.zeros((1, 4)), i2, i2, np.zeros(1, np.int32),
                                     i2, 0))
    records = tmp_path / "launches.pkl"
    with open(records, "wb") as f:
        pickle.dump([("kdtree_numba.kernels.tree_build", "_build_kernel", sig)], f)
    code = f"import ptxas_report as r; print(repr(r.compile_all({str(records)!r}, (9, 0), None)))"
    env = dict(os.environ, KDTREE_BACKEND="numpy", PYTHONPATH=os.pathsep.join([ROOT, BENCH]))
    env.pop("NUMBA_ENABLE_CUDASIM", None)                               # this session's simulator, if any
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    row = eval(r.stdout.strip().splitlines()[-1])[0]
    if isinstance(row[2], str) and ("NotFound" in row[2] or "Support" in row[2] or "ptxas failed" in row[2]):
        pytest.skip(f"no CUDA toolkit to compile with here: {row[2]}")
    assert row[0] == "tree_build._build_kernel" and 32 <= row[2] <= 255 and row[3] == "0 / 0", row


SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_3:
        /*0010*/                   LDS R4, [R2] ;
        /*0020*/                   HMMA.1688.F32.TF32 R8, R4, R6, R8 ;
        /*0030*/              @!PT LDS RZ, [RZ] ;
        /*0040*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR8][R10.64], P1 ;
.L_x_4:
        /*0050*/                   IADD3 R2, R2, 0x4, RZ ;
        /*0060*/               @P0 BRA `(.L_x_4) ;
        /*0070*/               @P1 BRA `(.L_x_3) ;
        /*0080*/                   BRA `(.L_x_5) ;
.L_x_5:
        /*0090*/                   EXIT ;
"""


def test_sass_loops_are_the_backward_branches():
    """Two loops (the inner one nested in the outer), a forward branch that is none; predicated instructions count
    under their opcode; --loops' rows keep the loops with HMMA or LDGSTS only."""
    loops = ptxas_report.sass_loops(SASS)
    assert [(lp["start"], lp["end"], lp["instructions"]) for lp in loops] == [(0x10, 0x70, 7), (0x50, 0x60, 2)]
    assert loops[0]["ops"] == {"LDS": 2, "HMMA": 1, "LDGSTS": 1, "IADD3": 1, "BRA": 2}
    assert ptxas_report.loop_rows("k", SASS) == [["k", "0x10-0x70", 7, 1, "7.0", 2, 1, "BRA 2, IADD3 1"]]
