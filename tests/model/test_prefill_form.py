"""Which attention form a target forward takes: MLA's decompressed form (kernels/gqa_attention.py) for causal chunks
of at least DECOMPRESSED_PREFILL_TOKENS tokens with a host-side start, the absorbed form (mla_attention /
tree_verify) for everything else - and the same logits either way. NumPy backend, a tiny random target."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import gqa_attention, tree as kt
from kdtree_numba.model import target as target_module
from kdtree_numba.model.target import TreeInput


@pytest.fixture
def calls(monkeypatch):
    """Counts of gqa_attention calls made through the module (as target.py makes them); threshold 8 tokens."""
    seen = []
    real = gqa_attention.gqa_attention
    monkeypatch.setattr(gqa_attention, "gqa_attention", lambda *a, **kw: seen.append(a[0].shape[0]) or real(*a, **kw))
    monkeypatch.setattr(target_module, "DECOMPRESSED_PREFILL_TOKENS", 8)
    return seen


def test_the_threshold_picks_the_form(calls, numpy_backend):
    target = kd.tiny_target(0)
    L = target.config.num_hidden_layers
    ids = np.arange(12, dtype=np.int32) % target.config.vocab_size
    target.forward(ids[:7], target.new_cache(16), 0)                  # 7 < 8: absorbed
    assert calls == []
    cache = target.new_cache(24)
    target.forward(ids[:8], cache, 0)                                  # 8: decompressed, once per layer
    assert calls == [8] * L
    target.forward(ids[8:9], cache, 8)                                 # a decode step: absorbed
    dev = kd.backend.full((1,), 8, np.int32)
    target.forward(ids[:8], target.new_cache(24), dev)                 # device-side start (graph replay): absorbed
    parents = np.array([-1, 0, 0, 1, 1, 2, 3, 4, 5])                   # a 9-token tree verify: absorbed
    paths, depths = kt.ancestor_paths(parents)
    tree = TreeInput(positions=8 + depths, paths=paths, depths=depths, max_depth=int(depths.max()))
    target.forward(ids[:9], cache, 8, tree=tree)
    assert calls == [8] * L


def test_both_forms_give_the_same_logits(monkeypatch, numpy_backend):
    target = kd.tiny_target(1)
    ids = (np.arange(20, dtype=np.int32) * 7) % target.config.vocab_size
    monkeypatch.setattr(target_module, "DECOMPRESSED_PREFILL_TOKENS", 10 ** 9)
    absorbed = target.forward(ids, target.new_cache(32), 0)[0]
    chunked_absorbed = target.new_cache(32)
    target.forward(ids[:12], chunked_absorbed, 0)
    monkeypatch.setattr(target_module, "DECOMPRESSED_PREFILL_TOKENS", 8)
    decompressed = target.forward(ids, target.new_cache(32), 0)[0]
    np.testing.assert_allclose(decompressed, absorbed, rtol=1e-4, atol=1e-4)
    # a second chunk of 8 over a 12-row prefix decompresses the prefix too: the same last logits
    second = target.forward(ids[12:], chunked_absorbed, 12)[0]
    np.testing.assert_allclose(second, absorbed[12:], rtol=1e-4, atol=1e-4)


def test_tree_positions_none_is_start_plus_depth():
    """TreeInput(positions=None): the verify ropes each node at start + depth, the kernels adding start (a device
    start in a captured round) - the logits of explicit positions, bit for bit. One layer: positions enter every
    layer alike, through its rope (three layers took 32 s on the simulator of a 2-core machine)."""
    target = kd.tiny_target(2, num_hidden_layers=1)
    ids = (np.arange(17, dtype=np.int32) * 5) % target.config.vocab_size
    parents = np.array([-1, 0, 0, 1, 1, 2, 3, 4, 5])
    paths, depths = kt.ancestor_paths(parents)
    got = []
    for positions, start in ((8 + depths, 8), (None, 8), (None, kd.backend.full((1,), 8, np.int32))):
        cache = target.new_cache(24)
        target.forward(ids[:8], cache, 0)
        tree = TreeInput(positions=positions, paths=paths, depths=depths, max_depth=int(depths.max()))
        got.append(kd.backend.to_host(target.forward(ids[8:], cache, start, tree=tree)[0]))
    np.testing.assert_array_equal(got[1], got[0])
    np.testing.assert_array_equal(got[2], got[0])


def test_logits_to_keep_computes_the_last_rows_only(numpy_backend, monkeypatch):
    """logits_to_keep = k: the lm_head GEMM sees the last k rows (what generate's prefill samples from) and they
    equal the full forward's last k rows; k >= T keeps all rows; a negative or non-integer k is refused by name."""
    target = kd.tiny_target(0)
    ids = np.arange(10, dtype=np.int32) % target.config.vocab_size
    full, _ = target.forward(ids, target.new_cache(10), 0)
    rows = []
    real = target_module.gemm.linear
    monkeypatch.setattr(target_module.gemm, "linear",
                        lambda x, w, **kw: (w is target.w["lm_head"] and rows.append(x.shape[0])) or real(x, w, **kw))
    last, _ = target.forward(ids, target.new_cache(10), 0, logits_to_keep=3)
    assert rows == [3] and last.shape == (3, full.shape[1])
    np.testing.assert_allclose(last, full[-3:], rtol=1e-5, atol=1e-5)     # BLAS blocks M = 3 differently
    every, _ = target.forward(ids, target.new_cache(10), 0, logits_to_keep=99)
    np.testing.assert_allclose(every, full, rtol=1e-5, atol=1e-5)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="logits_to_keep"):
            target.forward(ids, target.new_cache(10), 0, logits_to_keep=bad)
