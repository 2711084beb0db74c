"""Tutorial 01: RMSNorm - y = x / sqrt(mean(x**2) + eps) * w, one block per token row.

Run:  KDTREE_BACKEND=sim python tutorials/01_rmsnorm.py [--size small|large] [--out DIR]
"""
# %% [markdown]
# # 01 - RMSNorm
#
# Every DeepSeek-V3 / Kimi decoder layer normalises its input twice (before attention, before the MLP/MoE), MLA
# normalises its two low-rank projections (`q_a_layernorm`, `kv_a_layernorm`), and the model normalises the last
# hidden state before the LM head. All of them are RMSNorm:
#
#     y[t, :] = x[t, :] / sqrt(mean_j(x[t, j]^2) + eps) * w          (the mean of squares in float32, as HF does)
#
# Unlike LayerNorm there is no mean subtraction and no bias: it only rescales each token's vector to unit root
# mean square, then applies a learned per-channel gain `w`. Two consequences we check below:
# the output's RMS is 1 when w = 1, and the output does not change when the input is scaled
# (`rmsnorm(c * x) == rmsnorm(x)` for c > 0, up to eps).

# %%
import numpy as np

from _common import (banner, check, check_true, draw_owners, finish, host, parse_args, rng, save_figure, section,
                     show_kernel, stopwatch, table)

import kdtree_numba as kd
from kdtree_numba.kernels import rmsnorm

args = parse_args(__doc__)
banner("Tutorial 01 - RMSNorm", args)
R = rng(args, 1)
T, H = (4096, 7168) if args.size == "large" else (5, 37)     # irregular on purpose: 37 is not a multiple of 16
EPS = 1e-6

# %% [markdown]
# ## The reference
#
# Three lines of NumPy are the whole spec; the package's `rmsnorm_ref` is exactly that:

# %%
section("reference")
x = R.standard_normal((T, H)).astype(np.float32) * R.uniform(0.1, 10, (T, 1)).astype(np.float32)  # rows of any scale
w = R.uniform(0.5, 1.5, H).astype(np.float32)

ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)   # [T, 1]   mean square per row
plain = x / np.sqrt(ms + np.float32(EPS)) * w                    # [T, H]
ref = rmsnorm.rmsnorm_ref(x, w, EPS)
check("plain NumPy == rmsnorm_ref", plain, ref, atol=0, rtol=0)
check("docstring example [[3, 4]] -> [[0.8485, 1.1314]]",
      rmsnorm.rmsnorm_ref(np.array([[3, 4]], np.float32), np.ones(2, np.float32), 0.0),
      np.array([[0.8485281, 1.1313709]], np.float32), atol=1e-6, rtol=0)

# %% [markdown]
# ## The kernel: `kernels/rmsnorm.py::_rmsnorm_kernel`
#
# Thread mapping: **one block per token row** (grid = T blocks), `threads` per block (256 on a GPU, 16 on the
# simulator: `backend.block_size(256, 16)`). The row is needed twice - once for the sum of squares, once to scale
# it - so the block keeps a copy of it in shared memory and reads it from DRAM only once:
#
# 1. thread `tid` walks the columns `tid, tid + threads, tid + 2*threads, ...` of its row, sums their squares
#    **and stores each value in the shared row buffer** `row_buf` (`STAGE` = 8192 floats = 32 KB, enough for
#    Kimi/DeepSeek's H = 7168; columns past it are simply read again from global memory in step 3). Four columns
#    per loop step: four independent loads in flight per thread keep the memory system busy - one at a time left
#    the kernel latency-bound on the H200;
# 2. the block combines the per-thread sums with a shared-memory tree reduction (the pattern of tutorial 00):
#    `partial[tid] += partial[tid + stride]` for stride = threads/2 .. 1, a `syncthreads()` after each step (the
#    first barrier also makes the whole staged row visible to every thread);
# 3. every thread reads `partial[0]`, computes `inv = 1 / sqrt(sum / H + eps)` and writes its columns from the
#    shared copy: `out[row, c] = row_buf[c] * inv * w[c]` (`x[row, c]` for columns past `STAGE`). Measured on the
#    H200: 65 % of copy bandwidth when step 3 re-read the row (from L2), 70 % with the shared copy.
#
# The launcher `rmsnorm(x, w, eps, out=None)` checks shapes/dtypes (ValueError naming the argument), then runs the
# reference on the numpy backend or launches `_rmsnorm_kernel[T, threads](x, w, out, eps)`.

# %% [markdown]
# The kernel itself, printed from the package (so the page cannot drift from the code), and which thread of which
# block touches which element, drawn at a tiny shape: 3 rows of 37 columns with the simulator's 16 threads. Block
# r owns row r; thread tid owns columns tid, tid + 16, tid + 32 - so a warp's 32 threads read 32 consecutive
# floats (one coalesced load) on a GPU.

# %%
section("the kernel on the page")
show_kernel(rmsnorm._rmsnorm_kernel)
TH = 16                                                  # threads per block on the simulator (256 on a GPU)
owner = np.tile(np.arange(37) % TH, (3, 1))              # [3, 37] thread id that loads (r, c)
check_true("the text's constants match the code (STAGE = 8192 floats; 16 threads on the simulator)",
           rmsnorm.STAGE == 8192 and kd.backend.block_size(256, 16) == (16 if kd.backend.name != "cuda" else 256))
save_figure(draw_owners(owner, "RMSNorm: block r = row r; the number = the thread that loads the element (16 "
                        "threads)", "column c", "block (row)", [f"block {r}" for r in range(3)]),
            args, "01_rmsnorm_threads.png")

# %%
section("kernel vs reference")
out = kd.backend.full((T, H), np.nan, np.float32)       # poisoned output: anything unwritten stays NaN
with stopwatch() as t:
    rmsnorm.rmsnorm(x, w, EPS, out=out)
threads = kd.backend.block_size(256, 16)
print(f"_rmsnorm_kernel[grid={T}, block={threads}] on x {x.shape}: {t.ms:.1f} ms")
got = host(out)
check("rmsnorm kernel vs rmsnorm_ref", got, ref, atol=1e-5, rtol=1e-5)
check_true("the shared row buffer holds a whole Kimi/DeepSeek row (H = 7168)", rmsnorm.STAGE >= 7168,
           f"STAGE = {rmsnorm.STAGE} floats = {rmsnorm.STAGE * 4 // 1024} KB of shared memory per block")
if args.size == "small":                  # a row longer than the shared buffer: the columns past STAGE path
    wide = R.standard_normal((2, rmsnorm.STAGE + 37)).astype(np.float32)
    w_wide = R.uniform(0.5, 1.5, wide.shape[1]).astype(np.float32)
    out_w = kd.backend.full(wide.shape, np.nan, np.float32)
    rmsnorm.rmsnorm(wide, w_wide, EPS, out=out_w)
    check(f"rows longer than STAGE ({wide.shape[1]} columns: 37 past the shared copy)", out_w,
          rmsnorm.rmsnorm_ref(wide, w_wide, EPS), atol=1e-5, rtol=1e-5)

# %% [markdown]
# ## Properties
#
# * With w = 1 the output rows have RMS `sqrt(ms / (ms + eps))` = 1 up to eps (ms = the row's mean square; for a
#   row with ms = 0.01 and eps = 1e-6 that is 1 - 5e-5: eps matters for small rows).
# * Scale invariance: `rmsnorm(c * x) == rmsnorm(x)` for any c > 0 - the norm divides c out again (exactly so
#   with eps = 0; eps breaks it only for rows whose mean square is comparable to eps). This is why the residual
#   stream's magnitude can grow through the layers without the attention inputs growing with it.

# %%
section("properties")
ones = np.ones(H, np.float32)
y1 = host(rmsnorm.rmsnorm(x, ones, EPS))
rms_out = np.sqrt(np.mean(y1.astype(np.float64) ** 2, axis=1))
ms64 = np.mean(x.astype(np.float64) ** 2, axis=1)
check("RMS of each output row == sqrt(ms / (ms + eps)) (w = 1)", rms_out, np.sqrt(ms64 / (ms64 + EPS)),
      atol=1e-5, rtol=0)
c = np.float32(3.7)
y0 = host(rmsnorm.rmsnorm(x, w, 0.0))
y_scaled = host(rmsnorm.rmsnorm(np.ascontiguousarray(c * x), w, 0.0))
check("scale invariance: rmsnorm(3.7 x) == rmsnorm(x) (eps = 0)", y_scaled, y0, atol=1e-5, rtol=1e-5)

if args.size == "small":
    rms_in = np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1))
    table([(r, f"{rms_in[r]:.4f}", f"{rms_out[r]:.6f}", f"{np.abs(got[r] - ref[r]).max():.2e}") for r in range(T)],
          ("row", "RMS(x)", "RMS(y), w=1", "max|kernel-ref|"))

# %% [markdown]
# ## A picture: one row before and after

# %%
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(1, 2, figsize=(9, 3))
r = int(np.argmax(np.abs(x).max(axis=1)))
cols = min(H, 64)
ax[0].bar(np.arange(cols), x[r, :cols], color="tab:gray")
ax[0].set_title(f"x[{r}, :{cols}]  (RMS {np.sqrt(np.mean(x[r] ** 2)):.2f})")
ax[1].bar(np.arange(cols), got[r, :cols], color="tab:blue", label="kernel")
ax[1].plot(np.arange(cols), ref[r, :cols], "k.", label="reference")
ax[1].set_title("rmsnorm(x)[r] (RMS ~ 1, times w)")
ax[1].legend(fontsize=8)
save_figure(fig, args, "01_rmsnorm.png")

# %%
finish()
