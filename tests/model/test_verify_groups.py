"""A tree verify run as row groups side by side (model/target.py, VERIFY_GROUP_ROWS): the groups cut the rows as
documented, and a grouped verify gives the one-group verify's logits, hidden streams and cache rows - on the
process backend (the simulator in CI: the same host code, in order) and on the GPU, directly and replayed from a
captured graph whose groups run on concurrent streams (backend.branch, nested)."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba import backend
from kdtree_numba.kernels import tree as kt
from kdtree_numba.model import target as target_module
from kdtree_numba.model.target import TreeInput, _row_groups, _row_start

PARENTS = np.array([-1, 0, 0, 1, 1, 2, 3, 4, 5])         # a 9-node verify (root + 8), 4 deep


@pytest.mark.parametrize("T, rows, want", [
    (33, 17, [(0, 16), (16, 33)]),
    (33, 11, [(0, 11), (11, 22), (22, 33)]),
    (16, 17, [(0, 16)]),
    (17, 17, [(0, 17)]),
    (18, 17, [(0, 9), (9, 18)]),
    (9, 0, [(0, 9)]),
    (3, 1, [(0, 1), (1, 2), (2, 3)]),
])
def test_row_groups_cut_near_equal_groups(T, rows, want):
    groups = _row_groups(T, rows)
    assert groups == want
    assert all(r1 - r0 <= (rows or T) for r0, r1 in groups)


def test_row_start_keeps_the_form_of_start():
    dev = np.zeros(1, np.int32)
    assert _row_start(40, 17) == 57
    got = _row_start(dev, 17)
    assert got[0] is dev and got[1] == 17
    got = _row_start((dev, 5), 17)
    assert got[0] is dev and got[1] == 22


def _verify(target, group_rows, monkeypatch, start=8, seed=3, parents=PARENTS):
    """Logits, hidden streams (layers 0 and 1) and the cache rows of a tree verify after an 8-token prefill."""
    monkeypatch.setattr(target_module, "VERIFY_GROUP_ROWS", group_rows)
    V = target.config.vocab_size
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, V, start).astype(np.int32)
    ids = rng.integers(0, V, parents.size).astype(np.int32)
    paths, depths = kt.ancestor_paths(parents)
    cache = target.new_cache(start + parents.size + 4)
    target.forward(prompt, cache, 0)
    tree = TreeInput(positions=None, paths=backend.asarray(paths), depths=backend.asarray(depths),
                     max_depth=int(depths.max()))
    logits, hid = target.forward(ids, cache, start, tree=tree, hidden_layers=(0, 1))
    return [backend.to_host(a) for a in (logits, hid.stacked, cache.data)]


@pytest.mark.parametrize("group_rows", [4, 2])
def test_grouped_verify_equals_one_group(group_rows, monkeypatch):
    """9 rows as 3 groups (4 rows) and 5 groups (2): every output within float32 rounding of the one-group verify
    (each group's GEMMs see fewer rows) and the same argmax per row."""
    target = kd.tiny_target(4)
    one = _verify(target, 0, monkeypatch)
    grouped = _verify(target, group_rows, monkeypatch)
    for a, b in zip(grouped, one):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(grouped[0].argmax(1), one[0].argmax(1))


def test_a_moe_target_verifies_in_groups(monkeypatch, numpy_backend):
    """A target whose layers are MoE after the first (the default pair's shape): each group routes its own tokens;
    the same values as one group."""
    target, _ = kd.load_default()
    assert target.config.n_routed_experts > 0
    parents = np.concatenate([[-1], np.arange(32) // 2])                          # 33 rows, a binary tree
    one = _verify(target, 0, monkeypatch, parents=parents)
    grouped = _verify(target, 17, monkeypatch, parents=parents)
    for a, b in zip(grouped, one):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(grouped[0].argmax(1), one[0].argmax(1))


@pytest.mark.gpu
def test_grouped_verify_on_the_gpu_direct_and_captured(monkeypatch):
    """The default pair's 33-row verify as 2 groups on cuda: the one-group values directly, and a captured graph of
    it (groups and their inner branches on concurrent streams) replays them bit for bit; every side stream is
    free again after each forward."""
    from kdtree_numba.decode.capture import CapturedStep

    target, _ = kd.load_default()
    parents = np.concatenate([[-1], np.arange(32) // 2])
    one = _verify(target, 0, monkeypatch, parents=parents)
    direct = _verify(target, 17, monkeypatch, parents=parents)
    assert backend._held == {}
    for a, b in zip(direct, one):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(direct[0].argmax(1), one[0].argmax(1))

    V = target.config.vocab_size
    ids = backend.asarray(np.random.default_rng(5).integers(0, V, 33).astype(np.int32))
    paths, depths = kt.ancestor_paths(parents)
    tree = TreeInput(None, backend.asarray(paths), backend.asarray(depths), int(depths.max()))
    cache = target.new_cache(64)
    target.forward(np.arange(8, dtype=np.int32), cache, 0)
    start = backend.full((1,), 8, np.int32)
    out = {}

    def verify():
        out["logits"], _ = target.forward(ids, cache, start, tree=tree, check_ids=False)

    verify()
    first = backend.to_host(out["logits"])
    graph = CapturedStep(verify, "a grouped verify")
    assert backend._held == {}
    graph.replay()
    np.testing.assert_array_equal(backend.to_host(out["logits"]), first)
