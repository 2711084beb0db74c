"""Tutorial 03: SwiGLU - y = silu(g) * u on the fused [gate | up] projection, one block per token row.

Run:  KDTREE_BACKEND=sim python tutorials/03_swiglu.py [--size small|large] [--out DIR]
"""
# %% [markdown]
# # 03 - SwiGLU
#
# Every MLP in DeepSeek-V3 / Kimi (the dense MLP of the first layers, each routed expert, the shared expert) is
#
#     MLP(x) = down( silu(gate(x)) * up(x) ),        silu(g) = g * sigmoid(g) = g / (1 + exp(-g))
#
# `gate` and `up` read the same input, so the model concatenates their weights at load time: one GEMM gives
# `gu = x @ [W_gate ; W_up]^T = [g | u]` (`[T, 2I]`), and the SwiGLU stage reads both halves in one pass:
#
#     y[t, j] = silu(gu[t, j]) * gu[t, I + j]          j < I
#
# It is the simplest kind of kernel: element-wise, no communication between threads.

# %%
import numpy as np

from _common import banner, check, finish, host, parse_args, rng, save_figure, section, stopwatch, table

import kdtree_numba as kd
from kdtree_numba.kernels import gemm, swiglu

args = parse_args(__doc__)
banner("Tutorial 03 - SwiGLU", args)
R = rng(args, 3)
T, I, H = (4096, 2048, 7168) if args.size == "large" else (5, 23, 19)     # tokens, intermediate, hidden

# %% [markdown]
# ## The reference

# %%
section("reference")
gu = (2.0 * R.standard_normal((T, 2 * I))).astype(np.float32)         # [T, 2I] = [g | u]
g, u = gu[:, :I], gu[:, I:]
plain = g / (1.0 + np.exp(-g)) * u                                     # [T, I]
ref = swiglu.swiglu_ref(gu)
check("plain NumPy == swiglu_ref", plain, ref, atol=1e-6, rtol=1e-6)
check("docstring example [[0, 1, 2, 3]] -> [[0, 2.1932]]", swiglu.swiglu_ref(np.array([[0, 1, 2, 3]], np.float32)),
      np.array([[0.0, 2.1931758]], np.float32), atol=1e-6, rtol=0)

# %% [markdown]
# ## The kernel: `kernels/swiglu.py::_swiglu_kernel`
#
# Thread mapping: **one block per token row t** (256 threads on a GPU, 16 on the simulator); thread j handles the
# columns `j, j + threads, j + 2*threads, ...`: it reads `gu[t, j]` and `gu[t, I + j]` and writes `y[t, j]`,
# four columns per loop step (eight loads in flight per thread; one thread per element spent its time on 64-bit
# index divisions and waiting for single loads). Consecutive threads read consecutive addresses of each half, so
# on a GPU the loads coalesce.

# %%
section("kernel vs reference")
out = kd.backend.full((T, I), np.nan, np.float32)
with stopwatch() as t:
    swiglu.swiglu(gu, out=out)
print(f"_swiglu_kernel[grid={T}, block={kd.backend.block_size(256, 16)}]: {T * I} outputs in {t.ms:.1f} ms")
got = host(out)
check("swiglu kernel vs swiglu_ref", got, ref, atol=1e-5, rtol=1e-5)

# %% [markdown]
# ## The whole MLP, as the model runs it
#
# `Target._mlp(gu_w, down_w, h) = linear(swiglu(linear(h, gu_w)), down_w)` with `gu_w = [W_gate ; W_up]` and
# `linear(x, W) = x @ W^T` (HF weights are `[out, in]`). Against the textbook form with separate gate and up:

# %%
section("the MLP: down(silu(gate(x)) * up(x))")
x = R.standard_normal((T, H)).astype(np.float32)
W_gate = (R.standard_normal((I, H)) / np.sqrt(H)).astype(np.float32)      # 1/sqrt(fan-in): outputs of order 1
W_up = (R.standard_normal((I, H)) / np.sqrt(H)).astype(np.float32)
W_down = (R.standard_normal((H, I)) / np.sqrt(I)).astype(np.float32)
x64, g64 = x.astype(np.float64), x.astype(np.float64) @ W_gate.T.astype(np.float64)
textbook = (g64 / (1 + np.exp(-g64)) * (x64 @ W_up.T.astype(np.float64))) @ W_down.T.astype(np.float64)
fused = np.concatenate([W_gate, W_up])                                   # [2I, H], done once at load
y = host(gemm.linear(swiglu.swiglu(gemm.linear(x, fused)), W_down))
scale = float(np.abs(textbook).max())                                    # fp32 GEMM error grows with the sums
check(f"fused MLP == textbook MLP (float64), atol 1e-4 x {scale:.2f}", y, textbook, atol=1e-4 * scale, rtol=1e-4)

# %% [markdown]
# ## silu next to relu
#
# silu is smooth, slightly negative for g < 0 (minimum -0.278 at g = -1.278) and ~g for large g. The gate
# multiplies the `up` half element-wise: the "gated linear unit".

# %%
section("silu values")
gs = np.array([-6, -2, -1.278, -0.5, 0, 0.5, 1, 2, 6], np.float32)
table([(f"{v:+.3f}", f"{v / (1 + np.exp(-v)):+.4f}", f"{max(v, 0):+.3f}") for v in gs], ("g", "silu(g)", "relu(g)"))

import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(1, 2, figsize=(9, 3))
gg = np.linspace(-6, 6, 400)
ax[0].plot(gg, gg / (1 + np.exp(-gg)), label="silu(g)")
ax[0].plot(gg, np.maximum(gg, 0), "--", label="relu(g)")
ax[0].axhline(0, color="k", lw=0.5)
ax[0].legend(fontsize=8)
ax[0].set_title("activation")
ax[1].scatter(ref.ravel(), got.ravel(), s=6)
ax[1].set_xlabel("swiglu_ref")
ax[1].set_ylabel("kernel")
ax[1].set_title("kernel vs reference")
save_figure(fig, args, "03_swiglu.png")

# %%
finish()
