"""kernels/gemm_choice.py: every candidate computes the product; a new shape is timed once outside a capture and
then always runs its choice; a capture that meets an untimed shape runs the default and keeps it; TUNE = False is
the default rule. The pick itself (``pick``) runs anywhere."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import gemm, gemm_choice


def test_pick_keeps_the_default_within_the_margin():
    assert gemm_choice.pick({"skinny": 3.6, "blocks 16": 3.0, "rows": 3.2}, "skinny") == "blocks 16"
    assert gemm_choice.pick({"skinny": 3.1, "blocks 16": 3.0}, "skinny") == "skinny"           # 3.3 % slower
    assert gemm_choice.pick({"skinny": 3.1, "blocks 16": 3.0}, "skinny", margin=0.0) == "blocks 16"
    assert gemm_choice.pick({"blocks 16": 3.0, "rows": 2.0}, "skinny") == "rows"            # default not timed


def test_candidates_leave_out_the_kernels_that_cannot_read_the_layout():
    x, out = np.zeros((33, 256), np.float32), np.zeros((33, 240), np.float32)
    assert gemm_choice.candidates(x, np.zeros((240, 256), np.float32).T, out) == list(gemm_choice.CANDIDATES)
    left = gemm_choice.candidates(x, np.zeros((256, 240), np.float32), out)     # b row-major: k not contiguous
    assert left == ["blocks 16", "blocks 8", "rows"]
    long_k = np.zeros((33, 768), np.float32)                                    # past the skinny kernel's MAX_K
    assert gemm_choice.candidates(long_k, np.zeros((240, 768), np.float32).T, out)[-1] == "wide"


def test_a_saved_table_loads_back_and_a_bad_one_adds_nothing(tmp_path, monkeypatch):
    """save / load: the table of a normal process, for one under ncu (anywhere: no GPU needed)."""
    key = ((33, 256), (256, 240), (1024, 4), (4, 1024), False)
    monkeypatch.setattr(gemm_choice, "_chosen", {key: ("rows", {"rows": 3.29, "blocks 16": 6.89})})
    assert gemm_choice.save(tmp_path / "picks.json") == 1
    monkeypatch.setattr(gemm_choice, "_chosen", {})
    assert gemm_choice.load(tmp_path / "picks.json") == 1
    assert gemm_choice._chosen == {key: ("rows", {"rows": 3.29, "blocks 16": 6.89})}
    assert gemm_choice.choices()[0]["chosen"] == "rows"
    (tmp_path / "bad.json").write_text('{"gemm_choice": [{"a_shape": [33, 256], "b_shape": [256, 240], '
                                       '"a_strides": [1024, 4], "b_strides": [4, 1024], "accumulate": true, '
                                       '"chosen": "cublas-lt", "us": {}}]}')
    (tmp_path / "not.json").write_text("[1, 2]")
    monkeypatch.setattr(gemm_choice, "_chosen", {})
    for name, why in (("bad.json", "entry 0 is not a gemm_choice shape"), ("not.json", "expected a gemm_choice "
                                                                                        "table"),
                      ("missing.json", "expected a gemm_choice table")):
        with pytest.raises(ValueError, match=why):
            gemm_choice.load(tmp_path / name)
    assert gemm_choice._chosen == {}


def _operands(M, K, N, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    base = rng.standard_normal((M, N)).astype(np.float32)
    return x, w, base


@pytest.fixture
def fresh(monkeypatch):
    """An empty choice table and a count of the timings, restored afterwards."""
    monkeypatch.setattr(gemm_choice, "_chosen", {})
    timed = []
    real = gemm_choice._time_all

    def count(fns):
        timed.extend(fns)
        return real(fns)
    monkeypatch.setattr(gemm_choice, "_time_all", count)
    return timed


@pytest.mark.gpu
@pytest.mark.parametrize("name", gemm_choice.CANDIDATES)
@pytest.mark.parametrize("M, K, N, accumulate", [(33, 256, 240, False), (33, 192, 256, True), (37, 128, 384, False),
                                                 (17, 256, 1536, True), (80, 64, 100, False)])
def test_every_candidate_computes_the_product(name, M, K, N, accumulate):
    x, w, base = _operands(M, K, N)
    xs, ws = kd.backend.asarray(x), kd.backend.asarray(w)
    if name not in gemm_choice.candidates(xs, ws.T, kd.backend.asarray(base)):
        pytest.skip(f"{name} does not run this product")
    got = gemm_choice._run(name, xs, ws.T, kd.backend.asarray(base), accumulate)
    want = x @ w.T + (base if accumulate else 0)
    np.testing.assert_allclose(kd.backend.to_host(got), want, rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
def test_a_new_shape_is_timed_once_then_runs_its_choice(fresh):
    x, w, base = _operands(33, 256, 256, seed=1)
    xs, ws = kd.backend.asarray(x), kd.backend.asarray(w)
    first = kd.backend.to_host(gemm.linear(xs, ws, out=kd.backend.asarray(base), accumulate=True))
    assert fresh == gemm_choice.candidates(xs, ws.T, kd.backend.asarray(base))   # each timed once
    assert "skinny" in fresh
    (entry,) = gemm_choice.choices()
    assert (entry["M"], entry["K"], entry["N"], entry["accumulate"]) == (33, 256, 256, True)
    assert entry["chosen"] in entry["us"] and all(t > 0 for t in entry["us"].values())
    second = kd.backend.to_host(gemm.linear(xs, ws, out=kd.backend.asarray(base), accumulate=True))
    assert len(fresh) == len(gemm_choice.CANDIDATES)                       # not again
    np.testing.assert_array_equal(first, second)                          # the same kernel: the same bits
    np.testing.assert_allclose(first, x @ w.T + base, rtol=1e-5, atol=1e-4)   # the scratch runs left out alone


@pytest.mark.gpu
def test_a_capture_runs_the_default_for_an_untimed_shape_and_keeps_it(fresh):
    cp = kd.backend.cp
    x, w, _ = _operands(41, 128, 384, seed=2)
    xs, ws = kd.backend.asarray(x), kd.backend.asarray(w)
    out = kd.backend.empty((41, 384), np.float32)
    gemm_choice.skinny_gemm.run(xs, ws, out)                              # compiled outside the capture
    stream = kd.backend.stream
    stream.begin_capture()
    try:
        gemm.linear(xs, ws, out=out)
    finally:
        graph = stream.end_capture()
    out[...] = 0
    graph.launch(stream)
    assert not fresh                                                        # nothing timed under the capture
    assert [e["chosen"] for e in gemm_choice.choices()] == ["skinny"]      # the default (skinny_gemm.pays)
    np.testing.assert_allclose(cp.asnumpy(out), x @ w.T, rtol=1e-5, atol=1e-4)
    gemm.linear(xs, ws, out=out)                                            # a later direct call: not timed
    assert not fresh


@pytest.mark.gpu
def test_tune_off_is_the_default_rule(fresh, monkeypatch):
    monkeypatch.setattr(gemm_choice, "TUNE", False)
    ran = []
    monkeypatch.setattr(gemm_choice, "_run", lambda name, *args: ran.append(name))
    for M, K, N in [(33, 256, 240), (33, 256, 1536), (65, 768, 256)]:
        x, w, _ = _operands(M, K, N)
        gemm.linear(kd.backend.asarray(x), kd.backend.asarray(w))
    assert ran == ["skinny", "blocks 16", "blocks 16"] and not fresh and not gemm_choice.choices()
