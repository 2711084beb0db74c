"""Tree-verify attention (absorbed MLA over the latent cache, ancestor-only) and causal MLA (prefill, decode): the
kernel variants v1 (per token x 4 heads, CUDA cores), v2 - v8 (tiles of 32 query rows, tensor cores,
3xTF32; mla_attention's docstring says how they differ) and gemm (cuBLAS 3xTF32 GEMMs around a softmax kernel,
kernels/mla_gemm_attention.py), plus `auto` - what variant=None runs, the number users get - against PyTorch's
scaled_dot_product_attention, in fp32 and with TF32 allowed, plus % of the H200 rooflines.

Per tree shape: context S committed rows, n tree nodes (+ root), N heads, cache rows of 512 + 64 floats.
    FLOPs  = 2 * (n+1) * N * (S + depth + 1) * (576 + 512)      (scores + weighted values; useful work only)
    bytes  = 4 * ((S + n + 1) * 576 + (n+1) * N * (576 + 512))   (cache once, queries in, outputs out)
    fp32 roofline   = max(FLOPs / 51 TFLOP/s, bytes / 4.25 TB/s)   (fp32 cuBLAS GEMM and D2D copy, measured here)
    TF32 roofline   = max(FLOPs / 495 TFLOP/s, bytes / 4.25 TB/s)  (NVIDIA's H200 datasheet: TF32 tensor core
                      989 TFLOP/s "with sparsity", i.e. ~495 dense). v2 issues 3 TF32 MMAs per product (3xTF32),
                      so its own ceiling is 1/3 of that: 33 % of the TF32 column is the most it can show.
Causal shapes: prefill chunks (T tokens after `start`) and decode steps (T = 1), same formulas with each token's
key count start + t + 1.
Prefill in MLA's decompressed form (the target's path for chunks of >= 128 tokens): one attention layer at Kimi's
shape (64 heads, P / R / Vd 128 / 64 / 128, Lkv 512), causal from 0: the absorbed v2 kernel on the latent against
the decompression (two batched GEMMs: k = [c W_UK^T ; k_rot], v = c W_UV) + kernels/gqa_attention.py's variants,
and SDPA given the same per-head k and v (transformers' own form, is_causal). FLOPs = 2 N T (T + 1) / 2 (P + R + Vd).
The DFlash drafter's block attention (not causal, 16 tokens, 8 / 4 heads, D 32): block_attention's v1 and v2.
Phases of the "gemm" variant (kernels/mla_gemm_attention.py) on 256-node x 64-head verifies: each launch of one
call timed alone (the splits once a call, the score GEMM, softmax and the P V GEMMs once a row chunk), their sum
for the whole call (every chunk counted as a full one, so a short last chunk makes the sum too high) against the
whole call, and v5 in the same process.
Baselines, measured in the same run on the same inputs: SDPA with q [1, N, T, 576], k [1, N, S', 576] and
v [1, N, S', 512] (the latent copied to every head: a stride-0 view gave wrong results in torch 2.11) and a float
mask (-inf outside each token's keys; none for decode); once in strict fp32 (TF32 off) and once with TF32 allowed
(torch.backends.cuda.matmul.fp32_precision = "tf32" / allow_tf32, cuDNN likewise: the backends that go through
cuBLAS then use tensor cores). Errors: every variant is checked against a float64 reference on the first shape
of each table, and against SDPA (fp32) on every shape (max |difference| in the table).
Times are device times on both sides: each call is captured once in a CUDA graph (ours with CuPy's stream
capture, SDPA with torch.cuda.graph) and the replays timed with CUDA events, median of --reps. (Until 2026-12-02
the events bracketed one direct call, which charged numba's ~30 us of host launch work to our kernels and torch's
few microseconds to SDPA: the small cells compared launchers, not kernels.)

    PYTHONPATH=$PWD python3 benchmarks/bench_verify.py            # the GPU (KDTREE_BACKEND=cuda)
    PYTHONPATH=$PWD python3 benchmarks/bench_verify.py --tables prefill,block   # only those tables
    PYTHONPATH=$PWD python3 benchmarks/bench_verify.py --tables tree --fast v4  # v4's ratios to SDPA
    PYTHONPATH=$PWD python3 benchmarks/bench_verify.py --tables tree,causal --variants v3,v5,v7,v8 --fast v8
                                                                  # only those variants (v1 gives 'vs v1')
    PYTHONPATH=$PWD python3 benchmarks/bench_verify.py --tables tree,causal --variants v5,gemm
                                                                  # v5, gemm and `auto` (the GPU's --fast)
    PYTHONPATH=$PWD python3 benchmarks/bench_verify.py --tables phases   # where gemm's time goes
    KDTREE_BACKEND=sim python3 benchmarks/bench_verify.py --quick # a smoke run on the simulator (tiny shapes,
                                                                  # no torch rows; the numbers mean nothing)
"""
import sys

import numpy as np

from _common import args, graph_median_ms, kd, save, set_tf32, table, torch_graph_median_ms

TABLES = ("tree", "causal", "prefill", "block", "phases")


def _options(p):
    p.add_argument("--tables", default=",".join(TABLES),
                   help=f"comma-separated subset of {', '.join(TABLES)} (default: all)")
    p.add_argument("--fast", metavar="VARIANT", help="the absorbed-MLA variant whose speedups and roofline shares "
                   "the tree and causal tables report, or `auto`: what variant=None runs (default: auto on the GPU; "
                   "v2 elsewhere)")
    p.add_argument("--variants", help="comma-separated absorbed-MLA variants the tree and causal tables time "
                   "(default: all; the --fast one is always timed, v1 is needed for the 'vs v1' column)")


a = args(__doc__, _options)
only = [t.strip() for t in a.tables.split(",") if t.strip()]
if not only or any(t not in TABLES for t in only):
    print(f"bench_verify.py: --tables expects a comma-separated subset of {', '.join(TABLES)}, got {a.tables!r}",
          file=sys.stderr)
    sys.exit(2)
xp = kd.backend.xp
from kdtree_numba.kernels import block_attention, gemm, gqa_attention, mla_attention, tree, tree_verify  # noqa: E402

if a.fast is not None and a.fast not in mla_attention.VARIANTS + ("auto",):
    print(f"bench_verify.py: --fast expects one of {', '.join(mla_attention.VARIANTS)} or auto, got {a.fast!r}",
          file=sys.stderr)
    sys.exit(2)
picked = mla_attention.VARIANTS if a.variants is None else [v.strip() for v in a.variants.split(",") if v.strip()]
if not picked or any(v not in mla_attention.VARIANTS + ("auto",) for v in picked):
    print(f"bench_verify.py: --variants expects a comma-separated subset of {', '.join(mla_attention.VARIANTS)}, "
          f"auto, got {a.variants!r}", file=sys.stderr)
    sys.exit(2)

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

GPU = kd.backend.name == "cuda"
D, LKV = (576, 512) if GPU else (24, 16)           # the simulator runs a narrow latent (a thread per CUDA thread)
FP32_FLOPS, TF32_FLOPS, BW = 51e12, 495e12, 4.25e12
SCALE = 0.13
FAST = a.fast or ("auto" if GPU else "v2")   # the variant the speedups and roofline shares are of
VARIANTS = tuple(v for v in mla_attention.VARIANTS + ("auto",) if v in picked or v == FAST)
H = kd.backend.to_host
if GPU and not a.quick:
    contexts, nodes, heads = [512, 4096, 32768], [16, 64, 256], [16, 64]
    causal = [(512, 0, 64), (2048, 0, 64), (1, 4096, 64), (1, 32768, 64), (1, 32768, 16)]   # (T, start, N)
    prefill, block_keys = [128, 512, 1024, 4096], [150, 300, 450]
elif GPU:
    contexts, nodes, heads, causal = [512], [16], [16], [(64, 0, 16), (1, 4096, 64)]
    prefill, block_keys = [256], [150]
else:
    contexts, nodes, heads, causal = [16], [4], [2], [(3, 5, 2)]
    prefill, block_keys = [3], [20]
# decompressed prefill: (heads, P, R, Vd, Lkv); the drafter's block: (tokens, Nq, Nkv, D)
MHA = (64, 128, 64, 128, 512) if GPU else (2, 8, 8, 8, 16)
BLOCK = (16, 8, 4, 32) if GPU else (4, 4, 2, 8)


def random_tree(n, rng):
    return np.concatenate([[-1], [rng.integers(max(0, j - 8), j) for j in range(1, n + 1)]])


def rooflines(flops, nbytes):
    """(fp32 roofline, TF32 roofline) in ms."""
    return (max(flops / FP32_FLOPS, nbytes / BW) * 1e3, max(flops / TF32_FLOPS, nbytes / BW) * 1e3)


def sdpa_rows(q, cache, visible, reps, outs):
    """[SDPA fp32 cell, SDPA TF32 cell, max |v - SDPA fp32| over the variants' outputs ``outs``] (cuda + torch)."""
    if torch is None or not GPU:
        return ["-", "-", "-"]
    T, N, _ = q.shape
    S1 = cache.shape[0] if visible is None else visible.shape[1]
    tq = torch.from_dlpack(q).permute(1, 0, 2)[None]                                   # [1, N, T, D]
    tc = torch.from_dlpack(cache)[:S1]
    cells = []
    try:
        tk = tc[None, None].expand(1, N, S1, D).contiguous()
        tv = tc[None, None, :, :LKV].expand(1, N, S1, LKV).contiguous()
        mask = None if visible is None else \
            torch.where(torch.from_numpy(visible).cuda(), 0.0, float("-inf")).float()

        def run():
            return F.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask, scale=SCALE)
        for tf32 in (False, True):
            set_tf32(tf32)
            cells.append(torch_graph_median_ms(run, reps))
            if not tf32:
                check = run()[0].permute(1, 0, 2)
        set_tf32(False)
        diff = max(float((check - torch.from_dlpack(o)).abs().max()) for o in outs)
        del tk, tv
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return ["out of memory"] * 2 + ["-"]
    return cells + [f"{diff:.1e}"]


def print_reference_errors(label, outs, want):
    """One line: each variant's max |difference| from the float64 reference ``want`` on this shape."""
    print(f"float64 reference, {label}: max error " + ", ".join(
        f"{v} {np.abs(H(o) - want).max():.1e}" for v, o in outs.items()), flush=True)


def time_variants(call, shape, reps):
    """({variant: out}, {variant: ms}): ``call(variant, out)`` timed per absorbed-MLA variant into a fresh ``out``
    of ``shape`` (graph replays on the GPU, one direct run elsewhere); `auto` calls with variant None."""
    outs, ms = {}, {}
    for v in VARIANTS:
        outs[v] = xp.empty(shape, np.float32)
        ms[v] = graph_median_ms(lambda: call(None if v == "auto" else v, outs[v]), reps if GPU else 1,
                                1 if not GPU else 3)
    return outs, ms


def row_cells(ms, flops, nbytes, sdpa):
    """Times, speedups and roofline shares of one shape; ``ms``: {variant: ms}."""
    roof32, roof_tf = rooflines(flops, nbytes)
    best = ms[FAST]
    cells = [f"{ms[v]:.3f}" for v in VARIANTS] + [f"{ms['v1'] / best:.1f}x" if "v1" in ms else "-",
                                                   f"{flops / best / 1e9:.1f}",
                                                   f"{100 * roof32 / best:.0f} %", f"{100 * roof_tf / best:.1f} %"]
    for base in sdpa[:2]:
        cells.append(f"{base:.3f} ({base / best:.2f}x)" if isinstance(base, float) else base)
    return cells + [sdpa[2]]


HEADER = [f"{v} (ms)" for v in VARIANTS] + [f"{FAST} vs v1", f"{FAST} TFLOP/s", f"{FAST} % fp32 roof",
                                            f"{FAST} % TF32 roof", f"SDPA fp32 ms ({FAST} speedup)",
                                            f"SDPA TF32 ms ({FAST} speedup)", "max diff vs SDPA"]
rng = np.random.default_rng(0)

# ------------------------------------------------------------------------------------------------ tree verify
if "tree" in only:
    rows = []
    for S in contexts:
        for n in nodes:
            parents = random_tree(n, rng)
            paths, depth = tree.ancestor_paths(parents)
            paths_d, depth_d = xp.asarray(paths), xp.asarray(depth)
            cache = xp.asarray(rng.standard_normal((S + n + 1, D), dtype=np.float32))
            visible = np.zeros((n + 1, S + n + 1), bool)
            visible[:, :S] = True
            for i in range(n + 1):
                visible[i, S + paths[i, :depth[i] + 1]] = True
            for N in heads:
                q = xp.asarray(rng.standard_normal((n + 1, N, D), dtype=np.float32))
                reps = a.reps if S * n * N < 2 ** 26 else 5
                outs, ms = time_variants(lambda v, o: tree_verify.tree_attention(
                    q, cache, S, paths_d, depth_d, SCALE, LKV, max_depth=paths.shape[1] - 1, out=o, variant=v),
                    (n + 1, N, LKV), reps)
                if not rows:
                    print_reference_errors(f"tree S={S} n={n} N={N}", outs,
                                           tree_verify.tree_attention_ref(H(q), H(cache), S, parents, SCALE, LKV))
                flops = 2 * (n + 1) * N * (S + depth.mean() + 1) * (D + LKV)
                nbytes = 4 * ((S + n + 1) * D + (n + 1) * N * (D + LKV))
                rows.append([S, n, N] + row_cells(ms, flops, nbytes, sdpa_rows(q, cache, visible, reps,
                                                                               list(outs.values()))))
    table("Tree-verify attention (fp32 in and out): kernel variants vs torch SDPA with an explicit mask",
          ["context", "nodes", "heads"] + HEADER, rows)

# ------------------------------------------------------------------------------------------------ causal MLA
if "causal" in only:
    rows = []
    for T, start, N in causal:
        cache = xp.asarray(rng.standard_normal((start + T, D), dtype=np.float32))
        q = xp.asarray(rng.standard_normal((T, N, D), dtype=np.float32))
        reps = a.reps if start * N < 2 ** 20 and T < 1024 else 5
        outs, ms = time_variants(lambda v, o: mla_attention.mla_attention(q, cache, start, SCALE, LKV, out=o,
                                                                          variant=v), (T, N, LKV), reps)
        if not rows:
            print_reference_errors(f"causal T={T} start={start} N={N}", outs,
                                   mla_attention.mla_attention_ref(H(q), H(cache), start, SCALE, LKV))
        keys = T * start + T * (T + 1) / 2
        flops = 2 * N * keys * (D + LKV)
        nbytes = 4 * ((start + T) * D + T * N * (D + LKV))
        visible = None if T == 1 else np.arange(start + T)[None, :] <= start + np.arange(T)[:, None]
        rows.append([T, start, N] + row_cells(ms, flops, nbytes, sdpa_rows(q, cache, visible, reps,
                                                                           list(outs.values()))))
    table("Causal MLA (prefill chunks, decode steps): kernel variants vs torch SDPA",
          ["tokens", "start", "heads"] + HEADER, rows)

# ------------------------------------------------------------------------------------------------ decompressed
if "prefill" in only:
    rows = []
    N, P, R, Vd, Lkv = MHA
    w_uk = xp.asarray(0.05 * rng.standard_normal((N, P, Lkv), dtype=np.float32))                 # [N, P, Lkv]
    w_uv = xp.asarray(0.05 * rng.standard_normal((N, Lkv, Vd), dtype=np.float32))                # [N, Lkv, Vd]
    GQA = gqa_attention.VARIANTS
    fast = gqa_attention.default_variant(P + R, Vd)                   # the variant the target's prefill runs
    for T in prefill:
        latent = xp.asarray(rng.standard_normal((T, Lkv + R), dtype=np.float32))                 # [T, Lkv + R]
        q = xp.asarray(rng.standard_normal((T, N, P + R), dtype=np.float32))                      # [T, N, P + R]
        q_abs = xp.asarray(rng.standard_normal((T, N, Lkv + R), dtype=np.float32))               # [T, N, Lkv + R]
        k, v = xp.empty((T, N, P + R), np.float32), xp.empty((T, N, Vd), np.float32)
        o_abs, outs = xp.empty((T, N, Lkv), np.float32), {g: xp.empty((T, N, Vd), np.float32) for g in GQA}
        c = xp.broadcast_to(latent[:, :Lkv], (N, T, Lkv))                             # [N, T, Lkv], stride 0

        def decompress():
            gemm.bmm(c, w_uk.transpose(0, 2, 1), out=k[:, :, :P].transpose(1, 0, 2))
            k[:, :, P:] = latent[:, None, Lkv:]
            gemm.bmm(c, w_uv, out=v.transpose(1, 0, 2))
        reps = a.reps if T < 2048 else 5
        run = dict(reps=reps if GPU else 1, warmup=3 if GPU else 1)
        ms_abs = graph_median_ms(lambda: mla_attention.mla_attention(q_abs, latent, 0, SCALE, Lkv, out=o_abs), **run)
        ms_dec = graph_median_ms(decompress, **run)
        ms = {g: graph_median_ms(lambda: gqa_attention.gqa_attention(q, k, v, 0, SCALE, out=outs[g], variant=g), **run)
              for g in GQA}
        best = ms[fast]
        flops = 2 * N * T * (T + 1) / 2 * (P + R + Vd)
        if not rows:
            print_reference_errors(f"decompressed prefill T={T} N={N}", outs,
                                   gqa_attention.gqa_attention_ref(H(q), H(k), H(v), 0, SCALE))
        sd = ["-", "-", "-"]
        if torch is not None and GPU:
            tq, tk, tv = (torch.from_dlpack(x).permute(1, 0, 2).contiguous()[None] for x in (q, k, v))

            def sdpa():
                return F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, scale=SCALE)
            sd = []
            for tf32 in (False, True):
                set_tf32(tf32)
                sd.append(torch_graph_median_ms(sdpa, reps))
            set_tf32(False)
            diff = max(float((sdpa()[0].permute(1, 0, 2) - torch.from_dlpack(o)).abs().max()) for o in outs.values())
            sd.append(f"{diff:.1e}")
            del tq, tk, tv
        rows.append([T, f"{ms_abs:.3f}", f"{ms_dec:.3f}"] + [f"{ms[g]:.3f}" for g in GQA] +
                    [f"{ms_dec + best:.3f} ({ms_abs / (ms_dec + best):.2f}x)", f"{flops / best / 1e9:.1f}",
                     f"{100 * flops / FP32_FLOPS * 1e3 / best:.0f} %"] +
                    [f"{x:.3f} ({x / best:.2f}x)" if isinstance(x, float) else x for x in sd[:2]] + [sd[2]])
    table(f"Prefill attention in MLA's decompressed form, one layer ({N} heads, P / R / Vd {P} / {R} / {Vd}, "
          f"causal from 0): the absorbed kernel vs decompression + GQA vs torch SDPA on the same per-head k / v",
          ["tokens", "absorbed v2 ms", "decompress ms"] + [f"GQA {g} ms" for g in GQA] +
          [f"decompress + {fast} ms (vs absorbed)", f"{fast} TFLOP/s", f"{fast} % fp32 roof",
           f"SDPA fp32 ms ({fast} speedup)", f"SDPA TF32 ms ({fast} speedup)", "max diff vs SDPA"], rows)

# ------------------------------------------------------------------------------------------------ drafter block
if "block" in only:
    rows = []
    B, Nq, Nkv, Dh = BLOCK
    for n_keys in block_keys:
        q = xp.asarray(rng.standard_normal((B, Nq, Dh), dtype=np.float32))
        kb, vb = (xp.asarray(rng.standard_normal((n_keys + 64, Nkv, Dh), dtype=np.float32)) for _ in range(2))
        outs = {g: xp.empty((B, Nq, Dh), np.float32) for g in block_attention.VARIANTS}
        ms = {g: graph_median_ms(lambda: block_attention.block_attention(q, kb, vb, n_keys, SCALE, out=outs[g],
                                                                         variant=g), reps=a.reps if GPU else 1,
                                 warmup=3 if GPU else 1) for g in block_attention.VARIANTS}
        want = block_attention.block_attention_ref(H(q), H(kb), H(vb), n_keys, SCALE)
        rows.append([n_keys] + [f"{1e3 * ms[g]:.1f}" for g in block_attention.VARIANTS] +
                    [f"{ms['v1'] / ms['v2']:.2f}x"] + [f"{np.abs(H(outs[g]) - want).max():.1e}"
                                                       for g in block_attention.VARIANTS])
    table(f"The DFlash drafter's block attention ({B} tokens, {Nq} / {Nkv} heads, D {Dh}, not causal): v1 vs v2",
          ["keys"] + [f"{g} (us)" for g in block_attention.VARIANTS] + ["v2 speedup"] +
          [f"{g} max error vs float64" for g in block_attention.VARIANTS], rows)
# ------------------------------------------------------------------------------------------------ gemm phases
if "phases" in only:
    from kdtree_numba.kernels import _checks, mla_gemm_attention as mg  # noqa: E402

    rows = []
    zero = _checks.device_int(0, "start")[1]
    shapes = [(512, 256, 64), (4096, 256, 64), (32768, 256, 64)] if GPU and not a.quick else \
        [(512, 256, 64)] if GPU else [(16, 4, 2)]
    for S, n, N in shapes:
        paths, depth = (xp.asarray(x) for x in tree.ancestor_paths(random_tree(n, rng)))
        cache = xp.asarray(rng.standard_normal((S + n + 1, D), dtype=np.float32))                # [C, D]
        q = xp.asarray(rng.standard_normal((n + 1, N, D), dtype=np.float32))                      # [n+1, N, D]
        M, Kp = (n + 1) * N, mg.padded_keys(S + n + 1)
        r = mg.chunk_rows(M, Kp, None)                                                # rows of one chunk
        k3, q3 = mg._split3(cache, Kp, mg.KEYS), mg._split3(q.reshape(M, D), M, mg.QUERIES)
        W = mg.p_copies(Kp)
        vt = mg._split_vt(cache, LKV, Kp, 0, zero, S + n + 1, W)                      # [Lkv, W Kp]
        pw, o = xp.empty((r, W * Kp), np.float32), xp.empty((M, LKV), np.float32)     # [r, W Kp], [M, Lkv]
        run = dict(reps=a.reps if GPU else 1, warmup=3 if GPU else 1)
        ms = {"split q": graph_median_ms(lambda: mg._split3(q.reshape(M, D), M, mg.QUERIES), **run),
              "split k": graph_median_ms(lambda: mg._split3(cache, Kp, mg.KEYS), **run),
              "split V^T": graph_median_ms(lambda: mg._split_vt(cache, LKV, Kp, 0, zero, S + n + 1, W), **run),
              "S GEMM": graph_median_ms(lambda: mg._gemm_tf32(q3[:r], k3.T, pw[:, :Kp]), **run),
              "softmax": graph_median_ms(lambda: mg._softmax(pw, Kp, 0, N, S, zero, SCALE, True, paths, depth), **run),
              "P V": graph_median_ms(lambda: mg._pv(pw, vt, Kp, o[:r]), **run)}
        whole = graph_median_ms(lambda: tree_verify.tree_attention(q, cache, S, paths, depth, SCALE, LKV,
                                                                   out=o.reshape(n + 1, N, LKV), variant="gemm"), **run)
        v5 = graph_median_ms(lambda: tree_verify.tree_attention(q, cache, S, paths, depth, SCALE, LKV,
                                                                out=o.reshape(n + 1, N, LKV), variant="v5"), **run) \
            if GPU else float("nan")
        chunks = -(-M // r)
        total = ms["split q"] + ms["split k"] + ms["split V^T"] + chunks * (ms["S GEMM"] + ms["softmax"] + ms["P V"])
        rate = {"S GEMM": 2 * r * Kp * 3 * D, "P V": 2 * r * Kp * LKV * 3}             # FLOPs of one chunk's GEMMs
        rows.append([S, n, N, chunks] + [f"{v:.3f}" + (f" ({rate[k] / v / 1e9:.0f} TFLOP/s)" if k in rate else "")
                                         for k, v in ms.items()] +
                    [f"{total:.3f}", f"{whole:.3f} ({whole / total:.2f}x the sum)", f"{v5:.3f} ({v5 / whole:.2f}x)"])
    table("The gemm attention variant's launches, each timed alone (one chunk's for the per-chunk ones), their sum "
          "for a whole call, the whole call, and v5 (speedup of gemm)",
          ["context", "nodes", "heads", "row chunks"] + [f"{k} ms" for k in ms] +
          ["sum ms", "whole call ms", "v5 ms (gemm speedup)"], rows)
save("bench_verify")
