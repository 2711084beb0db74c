"""Tutorial 12: why verifying 65 tokens costs about one decode step - bytes vs flops, the ridge point, measured.

Run:  KDTREE_BACKEND=numpy python tutorials/12_why_verify_is_cheap.py [--size small|large] [--out DIR]
      (on the simulator the GEMMs are NumPy too, and the trained pair runs on the NumPy references)
"""
# %% [markdown]
# # 12 - Why verifying 65 tokens costs about one decode step
#
# A decode step runs every weight matrix of the target over **one** token. A DDTree verify runs the same matrices
# over the root + 64 tree nodes = **65** tokens (tutorial 09). Why is that not 65x the cost?
#
# Because a decode step is **memory-bound**: each weight byte is read from DRAM once per forward, whatever the
# number of tokens, while the arithmetic grows with the tokens. For a GEMM `y[T, N] = x[T, K] @ W[K, N]` in fp32:
#
#     bytes ~ 4 (K N + T K + T N)        (the weight, the input, the output)
#     flops = 2 T K N
#     intensity = flops / bytes ~ 2 T K N / (4 K N) = T / 2   flop/byte   (for T << K, N)
#
# A machine does `F` flop/s and moves `B` bytes/s; the call takes about `max(bytes / B, flops / F)`. Below the
# **ridge point** `F / B` flop/byte the memory term wins and extra tokens ride along for free; only once
# `T / 2 > F / B` does the arithmetic start to cost. On the H200 (docs/PERFORMANCE.md: copy ~4.2 TB/s, fp32 cuBLAS
# ~51 TFLOP/s) the fp32 ridge is ~12 flop/byte, i.e. T ~ 24 tokens; tensor cores move it far higher (bf16: the
# weight is 2 bytes and the intensity is ~T, against ~990 TFLOP/s dense on the vendor's sheet: T ~ 235).
#
# This tutorial (1) does that arithmetic for the shipped target's GEMMs and a Kimi-K2-shaped layer, (2) measures a
# weight-sized GEMM for T = 1 .. 257 on this machine, (3) times a real 65-token tree verify against a decode step of
# the shipped pair, (4) shows what is left when neither bytes nor flops count - latency - and the reduce-scatter
# of the kernel that takes the verify's small GEMMs off cuBLAS, and says honestly what a CPU shows and what the
# GPU shows.

# %%
import time

import numpy as np

from _common import (banner, check_true, finish, heldout_prompts, load_pair, parse_args, rng, save_figure, section,
                     table)

import kdtree_numba as kd
from kdtree_numba.config import TargetConfig
from kdtree_numba.kernels import gemm, logprobs
from kdtree_numba.model.target import TreeInput

args = parse_args(__doc__)
banner("Tutorial 12 - why verifying 65 tokens costs about one decode step", args)
Rng = rng(args, 12)
LARGE = args.size == "large"
PROC = kd.backend.process_name
COPY_BW, FP32_FLOPS = 4.2e12, 51e12          # H200 ceilings measured in docs/PERFORMANCE.md (bytes/s, flop/s)
BF16_FLOPS = 989e12                          # H200 dense bf16 tensor-core peak, vendor sheet (not measured here)
TS = (1, 16, 65, 257)

# %% [markdown]
# ## 1. The arithmetic: bytes and flops of one forward
#
# The list of a forward's GEMMs, from a `TargetConfig` (the same shapes `model/target.py` multiplies): per layer
# the MLA projections (`q_a`, `q_b` or `q`, `kv_a`, the absorbed `w_uk` / `w_uv` batched products, `o`), then a
# dense SwiGLU MLP or the MoE (router `gate`, the routed experts, the shared expert); `lm_head` at the end.
#
# **MoE caveat.** A routed expert's weights are read only if some token picks it. One token reads its `k` experts;
# T tokens routed independently and uniformly read on average `E (1 - (1 - k/E)^T)` of the `E` experts. The
# shipped target (8 experts, top-2) reads all 8 from T ~ 16 on. Kimi K2 (384, top-8) reads ~286 at T = 65: there
# the expert bytes grow with T, and the verify is *not* one step's worth of memory traffic (docs/PERFORMANCE.md's
# grouped expert GEMM: 0.94 ms at T = 1, 25.8 ms at T = 64). Tree tokens share their context and route alike more
# often than uniform, so the uniform count is a pessimistic bound; the dense parts (attention, dense layers, shared
# expert, lm_head) are read once either way.

# %%
section("bytes moved and flops per forward (fp32), and the H200 roofline time")


def gemms(cfg: TargetConfig, layers, lm_head: bool = True):
    """[(name, K, N, copies, routed)] of one forward over ``layers`` (indices; < first_k_dense_replace: dense)."""
    H, N = cfg.hidden_size, cfg.num_attention_heads
    P, R, Vd, Lkv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    out = []
    for i in layers:
        if cfg.q_lora_rank is None:
            out.append(("q", H, N * (P + R), 1, False))
        else:
            out += [("q_a", H, cfg.q_lora_rank, 1, False), ("q_b", cfg.q_lora_rank, N * (P + R), 1, False)]
        out += [("kv_a", H, Lkv + R, 1, False), ("w_uk", P, Lkv, N, False), ("w_uv", Lkv, Vd, N, False),
                ("o", N * Vd, H, 1, False)]
        if i < cfg.first_k_dense_replace:
            out += [("gu", H, 2 * cfg.intermediate_size, 1, False), ("down", cfg.intermediate_size, H, 1, False)]
        else:
            Im, E = cfg.moe_intermediate_size, cfg.n_routed_experts
            out += [("gate", H, E, 1, False), ("experts_gu", H, 2 * Im, E, True), ("experts_down", Im, H, E, True)]
            if cfg.n_shared_experts:
                Is = Im * cfg.n_shared_experts
                out += [("shared_gu", H, 2 * Is, 1, False), ("shared_down", Is, H, 1, False)]
    if lm_head:
        out.append(("lm_head", H, cfg.vocab_size, 1, False))
    return out


def cost(cfg: TargetConfig, gl, T: int):
    """(weight bytes, activation bytes, flops, experts read per MoE layer) of ``gl`` over T tokens, fp32."""
    E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    used = E * (1 - (1 - k / E) ** T)                     # expected distinct experts, uniform independent routing
    wb = ab = fl = 0.0
    for _, K, N, copies, routed in gl:
        rows = T * k if routed else T * copies           # routed: T*k (token, expert) rows over all experts
        wb += 4 * K * N * (used if routed else copies)
        ab += 4 * rows * (K + N)
        fl += 2 * rows * K * N
    return wb, ab, fl, used


def roofline_us(nbytes, flops, flop_s=FP32_FLOPS):
    return 1e6 * max(nbytes / COPY_BW, flops / flop_s)


target, drafter = load_pair()
cfg = target.config
default_gl = gemms(cfg, range(cfg.num_hidden_layers))
names = {"q", "q_a", "q_b", "kv_a", "w_uk", "w_uv_t", "o", "gu", "down", "gate", "experts_gu", "experts_down",
         "shared_gu", "shared_down"}
real_bytes = sum(int(v.nbytes) for L in target.layers for key, v in L.items() if key in names)
real_bytes += int(target.w["lm_head"].nbytes)
listed = sum(4 * K * N * copies for _, K, N, copies, _ in default_gl)
check_true("GEMM list from the config == the target's weight matrices", listed == real_bytes,
           f"{listed / 1e6:.2f} MB listed, {real_bytes / 1e6:.2f} MB in target.layers + lm_head")

kimi = TargetConfig(vocab_size=163840, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                    num_hidden_layers=61, num_attention_heads=64, num_key_value_heads=64, n_shared_experts=1,
                    n_routed_experts=384, num_experts_per_tok=8, kv_lora_rank=512, q_lora_rank=1536,
                    qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=1, topk_group=1,
                    first_k_dense_replace=1)
models = [(f"shipped target ({cfg.num_hidden_layers} layers + lm_head)", cfg, default_gl),
          ("Kimi-K2 dense layer (layer 0)", kimi, gemms(kimi, [0], lm_head=False)),
          ("Kimi-K2 MoE layer", kimi, gemms(kimi, [1], lm_head=False))]
rows, curves = [], {}
for name, c, gl in models:
    moe = any(routed for *_, routed in gl)
    base32 = base16 = None
    for T in TS:
        wb, ab, fl, used = cost(c, gl, T)
        us32, us16 = roofline_us(wb + ab, fl), roofline_us((wb + ab) / 2, fl, BF16_FLOPS)   # bf16: half the bytes
        base32, base16 = base32 or us32, base16 or us16
        rows.append((name if T == TS[0] else "", T, f"{used:.0f}/{c.n_routed_experts}" if moe else "-",
                     f"{wb / 1e6:,.1f}", f"{ab / 1e6:,.2f}", f"{fl / 1e9:,.3f}", f"{fl / (wb + ab):.1f}",
                     f"{us32:,.1f}", f"{us32 / base32:.2f}x", f"{us16:,.1f}", f"{us16 / base16:.2f}x"))
    for prec, flop_s, div in (("fp32", FP32_FLOPS, 1), ("bf16", BF16_FLOPS, 2)):
        cs = [cost(c, gl, T) for T in range(1, 258)]
        curves[(name, prec)] = [roofline_us((wb + ab) / div, fl, flop_s) for wb, ab, fl, _ in cs]
table(rows, ("model", "T", "experts read", "weights MB", "activations MB", "GFLOP", "flop/byte",
             "H200 fp32 us", "vs T=1", "bf16 us", "vs T=1"))
ridge = FP32_FLOPS / COPY_BW
print(f"\nH200 fp32 ridge point: {FP32_FLOPS / 1e12:.0f} TFLOP/s / {COPY_BW / 1e12:.1f} TB/s = {ridge:.1f} flop/byte "
      f"-> T ~ {2 * ridge:.0f} tokens (intensity ~ T/2);")
print(f"bf16 tensor cores (vendor {BF16_FLOPS / 1e12:.0f} TFLOP/s dense, 2-byte weights, intensity ~ T): "
      f"T ~ {BF16_FLOPS / COPY_BW:.0f} tokens.")
print("'H200 fp32 us' = max(bytes / 4.2 TB/s, flops / 51 TFLOP/s); 'bf16 us' = max(bytes / 2 / 4.2 TB/s, flops / "
      "989 TFLOP/s).\nBoth are lower bounds: the shipped 9 M-parameter target is latency-bound on the GPU (~12 ms "
      "a step of host\nlaunches, 0.41 ms graph-replayed; docs/PERFORMANCE.md), far above them. flop/byte is the fp32 "
      "intensity.")

K = N = 4096
for T in (1, 16):
    exact = 2 * T * K * N / (4 * (K * N + T * K + T * N))
    check_true(f"intensity of x[{T}, 4096] @ W[4096, 4096] ~ T/2", abs(exact - T / 2) / (T / 2) < 0.01,
               f"{exact:.3f} flop/byte vs T/2 = {T / 2:g}")
dense_gl = gemms(kimi, [0], lm_head=False)
(w1, a1, f1, _), (w65, a65, f65, _) = cost(kimi, dense_gl, 1), cost(kimi, dense_gl, 65)
r32 = roofline_us(w65 + a65, f65) / roofline_us(w1 + a1, f1)
r16 = roofline_us((w65 + a65) / 2, f65, BF16_FLOPS) / roofline_us((w1 + a1) / 2, f1, BF16_FLOPS)
check_true("Kimi dense layer, bf16: 65 tokens cost < 1.2x one token", r16 < 1.2,
           f"{r16:.2f}x on the bf16 roofline ({r32:.2f}x in fp32: T = 65 is past the fp32 ridge)")

# %% [markdown]
# ## 2. Measured: one weight-sized GEMM for T = 1 .. 257
#
# `gemm.linear(x, W)` (`x @ W.T`, the call every projection of the target makes; NumPy/OpenBLAS on the CPU and the
# simulator, cuBLAS on a GPU) with W 4096 x 4096 fp32 = 64 MiB, larger than the CPU's caches, so every call streams
# the weight from DRAM. The fastest of several calls per T (`time.perf_counter`, after `kd.backend.synchronize()`
# on a GPU): the call's own cost, which other work on the machine only adds to. On a CPU note two things: T = 1
# goes to BLAS's matrix-*vector* kernel, which reads W once; from T = 2 on the matrix-matrix kernel first copies
# (packs) W into its own layout, so it starts higher - and then grows far slower than T until the arithmetic takes
# over (T = 16 cost 1.3-3.1x T = 2 on the machines the tests ran on, by how well BLAS's small-M kernel does on one
# thread). One CPU core moves ~12-16 GB/s but does only ~30-70 GFLOP/s in fp32, so its ridge sits at a few
# flop/byte (T ~ 3-11, printed below) and T = 65 is already compute-bound there: expect 65 tokens to cost ~10-30x
# one token on this machine, against ~1-3x on the H200.

# %%
section(f"measured: gemm.linear(x[T, K], W[N, K]) on {PROC}")
KW = 8192 if (LARGE and PROC == "cuda") else 4096
REPS = 20 if PROC == "cuda" else 7
W = Rng.standard_normal((KW, KW), dtype=np.float32)
W = kd.backend.asarray(W) if PROC == "cuda" else W
T_SWEEP = (1, 2, 4, 8, 16, 32, 65, 128, 257)


def best_ms(fn, reps):
    fn()                                                  # warm-up (first touch, BLAS threads, cuBLAS handles)
    ts = []
    for _ in range(reps):
        kd.backend.synchronize()
        t0 = time.perf_counter()
        fn()
        kd.backend.synchronize()
        ts.append(time.perf_counter() - t0)
    return 1e3 * min(ts)


ms = {}
for T in T_SWEEP:
    x = Rng.standard_normal((T, KW), dtype=np.float32)
    x = kd.backend.asarray(x) if PROC == "cuda" else x
    out = kd.backend.empty((T, KW), np.float32)
    ms[T] = best_ms(lambda: gemm.linear(x, W, out=out), REPS)
rows = []
for T in T_SWEEP:
    nbytes, flops = 4 * (KW * KW + 2 * T * KW), 2 * T * KW * KW
    rows.append((T, f"{ms[T]:.3f}", f"{ms[T] / T:.4f}", f"{ms[T] / ms[1]:.2f}x",
                 f"{nbytes / ms[T] / 1e6:.1f}", f"{flops / ms[T] / 1e6:.1f}"))
table(rows, ("T", "ms / call", "ms / token", "vs T=1", "GB/s", "GFLOP/s"))
bw, fl = 4 * KW * KW / ms[1] / 1e6, 2 * 257 * KW * KW / ms[257] / 1e6
print(f"this machine: ~{bw:.1f} GB/s at T = 1, ~{fl:.1f} GFLOP/s at T = 257 -> ridge ~{fl / bw:.1f} flop/byte, "
      f"T ~ {2 * fl / bw:.0f} (H200 fp32: T ~ {2 * ridge:.0f})")
check_true("time(T=65) / time(T=1) well below 65", ms[65] / ms[1] < 32,
           f"{ms[65] / ms[1]:.2f}x for 65x the tokens (bound 32: a token at least 2x cheaper than alone)")
check_true("8x the tokens (T 2 -> 16) cost < 4x the time", ms[16] / ms[2] < 4,
           f"{ms[16] / ms[2]:.2f}x (a token at T = 16 under half one at T = 2)")

import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(1, 3, figsize=(15, 3.8))
Tv = np.array(T_SWEEP)
ax[0].plot(Tv, [ms[T] for T in T_SWEEP], "o-")
ax[0].set_title(f"time per call, W {KW} x {KW} fp32 ({PROC})")
ax[1].plot(Tv, [ms[T] / T for T in T_SWEEP], "o-", color="tab:green")
ax[1].set_yscale("log")
ax[1].set_title("time per token")
for a in ax[:2]:
    a.set_xscale("log", base=2)
    a.set_xlabel("tokens T")
    a.set_ylabel("ms")
    a.axvline(65, color="gray", ls=":", lw=1)
for (name, prec), c in curves.items():
    color = f"C{[m[0] for m in models].index(name)}"
    ax[2].plot(range(1, 258), np.array(c) / c[0], color=color, ls="-" if prec == "fp32" else "--",
               label=f"{name}, {prec}")
ax[2].axvline(65, color="gray", ls=":", lw=1)
ax[2].axvline(2 * ridge, color="k", ls=":", lw=1, label=f"fp32 ridge T ~ {2 * ridge:.0f}")
ax[2].set_xscale("log", base=2)
ax[2].set_yscale("log")
ax[2].set_xlabel("tokens T")
ax[2].set_ylabel("x the T = 1 time")
ax[2].set_title("H200 roofline (fp32 solid, bf16 dashed)")
ax[2].legend(fontsize=7, loc="upper left")
save_figure(fig, args, "12_gemm_vs_tokens.png")

# %% [markdown]
# ## 3. DDTree with the shipped pair: one 65-token verify vs one decode step
#
# A real round on a held-out prompt: prefill, the DFlash draft, a best-first tree of budget 64 (tutorials 07, 08),
# then `target.forward` over `[root] + 64 nodes` with the tree mask (tutorial 09), against `target.forward` over one
# token with the cache (a plain decode step). Then whole generations: `kd.generate` autoregressive (ms per step)
# and DDTree (the verify stage per round, from `res.stage_totals()`), and tokens/s.

# %%
section(f"the shipped pair on {target.backend}: verify of 65 tokens vs a decode step")
tok = target.tokenizer
task = heldout_prompts()[4]
prompt = np.asarray(tok.encode(task["prompt"]), np.int32)
start, BUDGET, L = len(prompt), 64, drafter.depth
root = int(np.argmax(target.logits(prompt)[-1]))
lp, ids = logprobs.topk_logprobs_ref(drafter.draft_logits(prompt, root), BUDGET)
tree = kd.build_tree(lp, ids, BUDGET)
paths, pdepth = tree.paths(L)
cache = target.new_cache(start + tree.n + 1)
target.forward(prompt, cache, 0)                                       # prefill: rows 0 .. start-1
verify_ids = np.concatenate([[root], tree.tokens]).astype(np.int32)
tin = TreeInput(positions=(start + pdepth).astype(np.int32), paths=paths, depths=pdepth, max_depth=L)
one = np.array([root], np.int32)
with kd.backend.use(target.backend):
    step_ms = best_ms(lambda: target.forward(one, cache, start), 7)
    verify_ms = best_ms(lambda: target.forward(verify_ids, cache, start, tree=tin), 7)
print(f"{task['task_id']}: prompt {start} tokens, tree of {tree.n} nodes (depth <= {int(pdepth.max())})")
table([("decode step", 1, f"{step_ms:.2f}", f"{step_ms:.3f}"),
       ("tree verify", tree.n + 1, f"{verify_ms:.2f}", f"{verify_ms / (tree.n + 1):.3f}")],
      ("forward", "tokens", "ms", "ms / token"))
check_true(f"verify of {tree.n + 1} tokens costs well under {tree.n + 1} steps", verify_ms / step_ms < 16,
           f"{verify_ms / step_ms:.2f}x a decode step (bound 16)")

N_NEW = 64 if LARGE else 48
ar = kd.generate(target, prompt, N_NEW)
dd = kd.generate(target, prompt, N_NEW, drafter=drafter, budget=BUDGET)
R = len(dd.rounds)
per_round = {s: t / R for s, t in dd.stage_totals().items()}
ar_step = 1e3 * ar.seconds / len(ar.tokens)
print(f"\nkd.generate, {N_NEW} new tokens: autoregressive {ar_step:.2f} ms per step; DDTree {R} rounds, "
      f"tau {dd.acceptance_length:.2f}, ms per round: " + " / ".join(f"{s} {t:.2f}" for s, t in per_round.items()))
table([("autoregressive", len(ar.tokens), ar.target_forwards, f"{ar_step:.2f} per step", "",
        f"{ar.tokens_per_second:.1f}"),
       (f"DDTree, budget {BUDGET}", len(dd.tokens), dd.target_forwards, f"{per_round['verify']:.2f} verify per round",
        f"{dd.acceptance_length:.2f}", f"{dd.tokens_per_second:.1f}")],
      ("method", "tokens", "target forwards", "target ms", "tau", "tokens/s"))
check_true("greedy DDTree tokens == autoregressive tokens", list(dd.tokens) == list(ar.tokens),
           f"{len(dd.tokens)} tokens")
print(f"\nverify per round / AR step = {per_round['verify'] / ar_step:.2f}x; a round commits tau = "
      f"{dd.acceptance_length:.2f} tokens, so the target alone costs {per_round['verify'] / dd.acceptance_length:.2f}"
      f" ms per token vs {ar_step:.2f} ms (draft + build + accept add "
      f"{sum(per_round.values()) - per_round['verify']:.2f} ms per round).")

# %% [markdown]
# ## 4. When latency is all there is: a 65-row product in one launch
#
# On the GPU the shipped target is far below every roofline above: a q_b projection of a 65-token verify,
# `x[65, 128] @ W[128, 384]`, is 6.4 MFLOP and 0.3 MB - nanoseconds of arithmetic and bandwidth. What it costs is
# latency: a launch, a round trip to memory, a reduction. cuBLAS answers such a shape with split-K kernels (the
# K axis cut into slices, a second kernel summing them): 9-12 us on the H200 against ~5 us for one row, so each of
# the verify's ~36 GEMMs costs a few microseconds more than a step's. `kernels/skinny_gemm.py` does it in one
# pass: a warp owns 8 x 4 = 32 outputs, lane l multiplies k = l, l + 32, ... into 32 partial sums - one per output
# - and a **reduce-scatter** turns 32 lanes x 32 partial sums into one finished output per lane in 31 shuffles:
# at offset o = 16, 8, 4, 2, 1 each lane sends its partner (lane ^ o) the half of its 2o sums the partner keeps,
# and adds the half it receives. (Two warps share each patch, each taking half of K, and the second hands its 32
# finished sums to the first through shared memory: at the model's K = 256 a warp's loads then go out in one round
# trip to memory, not two - DDTree-32 +2.7 % tokens/s, docs/PERFORMANCE.md.) Below, the five steps in NumPy (a row
# per lane), then the kernel itself.
# (The verify's wider products - the dense MLP's, the LM head's - have too many outputs for it; there
# `kernels/_cublas.py` cuts a 33- or 65-row product into blocks of <= 16 rows in one batched call, since cuBLAS
# runs 16 rows with a GEMV-like kernel rather than split-K. Which of the two is faster depends on the shape in ways
# no rule caught - cuBLAS's batched kernel is 2x slower for some shapes - so on the GPU `kernels/gemm_choice.py`
# times the skinny kernel and cuBLAS over blocks of <= 16, 8 and 1 rows once per shape and keeps the fastest:
# DDTree-32 +2.7 %.)

# %%
section("the reduce-scatter of the skinny GEMM, in NumPy: 32 lanes x 32 partial sums")
from kdtree_numba.kernels import skinny_gemm  # noqa: E402

part = Rng.integers(-9, 10, (32, 32)).astype(np.float64)   # part[lane, value]: lane's share of output value
acc = part.copy()
lanes = np.arange(32)
for o in (16, 8, 4, 2, 1):
    upper = (lanes & o) != 0                                    # this lane keeps values [o, 2o), its partner [0, o)
    keep = np.where(upper[:, None], acc[:, o:2 * o], acc[:, :o])
    send = np.where(upper[:, None], acc[:, :o], acc[:, o:2 * o])
    acc = keep + send[lanes ^ o]                                # what lane ^ o sent: the half this lane keeps
    print(f"offset {o:2d}: each lane holds {acc.shape[1]:2d} partial sums")
check_true("after 5 steps lane l holds the whole sum of value l", np.array_equal(acc[:, 0], part.sum(axis=0)),
           "31 shuffle-adds per lane against 32 x 5 for 32 separate warp sums")

x_small = Rng.standard_normal((9, 37)).astype(np.float32)  # 9 rows: a second row block of 8; K 37: ragged
w_small = Rng.standard_normal((5, 37)).astype(np.float32)  # 5 columns: a second column group of 4
got = kd.backend.to_host(skinny_gemm.skinny_linear(kd.backend.asarray(x_small), kd.backend.asarray(w_small),
                                                   kd.backend.empty((9, 5), np.float32)))   # the kernel (sim, cuda)
check_true(f"skinny_linear on {kd.backend.name} == x @ w.T (9 x 37 x 5)",
           np.allclose(got, x_small @ w_small.T, rtol=1e-5, atol=1e-5), "a warp per 8 x 4 outputs")
print(f"on the GPU it is gemm.linear's default for M >= {skinny_gemm.MIN_ROWS}, M x N <= {skinny_gemm.MAX_OUTPUTS}, "
      f"K <= {skinny_gemm.MAX_K}: a 65-token verify's q_a/kv_a, q_b, o_proj, router and shared-expert products "
      f"(docs/PERFORMANCE.md: the verify 10 % shorter), and one candidate of gemm_choice at 16-80 rows.")

# %% [markdown]
# ## What this means, honestly
#
# * **On this CPU** a 65-token verify of the shipped pair costs several decode steps, not one: the model is tiny
#   (9.1 M parameters, 32 MB of fp32 GEMM weights), so a decode step is not purely memory-bound, and one
#   core's ridge point is only a few flop/byte (section 2: T ~ 10 here). With tau ~ 3 the round does not pay:
#   docs/PERFORMANCE.md measures 271.4 tokens/s autoregressive vs 200.4 for DDTree at budget 64 with the shipped
#   drafter (0.74x at tau 6.14; 0.58x with an earlier drafter at tau 5.02, 0.39-0.56x at tau 3.14).
# * **On the H200, host-launched** (`replay=False`) a step of the shipped pair and a round are both bound by
#   numba's host launches (~12 ms a step), so a 65-token verify costs about one step, and DDTree at budget 64
#   (tau 3.14 on the held-out prompts) runs at **146.2 vs 84.6 tokens/s: 1.71x** over plain decoding.
#   **Graph-replayed** (`replay=True`, 14-24x faster) the launches are gone and what is left is each kernel's own
#   latency: a step takes 0.41 ms and a 65-token verify 0.59 ms, 1.4 steps - every one of its GEMMs costs a few
#   microseconds more at 65 rows than at one (cuBLAS answers them with split-K kernels; `kernels/skinny_gemm.py`
#   and the MoE's grouped skinny patches took 17 % off the verify by doing each in one launch), so DDTree-64 ran
#   at 2077 vs 1953 tokens/s (1.07x, tau 3.14, before the grouped patches), and with a drafter trained on 8x the
#   regenerated text (tau 4.75; the prefill replayed too) at 4362 vs 2506 (1.75x; budget 32: 1.84x), and with the
#   drafter E (tau 5.02 at budget 64, 4.69 at 32) at 4884 vs 2523 (1.93x; budget 32: 5035, 2.00x; 1.26x the
#   chain) on HumanEval/0-7, and over all 164 held-out prompts at 5699 (budget 32) vs 2455 tokens/s: 2.32x, 1.22x
#   the chain (docs/PERFORMANCE.md, 2026-12-04, nineteenth and twentieth sessions). With today's shipped drafter
#   (tau 5.62 at budget 32) and a faster plain step: 6723 vs 2849 tokens/s, 2.35x, 1.16x the chain (2026-12-05,
#   twenty-seventh session); with the drafter shipped after it (tau 5.55; 5.79 as counted then) on an H100: 7253 vs
#   2876, 2.52x, 1.21x; with the verify's GEMMs on the kernel timed fastest per shape: 7552 vs 2903, 2.60x, 1.24x
#   (fortieth session); with the draft's and the chain's 16-row GEMMs timed too, which sped the chain up more:
#   7903 vs 2919, 2.71x, 1.21x (forty-fourth session); with one MoE launch fewer a layer: 8040 vs 2968, 2.71x,
#   1.22x (forty-fifth).
#   A tiny model never leaves that regime. For a model large enough to be bandwidth-bound (section 1: a Kimi-K2
#   dense layer) the roofline says the same on bf16 tensor cores: 65 tokens cost ~1.0x one token (~2.7x in fp32
#   on CUDA cores, where T = 65 is past the ridge at T ~ 24; 16 tokens ~1.0x).
#   The caveat is the MoE: a routed expert is read once per *distinct* expert, so at batch 1 a Kimi-K2 MoE layer's
#   verify reads many more expert bytes than a step (uniform routing: ~25x at T = 65; measured grouped GEMM
#   25.8 vs 0.94 ms) - a tree whose tokens route alike, or a batch that touches every expert anyway, pays less.

# %%
finish()
