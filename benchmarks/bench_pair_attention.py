"""The default pair's attention launches as a graph-replayed step and round run them: the start read on the device
(the grid planned for the cache's capacity, each block cutting its real key list over the splits itself:
``mla_attention.split_range`` / ``past_the_list``) against a host start (the split plan sized for the real keys).

A replayed decode step or DDTree round cannot plan its key splits for the keys it has - the start lives on the
device - so its launches are planned for every cache row (the program's capacity: 256, 512, 1024 .. rows). This
table shows what that costs, launch by launch, at the default pair's shapes (target: absorbed MLA, 8 heads, latent
rows of kv_lora_rank + qk_rope_head_dim = 112 floats, Lkv 96; drafter: GQA 8 / 4 heads of 32, a block of 16):
    tree verify   1 + budget tokens (DDTree-32: 33; the chain: 16), paths of depth <= 16
    decode step   1 token, causal
    draft block   16 tokens over the draft cache, not causal
Each cell: us per call inside a CUDA graph of 20 back-to-back calls (``_common.graph_per_call_us``: the gaps a
round's kernels have between them are in it), median of the replays; "device / host" is the ratio in the same run
(1.00 = the device start costs nothing). Example (H200, 2026-12-04, before split_range): a 33-token verify in a
512-row cache at start 120 took 27.0 us with the device start and 19.6 with the host's plan.

    PYTHONPATH=$PWD KDTREE_BACKEND=cuda python3 benchmarks/bench_pair_attention.py
    KDTREE_BACKEND=sim python3 benchmarks/bench_pair_attention.py --quick     # a smoke run, numbers meaningless
"""
import numpy as np

from _common import args, graph_per_call_us, kd, save, table

from kdtree_numba.kernels import block_attention, mla_attention, tree_verify  # noqa: E402
from kdtree_numba.kernels.tree import ancestor_paths  # noqa: E402

a = args(__doc__)
GPU = kd.backend.name == "cuda" and not a.quick
tc = kd.load_default()[0].config if GPU else None
N, D, LKV = (tc.num_attention_heads, tc.latent_dim, tc.kv_lora_rank) if GPU else (2, 24, 16)
NQ, NKV, DH, BLOCK = (8, 4, 32, 16) if GPU else (2, 1, 8, 3)          # the shipped drafter's block attention
DEPTH = 16 if GPU else 3
caps, starts, trees = ([512, 1024], [120, 250], [33, 16]) if GPU else ([48], [20], [4])
rng = np.random.default_rng(0)
xp = kd.backend


def dev(value: int):
    return xp.asarray(np.array([value], np.int32))


def cell(call_dev, call_host) -> list:
    kw = {} if GPU else dict(calls=2, reps=1, warmup=1)             # the simulator: a smoke run
    d, h = graph_per_call_us(call_dev, **kw), graph_per_call_us(call_host, **kw)
    return [f"{d:.1f}", f"{h:.1f}", f"{d / h:.2f}"]


rows = []
for cap in caps:
    cache = xp.asarray(rng.standard_normal((cap, D)).astype(np.float32))                 # [C, D] latent rows
    for n1 in trees:
        parents = np.concatenate([[-1], [rng.integers(max(0, j - 4), j) for j in range(1, n1)]])
        paths, depths = (xp.asarray(x) for x in ancestor_paths(parents, DEPTH))
        q = xp.asarray(rng.standard_normal((n1, N, D)).astype(np.float32))            # [n+1, N, D]
        out = xp.empty((n1, N, LKV), np.float32)
        for s in starts:
            rows.append([f"tree verify, {n1} tokens", cap, s] + cell(
                lambda st=dev(s): tree_verify.tree_attention(q, cache, st, paths, depths, 0.1, LKV, DEPTH, out=out),
                lambda s=s: tree_verify.tree_attention(q, cache, s, paths, depths, 0.1, LKV, DEPTH, out=out)))
    q1 = xp.asarray(rng.standard_normal((1, N, D)).astype(np.float32))                   # [1, N, D]
    o1 = xp.empty((1, N, LKV), np.float32)
    for s in starts:
        rows.append(["decode step", cap, s] + cell(
            lambda st=dev(s): mla_attention.mla_attention(q1, cache, st, 0.1, LKV, out=o1),
            lambda s=s: mla_attention.mla_attention(q1, cache, s, 0.1, LKV, out=o1)))
    k = xp.asarray(rng.standard_normal((cap, NKV, DH)).astype(np.float32))                # [C, Nkv, D]
    v = xp.asarray(rng.standard_normal((cap, NKV, DH)).astype(np.float32))
    qb = xp.asarray(rng.standard_normal((BLOCK, NQ, DH)).astype(np.float32))            # [B, Nq, D]
    ob = xp.empty((BLOCK, NQ, DH), np.float32)
    for s in starts:
        rows.append([f"draft block, {BLOCK} tokens", cap, s] + cell(
            lambda nk=dev(s + BLOCK): block_attention.block_attention(qb, k, v, nk, 0.1, out=ob),
            lambda s=s: block_attention.block_attention(qb, k, v, s + BLOCK, 0.1, out=ob)))
table(f"The default pair's attention launches, device-side start vs host start ({kd.backend.name}; us per call in "
      f"a graph of 20)", ["launch", "cache rows", "start", "device start us", "host start us", "device / host"], rows)
save("bench_pair_attention")
