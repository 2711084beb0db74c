"""Registers, spills and shared memory of every kernel a test run launches, compiled for a GPU this machine may not
have: ptxas's own report, for sessions without a device (and a quick check with one).

    PYTHONPATH=$PWD python3 benchmarks/ptxas_report.py                       # tests/kernels, sm_90
    PYTHONPATH=$PWD python3 benchmarks/ptxas_report.py --sass /tmp/sass -- tests/kernels/test_tree_build.py -k deep

Two steps. (1) The given pytest arguments (default ``tests/kernels``) run on numba's CUDA simulator with
``backend.launch`` recording each kernel and its argument types (``numba.typeof`` of the arguments as passed,
before the simulator's contiguous copies: a strided view is typed with layout A, as a GPU launch compiles it).
(2) A second process (no simulator) compiles each distinct (kernel, types) to PTX for ``--cc``
with the kernel's own jit options (launch bounds, fastmath, lineinfo; ``max_registers`` becomes ptxas's
``-maxrregcount``) and runs ``ptxas -v``; ``--sass DIR`` also writes each kernel's SASS there (nvdisasm).

Needs the CUDA toolkit's libNVVM and ptxas (on PATH, under CUDA_HOME, or /usr/local/cuda*), NVRTC (numba-cuda
asks it for the architectures it supports) and, for ``--sass``, nvdisasm. A CPU machine with the toolkit but not
those two can take them from PyPI's wheels without installing anything:
    pip download --no-deps 'nvidia-cuda-nvrtc==13.0.*' 'nvidia-cuda-nvdisasm==13.2.*' -d /tmp/w
    for f in /tmp/w/*.whl; do unzip -q -o $f -d /tmp/cu; done
    LD_LIBRARY_PATH=/tmp/cu/nvidia/cu13/lib PATH=$PATH:/tmp/cu/nvidia/cu13/bin python3 benchmarks/ptxas_report.py
Without a GPU, numba-cuda's device query is replaced by ``--cc`` for the compile (the one patch; nothing runs).
Output: one row per (kernel, types): registers, spill stores / loads (bytes), stack frame, static shared memory.
Example row: ``tree_build._build_kernel | f32[2d], i32[3d], int64, .. | 80 | 0 / 0 | 0 | 46216``.

``--loops`` (needs nvdisasm) adds a second table from the SASS: every loop (a backward branch) that issues
tensor-core MMAs or asynchronous copies, with its instructions per pass and how many are HMMA, LDS and LDGSTS - the
instruction budget of a kernel's inner loops, readable without a GPU (the twenty-second session found a key-tile
copy loop of 52 instructions a 16-byte copy this way). Example row: ``tree_verify._tree_attention_v3_kernel |
0xeea0-0xf260 | 61 | 12 | 5.1 | 12 | 0 | IMAD 6, IADD3 2, ISETP 2``: one k8 step of the scores.
"""
import glob
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def capture(out: str, pytest_args: list) -> int:
    """Step 1 (in a simulator process): run pytest with backend.launch recording (module, name, types)."""
    from kdtree_numba import backend          # first: it sets NUMBA_ENABLE_CUDASIM before numba reads its config

    import numba
    import pytest

    seen = {}
    launch = backend.launch

    def recording(kernel, grid, block, *args, shared=0):
        fn = kernel.fn
        types = tuple(numba.typeof(backend.view(a) if hasattr(a, "__cuda_array_interface__") else a) for a in args)
        seen.setdefault((fn.__module__, fn.__qualname__, types), None)
        return launch(kernel, grid, block, *args, shared=shared)

    backend.launch = recording
    rc = pytest.main(pytest_args)
    with open(out, "wb") as f:
        pickle.dump(list(seen), f)
    return rc


def _tool(name: str) -> str:
    """A CUDA toolkit program: on PATH, else under CUDA_HOME / CUDA_PATH, else the newest /usr/local/cuda*/bin."""
    homes = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")] + sorted(glob.glob("/usr/local/cuda*"))[::-1]
    found = [os.path.join(h, "bin", name) for h in homes if h and os.path.exists(os.path.join(h, "bin", name))]
    return shutil.which(name) or (found[0] if found else name)


def _ptxas_lines(text: str) -> dict:
    """ptxas -v's numbers for the one entry function it compiled."""
    num = {}
    for key, pat in (("registers", r"Used (\d+) registers"), ("smem", r"(\d+) bytes smem"),
                     ("stack", r"(\d+) bytes stack frame"), ("spill_st", r"(\d+) bytes spill stores"),
                     ("spill_ld", r"(\d+) bytes spill loads")):
        m = re.search(pat, text)
        num[key] = int(m.group(1)) if m else 0
    return num


_SASS_LINE = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^\s*\.(L_x_\d+):")


def sass_loops(text: str) -> list:
    """The loops of one kernel's SASS (nvdisasm -c): for each backward branch, its body from the target label to
    the branch, as {"start", "end" (addresses), "instructions", "ops" (opcode without suffixes -> count)}, in
    address order. A predicated instruction counts under its opcode (``@!P1 BRA`` is a BRA)."""
    ins, labels, pending = [], {}, []
    for line in text.splitlines():
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _SASS_LINE.match(line)
        if m:
            body = re.sub(r"^@!?U?P[0-9T]\s+", "", m.group(2).strip())
            for name in pending:
                labels[name] = len(ins)
            pending = []
            ins.append((int(m.group(1), 16), body.split()[0].split(".")[0], body))
    loops = []
    for i, (addr, op, body) in enumerate(ins):
        m = re.search(r"\(\.(L_x_\d+)\)", body) if op == "BRA" else None
        if m and labels.get(m.group(1), i + 1) <= i:
            first = labels[m.group(1)]
            ops = {}
            for _, o, _ in ins[first:i + 1]:
                ops[o] = ops.get(o, 0) + 1
            loops.append({"start": ins[first][0], "end": addr, "instructions": i + 1 - first, "ops": ops})
    return sorted(loops, key=lambda lp: lp["start"])


def loop_rows(label: str, text: str) -> list:
    """``--loops``' table rows of one kernel: its loops with HMMA or LDGSTS instructions."""
    rows = []
    for lp in sass_loops(text):
        ops = lp["ops"]
        if not (ops.get("HMMA") or ops.get("LDGSTS")):
            continue
        rest = sorted(((n, o) for o, n in ops.items() if o not in ("HMMA", "LDS", "LDGSTS")), reverse=True)[:3]
        per = f"{lp['instructions'] / ops['HMMA']:.1f}" if ops.get("HMMA") else "-"
        rows.append([label, f"{lp['start']:#x}-{lp['end']:#x}", lp["instructions"], ops.get("HMMA", 0), per,
                     ops.get("LDS", 0), ops.get("LDGSTS", 0), ", ".join(f"{o} {n}" for n, o in rest)])
    return rows


def compile_all(records: str, cc: tuple, sass_dir: str | None) -> list:
    """Step 2 (no simulator): PTX per record, ptxas -v, optionally SASS. Returns table rows."""
    import importlib
    import types

    import numba.cuda.dispatcher as dispatcher
    from numba import cuda

    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=cc)
    ptxas, nvdisasm = _tool("ptxas"), _tool("nvdisasm")
    arch = f"sm_{cc[0]}{cc[1]}"
    rows = []
    with open(records, "rb") as f:
        todo = pickle.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (module, name, sig) in enumerate(sorted(todo, key=lambda r: (r[0], r[1], str(r[2])))):
            disp = getattr(importlib.import_module(module), name.split(".")[-1])
            opts = disp.targetoptions
            label = f"{module.rsplit('.', 1)[-1]}.{name}"
            try:
                ptx, _ = cuda.compile_ptx(disp.py_func, sig, cc=cc, lineinfo=bool(opts.get("lineinfo")),
                                          fastmath=bool(opts.get("fastmath")), opt=opts.get("opt", True),
                                          launch_bounds=opts.get("launch_bounds"))
            except Exception as e:                     # report and go on: one kernel must not hide the rest
                rows.append([label, _sig(sig), f"compile failed: {type(e).__name__}", "", "", ""])
                continue
            src = os.path.join(tmp, f"k{i}.ptx")
            cubin = os.path.join(tmp, f"k{i}.cubin")
            with open(src, "w") as f:
                f.write(ptx)
            cmd = [ptxas, f"-arch={arch}", "-v", src, "-o", cubin]
            if opts.get("max_registers"):
                cmd[1:1] = ["-maxrregcount", str(opts["max_registers"])]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                rows.append([label, _sig(sig), f"ptxas failed: {done.stderr.strip()[-200:]}", "", "", ""])
                continue
            n = _ptxas_lines(done.stderr)
            rows.append([label, _sig(sig), n["registers"], f"{n['spill_st']} / {n['spill_ld']}", n["stack"],
                         n["smem"]])
            if sass_dir:
                os.makedirs(sass_dir, exist_ok=True)
                with open(os.path.join(sass_dir, f"{label}.{i}.sass"), "w") as f:
                    subprocess.run([nvdisasm, "-c", cubin], stdout=f, check=False)
    return rows



def report(records: str, cc: tuple, sass_dir: str | None, loops: bool = False) -> None:
    """Step 2's table, with ``loops`` the loop table from the SASS in ``sass_dir`` (and
    bench_results/ptxas_report.json, as every benchmark writes)."""
    from _common import save, table

    rows = compile_all(records, cc, sass_dir)
    table(f"Kernels compiled for sm_{cc[0]}{cc[1]} (ptxas -v)", ["kernel", "argument types", "registers",
          "spill stores / loads (bytes)", "stack (bytes)", "static shared (bytes)"], rows)
    if loops:
        found = []
        for path in sorted(glob.glob(os.path.join(sass_dir, "*.sass"))):
            with open(path) as f:
                found += loop_rows(os.path.basename(path).rsplit(".", 2)[0], f.read())
        table("Loops with tensor-core MMAs or asynchronous copies (SASS; instructions per pass)",
              ["kernel", "loop", "instructions", "HMMA", "per HMMA", "LDS", "LDGSTS", "most of the rest"], found)
    save("ptxas_report")


def _sig(sig) -> str:
    """Argument types, short: array(float32, 2d, C) -> f32[2d], a non-C layout named (f32[2d A])."""
    short = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64", "uint32": "u32", "int8": "i8"}

    def one(m):
        layout = "" if m.group(3) == "C" else " " + m.group(3)
        return f"{short.get(m.group(1), m.group(1))}[{m.group(2)}d{layout}]"
    return re.sub(r"array\((\w+), (\d)d, (\w)\)", one, ", ".join(str(t) for t in sig))


def main() -> int:
    from kdtree_numba.argtypes import OneLineParser

    p = OneLineParser(description=__doc__.split("\n\n")[0])                 # a bad value: one line, exit 2
    p.add_argument("--cc", default="9.0", help="compute capability to compile for (default 9.0, the H200)")
    p.add_argument("--sass", metavar="DIR", help="also write each kernel's SASS into DIR (needs nvdisasm)")
    p.add_argument("--loops", action="store_true", help="also list each kernel's loops with MMAs or async copies "
                   "(their instructions per pass, from the SASS; needs nvdisasm)")
    p.add_argument("pytest_args", nargs="*", help="pytest arguments after -- (default: tests/kernels)")
    a = p.parse_args()
    m = re.fullmatch(r"(\d+)\.(\d)", a.cc)
    if not m:
        p.error(f"--cc {a.cc!r}: expected MAJOR.MINOR, e.g. 9.0")
    cc = (int(m.group(1)), int(m.group(2)))
    with tempfile.TemporaryDirectory() as tmp:
        records = os.path.join(tmp, "launches.pkl")
        sass = a.sass or (os.path.join(tmp, "sass") if a.loops else None)
        env = dict(os.environ, KDTREE_BACKEND="sim", PYTHONPATH=os.pathsep.join([ROOT, HERE]))
        tests = a.pytest_args or ["tests/kernels", "-q"]
        code = f"import sys, ptxas_report; sys.exit(ptxas_report.capture({records!r}, {tests!r}))"
        if subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env).returncode not in (0, 5):
            print("ptxas_report: the test run failed (its launches are still reported)", file=sys.stderr)
        if not os.path.exists(records):
            return 1
        with open(records, "rb") as f:
            if not pickle.load(f):
                print(f"ptxas_report: the tests {' '.join(tests)} launched no kernel (on the numpy backend, or "
                      "deselected?)", file=sys.stderr)
                return 1
        env["KDTREE_BACKEND"] = "numpy"
        env.pop("NUMBA_ENABLE_CUDASIM", None)          # inherited from a simulator session, it would fake the compile
        code = f"import ptxas_report; ptxas_report.report({records!r}, {cc!r}, {sass!r}, {a.loops!r})"
        return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env).returncode

if __name__ == "__main__":
    sys.exit(main())
