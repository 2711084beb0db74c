"""Stage kernels at large realistic shapes: device time, achieved GB/s and % of the copy bandwidth measured in
the same run; routing at Kimi-K2's shape; draft top-K by both paths; the skinny GEMM against cuBLAS at the
default pair's shapes; the educational GEMMs (tiled, 3xTF32 MMA) against cuBLAS fp32 and TF32 as ratios.

    PYTHONPATH=$PWD python3 benchmarks/bench_kernels.py
Goals (issue 2): RMSNorm, RoPE and SwiGLU >= 60 % of copy bandwidth; routing 4096 x 384 top-8 < 50 us.
"""
import numpy as np

from _common import args, copy_bandwidth_gbs, graph_median_ms, kd, median_ms, save, set_tf32, table, torch_median_ms

a = args(__doc__)
xp = kd.backend.xp
from kdtree_numba.kernels import _cublas, embedding, gemm, moe_routing, rmsnorm, rope, skinny_gemm, swiglu  # noqa: E402,E501

T, Hd = (16384, 7168) if not a.quick else (64, 256)
copy = copy_bandwidth_gbs() if not a.quick else float("nan")


def rand(*shape):
    return xp.asarray(np.random.default_rng(0).standard_normal(shape, dtype=np.float32)) if a.quick else \
        xp.random.standard_normal(shape, dtype=np.float32)


rows = []


def bw_row(name, shape, fn, nbytes, goal=None):
    """Device time from a CUDA-graph replay (numba's ~30 us host launch cost left out), the direct call beside it;
    GB/s and % of copy bandwidth from the device time."""
    ms = graph_median_ms(fn, a.reps)
    direct = median_ms(fn, a.reps)
    gbs = nbytes / (ms * 1e-3) / 1e9
    pct = 100 * gbs / copy
    rows.append([name, shape, f"{ms * 1e3:.1f} (direct call {direct * 1e3:.0f})", f"{gbs:.0f}", f"{pct:.0f} %",
                 goal or ""])


# RMSNorm [T, H]: read x once (+ w), write y once
x, w = rand(T, Hd), rand(Hd)
out = xp.empty_like(x)
bw_row("rmsnorm", f"{T} x {Hd}", lambda: rmsnorm.rmsnorm(x, w, 1e-6, out=out), 2 * x.nbytes, ">= 60 %")
# SwiGLU: read [T, 2H], write [T, H]
gu = rand(T, 2 * Hd)
sw = xp.empty((T, Hd), np.float32)
bw_row("swiglu", f"{T} x 2*{Hd}", lambda: swiglu.swiglu(gu, out=sw), gu.nbytes + sw.nbytes, ">= 60 %")
del gu, sw
# RoPE [T, 64 heads, 64] in place
R_T = T if not a.quick else 64
q = rand(R_T, 64, 64)
pos = xp.arange(R_T, dtype=np.int32)
inv = xp.asarray(rope.yarn_inv_freq(64, 50000.0, 32.0, 4096, 1, 1))
bw_row("rope (in place)", f"{R_T} x 64 x 64", lambda: rope.apply_rope(q, pos, inv, 1.0, out=q), 2 * q.nbytes,
       ">= 60 %")
del q
# embedding gather
table_w = rand(163840 if not a.quick else 512, Hd)
n_ids = 4096 if not a.quick else 16
ids = xp.asarray(np.random.default_rng(1).integers(0, table_w.shape[0], n_ids).astype(np.int32))
emb = xp.empty((n_ids, Hd), np.float32)
bw_row("embedding", f"{n_ids} rows of {table_w.shape[0]} x {Hd}", lambda: embedding.embed(table_w, ids, out=emb,
                                                                                          check=False), 2 * emb.nbytes)
del table_w, emb, x, out
# routing at Kimi-K2's shape: 4096 tokens x 384 experts, top-8, one group (--quick: 16 tokens x 96 experts)
n_tok, n_exp = (4096, 384) if not a.quick else (16, 96)
logits = rand(n_tok, n_exp)
bias = rand(n_exp) * 0.1
# small kernels: the direct call is host-bound (numba launch + checks); a CUDA-graph replay shows device time
ds_logits, ds_bias = logits[:, :n_exp * 2 // 3].copy(), bias[:n_exp * 2 // 3].copy()
idx, _ = moe_routing.route(logits, bias, 8, 1, 1, True, 2.827)
for name, shape, fn, goal in [
        ("moe routing", f"{n_tok} x {n_exp}, top-8", lambda: moe_routing.route(logits, bias, 8, 1, 1, True, 2.827),
         "< 50 us"),
        ("moe routing (groups)", f"{n_tok} x {ds_logits.shape[1]}, 8 groups keep 4",
         lambda: moe_routing.route(ds_logits, ds_bias, 8, 8, 4, True, 2.5), ""),
        ("group by expert", f"{idx.size} assignments, {n_exp} experts",
         lambda: moe_routing.group_by_expert(idx, n_exp), "")]:
    direct = median_ms(fn, a.reps)
    try:
        dev = f"{graph_median_ms(fn, a.reps) * 1e3:.1f}"
    except Exception as e:           # report, do not hide
        dev = f"graph capture failed: {type(e).__name__}"
    rows.append([name, shape, f"{dev} (direct call {direct * 1e3:.0f})", "", "", goal])
table(f"Stage kernels ({kd.backend.name}; copy bandwidth measured now: {copy:.0f} GB/s)",
      ["stage", "shape", "device time (us)", "GB/s", "% of copy", "goal"], rows)

# draft top-K: which path pays at which vocabulary. logprobs.topk_logprobs splits a row over blocks only from
# V >= 2 x SPLIT_CHUNK; a small draft vocabulary (the default pair: 15 x 4096, k = 64) takes one block per row,
# 100 us per round in a replayed DDTree round (ncu, 2026-12-02). Same rows through both paths, ids checked equal.
from kdtree_numba.kernels import logprobs, topk_block, topk_split  # noqa: E402

topk_rows = []
for V, k in ([(4096, 64), (32768, 64), (163840, 256)] if not a.quick else [(512, 16)]):
    x = rand(15, V) * 3
    lp, ids = xp.empty((15, k), np.float32), xp.empty((15, k), np.int32)
    want = kd.backend.to_host(logprobs.topk_logprobs(x, k)[1])
    paths = [("one block per row", lambda: topk_block._launch_block(x, k, lp, ids))]
    paths += [(f"split, chunk {c}", lambda c=c: topk_split._launch_split(x, k, lp, ids, c))
              for c in (1024, 4096, topk_split.SPLIT_CHUNK) if c < V]
    base = None
    for name, fn in paths:
        fn()
        assert (kd.backend.to_host(ids) == want).all(), f"top-K {name} disagrees at V = {V}"
        us = graph_median_ms(fn, a.reps) * 1e3
        base = base or us
        topk_rows.append([f"15 x {V}, k {k}", name, f"{us:.1f}", f"{base / us:.2f}x"])
table("Draft top-K (15 rows): one block per row vs rows split over blocks (device time, graph replay)",
      ["logits", "path", "us", "speed-up vs one block per row"], topk_rows)

# the skinny GEMM against cuBLAS on the default pair's products (rows: a draft / chain verify 16, a budget-32 and
# a budget-64 verify 33 / 65, a prefill 128; K x N: q_a+kv_a, q_b, o_proj (+= residual), router+shared gate/up,
# shared down (+=), the dense MLP's gate/up and down (+=)), both on the same arrays, graph replays
sk_rows = []
sk_shapes = [(256, 240, False), (128, 384, False), (256, 256, True), (256, 392, False), (192, 256, True),
             (256, 1536, False), (768, 256, True)] if not a.quick else [(40, 24, True)]
for M in ((16, 17, 33, 65, 128) if not a.quick else (17,)):
    for K, N, acc in sk_shapes:
        x, w = rand(M, K), rand(N, K) * 0.05
        o_c, o_s = xp.zeros((M, N), np.float32), xp.zeros((M, N), np.float32)
        if kd.backend.name == "cuda":
            us_c = graph_median_ms(lambda: _cublas.gemm(x, w.T, o_c, acc), a.reps) * 1e3
        else:
            us_c = median_ms(lambda: gemm.linear(x, w, out=o_c, accumulate=acc), a.reps) * 1e3
        us_s = graph_median_ms(lambda: skinny_gemm.skinny_linear(x, w, o_s, acc), a.reps) * 1e3
        want = kd.backend.to_host(gemm.linear(x, w)) if kd.backend.name != "cuda" else \
            kd.backend.to_host(_cublas.gemm(x, w.T, xp.empty((M, N), np.float32)))
        got = kd.backend.to_host(skinny_gemm.skinny_linear(x, w, xp.empty((M, N), np.float32)))
        assert np.abs(got - want).max() < 1e-4, f"skinny GEMM disagrees at {M} x {K} x {N}"
        sk_rows.append([f"{M} x {K} x {N}{' (+=)' if acc else ''}", f"{us_c:.2f}", f"{us_s:.2f}", f"{us_c / us_s:.2f}x",
                        "skinny" if skinny_gemm.pays(M, K, N) else "cuBLAS"])
table("Skinny GEMM vs cuBLAS, x [M, K] @ w.T [K, N] (device time, graph replay, us)",
      ["M x K x N", "cuBLAS", "skinny", "speed-up", "gemm.linear takes"], sk_rows)

# the educational GEMMs (CUDA cores; 3xTF32 tensor-core MMAs) vs cuBLAS fp32 and, when torch sees the GPU, vs
# cuBLAS with TF32 allowed (torch.matmul; one TF32 MMA per product: the tensor-core ceiling, not fp32-grade)
n = 4096 if not a.quick else 64
A, B = rand(n, n), rand(n, n)
C = xp.empty((n, n), np.float32)
ms_t = median_ms(lambda: gemm.matmul_tiled(A, B, out=C), max(3, a.reps // 4))
ms_m = median_ms(lambda: gemm.matmul_mma(A, B, out=C), max(3, a.reps // 4))
ms_c = median_ms(lambda: xp.matmul(A, B, out=C), a.reps)
tf = lambda ms: 2 * n ** 3 / (ms * 1e-3) / 1e12   # noqa: E731
gemm_rows = [[name, f"{n}^3", f"{ms:.2f}", f"{tf(ms):.1f}", f"{ms / ms_c:.2f}x cuBLAS fp32's time"]
             for name, ms in (("matmul_tiled (16x16 shared tiles, CUDA cores)", ms_t),
                              ("matmul_mma (32x16 tiles, 3xTF32 MMAs, fp32-grade)", ms_m),
                              ("cuBLAS fp32 (cupy.matmul)", ms_c))]
if kd.backend.name == "cuda":
    import torch

    tA, tB, tC = torch.from_dlpack(A), torch.from_dlpack(B), torch.from_dlpack(C)
    set_tf32(True)
    try:
        ms_x = torch_median_ms(lambda: torch.matmul(tA, tB, out=tC), a.reps)
    finally:
        set_tf32(False)
    gemm_rows.append(["cuBLAS TF32 (torch.matmul, TF32 allowed; TF32 rounding)", f"{n}^3", f"{ms_x:.2f}",
                      f"{tf(ms_x):.1f}", f"{ms_x / ms_c:.2f}x cuBLAS fp32's time"])
table("Educational GEMMs vs cuBLAS (fp32; TF32 where torch sees the GPU)",
      ["kernel", "shape", "time (ms)", "TFLOP/s", "time ratio"], gemm_rows)
save("bench_kernels")
