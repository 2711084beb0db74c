"""Expert parallelism on fake ranks: the EP MoE layer equals the single-rank ``Target._moe``; the all-to-all
bookkeeping equals a brute-force enumeration of the assignments; a sharded target generates the unsharded
target's greedy DDTree tokens; bad world sizes are named ValueErrors. NumPy backend, tiny configs."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.parallel import (dispatch_plan, ep_moe, ep_moe_all_to_all, expert_range, receive_plan, run_ranks,
                                   shard_experts, shard_target)
from kdtree_numba.parallel.communicator import FakeGroup

CONFIGS = {
    "default": {},                                                   # 8 experts top-2, 2 groups (topk_group 1)
    "groups": dict(n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, norm_topk_prob=False),
    "kimi_like": dict(n_group=1, topk_group=1, q_lora_rank=None, n_shared_experts=0),
}
PROMPT = [3, 17, 99, 5, 42]


@pytest.fixture(scope="module")
def targets():
    with kd.backend.use("numpy"):
        return {name: kd.tiny_target(i, **kw) for i, (name, kw) in enumerate(CONFIGS.items())}


def moe_layer(target):
    return next(L for L in target.layers if "gate" in L)


def rel_err(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


# ------------------------------------------------------------------------------------------------ sharding
def test_expert_ranges_tile_the_experts():
    for world in (1, 2, 4, 8):
        ranges = [expert_range(8, r, world) for r in range(world)]
        assert ranges[0][0] == 0 and ranges[-1][1] == 8
        assert all(a[1] == b[0] and a[1] - a[0] == 8 // world for a, b in zip(ranges, ranges[1:]))


@pytest.mark.parametrize("world", [3, 5, 16, 0, -2, 2.0, True])
def test_bad_world_sizes_are_named(world, targets, numpy_backend):
    t = targets["default"]
    with pytest.raises(ValueError, match="world"):
        expert_range(8, 0, world)
    with pytest.raises(ValueError, match="world"):
        shard_experts(moe_layer(t), 0, world)
    with pytest.raises(ValueError, match="world"):
        shard_target(t, 0, world, FakeGroup(1).communicators()[0])


def test_shard_holds_its_slice_and_shares_the_rest(targets, numpy_backend):
    L = moe_layer(targets["default"])
    s = shard_experts(L, 1, 4)
    np.testing.assert_array_equal(s["experts_gu"], L["experts_gu"][2:4])
    np.testing.assert_array_equal(s["experts_down"], L["experts_down"][2:4])
    assert s["expert_first"] == 2 and s["gate"] is L["gate"] and s["shared_gu"] is L["shared_gu"]
    assert not np.shares_memory(s["experts_gu"], L["experts_gu"])
    with pytest.raises(ValueError, match="not a MoE layer"):
        shard_experts(targets["default"].layers[0], 0, 2)


def test_two_or_more_ranks_turn_the_gemm_timing_off(targets, numpy_backend, monkeypatch):
    """Ranks replicate the router, attention and LM head: they must run the same GEMM kernels, which a kernel timed
    fastest per process (kernels/gemm_choice.py) does not promise - a sharded target of 2+ ranks takes the fixed
    rule for its process; one rank keeps the timing."""
    from kdtree_numba.kernels import gemm_choice
    monkeypatch.setattr(gemm_choice, "TUNE", True)
    shard_target(targets["default"], 0, 1)
    assert gemm_choice.TUNE
    shard_target(targets["default"], 1, 2, FakeGroup(2).communicators()[1])
    assert not gemm_choice.TUNE


def test_wrong_shard_or_mode_is_refused(targets, numpy_backend):
    t = targets["default"]
    L, h = moe_layer(t), np.zeros((3, t.config.hidden_size), np.float32)
    comms = FakeGroup(2).communicators()
    with pytest.raises(ValueError, match="rank 1 of 2 owns experts 4..7"):
        ep_moe(h, shard_experts(L, 0, 2), t.config, comms[1])
    with pytest.raises(ValueError, match="reduce"):
        ep_moe(h, shard_experts(L, 0, 2), t.config, comms[0], reduce="sum")
    with pytest.raises(ValueError, match="comm: expected a communicator for rank 0 of 2"):
        shard_target(t, 0, 2, comms[1])


# ------------------------------------------------------------------------------------------------ the EP layer
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("T", [1, 7, 13])
def test_ep_moe_equals_single_rank(targets, config, world, T, numpy_backend):
    t = targets[config]
    L = moe_layer(t)
    h = np.random.default_rng(T).standard_normal((T, t.config.hidden_size)).astype(np.float32)
    ref = t._moe(L, h)
    for reduce in ("tokens", "assignments"):
        outs = run_ranks(world, lambda c: ep_moe(h, shard_experts(L, c.rank, world), t.config, c, reduce=reduce))
        for out in outs:
            assert out.shape == ref.shape and out.dtype == np.float32
            assert rel_err(out, ref) <= 1e-5, (reduce, rel_err(out, ref))
            np.testing.assert_array_equal(out, outs[0])                  # every rank holds the same result
            if reduce == "assignments":
                np.testing.assert_array_equal(out, ref)                  # zeros added: bit for bit


def test_ep_moe_on_the_kernel_backend(kernel_backend):
    """The stage kernels (simulator or GPU) under 2 fake ranks, taking turns, against the NumPy single rank."""
    t = kd.tiny_target(0)                                                # on the process backend
    L = moe_layer(t)
    h = np.random.default_rng(5).standard_normal((3, t.config.hidden_size)).astype(np.float32)
    with kd.backend.use("numpy"):
        ref = t.with_backend("numpy")._moe(L, h) if t.backend != "cuda" else None
    outs = run_ranks(2, lambda c: kd.backend.to_host(ep_moe(kd.backend.asarray(h), shard_experts(L, c.rank, 2),
                                                            t.config, c)))
    if ref is None:
        ref = kd.backend.to_host(t._moe(L, kd.backend.asarray(h)))
    for out in outs:
        assert rel_err(out, ref) <= 1e-5


# ------------------------------------------------------------------------------------------------ all-to-all
def brute_force(idxs, E, world):
    """Every rank's received assignments (source, assignment id), in receive layout and in expert-major order."""
    per = E // world
    recv, major = [], []
    for d in range(world):
        rows = [(s, int(e), a) for s, idx in enumerate(idxs) for a, e in enumerate(idx.reshape(-1))
                if e // per == d]
        recv.append(sorted(rows, key=lambda r: (r[0], r[1], r[2])))      # by source, then the source's send order
        major.append(sorted(rows, key=lambda r: (r[1], r[0], r[2])))     # by expert, then source, then assignment
    return recv, major


@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("seed", [0, 1])
def test_dispatch_bookkeeping_equals_brute_force(world, seed):
    E, k = 8, 3
    rng = np.random.default_rng(seed)
    idxs = [np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).reshape(T, k).astype(np.int32)
            if T else np.zeros((0, k), np.int32) for T in rng.integers(0, 9, size=world)]
    sends = [dispatch_plan(idx, E, world) for idx in idxs]
    for s, p in enumerate(sends):                                        # send side
        flat = idxs[s].reshape(-1)
        np.testing.assert_array_equal(p.order[p.slot], np.arange(flat.size))
        np.testing.assert_array_equal(p.experts, flat[p.order])
        assert np.all(np.diff(p.experts) >= 0)                           # expert-major = destination-major
        np.testing.assert_array_equal(p.send_counts, np.bincount(flat // (E // world), minlength=world))

    def split(a, counts):
        return np.split(a, np.cumsum(counts)[:-1])
    ids = [[(s, a) for a in p.order] for s, p in enumerate(sends)]      # what each source sends, in send order
    recv_ids = [[x for s in range(world) for x in split(np.array(ids[s] or np.zeros((0, 2), int)),
                                                        sends[s].send_counts)[d].tolist()] for d in range(world)]
    recv_experts = [[split(sends[s].experts, sends[s].send_counts)[d] for s in range(world)] for d in range(world)]
    want_recv, want_major = brute_force(idxs, E, world)
    back = [[None] * world for _ in range(world)]                        # back[s][d]: outputs d returns to s
    for d in range(world):
        plan = receive_plan(recv_experts[d], d, E, world)
        assert [tuple(x) for x in recv_ids[d]] == [(s, a) for s, _, a in want_recv[d]]
        np.testing.assert_array_equal(plan.sources, [s for s, _, _ in want_recv[d]])
        np.testing.assert_array_equal(plan.experts + d * (E // world), [e for _, e, _ in want_recv[d]])
        major = np.array(recv_ids[d], int).reshape(-1, 2)[plan.order]
        assert [tuple(x) for x in major] == [(s, a) for s, _, a in want_major[d]]
        np.testing.assert_array_equal(np.diff(plan.offsets), np.bincount(plan.experts, minlength=E // world))
        # an "expert output" that names its row, computed in expert-major order, put back in receive layout
        y = (major[:, 0] * 1000 + major[:, 1])[plan.slot]
        for s, chunk in enumerate(split(y, plan.recv_counts)):
            back[s][d] = chunk
    for s, p in enumerate(sends):                                        # combine side: the inverse permutation
        y_sent = np.concatenate(back[s]) if world else np.zeros(0)
        np.testing.assert_array_equal(y_sent[p.slot], s * 1000 + np.arange(idxs[s].size))


def test_receive_plan_refuses_foreign_experts():
    with pytest.raises(ValueError, match="source 1 sent expert 0"):
        receive_plan([np.array([4, 5]), np.array([0])], 1, 8, 2)


@pytest.mark.parametrize("config", ["default", "groups"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_all_to_all_layer_equals_single_rank(targets, config, world, numpy_backend):
    t = targets[config]
    L = moe_layer(t)
    T = 11
    h = np.random.default_rng(world).standard_normal((T, t.config.hidden_size)).astype(np.float32)
    ref = t._moe(L, h)
    cuts = [0, 0, 3, 4, 11][-world - 1:] if world < 4 else [0, 0, 3, 4, 11]   # uneven, incl. an empty rank
    cuts = [0] + cuts[1:-1] + [T] if world > 1 else [0, T]
    parts = [h[cuts[r]:cuts[r + 1]] for r in range(world)]
    outs = run_ranks(world, lambda c: ep_moe_all_to_all(parts[c.rank], shard_experts(L, c.rank, world),
                                                        t.config, c))
    out = np.concatenate(outs)
    assert out.shape == ref.shape and rel_err(out, ref) <= 1e-5


# ------------------------------------------------------------------------------------------------ Target level
@pytest.mark.parametrize("world", [2, 4])
def test_sharded_target_logits(targets, world, numpy_backend):
    t = targets["groups"]
    ref = t.logits(PROMPT)
    outs = run_ranks(world, lambda c: shard_target(t, c.rank, world, c).logits(PROMPT))
    for out in outs:
        assert rel_err(out, ref) <= 1e-5


@pytest.mark.parametrize("config,world,reduce", [("default", 2, "tokens"), ("default", 4, "assignments"),
                                                 ("groups", 4, "tokens"), ("kimi_like", 2, "tokens")])
def test_sharded_greedy_ddtree_equals_unsharded(targets, config, world, reduce, numpy_backend):
    t = targets[config]

    def run(target):
        d = kd.OracleDrafter(target, noise=0.5, seed=2, depth=6)
        return kd.generate(target, PROMPT, 40, drafter=d, budget=16).tokens

    ref = run(t)
    outs = run_ranks(world, lambda c: run(shard_target(t, c.rank, world, c, reduce=reduce)))
    assert all(o == ref for o in outs)


def test_sharded_target_is_a_target_that_cannot_be_saved(targets, numpy_backend):
    t = targets["default"]
    s = shard_target(t, 0, 1)
    assert isinstance(s, kd.Target) and s.w is t.w
    assert kd.generate(s, PROMPT, 8).tokens == kd.generate(t, PROMPT, 8).tokens      # autoregressive too
    comm = FakeGroup(2).communicators()[0]
    s2 = shard_target(t, 0, 2, comm)
    assert s2.layers[1]["experts_gu"].shape[0] == 4 and s2.layers[0] is t.layers[0]
    with pytest.raises(ValueError, match="holds only 4 of the 8 experts"):
        s2.state_dict()
    with pytest.raises(ValueError, match="already sharded"):
        shard_target(s2, 0, 1)
