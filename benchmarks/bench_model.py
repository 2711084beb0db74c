"""A Kimi-K2-shaped target on the H200: decode ms/step and prefill tokens/s at context 4096, the memory floor, and
the same model (the very same weight memory, shared through DLPack) in HF transformers as the baseline.

Kimi-K2 shape: hidden 7168, 64 heads, q_lora 1536, kv_lora 512, nope/rope/v 128/64/128, vocab 163840, MoE layers
with 384 experts top-8 (1 group) + 1 shared expert of 2048, dense layers of 18432, YaRN factor 32.
fp32 memory decides the depth: one MoE layer's experts alone are 384 x 3 x 7168 x 2048 x 4 B = 67.6 GB, so the
stack is cut to 2 layers (1 dense + 1 MoE, like Kimi's first two) - about 79 GB of weights.
Memory floor of a decode step = bytes it must read (all attention and dense weights, the 8 routed + 1 shared
experts it uses, the router, one embedding row, lm_head, the latent cache) / the copy bandwidth measured now.

Prefill is timed twice on both engines: with every row's logits (a forward) and with the last row's only (what
generate's prefill needs: ``Target.forward(..., logits_to_keep=1)``, transformers' ``logits_to_keep=1``, as its
``generate`` passes) - at Kimi's vocab the lm_head GEMM over 4096 rows is about half of the first.

    PYTHONPATH=$PWD python3 benchmarks/bench_model.py

Where a replayed decode step goes, per kernel (NVIDIA Nsight Compute on the GPU machine; --profile N profiles one
replayed generation of N tokens after the timings above and exits before the transformers part):

    ncu --profile-from-start off --clock-control none --cache-control none --metrics gpu__time_duration.sum \
        --csv --page raw python3 benchmarks/bench_model.py --profile 4 > kimi.csv
    python3 benchmarks/profile_kernels.py --summarize kimi.csv
"""
import sys
import time

import numpy as np

from _common import args, copy_bandwidth_gbs, kd, save, steady_pair, sync, table

a = args(__doc__, lambda p: (p.add_argument("--context", type=int, default=4096),
                             p.add_argument("--profile", type=int, default=0, metavar="N",
                                            help="then profile N replayed decode steps for ncu and exit")))
if a.profile and kd.backend.name != "cuda":
    print("bench_model.py: --profile needs the GPU (KDTREE_BACKEND=cuda) and ncu", file=sys.stderr)
    sys.exit(2)
if a.context < 1 or a.profile < 0:
    print(f"bench_model.py: --context expects a positive integer and --profile a non-negative one, got "
          f"{a.context} and {a.profile}", file=sys.stderr)
    sys.exit(2)
xp = kd.backend.xp
from kdtree_numba.model.target import Target  # noqa: E402

if a.quick:
    shape = dict(vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=16,
                 num_attention_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                 v_head_dim=16)
    context, steps = 64, 3
else:
    shape = dict(vocab_size=163840, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                 n_routed_experts=384, num_attention_heads=64, q_lora_rank=1536, kv_lora_rank=512,
                 qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    context, steps = a.context, 10
cfg = kd.TargetConfig(**shape, num_hidden_layers=2, num_key_value_heads=shape["num_attention_heads"],
                      n_shared_experts=1, routed_scaling_factor=2.827, n_group=1, topk_group=1,
                      num_experts_per_tok=8, first_k_dense_replace=1, max_position_embeddings=131072,
                      rms_norm_eps=1e-6, rope_theta=50000.0,
                      rope_scaling={"factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0,
                                    "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "truncate": True,
                                    "attention_factor": None}).validate()
H, N, P, R, Vd, Lkv, Lq = (cfg.hidden_size, cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                           cfg.v_head_dim, cfg.kv_lora_rank, cfg.q_lora_rank)
E, I, F, V = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.intermediate_size, cfg.vocab_size


def rnd(*s, fan_in=None):
    scale = (fan_in or s[-1]) ** -0.5
    return (xp.random.standard_normal(s, dtype=np.float32) * np.float32(scale)) if kd.backend.name == "cuda" else \
        (np.random.default_rng(len(s)).standard_normal(s).astype(np.float32) * np.float32(scale))


def ones(n):
    return xp.ones(n, np.float32)


t0 = time.perf_counter()
weights = {"embed": rnd(V, H, fan_in=1), "norm": ones(H), "lm_head": rnd(V, H)}
layers = []
for i in range(cfg.num_hidden_layers):
    L = {"in_norm": ones(H), "post_norm": ones(H), "q_a": rnd(Lq, H), "q_a_norm": ones(Lq), "q_b": rnd(N * (P + R), Lq),
         "kv_a": rnd(Lkv + R, H), "kv_a_norm": ones(Lkv), "w_uk": rnd(N, P, Lkv), "w_uv_t": rnd(N, Lkv, Vd, fan_in=Lkv),
         "o": rnd(H, N * Vd)}
    if cfg.is_moe_layer(i):
        L.update(gate=rnd(E, H), bias=rnd(E, fan_in=100), experts_gu=rnd(E, 2 * I, H), experts_down=rnd(E, H, I),
                 shared_gu=rnd(2 * I, H), shared_down=rnd(H, I))
    else:
        L.update(gu=rnd(2 * F, H), down=rnd(H, F))
    layers.append(L)
target = Target(cfg, weights, layers)
sync()
weight_bytes = sum(int(v.nbytes) for v in weights.values() if v is not weights["embed"]) + \
    sum(int(v.nbytes) for L in layers for v in L.values())
print(f"built a random Kimi-K2-shaped stack: {weight_bytes / 1e9:.1f} GB of fp32 weights in "
      f"{time.perf_counter() - t0:.1f} s", flush=True)

rng = np.random.default_rng(0)
prompt = rng.integers(0, V, context).astype(np.int32)
cache = target.new_cache(context + steps + 1)


def prefill(keep=0):
    logits, _ = target.forward(prompt, cache, 0, check_ids=False, logits_to_keep=keep)
    sync()
    return logits


def timed(fn):
    """(seconds of one call after a warm-up call, its result)."""
    fn()
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


prefill1_s, _ = timed(lambda: prefill(1))          # generate's prefill: the last row's logits only
prefill_s, logits = timed(prefill)                 # every row's logits
tok = xp.asarray(np.array([int(kd.backend.to_host(logits[-1]).argmax())], np.int32))
step_ms = []
for s in range(steps):
    t = time.perf_counter()
    logits, _ = target.forward(tok, cache, context + s, check_ids=False)
    tok = xp.argmax(logits[-1:], axis=1).astype(np.int32)
    sync()
    step_ms.append((time.perf_counter() - t) * 1e3)
ours_decode = float(np.median(step_ms[1:] if len(step_ms) > 1 else step_ms))


# steady-state ms per token of graph-replayed greedy decoding: an n- and a 2n-token generation's difference over n
g1, g2 = steady_pair(lambda m: kd.generate(target, prompt, m, replay=True), 3 * steps)
ours_replayed = 1e3 * (g2.seconds - g1.seconds) / (3 * steps)
if a.profile:
    import cupy
    sync()
    cupy.cuda.runtime.profilerStart()
    kd.generate(target, prompt, a.profile, replay=True)
    sync()
    cupy.cuda.runtime.profilerStop()
    print(f"profiled one replayed generation of {a.profile} tokens (decode {ours_replayed:.2f} ms/step replayed)")
    raise SystemExit(0)

# memory floor of one decode step
per_layer_attn = sum(int(layers[0][k].nbytes) for k in ("q_a", "q_b", "kv_a", "w_uk", "w_uv_t", "o"))
dense = int(layers[0]["gu"].nbytes + layers[0]["down"].nbytes)
moe = int(layers[1]["gate"].nbytes + layers[1]["shared_gu"].nbytes + layers[1]["shared_down"].nbytes) + \
    8 * int(layers[1]["experts_gu"][0].nbytes + layers[1]["experts_down"][0].nbytes)
floor_bytes = 2 * per_layer_attn + dense + moe + int(weights["lm_head"].nbytes) + H * 4 + \
    2 * (context + 1) * (Lkv + R) * 4
copy = copy_bandwidth_gbs() if not a.quick else float("nan")
floor_ms = floor_bytes / (copy * 1e9) * 1e3

rows = [["kdtree_numba", f"{ours_decode:.2f}", f"{context / prefill_s:.0f}", f"{context / prefill1_s:.0f}",
         f"{floor_ms:.2f}", f"{100 * floor_ms / ours_decode:.0f} %"],
        ["kdtree_numba, graph-replayed (generate replay=True)", f"{ours_replayed:.2f}", "", "", f"{floor_ms:.2f}",
         f"{100 * floor_ms / ours_replayed:.0f} %"]]

# the same model in transformers, sharing the weight memory
hf_row = ["transformers (eager MoE, sdpa attention)", "", "", "", "", ""]
try:
    import torch
    import transformers
    dev = "cuda" if kd.backend.name == "cuda" else "cpu"        # cpu: --quick smoke run of the mapping
    T_ = lambda x: torch.from_dlpack(x)   # noqa: E731
    sync_t = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    hf_cfg = transformers.DeepseekV3Config(**{k: v for k, v in cfg.to_hf_dict().items() if k not in (
        "architectures", "model_type", "weight_prefix")})
    hf_cfg.rope_interleave = False                    # our rope rows are already in NeoX order
    hf_cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        hf = transformers.DeepseekV3ForCausalLM(hf_cfg)

    def put(module, name, tensor, buffer=False):
        if buffer:
            module._buffers[name] = tensor
        else:
            module._parameters[name] = torch.nn.Parameter(tensor, requires_grad=False)

    put(hf.model.embed_tokens, "weight", T_(weights["embed"]))
    put(hf.model.norm, "weight", T_(weights["norm"]))
    put(hf.lm_head, "weight", T_(weights["lm_head"]))
    for i, (L, layer) in enumerate(zip(layers, hf.model.layers)):
        put(layer.input_layernorm, "weight", T_(L["in_norm"]))
        put(layer.post_attention_layernorm, "weight", T_(L["post_norm"]))
        at = layer.self_attn
        put(at.q_a_proj, "weight", T_(L["q_a"]))
        put(at.q_a_layernorm, "weight", T_(L["q_a_norm"]))
        put(at.q_b_proj, "weight", T_(L["q_b"]))
        put(at.kv_a_proj_with_mqa, "weight", T_(L["kv_a"]))
        put(at.kv_a_layernorm, "weight", T_(L["kv_a_norm"]))
        kv_b = torch.cat([T_(L["w_uk"]), T_(L["w_uv_t"]).transpose(1, 2)], dim=1).reshape(N * (P + Vd), Lkv)
        put(at.kv_b_proj, "weight", kv_b.contiguous())
        put(at.o_proj, "weight", T_(L["o"]))
        m = layer.mlp
        if "gu" in L:
            put(m.gate_proj, "weight", T_(L["gu"][:F]))
            put(m.up_proj, "weight", T_(L["gu"][F:]))
            put(m.down_proj, "weight", T_(L["down"]))
        else:
            put(m.gate, "weight", T_(L["gate"]))
            put(m.gate, "e_score_correction_bias", T_(L["bias"]), buffer=True)
            put(m.experts, "gate_up_proj", T_(L["experts_gu"]))
            put(m.experts, "down_proj", T_(L["experts_down"]))
            put(m.shared_experts.gate_proj, "weight", T_(L["shared_gu"][:I]))
            put(m.shared_experts.up_proj, "weight", T_(L["shared_gu"][I:]))
            put(m.shared_experts.down_proj, "weight", T_(L["shared_down"]))
    rot = type(hf.model.rotary_emb)(config=hf_cfg)
    hf.model.rotary_emb = rot.to(dev)
    left = [n for n, p in list(hf.named_parameters()) + list(hf.named_buffers()) if p.device.type == "meta"]
    assert not left, left[:5]
    hf.eval()
    ids = torch.from_numpy(prompt.astype(np.int64))[None].to(dev)
    with torch.no_grad():
        out = hf(ids[:, :8])
        ref = torch.from_dlpack(target.forward(prompt[:8], target.new_cache(8), 0, check_ids=False)[0])
        err = float((out.logits[0] - ref).abs().max() / ref.abs().max())
        print(f"transformers vs kdtree_numba on the shared weights: max |diff| / max |logit| = {err:.2e}", flush=True)

        def hf_prefill(keep=0):
            o = hf(ids, use_cache=True, logits_to_keep=keep)
            sync_t()
            return o
        hf_prefill1_s, _ = timed(lambda: hf_prefill(1))
        hf_prefill_s, o = timed(hf_prefill)
        past = o.past_key_values
        nxt = o.logits[:, -1:].argmax(-1)
        hf_ms = []
        for s in range(steps):
            t = time.perf_counter()
            o = hf(nxt, past_key_values=past, use_cache=True)
            past = o.past_key_values
            nxt = o.logits[:, -1:].argmax(-1)
            sync_t()
            hf_ms.append((time.perf_counter() - t) * 1e3)
    hf_decode = float(np.median(hf_ms[1:]))
    assert err < 1e-3, f"transformers disagrees with kdtree_numba on the shared weights ({err:.1e})"
    hf_row = ["transformers (eager MoE, sdpa attention)", f"{hf_decode:.2f}", f"{context / hf_prefill_s:.0f}",
              f"{context / hf_prefill1_s:.0f}",
              f"{floor_ms:.2f}", f"{100 * floor_ms / hf_decode:.0f} %"]
    rows.append(hf_row)
    rows.append(["speedup of kdtree_numba (same run)", f"{hf_decode / ours_decode:.2f}x",
                 f"{hf_prefill_s / prefill_s:.2f}x", f"{hf_prefill1_s / prefill1_s:.2f}x", "", ""])
    rows.append(["speedup of kdtree_numba replayed (same run)", f"{hf_decode / ours_replayed:.2f}x", "", "", "", ""])
except Exception as e:       # report, do not hide: the baseline is part of the measurement
    rows.append(hf_row[:1] + [f"not run: {type(e).__name__}: {str(e)[:120]}", "", "", "", ""])
table(f"Kimi-K2-shaped stack (2 layers: 1 dense + 1 MoE of 384 experts top-8 + 1 shared; fp32), context {context}",
      ["engine", "decode ms/step", "prefill tokens/s (all logits)", "prefill tokens/s (last row's logits)",
       "memory floor ms/step", "% of floor"], rows)
print(f"floor bytes per step: {floor_bytes / 1e9:.2f} GB at {copy:.0f} GB/s copy bandwidth")
save("bench_model")
