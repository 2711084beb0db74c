"""The end of a DDTree round (kernels/round_end.py): the records row and the replayed round's state in one launch."""
from types import SimpleNamespace

import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import round_end

H = kd.backend.to_host
L, K, B, ROUNDS = 3, 2, 5, 4


def _round():
    """A round whose walk accepted nodes [0, 2] (m = 2) of a 5-node tree: the docstring's example, padded."""
    a = kd.backend.asarray
    tree = SimpleNamespace(tokens=a(np.array([[11, 7, 12, 13, 14]], np.int32)),
                           depth=a(np.array([[1, 1, 2, 2, 3]], np.int32)),
                           parent=a(np.array([[0, 0, 1, 2, 4]], np.int32)),
                           logw=a(np.array([[-0.5, -0.25, -1.0, -2.0, -3.0]])),
                           n=a(np.array([5], np.int32)))
    acc = SimpleNamespace(accepted=a(np.array([0, 2, -1, -1], np.int32)), n_acc=a(np.array([2], np.int32)),
                          result=a(np.array([2, 7, 3, -1, -1], np.int32)),
                          chosen=a(np.array([7, 1, 3, 9, 9, 9], np.int32)))
    lp = a(np.array([[-1, -2], [-3, -4], [-5, -6]], np.float32))
    ids = a(np.array([[5, 7], [9, 3], [1, 2]], np.int32))
    rec = {f: kd.backend.full((ROUNDS,) + shape, fill, dtype) for f, shape, fill, dtype in (
        ("tokens", (B,), -9, np.int32), ("depth", (B,), -9, np.int32), ("parent", (B,), -9, np.int32),
        ("logw", (B,), np.nan, np.float64), ("n", (), -9, np.int32), ("accepted", (L + 1,), -9, np.int32),
        ("n_acc", (), -9, np.int32), ("result", (L + 2,), -9, np.int32), ("draft_lp", (L,), 7.0, np.float32))}
    return tree, acc, lp, ids, rec


def _check_row(rec, row, tree, acc):
    h = {f: H(v) for f, v in rec.items()}
    np.testing.assert_array_equal(h["tokens"][row], H(tree.tokens)[0])
    np.testing.assert_array_equal(h["logw"][row], H(tree.logw)[0])
    np.testing.assert_array_equal(h["parent"][row], H(tree.parent)[0])
    assert h["n"][row] == 5 and h["n_acc"][row] == 2
    np.testing.assert_array_equal(h["accepted"][row], [0, 2, -1, -1])
    np.testing.assert_array_equal(h["result"][row], [2, 7, 3, -1, -1])
    np.testing.assert_array_equal(h["draft_lp"][row], [-2, -4, np.nan])      # 7 at depth 1, 3 at depth 2
    others = [r for r in range(ROUNDS) if r != row]
    assert (h["tokens"][others] == -9).all() and (h["draft_lp"][others] == 7).all() and (h["n"][others] == -9).all()


def test_reference_draft_logprobs():
    _, acc, lp, ids, _ = _round()
    got = round_end.draft_lp_ref(H(acc.chosen), H(acc.accepted), 2, H(lp), H(ids))
    np.testing.assert_array_equal(got, [-2, -4, np.nan])
    assert np.isnan(round_end.draft_lp_ref(np.array([8, 1]), np.array([0, 1]), 1, H(lp), H(ids))[0])   # not in ids


@pytest.mark.usefixtures("kernel_backend")
def test_kernel_writes_one_row():
    tree, acc, lp, ids, rec = _round()
    round_end.round_end(rec, tree, acc, lp, ids, 2)
    _check_row(rec, 2, tree, acc)


@pytest.mark.usefixtures("kernel_backend")
def test_draft_logprobs_of_wide_rows():
    """K = 70 ids a depth (three warp-wide chunks): the chosen token found in the first chunk, past it (twice: the
    first index counts, as in the reference), in the last, partial chunk, not at all, and a depth past the path."""
    Lw, Kw = 5, 70
    rng = np.random.default_rng(0)
    ids = np.stack([rng.permutation(1000)[:Kw] + 10 for _ in range(Lw)]).astype(np.int32)      # [L, K], ids >= 10
    lp = -np.sort(rng.random((Lw, Kw)), axis=1).astype(np.float32)                             # [L, K]
    ids[1, 40] = ids[1, 45] = 5                                          # depth 2: chosen token 5 at 40 and 45
    chosen = np.array([ids[0, 3], 5, ids[2, 69], 7, ids[4, 0], -1], np.int32)   # depth 4: 7 is not drafted
    accepted = np.array([0, 1, 2, 3, -1, -1], np.int32)                  # m = 4: depth 5 is past the path
    a = kd.backend.asarray
    acc = SimpleNamespace(accepted=a(accepted), n_acc=a(np.array([4], np.int32)),
                          result=a(np.full(Lw + 2, -1, np.int32)), chosen=a(chosen))
    tree = SimpleNamespace(tokens=a(np.zeros((1, 3), np.int32)), depth=a(np.zeros((1, 3), np.int32)),
                           parent=a(np.zeros((1, 3), np.int32)), logw=a(np.zeros((1, 3))), n=a(np.array([3], np.int32)))
    rec = {f: kd.backend.zeros((2,) + shape, dtype) for f, shape, dtype in (
        ("tokens", (3,), np.int32), ("depth", (3,), np.int32), ("parent", (3,), np.int32), ("logw", (3,), np.float64),
        ("n", (), np.int32), ("accepted", (Lw + 1,), np.int32), ("n_acc", (), np.int32),
        ("result", (Lw + 2,), np.int32), ("draft_lp", (Lw,), np.float32))}
    round_end.round_end(rec, tree, acc, a(lp), a(ids), 1)
    want = round_end.draft_lp_ref(chosen, accepted, 4, lp, ids)
    np.testing.assert_array_equal(want, [lp[0, 3], lp[1, 40], lp[2, 69], np.nan, np.nan])
    np.testing.assert_array_equal(H(rec["draft_lp"])[1], want)


@pytest.mark.parametrize("backend_name", ["numpy", "kernel"])
def test_device_row_and_advance(backend_name):
    """The replay's call: row = round - 1 read on the device, then start += m, root = result[m], round += 1."""
    if backend_name == "kernel" and kd.backend.process_name == "numpy":
        pytest.skip("kernels need KDTREE_BACKEND=sim or cuda")
    with kd.backend.use("numpy" if backend_name == "numpy" else kd.backend.process_name):
        tree, acc, lp, ids, rec = _round()
        start, root, rnd, copy = (kd.backend.asarray(np.array([v], np.int32)) for v in (40, 0, 4, -9))
        round_end.round_end(rec, tree, acc, lp, ids, rnd, row_offset=-1, advance=(start, root, rnd))
        _check_row(rec, 3, tree, acc)
        assert (int(H(start)[0]), int(H(root)[0]), int(H(rnd)[0])) == (42, 3, 5)
        rnd[...] = 4
        round_end.round_end(rec, tree, acc, lp, ids, rnd, row_offset=-1, advance=(start, root, rnd),
                            root_copy=copy)                          # the drafter's slot: the same root
        assert (int(H(start)[0]), int(H(root)[0]), int(H(rnd)[0]), int(H(copy)[0])) == (44, 3, 5, 3)


def test_root_copy_needs_advance():
    tree, acc, lp, ids, rec = _round()
    with pytest.raises(ValueError, match=r"root_copy: a second home of the next root needs advance="):
        round_end.round_end(rec, tree, acc, lp, ids, 0, root_copy=np.zeros(1, np.int32))


def test_bad_rows_and_records_are_named():
    tree, acc, lp, ids, rec = _round()
    with pytest.raises(ValueError, match=r"row: expected a record row in \[0, 4\), got 4"):
        round_end.round_end(rec, tree, acc, lp, ids, 4)
    del rec["draft_lp"]
    with pytest.raises(ValueError, match="rec: missing the record 'draft_lp'"):
        round_end.round_end(rec, tree, acc, lp, ids, 0)
