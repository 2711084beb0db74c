"""The target's fused weights: weights that read the same input (q_a + kv_a; the MoE router + the shared expert's
gate/up) are stacked at construction so that each pair is one GEMM. The names they had stay as row views of the
stack: state_dict and save see the checkpoint's tensors, and the forward equals the unfused one."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.model import presets

pytestmark = pytest.mark.usefixtures("numpy_backend")


def test_stacks_are_row_views_and_state_dict_is_the_checkpoint():
    cfg = presets.tiny_config()
    state = presets.random_state_dict(cfg, 3)
    t = kd.Target.from_state_dict(cfg, state)
    moe = [L for L in t.layers if "gate" in L]
    assert moe and all("gate_shared_gu" in L and "qkv_a" in L for L in moe)
    for L in moe:
        for fused, names in (("qkv_a", ("q_a", "kv_a")), ("gate_shared_gu", ("gate", "shared_gu"))):
            assert all(np.shares_memory(L[n], L[fused]) for n in names)
            np.testing.assert_array_equal(L[fused], np.concatenate([L[n] for n in names]))
    got = t.state_dict()
    assert set(got) == set(state)
    for key, value in state.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_fused_router_and_shared_expert_equal_the_separate_gemms():
    """With the stack removed, _moe runs the router and the shared expert as two GEMMs: same logits (to BLAS
    rounding); and a target without a shared expert routes on the plain router weight."""
    t = kd.tiny_target(5)
    ids = np.arange(2, 30, 3)
    want = t.logits(ids)
    for L in t.layers:
        L.pop("gate_shared_gu", None)
    np.testing.assert_allclose(t.logits(ids), want, rtol=1e-5, atol=1e-5)
    bare = kd.tiny_target(5, n_shared_experts=0)
    assert all("gate_shared_gu" not in L and "shared_gu" not in L for L in bare.layers)
    assert np.isfinite(bare.logits(ids)).all()
