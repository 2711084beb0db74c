"""The command line: the demo completes a held-out prompt with the trained pair and agrees with plain decoding;
generate / trees / sweep work on the default pair and on byte-level checkpoints; bad input prints one line naming
the flag and exits 2.

Runs that generate are subprocesses on the NumPy backend with short generations (a few seconds each); BLAS is held
to one thread there: two test workers on two cores would otherwise oversubscribe the CPU and slow every run
several-fold. Error paths and the ``trees`` command run in this process (``cli.main``): they fail or finish before
anything is generated, so the backend does not matter and no interpreter start-up is paid.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

ENV = {**os.environ, "KDTREE_BACKEND": "numpy", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
       "MKL_NUM_THREADS": "1"}


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "kdtree_numba", *args], capture_output=True, text=True, env=ENV,
                          timeout=300, cwd=cwd)


def inproc(capsys, *args):
    """The CLI in this process (no interpreter start-up): for error paths and commands that do not generate."""
    from kdtree_numba.cli import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def one_line_error(r, msg):
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory):
    """A tiny byte-level checkpoint directory (vocab 256, no tokenizer.json, no drafter/)."""
    import kdtree_numba as kd

    path = tmp_path_factory.mktemp("byte_model")
    with kd.backend.use("numpy"):
        kd.tiny_target(0).save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """A tiny checkpoint with a 300-token vocabulary and no tokenizer: text prompts cannot be encoded."""
    import kdtree_numba as kd

    path = tmp_path_factory.mktemp("wide_model")
    with kd.backend.use("numpy"):
        kd.tiny_target(0, vocab_size=300).save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def default_trace(tmp_path_factory):
    """``generate --trace`` on the default pair (the demo's prompt, 16 tokens)."""
    trace = tmp_path_factory.mktemp("trace") / "t.json"
    r = cli("generate", "--max-new-tokens", "16", "--budget", "16", "--trace", str(trace))
    assert r.returncode == 0, r.stderr
    return trace, r


# ------------------------------------------------------------------------------------------------ demo
def test_demo_runs_and_writes_its_outputs(tmp_path):
    out = tmp_path / "demo"
    r = cli("demo", "--max-new-tokens", "24", "--out", str(out))
    assert r.returncode == 0, r.stderr
    s = r.stdout
    assert "HumanEval/18, held out from training" in s and "def how_many_times(string: str" in s   # the prompt
    assert "outputs identical to plain decoding:  DFlash chain yes   DDTree yes" in s
    for row in ("autoregressive", "DFlash chain", "DDTree (budget 32)", "new tokens", "target forwards / token",
                "acceptance length", "tokens/s, wall clock", "tokens/s, target side", "docs/PERFORMANCE.md"):
        assert row in s, row
    for f in ("rounds.png", "acceptance.png", "viewer.html", "trace.json"):
        assert (out / f).stat().st_size > 0
    trace = json.loads((out / "trace.json").read_text())
    assert trace["settings"]["model"] == "default" and trace["settings"]["vocab_size"] == 4096
    assert len(trace["tokens"]) == 24
    page = (out / "viewer.html").read_text(encoding="utf-8")
    assert '"short":' in page and "\\u00b7" in page                    # decoded labels (spaces shown as ·)


def test_demo_other_task_and_prompt(tmp_path):
    r = cli("demo", "--task", "HumanEval/62", "--max-new-tokens", "12", "--budget", "8", "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    assert "HumanEval/62" in r.stdout and "def derivative(xs: list)" in r.stdout
    assert "DDTree (budget 8)" in r.stdout and "DDTree yes" in r.stdout
    r = cli("demo", "--prompt", "def add(a, b):", "--max-new-tokens", "8", "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert "your --prompt" in r.stdout and "def add(a, b):" in r.stdout


# ------------------------------------------------------------------------------------------------ generate
def test_generate_default_pair_text_and_trace(default_trace, tmp_path):
    trace, r = default_trace
    assert "self" in r.stdout                                          # decoded text, not ids
    assert "[ddtree: 16 tokens" in r.stderr and "tau" in r.stderr
    data = json.loads(trace.read_text())
    assert len(data["tokens"]) == 16 and data["rounds"] and data["settings"]["drafter"] == "dflash"
    r = cli("generate", "--prompt", "def add(a, b):", "--max-new-tokens", "8", "--chain")
    assert r.returncode == 0 and "[chain: 8 tokens" in r.stderr, r.stderr
    r = cli("generate", "--task", "HumanEval/2", "--max-new-tokens", "6", "--drafter", "none", "--stop-at-eos")
    assert r.returncode == 0 and "[autoregressive: " in r.stderr, r.stderr
    r = cli("generate", "--ids", "5,6,7", "--max-new-tokens", "5", "--drafter", "oracle", "--noise", "0.5",
            "--depth", "4")
    assert r.returncode == 0 and len(r.stdout.split()) == 5 and all(t.isdigit() for t in r.stdout.split())


def test_generate_replay_same_text_and_refuses_a_host_drafter(default_trace, capsys):
    _, r = default_trace                                               # generate --max-new-tokens 16
    rr = cli("generate", "--max-new-tokens", "16", "--budget", "16", "--replay")
    assert rr.returncode == 0 and "[ddtree: 16 tokens" in rr.stderr and rr.stdout == r.stdout, rr.stderr
    r = inproc(capsys, "generate", "--ids", "5,6,7", "--max-new-tokens", "5", "--drafter", "oracle", "--replay")
    assert r.returncode == 2 and "replay: the oracle drafter reads the host context" in r.stderr


def test_generate_byte_model(byte_model, tmp_path):
    trace = tmp_path / "b.json"
    r = cli("generate", "--model", byte_model, "--prompt", "Hello", "--drafter", "oracle", "--max-new-tokens", "12",
            "--budget", "8", "--trace", str(trace))
    assert r.returncode == 0, r.stderr
    data = json.loads(trace.read_text())
    assert len(data["tokens"]) == 12 and data["settings"]["vocab_size"] == 256
    r = cli("generate", "--model", byte_model, "--ids", "1,2,3", "--max-new-tokens", "5", "--drafter", "none")
    assert r.returncode == 0 and len(r.stdout.split()) == 5


# ------------------------------------------------------------------------------------------------ trees
def test_trees_labels(default_trace, byte_model, tmp_path, capsys):
    trace, _ = default_trace
    r = inproc(capsys, "trees", trace, "--out", tmp_path / "t", "--rounds", "0,1")
    assert r.returncode == 0, r.stderr
    assert "labels: decoded tokens" in r.stdout
    for f in ("round000.png", "round001.png", "rounds.png", "acceptance.png", "tree_shape.png", "stage_times.png",
              "viewer.html"):
        assert (tmp_path / "t" / f).stat().st_size > 0, f
    r = inproc(capsys, "trees", trace, "--out", tmp_path / "ids", "--vocab-size", "4096", "--rounds", "0,0")
    assert r.returncode == 0 and "labels: token ids" in r.stdout, r.stderr
    assert "wrote 1 round figure" in r.stdout, r.stdout                 # a repeated index draws (and counts) once
    r = inproc(capsys, "trees", trace, "--out", tmp_path / "m", "--rounds", "0",
               "--model", os.path.join(os.path.dirname(__import__("kdtree_numba").__file__), "default_model", "target"))
    assert r.returncode == 0 and "labels: decoded tokens" in r.stdout, r.stderr
    btrace = tmp_path / "b.json"
    r = cli("generate", "--model", byte_model, "--prompt", "Hi", "--drafter", "random", "--depth", "3",
            "--max-new-tokens", "6", "--budget", "4", "--trace", str(btrace))
    assert r.returncode == 0, r.stderr
    r = inproc(capsys, "trees", btrace, "--out", tmp_path / "b", "--rounds", "0")
    assert r.returncode == 0 and "labels: bytes" in r.stdout, r.stderr


def test_not_a_trace(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1}')
    one_line_error(inproc(capsys, "trees", bad), "not a kdtree_numba trace")
    auto = tmp_path / "ar.json"
    r = cli("generate", "--drafter", "none", "--max-new-tokens", "3", "--trace", str(auto))
    assert r.returncode == 0, r.stderr
    one_line_error(inproc(capsys, "trees", auto), "has no DDTree rounds")


# ------------------------------------------------------------------------------------------------ sweep
def test_sweep(tmp_path):
    out = tmp_path / "s.svg"
    r = cli("sweep", "--budgets", "2,16", "--max-new-tokens", "10", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_text().lstrip().startswith("<?xml")
    assert "budget     2" in r.stdout and "budget    16" in r.stdout and "DFlash chain: tau" in r.stdout


# ------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("args, msg", [
    (["generate", "--model", "/no/such/dir"], "--model: /no/such/dir is not a directory"),
    (["generate", "--ids", "1,9999"], "--ids: token id 9999 is outside the vocabulary"),
    (["generate", "--ids", "1,2,x"], "--ids: expected comma-separated whole numbers"),
    (["generate", "--budget", "-3"], "argument --budget: expected a whole number in [0, 1024], got -3"),
    (["demo", "--budget", "2000"], "argument --budget: expected a whole number in [0, 1024], got 2000"),
    (["generate", "--temperature", "nan"], "argument --temperature: expected a finite number >= 0, got 'nan'"),
    (["generate", "--temperature", "hot"], "argument --temperature: expected a finite number >= 0, got 'hot'"),
    (["generate", "--max-new-tokens", "0"], "argument --max-new-tokens: expected a whole number >= 1, got 0"),
    (["generate", "--noise", "0.5"], "--noise 0.5: applies to --drafter oracle only, not --drafter dflash"),
    (["generate", "--drafter", "random", "--noise", "1"], "--noise 1: applies to --drafter oracle only, not "
                                                          "--drafter random"),
    (["generate", "--drafter", "oracle", "--noise", "-1"], "argument --noise: expected a finite number >= 0 and "
                                                           "<= 1e+06, got '-1'"),
    (["generate", "--depth", "3"], "--depth 3: applies to --drafter oracle or random only, not --drafter dflash"),
    (["generate", "--drafter", "none", "--depth", "3"], "--depth 3: applies to --drafter oracle or random only, "
                                                        "not --drafter none"),
    (["generate", "--drafter-dir", "/no/such"], "--drafter-dir /no/such: not a directory"),
    (["generate", "--drafter", "oracle", "--drafter-dir", "/tmp"], "--drafter-dir /tmp: applies to --drafter "
                                                                  "dflash only, not --drafter oracle"),
    (["generate", "--drafter", "none", "--chain"], "--chain: needs a drafter, not --drafter none"),
    (["generate", "--chain", "--budget", "8"], "--budget 8: does not apply with --chain"),
    (["generate", "--drafter", "none", "--budget", "8"], "--budget 8: does not apply with --drafter none"),
    (["generate", "--trace", "/no/such/dir/t.json"], "--trace: cannot write /no/such/dir/t.json (the folder "
                                                     "/no/such/dir does not exist)"),
    (["generate", "--trace", "/tmp"], "--trace: /tmp is a folder, expected a file path"),
    # /proc takes no new file even for root, whatever its permission bits say: refused before any work
    (["generate", "--trace", "/proc/kdtree_t.json"], "--trace: cannot write /proc/kdtree_t.json (cannot write in "
                                                     "/proc ("),
    (["generate", "--task", "HumanEval/999"], "--task: unknown task 'HumanEval/999', expected HumanEval/0 .. "
                                              "HumanEval/163"),
    (["generate", "--task", "HumanEval/1", "--prompt", "x"], "argument --prompt: not allowed with argument --task"),
    (["generate", "--drafter", "medusa"], "argument --drafter: invalid choice: 'medusa'"),
    (["sweep", "--budgets", ""], "argument --budgets: expected at least one whole number (comma-separated, e.g. "
                                 "4,16,64), got ''"),
    (["sweep", "--budgets", "4,2000"], "argument --budgets: expected whole numbers in [1, 1024], got 2000 in '4,2000'"),
    (["generate", "--ids", "1,,2"], "argument --ids: expected comma-separated whole numbers, got an empty item in "
                                    "'1,,2'"),
    (["generate", "--drafter-dir", "/tmp", "--max-new-tokens", "2"], "--drafter-dir: /tmp has no config.json"),
    (["sweep", "--budgets", "0"], "argument --budgets: expected whole numbers in [1, 1024], got 0 in '0'"),  # log axis
    (["sweep", "--budgets", "4 16"], "argument --budgets: expected comma-separated whole numbers, got '4 16'"),
    (["generate", "--ids", "1 2"], "argument --ids: expected comma-separated whole numbers, got '1 2'"),
    (["generate", "--trace", ""], "--trace: expected a file path, got ''"),
    # a library error names its argument; the CLI names the flag (the positional 'trace' of trees stays as it is)
    (["generate", "--prompt", "a", "--max-new-tokens", "3000"], "--max-new-tokens: prompt (1 tokens) + "
                                                                "max_new_tokens (3000) = 3001 exceeds"),
    (["sweep", "--out", ".png"], "--out: expected a file path ending in .png or .svg, got '.png'"),
    (["generate", "--drafter", "oracle", "--noise", "1e308"], "argument --noise: expected a finite number >= 0 and "
                                                               "<= 1e+06, got '1e308'"),
    (["generate", "--prompt", "a", "--seed", "-5"], "argument --seed: expected a whole number in [0, "),
    # a seed nothing would draw from: greedy with the DFlash drafter (or none), and every sweep (greedy) with it
    (["generate", "--prompt", "a", "--seed", "3"], "--seed 3: nothing draws random numbers here (it seeds sampling "
                                                   "at --temperature > 0 and the oracle and random drafters, not "
                                                   "--drafter dflash)"),
    (["generate", "--drafter", "none", "--seed", "0"], "--seed 0: nothing draws random numbers here"),
    (["sweep", "--seed", "3"], "--seed 3: nothing draws random numbers here (it seeds the oracle and random "
                               "drafters, not --drafter dflash)"),
    (["sweep", "--out", "sweep.pdf"], "--out: expected a file path ending in .png or .svg, got 'sweep.pdf'"),
    (["sweep", "--out", "/no/such/dir/s.png"], "--out: cannot write /no/such/dir/s.png"),
    (["sweep", "--drafter", "none"], "argument --drafter: invalid choice: 'none'"),
    (["trees", "/no/such/trace.json"], "trace: /no/such/trace.json does not exist"),
    (["demo", "--budget", "x"], "argument --budget: expected a whole number in [0, 1024], got 'x'"),
    (["demo", "--task", "nope"], "--task: unknown task 'nope'"),
    (["demo", "--noise", "0.3"], "unrecognized arguments: --noise 0.3"),
    (["demo", "--depth", "8"], "unrecognized arguments: --depth 8"),
    (["demo", "--task", "HumanEval/1", "--prompt", "x"], "argument --prompt: not allowed with argument --task"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["bench", "nonsense"], "unknown benchmark 'nonsense'"),
])
def test_bad_input_is_one_line_and_status_2(args, msg, capsys):
    one_line_error(inproc(capsys, *args), msg)


def test_bad_input_in_a_real_process():
    """The same contract through the interpreter: status 2, one line on stderr."""
    one_line_error(cli("generate", "--noise", "0.5"), "--noise 0.5: applies to --drafter oracle only")
    one_line_error(cli("sweep", "--budgets", ""), "argument --budgets: expected at least one whole number")


def test_errors_that_need_files(tmp_path, byte_model, wide_model, default_trace, capsys):
    trace, _ = default_trace
    cli = lambda *a: inproc(capsys, *a)                                  # noqa: E731
    afile = tmp_path / "afile"
    afile.write_text("x")
    one_line_error(cli("demo", "--out", str(afile)), f"--out: {afile} exists and is not a folder")
    one_line_error(cli("figures", "--out", str(afile)), f"--out: {afile} exists and is not a folder")
    one_line_error(cli("generate", "--model", byte_model),
                   f"--drafter dflash: {byte_model} has no drafter/ folder; pass --drafter-dir DIR")
    one_line_error(cli("generate", "--model", wide_model, "--prompt", "hi", "--drafter", "none"),
                   "--prompt: this model has no tokenizer.json and a 300-token vocabulary, so text cannot be "
                   "encoded; pass token ids with --ids")
    one_line_error(cli("generate", "--model", wide_model, "--task", "HumanEval/3", "--drafter", "none"),
                   "--task: this model has no tokenizer.json")
    one_line_error(cli("generate", "--model", byte_model, "--drafter", "none", "--stop-at-eos"),
                   "--stop-at-eos: this model has no tokenizer with an <|endoftext|> token")
    one_line_error(cli("trees", str(trace), "--model", "/no/such"), "--model: /no/such is not a directory")
    one_line_error(cli("trees", str(trace), "--model", byte_model), f"--model: {byte_model} has no tokenizer.json")
    one_line_error(cli("trees", str(trace), "--vocab-size", "10"), "--vocab-size 10: too small for this trace")
    # a trace whose own vocab_size is too small: the trace is named, not a --vocab-size nobody gave
    raw = json.loads(open(trace).read())
    raw["settings"].update(model="elsewhere", vocab_size=10)
    small = tmp_path / "small.json"
    small.write_text(json.dumps(raw))
    one_line_error(cli("trees", str(small), "--out", str(tmp_path / "t")),
                   f"trace: {small} holds token ")
    one_line_error(cli("trees", str(trace), "--rounds", "99"), "--rounds: round 99 outside")
    one_line_error(cli("trees", str(trace), "--out", str(afile)), f"--out: {afile} exists and is not a folder")
    # a loader's own error names the flag, not its parameter ("path: ... has no config.json" before)
    one_line_error(cli("generate", "--model", str(tmp_path), "--drafter", "none"),
                   f"--model: {tmp_path} has no config.json")
    model = tmp_path / "model"
    shutil.copytree(byte_model, model)
    (model / "drafter").mkdir()
    one_line_error(cli("generate", "--model", str(model), "--max-new-tokens", "2"),
                   f"--model (its drafter/): {model / 'drafter'} has no config.json")


def test_tour_and_help(capsys):
    r = cli("tour")
    assert r.returncode == 0 and "all stages match their references" in r.stdout
    assert inproc(capsys, "--help").returncode == 0
    for cmd in ("demo", "generate", "trees", "sweep", "figures"):
        h = inproc(capsys, cmd, "--help")
        assert h.returncode == 0 and "usage:" in h.stdout


def test_bench_runs_from_any_directory(tmp_path, capsys):
    """``bench`` finds the scripts' shared helpers (_common.py) from any working directory (#16 item 10), and
    without a GPU refuses a full run in one line but runs the --quick smoke test."""
    import kdtree_numba as kd

    if kd.backend.name != "cuda":
        one_line_error(inproc(capsys, "bench", "tree"), "bench: the benchmarks need a GPU")
    r = cli("bench", "tree", "--quick", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "== bench_tree.py" in r.stdout and "Traceback" not in r.stderr


def test_bench_mma_smoke_run_without_a_gpu(tmp_path):
    """bench_mma times tensor-core instructions, which only a GPU has: its --quick smoke run (part of ``bench all
    --quick``) says so in one line and succeeds, rather than failing the whole list on the simulator."""
    import kdtree_numba as kd

    if kd.backend.name == "cuda":
        pytest.skip("a GPU runs the real benchmark")
    r = cli("bench", "mma", "--quick", cwd=str(tmp_path))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "bench_mma: nothing to smoke-test" in r.stdout


def test_an_output_folder_the_filesystem_refuses_is_one_line(tmp_path, capsys, monkeypatch):
    """The permission bits can allow what the filesystem refuses (root on /proc, a read-only mount): the check
    creates the folder, fails, and the command says so in one line naming --out, having written nothing."""
    import errno

    from kdtree_numba import cli as cli_module

    def refuse(path, exist_ok=False):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)

    monkeypatch.setattr(cli_module.os, "makedirs", refuse)
    out = tmp_path / "new"
    one_line_error(inproc(capsys, "figures", "--out", str(out)),
                   f"--out: cannot create the folder {out} (Read-only file system)")
    assert not out.exists()


def test_out_dir_problem_probes_and_leaves_nothing(tmp_path):
    from kdtree_numba.argtypes import out_dir_problem

    afile = tmp_path / "afile"
    afile.write_text("x")
    assert out_dir_problem(str(afile)) == f"{afile} exists and is not a folder"
    assert out_dir_problem(str(tmp_path / "a" / "b")) is None and not (tmp_path / "a").exists()
    assert out_dir_problem(str(tmp_path)) is None and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    assert out_dir_problem(str(afile / "sub")).startswith(f"cannot create the folder {afile / 'sub'} (")
