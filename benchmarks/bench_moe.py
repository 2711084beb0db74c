"""The expert GEMMs of one MoE layer at Kimi-K2's shape (hidden 7168, expert intermediate 2048, 384 experts, top-8),
random routing, T tokens: the grouped path the model runs (kernels/moe_grouped_gemm.py: tile table, grouped gate/up
GEMM, SwiGLU, grouped down GEMM; offsets never leave the device) against the path it replaced (offsets read on the
host, then one cuBLAS GEMM per expert with work for gate/up and again for down, SwiGLU between), in the same run.

Both start from the same grouped rows xs [T*8, H] and end with ys [T*8, H]; routing, the gather and the combine
are the same on both paths and left out. Times: device events around the whole path, median of --reps after
warm-up (the old path's host read and its per-expert launches are part of its cost). The grouped path is also
replayed from a CUDA graph (it has no host read, so it can be captured: the round-graph case), and each kernel
variant is timed (1: plain, 2: next tiles prefetched into registers during the multiply, 3: the grouped GEMV:
warps streaming W rows, for decode-sized T).
Memory floor = expert weight bytes the T tokens touch (active experts x 3 x H x I x 4 B) / the copy bandwidth
measured now: at decode sizes both paths are bound by streaming the experts' weights.
fp32 memory: the 384 experts are 384 x 3 x 7168 x 2048 x 4 B = 67.6 GB, which fits the H200 (--experts to use a
subset with the same per-expert shapes where it does not; routing then spreads T*8 rows over fewer experts).

    PYTHONPATH=$PWD python3 benchmarks/bench_moe.py [--tokens 1,16,64,256] [--experts 384]
"""
import numpy as np

from _common import args, copy_bandwidth_gbs, graph_median_ms, kd, median_ms, save, sync, table

a = args(__doc__, lambda p: (p.add_argument("--tokens", default=None, help="comma-separated T (default 1,16,64,256)"),
                             p.add_argument("--experts", type=int, default=None, help="routed experts (default 384)")))
xp = kd.backend.xp
B = kd.backend
from kdtree_numba.kernels import gemm, moe_grouped_gemm as mg, moe_routing as mr, swiglu  # noqa: E402

K_TOP = 8
if a.quick:
    Hd, I, E, tokens = 64, 32, a.experts or 16, [1, 4, 16]
else:
    Hd, I, E, tokens = 7168, 2048, a.experts or 384, [1, 16, 64, 256]
if a.tokens:
    tokens = [int(t) for t in a.tokens.split(",")]
copy = copy_bandwidth_gbs() if B.name == "cuda" else float("nan")


def weights(*shape):
    """N(0, 1/fan_in) fp32, one expert at a time (no 45 GB temporary)."""
    w = xp.empty(shape, np.float32)
    rng = np.random.default_rng(0)
    for e in range(shape[0]):
        w[e] = xp.random.standard_normal(shape[1:], dtype=np.float32) if B.name == "cuda" else \
            rng.standard_normal(shape[1:]).astype(np.float32)
        w[e] *= np.float32(shape[-1] ** -0.5)
    return w


w_gu, w_down = weights(E, 2 * I, Hd), weights(E, Hd, I)              # [E, 2I, H], [E, H, I]
sync()
print(f"experts: {E} x (gate/up [{2 * I}, {Hd}] + down [{Hd}, {I}]) fp32 = "
      f"{(w_gu.nbytes + w_down.nbytes) / 1e9:.1f} GB; copy bandwidth {copy:.0f} GB/s", flush=True)


def per_expert(xs, offsets, gu, act, ys):
    """The replaced path: read the offsets on the host (a stream sync), one GEMM per expert with work."""
    off = B.to_host(offsets)
    active = np.flatnonzero(np.diff(off))
    for e in active:
        gemm.linear(xs[off[e]:off[e + 1]], w_gu[e], out=gu[off[e]:off[e + 1]])
    swiglu.swiglu(gu, out=act)
    for e in active:
        gemm.linear(act[off[e]:off[e + 1]], w_down[e], out=ys[off[e]:off[e + 1]])
    return ys


def grouped(xs, offsets, tiles, gu, act, ys, variant):
    """The model's path: the tile table, then one grouped GEMM per projection; nothing read on the host."""
    mg.tile_table(offsets, out=tiles)
    mg.grouped_linear(xs, w_gu, offsets, out=gu, tiles=tiles, variant=variant, per_expert_above=False)
    swiglu.swiglu(gu, out=act)
    mg.grouped_linear(act, w_down, offsets, out=ys, tiles=tiles, variant=variant, per_expert_above=False)
    return ys


rows = []
for T in tokens:
    rng = np.random.default_rng(T)
    idx, _ = mr.route(B.asarray(rng.standard_normal((T, E)).astype(np.float32)), B.zeros((E,)), K_TOP)
    counts, offsets, order, slot = mr.group_by_expert(idx, E)
    xs = xp.take(B.asarray(rng.standard_normal((T, Hd)).astype(np.float32)), order // K_TOP, axis=0)   # [T*8, H]
    N = T * K_TOP
    gu, act = B.empty((N, 2 * I)), B.empty((N, I))
    ys_old, ys_new, tiles = B.empty((N, Hd)), B.empty((N, Hd)), B.empty((E + 1,), np.int32)
    n_active = int(np.count_nonzero(B.to_host(counts)))
    floor_ms = n_active * 3 * Hd * I * 4 / (copy * 1e9) * 1e3

    old = median_ms(lambda: per_expert(xs, offsets, gu, act, ys_old), a.reps)
    new = {v: median_ms(lambda: grouped(xs, offsets, tiles, gu, act, ys_new, v), a.reps) for v in (1, 2, 3)}
    best = min(new, key=new.get)
    graph = graph_median_ms(lambda: grouped(xs, offsets, tiles, gu, act, ys_new, best), a.reps)
    grouped(xs, offsets, tiles, gu, act, ys_new, best)
    per_expert(xs, offsets, gu, act, ys_old)
    sync()
    want = B.to_host(ys_old)
    err = float(np.abs(B.to_host(ys_new) - want).max() / max(np.abs(want).max(), 1e-30))
    assert err < 1e-4, f"T={T}: grouped and per-expert paths disagree ({err:.1e})"
    rows.append([T, n_active, f"{old:.3f}", f"{new[1]:.3f}", f"{new[2]:.3f}", f"{new[3]:.3f}", f"{graph:.3f} (v{best})",
                 f"{old / new[best]:.2f}x", f"{floor_ms:.3f}", f"{100 * floor_ms / new[best]:.0f} %",
                 f"{err:.0e}"])

table(f"MoE expert GEMMs of one layer: H {Hd}, I {I}, {E} experts top-{K_TOP}, fp32 ({kd.backend.name})",
      ["T", "active experts", "per-expert + host read ms", "grouped v1 ms", "grouped v2 ms", "grouped v3 (GEMV) ms",
       "grouped, graph ms",
       "old / grouped (best)", "memory floor ms", "grouped % of floor", "max rel diff"], rows)
save("bench_moe")
