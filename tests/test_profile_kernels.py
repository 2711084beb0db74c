"""benchmarks/profile_kernels.py --summarize: an ncu raw CSV -> per kernel calls, mean and share per step / round
(the profiling half needs a GPU and ncu; the summary runs anywhere)."""
import csv
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "profile_kernels.py")
TOPK = "topk_block::_topk_kernel[abi:v81,cw51c](Array<float, 2>)"
ATTN = "tree_verify::_tree_attention_v2_kernel[abi:v142,cw51c](Array<float, 2>)"
GEMM = "sm80_xmma_gemm_f32f32_tn_n_tilesize32x128x8_execute_kernel__5x_cublas"


def write_csv(path, launches):
    with open(path, "w", newline="") as f:
        f.write("==PROF== Connected to process 1\n")
        w = csv.writer(f)
        w.writerow(["ID", "Process ID", "Kernel Name", "gpu__time_duration.sum"])
        w.writerow(["", "", "", "nsecond"])
        for i, (name, ns) in enumerate(launches):
            w.writerow([i, 1, name, f"{ns:,}"])


def summarize(path):
    return subprocess.run([sys.executable, SCRIPT, "--summarize", str(path)], capture_output=True, text=True)


def test_rounds_split_at_the_top_k_and_prefill_left_out(tmp_path):
    prefill = [(GEMM, 900_000)]                                   # before the first round: not counted
    round_ = [(TOPK, 100_000), (ATTN, 70_000), (ATTN, 74_000), (GEMM, 46_000)]
    write_csv(tmp_path / "p.csv", prefill + round_ * 3 + [(TOPK, 100_000)])
    r = summarize(tmp_path / "p.csv")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("3 rounds, 4 kernels and 290.0 us per round")
    rows = {ln.split(" | ")[0].lstrip("| "): ln.split(" | ")[1:] for ln in lines if ln.startswith("| ") and
            "calls" not in ln}
    assert rows["tree_verify::_tree_attention_v2_kernel"][:3] == ["2.0", "72.00", "144.0"]
    assert rows[GEMM][:3] == ["1.0", "46.00", "46.0"]                 # the prefill's 900 us is not in it
    assert next(iter(rows)) == "tree_verify::_tree_attention_v2_kernel"   # largest share first


@pytest.mark.parametrize("sampler", ["sampling::_choose_kernel[abi:v3](Array<float, 2>)",
                                     "sampling::_choose_parts_kernel[abi:v3](Array<double, 2>)"])
def test_plain_steps_end_with_either_sampler(tmp_path, sampler):
    """A step ends with its sampler: the one-block kernel, or (rows wider than sampling.CHUNK, a Kimi vocabulary)
    the pick among chunk winners; the prefill and its own sampler come before the first step."""
    best = "sampling::_chunk_best_kernel[abi:v3](Array<float, 2>)"
    step = [(GEMM, 200_000), (best, 12_000), (sampler, 3_000)]
    write_csv(tmp_path / "ar.csv", [(GEMM, 900_000), (sampler, 3_000)] + step * 2)
    r = summarize(tmp_path / "ar.csv")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("2 steps, 3 kernels and 215.0 us per step")


@pytest.mark.parametrize("text, why", [("no header here\n", "no ncu raw CSV header"),
                                       ('"ID","Kernel Name"\n"",""\n', "gpu__time_duration.sum")])
def test_a_bad_csv_is_one_line_and_exit_2(tmp_path, text, why):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    r = summarize(p)
    assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_missing_csv_is_one_line_and_exit_2(tmp_path):
    r = summarize(tmp_path / "none.csv")
    why = "cannot read it as a CSV"
    assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_several_csvs_compare_kernel_by_kernel(tmp_path):
    """--summarize A B: us per step / round of every kernel in each, and B - A, largest difference first (here:
    a plain step against a DDTree round - which kernels grow with the verify's rows)."""
    sampler = "sampling::_choose_kernel[abi:v3](Array<float, 2>)"
    step = [(GEMM, 20_000), (sampler, 3_000)]
    write_csv(tmp_path / "ar.csv", [(GEMM, 900_000), (sampler, 3_000)] + step * 2)
    round_ = [(TOPK, 10_000), (ATTN, 70_000), (GEMM, 26_000)]
    write_csv(tmp_path / "ddtree.csv", round_ * 2 + [(TOPK, 10_000)])
    r = subprocess.run([sys.executable, SCRIPT, "--summarize", str(tmp_path / "ar.csv"), str(tmp_path / "ddtree.csv")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0].startswith("ar.csv: 2 steps, 2 kernels and 23.0 us per step")
    assert out[1].startswith("ddtree.csv: 2 rounds, 3 kernels and 106.0 us per round")
    rows = [ln.split(" | ") for ln in out if ln.startswith("| ") and not ln.startswith("| kernel |")]
    assert rows[0][0] == "| tree_verify::_tree_attention_v2_kernel" and rows[0][1:] == ["-", "1.0, 70.0", "+70.0 |"]
    assert rows[1][0] == f"| {TOPK.split('[')[0]}" and rows[1][-1] == "+10.0 |"
    gemm = next(x for x in rows if x[0] == f"| {GEMM}")
    assert gemm[1:] == ["1.0, 20.0", "1.0, 26.0", "+6.0 |"]
    assert rows[-1] == ["| **all kernels**", "2, 23.0", "3, 106.0", "+83.0 |"]


def aligned(*paths):
    return subprocess.run([sys.executable, SCRIPT, "--summarize", *map(str, paths), "--aligned"], capture_output=True,
                          text=True)


def test_aligned_compares_two_rounds_launch_by_launch(tmp_path):
    """--aligned: the median of each launch position over the rounds of each CSV, the second minus the first, and
    the running sum - even where the two run different kernels at a position (cuBLAS against the skinny kernel)."""
    skinny = "skinny_gemm::_skinny_kernel[abi:v6](Array<float, 2>)"
    chain = [(TOPK, 10_000), (GEMM, 6_000), (ATTN, 17_000)]
    tree = [(TOPK, 11_000), (skinny, 6_500), (ATTN, 17_000)]
    write_csv(tmp_path / "chain.csv", [(GEMM, 900_000)] + chain * 3 + [(TOPK, 10_000)])
    slow = [(TOPK, 11_000), (skinny, 9_000), (ATTN, 17_000)]           # one outlier round: the median ignores it
    write_csv(tmp_path / "tree.csv", tree * 2 + slow + [(TOPK, 11_000)])
    r = aligned(tmp_path / "chain.csv", tmp_path / "tree.csv")
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "chain.csv: 3 rounds of 3 kernels, 33.0 us per round (medians by position)"
    assert out[1] == "tree.csv: 3 rounds of 3 kernels, 34.5 us per round (medians by position)"
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in out if ln.startswith("| ") and
            not ln.startswith("| # |")]
    assert [x[0] for x in rows] == ["0", "1", "2", "**all**"]                # launch order, then the totals
    assert rows[1][1].startswith("sm80_xmma") and rows[1][3] == "skinny_gemm::_skinny_kernel"
    assert rows[1][5:] == ["+0.50", "+1.5"]                                    # 6.5 - 6.0; running sum 1.0 + 0.5
    assert rows[-1][2] == "33.0" and rows[-1][4] == "34.5" and rows[-1][5] == "+1.5"


def test_aligned_refuses_rounds_that_do_not_line_up(tmp_path):
    write_csv(tmp_path / "a.csv", [(TOPK, 10_000), (GEMM, 6_000)] * 2 + [(TOPK, 10_000)])
    write_csv(tmp_path / "b.csv", [(TOPK, 10_000), (GEMM, 6_000), (GEMM, 6_000)] * 2 + [(TOPK, 10_000)])
    for r, why in ((aligned(tmp_path / "a.csv", tmp_path / "b.csv"), "do not line up"),
                   (aligned(tmp_path / "a.csv"), "expected two CSVs")):
        assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_picks_are_checked_before_the_gpu_is(tmp_path):
    """--picks names a file that is not a gemm_choice table in one line, exit 2 - on a machine without a GPU too;
    --picks with --summarize, or a missing file, is a usage error."""
    (tmp_path / "bad.json").write_text("{}")
    r = subprocess.run([sys.executable, SCRIPT, "--method", "chain", "--picks", str(tmp_path / "bad.json")],
                       capture_output=True, text=True, env={**os.environ, "KDTREE_BACKEND": "numpy"})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "--picks:" in r.stderr and "expected a gemm_choice table" in r.stderr
    for extra in (["--summarize", str(tmp_path / "bad.json")], []):
        r = subprocess.run([sys.executable, SCRIPT, "--picks", str(tmp_path / ("bad.json" if extra else "no.json"))]
                           + extra, capture_output=True, text=True)
        assert r.returncode == 2 and "--picks" in r.stderr.splitlines()[-1]
