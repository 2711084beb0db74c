"""``python -m kdtree_numba.parallel``: the fake-rank run end to end (in this process, NumPy backend), its bad
arguments (one line, status 2, before anything is loaded), and on a machine with 2 GPUs the real NCCL launch."""
import os
import subprocess
import sys

import pytest

from kdtree_numba.parallel import launcher


def run(capsys, *args):
    code = launcher.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_fake_ranks_generate_the_one_rank_tokens(capsys, numpy_backend):
    code, out, err = run(capsys, "--world", 2, "--comm", "fake", "--max-new-tokens", 16, "--budget", 8)
    assert code == 0, err
    assert "OK: 2 ranks (fake, reduce=tokens) generated the 1-rank tokens" in out
    assert out.count("16 tokens") == 3


@pytest.mark.parametrize("args,msg", [
    (["--world", "0"], "argument --world: expected a whole number >= 1, got 0"),
    (["--world", "two"], "argument --world: expected a whole number >= 1, got 'two'"),
    ([], "the following arguments are required: --world"),
    (["--world", "3", "--comm", "fake"], "--world 3: does not divide the model's 8 routed experts"),
    (["--world", "16", "--comm", "fake"], "--world 16: does not divide the model's 8 routed experts"),
    (["--world", "2", "--comm", "mpi"], "argument --comm: invalid choice"),
    (["--world", "2", "--comm", "fake", "--model", "/no/such/dir"], "--model: /no/such/dir is not tiny"),
    (["--world", "2", "--comm", "fake", "--drafter", "/no/such/dir"], "--drafter: /no/such/dir is not oracle"),
    (["--world", "2", "--comm", "fake", "--budget", "2000"], "expected a whole number in [0, 1024], got 2000"),
    (["--world", "2", "--comm", "fake", "--ids", "1,x"], "expected comma-separated token ids"),
    # options the run would ignore
    (["--world", "2", "--comm", "fake", "--drafter", "default", "--noise", "0.2"],
     "--noise 0.2: applies to --drafter oracle only, not --drafter default"),
    (["--world", "2", "--comm", "fake", "--drafter", "default", "--depth", "4"],
     "--depth 4: applies to --drafter oracle only"),
    (["--world", "2", "--comm", "fake", "--model", "default", "--drafter", "default", "--seed", "1"],
     "--seed 1: seeds --model tiny's weights and the oracle drafter, neither of which runs here"),
])
def test_bad_arguments_are_one_line_and_status_2(args, msg, capsys):
    code, out, err = run(capsys, *args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], err


def test_nccl_needs_as_many_gpus_as_ranks(capsys):
    n = launcher._visible_gpus()
    code, _, err = run(capsys, "--world", n + 2 if n % 2 == 0 else n + 1)
    assert code == 2 and "--comm nccl runs one process per GPU" in err and len(err.strip().splitlines()) == 1


def test_bad_world_in_a_real_process():
    r = subprocess.run([sys.executable, "-m", "kdtree_numba.parallel", "--world", "-1"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "KDTREE_BACKEND": "numpy"})
    assert r.returncode == 2 and r.stderr.strip().startswith("error: ") and "Traceback" not in r.stderr


def two_gpus() -> bool:
    return launcher._visible_gpus() >= 2


@pytest.mark.gpu
@pytest.mark.parametrize("extra", [[], ["--reduce", "assignments", "--model", "default", "--drafter", "default"]])
def test_nccl_two_gpus_generate_the_one_rank_tokens(extra):
    if not two_gpus():
        pytest.skip("needs 2 visible GPUs")
    r = subprocess.run([sys.executable, "-m", "kdtree_numba.parallel", "--world", "2", "--max-new-tokens", "32",
                        *extra], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "generated the 1-rank tokens" in r.stdout


@pytest.mark.gpu
def test_nccl_collectives_two_gpus(tmp_path):
    """all_reduce / all_gather / all_to_all_v on two processes, one GPU each, against NumPy."""
    if not two_gpus():
        pytest.skip("needs 2 visible GPUs")
    script = tmp_path / "rank.py"
    script.write_text(
        "import numpy as np, kdtree_numba as kd\n"
        "from kdtree_numba.parallel.communicator import NcclCommunicator\n"
        "c = NcclCommunicator.from_env()\n"
        "cp = kd.backend.cp\n"
        "x = cp.full((3, 2), c.rank + 1.0, dtype=np.float32)\n"
        "assert (kd.backend.to_host(c.all_reduce(x)) == 3.0).all()\n"
        "g = kd.backend.to_host(c.all_gather(x))\n"
        "assert g.shape == (6, 2) and (g[:3] == 1).all() and (g[3:] == 2).all()\n"
        "chunks = [cp.full((d + 1 + c.rank, 2), 10 * c.rank + d, dtype=np.float32) for d in range(2)]\n"
        "got = [kd.backend.to_host(a) for a in c.all_to_all_v(chunks)]\n"
        "assert [a.shape[0] for a in got] == [c.rank + 1, c.rank + 2], [a.shape for a in got]\n"
        "assert all((got[s] == 10 * s + c.rank).all() for s in range(2))\n"
        "c.barrier(); c.close(); print('rank', c.rank, 'ok')\n")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = [g for g in visible.split(",") if g.strip()] if visible else ["0", "1"]
    procs = []
    for r in range(2):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus[r], "KDTREE_BACKEND": "cuda", "KDTREE_RANK": str(r),
               "KDTREE_WORLD": "2", "KDTREE_NCCL_ID_FILE": str(tmp_path / "id.json")}
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
