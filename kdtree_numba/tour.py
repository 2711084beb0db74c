"""Kernel tour: every stage kernel on the active backend at a small irregular shape, against its reference.

``python -m kdtree_numba tour`` prints one line per stage with the max error and OK/FAIL. On the numpy backend
the "kernels" are the references themselves (set KDTREE_BACKEND=sim to run the numba kernels on the simulator).
"""
from __future__ import annotations

import numpy as np

from . import backend
from .kernels import (draft_kv, embedding, gemm, kv_compaction, logprobs, mla_attention, mla_latent, moe_routing,
                      rmsnorm, rope, sampling, swiglu, tree, tree_accept, tree_build, tree_verify)


def _cases(rng):
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)   # noqa: E731
    H = backend.to_host
    x, w = f32(7, 69), f32(69)
    yield "rmsnorm", "7x69", H(rmsnorm.rmsnorm(x, w, 1e-6)), rmsnorm.rmsnorm_ref(x, w, 1e-6)
    q, pos, inv = f32(5, 3, 10), np.array([4, 5, 5, 6, 90], np.int32), rope.rope_inv_freq(10, 1e4)
    yield "rope", "5x3x10", H(rope.apply_rope(q, pos, inv)), rope.rope_ref(q, pos, inv)
    gu = f32(7, 46)
    yield "swiglu", "7x46", H(swiglu.swiglu(gu)), swiglu.swiglu_ref(gu)
    table, ids = f32(50, 13), np.array([3, 49, 0, 3], np.int32)
    yield "embedding", "4 of 50x13", H(embedding.embed(table, ids)), table[ids]
    a, b = f32(7, 37), f32(37, 19)
    yield "gemm (tiled)", "7x37 @ 37x19", H(gemm.matmul_tiled(a, b)), a.astype(np.float64) @ b
    lg, bias = f32(6, 16), 0.2 * f32(16)
    idx, wts = moe_routing.route(lg, bias, 3, 4, 2, True, 2.5)
    ridx, rw = moe_routing.route_ref(lg, bias, 3, 4, 2, True, 2.5)
    yield "moe routing (ids)", "6x16 top-3", H(idx), ridx
    yield "moe routing (weights)", "6x16 top-3", H(wts), rw
    order = H(moe_routing.group_by_expert(idx, 16)[2])
    yield "moe grouping", "18 assignments", order, moe_routing.group_by_expert_ref(ridx, 16)[2]
    ckv, lat = f32(4, 15), backend.zeros((9, 15), np.float32)
    mla_latent.write_latent(ckv, w[:9], 1e-6, pos[:4], inv[:3], 1.0, lat, 2)
    yield "mla latent write", "4 rows of 9 + 6", H(lat)[2:6], mla_latent.latent_rows_ref(ckv, w[:9], 1e-6, pos[:4],
                                                                                       inv[:3])
    kv, kc, vc = f32(3, 40), backend.zeros((6, 2, 10), np.float32), backend.zeros((6, 2, 10), np.float32)
    draft_kv.write_draft_kv(kv, w[:10], 1e-6, pos[:3], inv, 1.0, kc, vc, 1)
    yield "draft kv write", "3 rows x 2 heads of 10", np.concatenate([H(kc)[1:4], H(vc)[1:4]]), \
        np.concatenate(draft_kv.draft_kv_ref(kv, w[:10], 1e-6, pos[:3], inv))
    yield "draft query", "3 x 3 heads of 10, view", \
        H(draft_kv.draft_query(kv[:, 10:], w[:10], 1e-6, pos[:3], inv, 1.0)), \
        draft_kv.draft_query_ref(kv[:, 10:], w[:10], 1e-6, pos[:3], inv)
    qa, cache = f32(3, 5, 13), f32(12, 13)
    yield "mla attention", "3 tokens x 5 heads, 9 rows", H(mla_attention.mla_attention(qa, cache, 6, 0.3, 9)), \
        mla_attention.mla_attention_ref(qa, cache, 6, 0.3, 9)
    parents = np.array([-1, 0, 0, 1, 3, 1])
    paths, depth = tree.ancestor_paths(parents)
    qt = f32(6, 3, 11)
    cache = f32(14, 11)
    yield "tree verify", "6 tree tokens, start 5", \
        H(tree_verify.tree_attention(qt, cache, 5, paths, depth, 0.5, 8)), \
        tree_verify.tree_attention_ref(qt, cache, 5, parents, 0.5, 8)
    dl = f32(3, 40) * 2
    lp, tid = logprobs.topk_logprobs(dl, 6)
    rlp, rtid = logprobs.topk_logprobs_ref(dl, 6)
    yield "top-k logprobs (ids)", "3x40 k=6", H(tid), rtid
    yield "top-k logprobs (values)", "3x40 k=6", H(lp), rlp
    yield "choose tokens (T=0.8)", "4x40", H(sampling.choose_tokens(dl[:2].repeat(2, 0), 0.8, 3, 1)), \
        sampling.choose_tokens_ref(dl[:2].repeat(2, 0), 0.8, 3, 1)
    t = tree_build.build_tree(H(lp), H(tid), 10)
    r = tree_build.build_tree_ref(H(lp), H(tid), 10)     # the same inputs: the build is exact, the top-K ulp-close
    yield "tree build", "L=3 K=6 budget 10", np.concatenate([t.parents, t.tokens, t.logw.view(np.int64)]), \
        np.concatenate([r.parents, r.tokens, r.logw.view(np.int64)])
    vl = f32(t.n + 1, 40)
    got = tree_accept.accept(vl, t.tokens, t.parents[1:], t.n)
    want = tree_accept.walk_ref(sampling.choose_tokens_ref(vl, 0.0), t.tokens, t.parents[1:], t.n)
    yield "tree accept", f"{t.n} nodes", np.array(got[0] + [got[1]]), np.array(want[0] + [want[1]])
    kv = f32(3, 20, 33)
    want_kv = kv.copy()
    kv_compaction.compact_ref(want_kv, 4, np.array([0, 2, 5]))
    dev = backend.asarray(kv.copy())
    kv_compaction.compact(dev, 4, np.array([0, 2, 5], np.int32))
    yield "kv compaction", "3 layers x 20 rows", H(dev), want_kv


def run_tour(say=print) -> int:
    """Run every stage; return the number of failures."""
    rng = np.random.default_rng(0)
    say(f"kernel tour on backend {backend.name!r}"
        + (" (the references run as kernels: set KDTREE_BACKEND=sim for the numba simulator)"
           if backend.name == "numpy" else ""))
    failures = 0
    for name, shape, got, want in _cases(rng):
        got, want = np.asarray(got), np.asarray(want)
        exact = got.dtype.kind in "iu" or want.dtype.kind in "iu"
        err = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max()) if got.size else 0.0
        ok = got.shape == want.shape and (err == 0 if exact else err <= 1e-4 * max(1.0, np.abs(want).max()))
        failures += not ok
        say(f"  {name:<24}{shape:<28}max err {err:9.2e}   {'OK' if ok else 'FAIL'}")
    say("all stages match their references" if not failures else f"{failures} stage(s) FAILED")
    return failures
