"""Tree-verify attention (absorbed MLA over the latent cache, ancestor-only) against PyTorch's
scaled_dot_product_attention in fp32 with an explicit mask on the same shapes, plus % of the fp32 roofline.

Per shape: context S committed rows, n tree nodes (+ root), N heads, cache rows of 512 + 64 floats.
    FLOPs  = 2 * (n+1) * N * (S + depth + 1) * (576 + 512)      (scores + weighted values; ~ S for long contexts)
    bytes  = 4 * ((S + n + 1) * 576 + (n+1) * N * (576 + 512))   (cache once, queries in, outputs out)
    roofline time = max(FLOPs / 51 TFLOP/s, bytes / 4.25 TB/s)   (the H200 ceilings measured here)
SDPA baseline: q [1, N, n+1, 576], k [1, N, S+n+1, 576] and v [1, N, S+n+1, 512] (the latent copied to every head),
float mask [n+1, S+n+1] with -inf outside committed rows + ancestors. Both outputs are compared with a float64
reference on one shape; the table reports each one's max error.

    PYTHONPATH=$PWD python3 benchmarks/bench_verify.py
"""
import numpy as np

from _common import args, kd, median_ms, save, table, torch_median_ms

a = args(__doc__)
xp = kd.backend.xp
from kdtree_numba.kernels import tree, tree_verify  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

D, LKV = 576, 512
FLOP_CEIL, BW_CEIL = 51e12, 4.25e12
contexts = [512, 4096, 32768] if not a.quick else [16, 40]
nodes = [16, 64, 256] if not a.quick else [4, 9]
heads = [16, 64] if not a.quick else [2]


def random_tree(n, rng):
    parents = np.concatenate([[-1], [rng.integers(max(0, j - 8), j) for j in range(1, n + 1)]])
    return parents


rows = []
rng = np.random.default_rng(0)
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
            out = xp.empty((n + 1, N, LKV), np.float32)
            reps = a.reps if S * n * N < 2 ** 26 else 5
            ms = median_ms(lambda: tree_verify.tree_attention(q, cache, S, paths_d, depth_d, 0.13, LKV,
                                                              max_depth=paths.shape[1] - 1, out=out), reps)
            flops = 2 * (n + 1) * N * (S + depth.mean() + 1) * (D + LKV)
            nbytes = 4 * ((S + n + 1) * D + (n + 1) * N * (D + LKV))
            roof = max(flops / FLOP_CEIL, nbytes / BW_CEIL) * 1e3
            ratio = ""
            if torch is not None and kd.backend.name == "cuda":
                tq = torch.from_dlpack(q).permute(1, 0, 2)[None]                       # [1, N, n+1, D]
                tc = torch.from_dlpack(cache)
                tk = tc[None, None].expand(1, N, S + n + 1, D).contiguous()
                tv = tc[None, None, :, :LKV].expand(1, N, S + n + 1, LKV).contiguous()
                mask = torch.where(torch.from_numpy(visible).cuda(), 0.0, float("-inf")).float()
                try:
                    ms_t = torch_median_ms(
                        lambda: F.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask, scale=0.13), reps)
                    check = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask, scale=0.13)[0].permute(1, 0, 2)
                    diff = float((check - torch.from_dlpack(out)).abs().max())
                    ratio = f"{ms_t:.3f} ms ({ms_t / ms:.2f}x; max |ours - SDPA| {diff:.1e})"
                    if S == contexts[0] and n == nodes[0] and N == heads[0]:
                        want = tree_verify.tree_attention_ref(kd.backend.to_host(q), kd.backend.to_host(cache), S,
                                                              parents, 0.13, LKV)
                        print(f"float64 reference, S={S} n={n} N={N}: max error ours "
                              f"{np.abs(kd.backend.to_host(out) - want).max():.1e}, SDPA "
                              f"{np.abs(check.cpu().numpy() - want).max():.1e}", flush=True)
                    del tk, tv
                except torch.OutOfMemoryError:
                    ratio = "SDPA out of memory"
                    torch.cuda.empty_cache()
            rows.append([S, n, N, f"{ms:.3f}", f"{roof:.3f}", f"{100 * roof / ms:.0f} %", ratio])
table("Tree-verify attention (fp32): kdtree_numba kernel vs torch SDPA with an explicit mask",
      ["context", "nodes", "heads", "kernel (ms)", "roofline (ms)", "% of roofline", "SDPA (speedup of ours)"], rows)
save("bench_verify")
