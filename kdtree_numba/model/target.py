"""The DeepSeek-V3 / Kimi-K2 target, composed from the stage kernels.

    embed -> per layer [ RMSNorm -> MLA -> + residual -> RMSNorm -> dense SwiGLU MLP (first_k_dense_replace
    layers) or MoE (route -> group tokens per expert -> expert SwiGLU GEMMs -> weighted combine + shared
    experts) -> + residual ] -> final RMSNorm -> lm_head

MLA, absorbed (per token x after input_layernorm; P nope, R rope, Vd value dims, Lkv latent, N heads):
    q     = q_b(q_a_norm(q_a(x)))  or  q_proj(x)                 [T, N, P + R]   (q_a and kv_a: one GEMM)
    ckv   = kv_a_proj_with_mqa(x);  c = kv_a_norm(ckv[:Lkv]);  k_rot = RoPE(ckv[Lkv:])   -> cache row [c ; k_rot]
                                                                  (one launch: kernels/mla_latent.py)
    q_abs = [q_nope @ W_UK[h] ; RoPE(q_rot)]                    [T, N, Lkv + R]
    o_lat = attention(q_abs, cache)                              [T, N, Lkv]    (kernels/mla_attention.py)
    out   = o_proj(concat_h(o_lat[h] @ W_UV[h]^T))               [T, H]
A prefill chunk of DECOMPRESSED_PREFILL_TOKENS or more takes MLA's decompressed form (``_decompressed_attention``):
    k[h] = [c @ W_UK[h]^T ; k_rot],  v[h] = c @ W_UV[h]    per head, from the latent rows (two batched GEMMs)
    out  = o_proj(concat_h(attention(q[h] = [q_nope[h] ; RoPE(q_rot[h])], k[h], v[h])))   kernels/gqa_attention.py
the same function, 640 instead of 2176 FLOPs per (query, key) pair and head at Kimi's shape: compute-bound prefill
pays for the decompression, memory-bound decode and tree verify do not.
Rope rows of q_b/q_proj and kv_a are permuted once at load (interleaved -> NeoX, kernels/rope.py), so the NeoX
kernel reproduces the checkpoint's interleaved RoPE; ``save`` undoes it.

The MoE router and the shared expert's gate/up read the same input: one GEMM over their stacked weights
(``gate_shared_gu``), split into column views. MoE runs only the experts a token was routed to: the T*k
assignments are sorted by expert, gathered once, and two grouped GEMMs (kernels/moe_grouped_gemm.py) run every
expert on its contiguous slice, each in one launch whose grid is sized from shapes alone: the expert counts stay
on the device, and a decode step or a tree verify needs no host read (so it can be captured as a CUDA graph).
A prefill chunk of more than 2048 assignments reads the counts once per layer and runs one cuBLAS GEMM per
expert, which is faster there (moe_grouped_gemm.CUBLAS_ROWS).

A target lives on the backend it was built on (``self.backend``); its methods run there whatever
``backend.use`` says.
"""
from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np

from .. import backend
from ..config import TargetConfig
from ..kernels import (_checks, embedding, gemm, gqa_attention, mla_attention, mla_latent, moe_grouped_gemm,
                       moe_routing, rmsnorm, rope, swiglu, tree_verify)
from . import checkpoint, hf_keys
from .kv_cache import LatentCache

QKV_NORM_EPS = 1e-6   # HF's q_a_layernorm / kv_a_layernorm always use 1e-6
# A causal chunk of at least this many tokens (a prefill) attends in MLA's decompressed form (per-head keys and
# values from the latent, kernels/gqa_attention.py): 2 (P + R + Vd) FLOPs per (query, key) pair and head instead
# of the absorbed form's 2 (2 Lkv + R) (Kimi: 640 vs 2176), for 2 Lkv (P + Vd) N per key row to decompress.
# Shorter chunks, decode steps and tree verifies stay absorbed (their cost is the latent's bytes).
DECOMPRESSED_PREFILL_TOKENS = 128


def _on_backend(method):
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with backend.use(self.backend):
            return method(self, *args, **kwargs)
    return run


@dataclasses.dataclass
class TreeInput:
    """What the verify forward needs besides tokens: per node its rope position (``start + depth``) and its
    root-to-node path in tree-node indices (``paths [n+1, L+1]``, ``depths [n+1]``; kernels/tree_build.py).
    ``positions=None``: start + depths, added by the RoPE kernels themselves (a captured round: no add launch)."""
    positions: object
    paths: object
    depths: object
    max_depth: int


class Hiddens(dict):
    """``{k: [T, H]}``, the residual streams a forward was asked for (``hidden_layers``), each a column block of
    ``stacked [T, len(layers) * H]`` in the order asked: the drafter's context features side by side without a
    concatenation (model/drafters.concat_features returns ``stacked`` when the layers match). Example: layers
    (1, 2, 3), H = 256 -> ``self[2]`` is ``stacked[:, 256:512]``."""

    def __init__(self, layers: tuple, stacked):
        super().__init__()
        self.layers, self.stacked = layers, stacked


def token_ids_host(token_ids, vocab_size: int, arg: str = "prompt_ids") -> np.ndarray:
    """Host int32 copy of a 1-d sequence of ids in [0, vocab_size), or ValueError naming ``arg`` and the offending
    value (text, a 2-d array, an empty sequence, non-integer floats, an id outside the vocabulary).
    Example: token_ids_host([3, 4.0], 10) -> array([3, 4], dtype=int32); token_ids_host([12], 10) -> ValueError."""
    if isinstance(token_ids, (str, bytes)):
        raise ValueError(f"{arg}: expected token ids, got a {type(token_ids).__name__} (encode text first: "
                         f"target.tokenizer.encode(text))")
    try:
        ids = np.asarray(backend.to_host(token_ids) if backend.is_device(token_ids) else token_ids)
    except Exception:
        raise ValueError(f"{arg}: expected a sequence of token ids, got {type(token_ids).__name__}") from None
    if ids.ndim != 1:
        raise ValueError(f"{arg}: expected a 1-d sequence of token ids, got shape {ids.shape}")
    if ids.size == 0:
        raise ValueError(f"{arg}: expected at least one token, got an empty sequence")
    if ids.dtype.kind not in "iu":
        if ids.dtype.kind == "f" and np.all(np.isfinite(ids)) and np.all(ids == np.round(ids)):
            ids = ids.astype(np.int64)
        else:
            raise ValueError(f"{arg}: expected integer token ids, got dtype {ids.dtype}")
    embedding.check_ids(ids, vocab_size, arg)
    return ids.astype(np.int32)


class Target:
    """A DeepSeek-V3-family model ready to run. Build with ``load_target``, ``tiny_target`` or ``from_state_dict``."""

    def __init__(self, config: TargetConfig, weights: dict, layers: list[dict]):
        self.config = config
        self.backend = backend.name
        self.tokenizer = None     # a model/tokenizer.Tokenizer when the checkpoint has a tokenizer.json
        self.w = weights          # embed [V, H], norm [H], lm_head [V, H]
        self.layers = layers      # per layer: see from_state_dict
        for L in layers:                      # weights that read the same input: one GEMM each pair
            if "q_a" in L and "qkv_a" not in L:
                self._fuse_rows(L, "qkv_a", ("q_a", "kv_a"))                         # [Q + Lkv + R, H]
            if "gate" in L and "shared_gu" in L and "gate_shared_gu" not in L:
                self._fuse_rows(L, "gate_shared_gu", ("gate", "shared_gu"))           # [E + 2 Is, H]
        inv_freq, amp = config.rope_tables()
        self.inv_freq = backend.asarray(inv_freq)
        self.rope_amp = amp
        self.scale = config.softmax_scale

    # ---------------------------------------------------------------------------------------- construction
    @staticmethod
    def _fuse_rows(L: dict, fused_name: str, names: tuple) -> None:
        """Weights that read the same input (q_a and kv_a; the MoE router and the shared expert's gate/up) stacked
        into one ``L[fused_name]`` make one GEMM. Each ``L[name]`` becomes its row block (a contiguous view, no
        second copy), so state_dict, save and everything that reads them by name see the same values."""
        fused = backend.xp.concatenate([L[n] for n in names])                         # [sum of rows, H]
        L[fused_name] = fused
        r = 0
        for n in names:
            L[n] = fused[r:r + L[n].shape[0]]
            r += L[n].shape[0]

    @classmethod
    def from_state_dict(cls, config: TargetConfig, state: dict[str, np.ndarray]) -> "Target":
        """Build from HF-layout float32 tensors (keys as in checkpoint.expected_shapes) by the key map of
        model/hf_keys.py (permute rope rows, fuse gate/up, stack experts, split kv_b into W_UK / W_UV), and move
        everything to the backend. The target holds copies: changing ``state`` afterwards does not change the
        model."""
        cfg = config.validate()
        shapes = checkpoint.expected_shapes(cfg)
        for key in sorted(state):
            if key not in shapes:
                raise checkpoint.CheckpointError(f"{key}: unexpected tensor for this config (a weight the model "
                                                 f"would not use)")
        for key, shape in shapes.items():
            if key not in state:
                raise checkpoint.CheckpointError(f"{key}: missing from the state dict")
            if tuple(state[key].shape) != shape:
                raise checkpoint.CheckpointError(f"{key}: expected shape {shape}, got {tuple(state[key].shape)}")

        def dev(arrays):                # the table's transforms make fresh host copies: no aliasing of ``state``
            return {name: backend.asarray(a) for name, a in arrays.items()}

        weights = dev(hf_keys.to_engine(cfg, state))
        if cfg.tie_word_embeddings:
            weights["lm_head"] = weights["embed"]
        layers = [dev(hf_keys.to_engine(cfg, state, i)) for i in range(cfg.num_hidden_layers)]
        return cls(cfg, weights, layers)

    @_on_backend
    def state_dict(self) -> dict[str, np.ndarray]:
        """The HF-layout tensors (raw interleaved rope rows), float32 host copies: changing them does not change
        the model."""
        cfg = self.config

        def h(a):                      # a device array comes back as a fresh host array; a host one is copied
            return backend.to_host(a) if backend.is_device(a) else np.array(a, dtype=np.float32)

        sd = hf_keys.to_hf(cfg, self.w, h)
        for i, L in enumerate(self.layers):
            sd.update(hf_keys.to_hf(cfg, L, h, i))
        return {key: sd[key] for key, _ in hf_keys.iter_keys(cfg)}     # in layout order

    def save(self, path: str) -> None:
        """Write an HF directory (config.json + model.safetensors, fp32, + tokenizer.json when the target has a
        tokenizer) that transformers can load. Atomic (checkpoint.save_dir): all files or none; a failed save
        leaves an existing checkpoint as it was; a stale weight index and its shards are replaced, other files
        kept."""
        tok = self.tokenizer
        extra = None if tok is None else (lambda staging: tok.save(os.path.join(staging, "tokenizer.json")))
        checkpoint.save_state_dict(path, self.config, self.state_dict(), extra=extra)

    def with_backend(self, name: str) -> "Target":
        """The same model on another host backend ("sim" <-> "numpy"), sharing the weight arrays (no copy).
        E.g. an OracleDrafter on the NumPy references while the target's kernels run on the simulator."""
        if name == self.backend:
            return self
        if name == "cuda" or self.backend == "cuda":
            raise ValueError(f"name: {name!r}: only host backends (sim, numpy) can share weights, this target "
                             f"is on {self.backend!r}")
        with backend.use(name):
            clone = Target(self.config, self.w, self.layers)
        clone.tokenizer = self.tokenizer
        return clone

    # ---------------------------------------------------------------------------------------- forward
    def new_cache(self, capacity: int) -> LatentCache:
        with backend.use(self.backend):
            return LatentCache(self.config.num_hidden_layers, capacity, self.config.latent_dim)

    @_on_backend
    def forward(self, ids, cache: LatentCache, start: int, tree: TreeInput | None = None,
                hidden_layers=(), check_ids: bool = True, logits_to_keep: int = 0, logits_at=None):
        """Run T tokens whose cache rows go to ``start .. start + T - 1``; returns (logits [T, V], hiddens).
        ``logits_to_keep`` = k > 0 computes the logits of the last k tokens only ([min(k, T), V]; transformers'
        argument of the same name): a prefill that only samples its last token skips the lm_head GEMM over the
        other rows (Kimi's shape, 4096 tokens: 9.6 of its ~13 TFLOP). 0: all T rows. ``logits_at``: instead, a
        device int32 [k] of the rows whose logits to compute ([k, V]; a padded prefill keeps its last prompt row,
        read on the device: decode/prefill_replay.py).
        ``start`` is an int, or a device int32 [1] array (a step or a tree verify whose position lives on the
        device, so that a captured CUDA graph can be replayed round after round: decode/replay.py,
        decode/ddtree_replay.py).

        Causal (prefill chunk or decode step): token t sits at position start + t and sees rows 0 .. start + t.
        Tree (verify): token i sits at ``tree.positions[i]`` (None: start + ``tree.depths[i]``) and sees rows
        0 .. start - 1 plus its path.
        ``hiddens[k]`` is the residual stream after decoder layer k for k in ``hidden_layers`` (a ``Hiddens``: the
        streams are column blocks of one [T, len(hidden_layers) * H] array, the drafter's features). The cache's
        committed ``length`` is not changed here: the caller commits."""
        cfg = self.config
        ids = backend.asarray(ids)
        T = ids.shape[0]
        if T == 0:
            raise ValueError("ids: expected at least one token, got an empty sequence")
        keep = _checks.integer(logits_to_keep, "logits_to_keep", lo=0)
        layers = self._layer_indices(hidden_layers, "hidden_layers")
        if logits_at is not None:
            if keep:
                raise ValueError(f"logits_at: give logits_at or logits_to_keep (got {keep}), not both")
            logits_at = _checks.array(logits_at, "logits_at", dtype=np.int32, ndim=1)
        base = 0                                 # rope at base + positions (the kernels add base)
        if tree is not None:
            positions = tree.positions
            if positions is None:                # start + depth: no add launch
                positions, base = tree.depths, start
            if not hasattr(start, "shape") and start + T > cache.capacity:
                raise ValueError(f"ids: {T} tokens from position {start} exceed the cache capacity of "
                                 f"{cache.capacity}")
        elif hasattr(start, "shape"):            # device-side start [1] (graph replay): nothing read on the host
            positions = start if T == 1 else start + backend.xp.arange(T, dtype=np.int32)   # a step: no launch
        elif start + T > cache.capacity:
            raise ValueError(f"ids: {T} tokens from position {start} exceed the cache capacity of {cache.capacity}")
        else:                                    # made on the device, not copied from the host: a captured prefill
            positions = backend.xp.arange(start, start + T, dtype=np.int32)
        x = embedding.embed(self.w["embed"], ids, check=check_ids)                   # [T, H]
        H = cfg.hidden_size
        hiddens = Hiddens(layers, backend.empty((T, len(layers) * H), x.dtype) if layers else None)  # [T, nH]
        for i, L in enumerate(self.layers):                # the residual adds ride on the output GEMMs (beta = 1)
            h = rmsnorm.rmsnorm(x, L["in_norm"], cfg.rms_norm_eps)
            self._attention(i, L, h, positions, base, cache, start, tree, out=x)      # x += attention(h)
            h = rmsnorm.rmsnorm(x, L["post_norm"], cfg.rms_norm_eps)
            if "gate" in L:
                self._moe(L, h, out=x)                                                # x += moe(h)
            else:
                self._mlp(L["gu"], L["down"], h, out=x)                               # x += mlp(h)
            for j in (j for j, k in enumerate(layers) if k == i):
                hiddens[i] = hiddens.stacked[:, j * H:(j + 1) * H]                    # [T, H] view
                hiddens[i][...] = x
        if logits_at is not None:
            x = backend.xp.take(x, logits_at, axis=0)                                # [k, H]
        elif keep:
            x = x[-keep:]                                                             # [min(k, T), H]
        x = rmsnorm.rmsnorm(x, self.w["norm"], cfg.rms_norm_eps)                      # the kept rows [T', H]
        return gemm.linear(x, self.w["lm_head"]), hiddens                            # [T', V]

    def _attention(self, i, L, h, positions, base, cache, start, tree, out):
        """The attention output ``[T, H]``, added onto ``out`` (the residual stream) by the o_proj GEMM; RoPE at
        ``base + positions``."""
        cfg = self.config
        T = h.shape[0]
        N, P, R, Lkv = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
        if cfg.q_lora_rank is None:
            y, Q = gemm.linear(h, L["kv_a"]), 0                                       # [T, Lkv+R]
        else:
            y, Q = gemm.linear(h, L["qkv_a"]), cfg.q_lora_rank                        # [T, Q + Lkv+R]: one GEMM
        with backend.branch() as latent:                     # the cache rows beside the query's projections
            mla_latent.write_latent(y[:, Q:], L["kv_a_norm"], QKV_NORM_EPS, positions, self.inv_freq,
                                    self.rope_amp, cache.layer(i), start, base=base)  # rows [c ; k_rot]
        if Q:
            q = gemm.linear(rmsnorm.rmsnorm(y[:, :Q], L["q_a_norm"], QKV_NORM_EPS), L["q_b"])
        else:
            q = gemm.linear(h, L["q"])
        q = q.reshape(T, N, P + R)                                                    # [T, N, P+R]
        if tree is None and not hasattr(start, "shape") and T >= DECOMPRESSED_PREFILL_TOKENS:
            latent.join()
            o = self._decompressed_attention(L, q, positions, cache.layer(i)[:start + T])     # [T, N, Vd]
            return gemm.linear(o.reshape(T, -1), L["o"], out=out, accumulate=True)

        q_abs = backend.empty((T, N, Lkv + R), np.float32)                            # [T, N, Lkv+R]
        with backend.branch() as rot:                        # the rope columns beside the absorbed ones
            rope.apply_rope(q[:, :, P:], positions, self.inv_freq, self.rope_amp, out=q_abs[:, :, Lkv:],
                            base=base)
        gemm.bmm(q[:, :, :P].transpose(1, 0, 2), L["w_uk"], out=q_abs[:, :, :Lkv].transpose(1, 0, 2))
        rot.join()
        latent.join()                                                                 # the attention reads the rows
        if tree is None:
            o_lat = mla_attention.mla_attention(q_abs, cache.layer(i), start, self.scale, Lkv)
        else:
            o_lat = tree_verify.tree_attention(q_abs, cache.layer(i), start, tree.paths, tree.depths,
                                               self.scale, Lkv, max_depth=tree.max_depth)
        o = backend.empty((T, N, cfg.v_head_dim), np.float32)                        # [T, N, Vd]
        gemm.bmm(o_lat.transpose(1, 0, 2), L["w_uv_t"], out=o.transpose(1, 0, 2))    # per head, in place
        o = o.reshape(T, -1)                                                          # [T, N*Vd]
        return gemm.linear(o, L["o"], out=out, accumulate=True)                       # out += o W_o^T

    def _decompressed_attention(self, L, q, positions, rows):
        """Causal attention of a prefill chunk in MLA's decompressed form: per head, keys [c W_UK[h]^T ; k_rot]
        and values c W_UV[h] from the latent ``rows [S, Lkv + R]`` (two batched GEMMs; k_rot copied to every
        head), then grouped-query attention with one kv head per query head (kernels/gqa_attention.py).
        ``q [T, N, P + R]`` gets its rope columns rotated in place. Returns ``[T, N, Vd]``. Every chunk decompresses
        its whole prefix again (``rows`` = cache rows 0 .. start + T - 1): 2 Lkv (P + Vd) N FLOPs per row, small
        next to the attention itself once a chunk has a few hundred tokens, and 4 N (P + R + Vd) bytes per row of
        transient k / v (Kimi: 80 KB a row - 10.7 GB for a 128k-token prefix; chunk long prompts accordingly)."""
        cfg = self.config
        T, N, _ = q.shape
        P, Lkv, Vd = cfg.qk_nope_head_dim, cfg.kv_lora_rank, cfg.v_head_dim
        S = rows.shape[0]
        latent = backend.xp.broadcast_to(rows[:, :Lkv], (N, S, Lkv))                 # [N, S, Lkv] (stride 0)
        k = backend.empty((S, N, rows.shape[1] - Lkv + P), np.float32)              # [S, N, P+R]
        gemm.bmm(latent, L["w_uk"].transpose(0, 2, 1), out=k[:, :, :P].transpose(1, 0, 2))   # k_nope, in place
        k[:, :, P:] = rows[:, None, Lkv:]                                             # k_rot: shared by the heads
        v = backend.empty((S, N, Vd), np.float32)                                    # [S, N, Vd]
        gemm.bmm(latent, L["w_uv_t"], out=v.transpose(1, 0, 2))
        rope.apply_rope(q[:, :, P:], positions, self.inv_freq, self.rope_amp, out=q[:, :, P:])
        return gqa_attention.gqa_attention(q, k, v, S - T, self.scale)

    @staticmethod
    def _mlp(gu_w, down_w, h, out=None):
        """SwiGLU MLP of ``h [T, H]``; added onto ``out`` by the down GEMM when given."""
        return Target._swiglu_down(gemm.linear(h, gu_w), down_w, out)

    @staticmethod
    def _swiglu_down(gu, down_w, out=None):
        """down(silu(g) * u) of a gate/up product ``gu [T, 2I]``; added onto ``out`` when given."""
        return gemm.linear(swiglu.swiglu(gu), down_w, out=out, accumulate=out is not None)

    def _moe(self, L, h, out=None):
        """The MoE layer's output ``[T, H]`` (routed experts + shared expert); added onto ``out`` when given."""
        cfg = self.config
        k = cfg.num_experts_per_tok
        logits, shared_gu = self._router_and_shared_gu(L, h, cfg.n_routed_experts)   # [T, E], [T, 2 Is]
        with backend.branch() as shared:                     # the shared expert beside the routed ones (cuda: a
            out = self._shared_expert(L, shared_gu, out)     # second stream) - [T, H] (+)= shared(h)
        idx, w = moe_routing.route(logits, L["bias"], k, cfg.n_group, cfg.topk_group,
                                   cfg.norm_topk_prob, cfg.routed_scaling_factor)     # [T, k] each
        # offsets stay on the device: each grouped GEMM finds its experts' rows there (no host sync), through the
        # tile table [E+1] the grouping writes in its launch. On the simulator the GEMMs run in NumPy, like
        # gemm.linear's (the kernel is tested on its own at tiny shapes).
        counts, offsets, order, slot, tiles = moe_routing.group_by_expert_tiled(idx, cfg.n_routed_experts,
                                                                                moe_grouped_gemm.TM)
        xs = moe_routing.gather_rows(h, order, k)                                     # [T*k, H] expert-major
        gu = moe_grouped_gemm.grouped_linear(xs, L["experts_gu"], offsets, tiles=tiles,
                                             sim_kernel=False)                        # [T*k, 2I]
        act = swiglu.swiglu(gu)                                                       # [T*k, I]
        ys = moe_grouped_gemm.grouped_linear(act, L["experts_down"], offsets, tiles=tiles,
                                             sim_kernel=False)                        # [T*k, H]
        shared.join()
        return moe_routing.combine(ys, w, slot, out=out)                              # [T, H] (+)= routed

    @staticmethod
    def _router_and_shared_gu(L, h, E: int):
        """(router logits [T, E], the shared expert's gate/up [T, 2 Is] or None): one GEMM over the stacked
        ``gate_shared_gu`` (column views of its product), two without it."""
        if "gate_shared_gu" in L:
            y = gemm.linear(h, L["gate_shared_gu"])                                   # [T, E + 2 Is]
            return y[:, :E], y[:, E:]
        return gemm.linear(h, L["gate"]), (gemm.linear(h, L["shared_gu"]) if "shared_gu" in L else None)

    @staticmethod
    def _shared_expert(L, shared_gu, out=None):
        """The shared expert's down(silu(g) * u) from its gate/up ``[T, 2 Is]``, added onto ``out`` when given;
        ``out`` itself when the layer has no shared expert."""
        return out if shared_gu is None else Target._swiglu_down(shared_gu, L["shared_down"], out)

    # ---------------------------------------------------------------------------------------- conveniences
    @_on_backend
    def logits(self, token_ids) -> np.ndarray:
        """float32 ``[T, V]`` logits of one prefill over ``token_ids`` on the host; no cache is kept."""
        ids = self.check_ids(token_ids, "token_ids")
        cache = self.new_cache(len(ids))
        out, _ = self.forward(ids, cache, 0, check_ids=False)
        return backend.to_host(out)

    @_on_backend
    def hidden_states(self, token_ids, layers) -> dict[int, np.ndarray]:
        """Residual stream after each decoder layer in ``layers`` (HF output_hidden_states[k + 1]), on the host."""
        ids = self.check_ids(token_ids, "token_ids")
        layers = self._layer_indices(layers, "layers")
        _, hid = self.forward(ids, self.new_cache(len(ids)), 0, hidden_layers=layers, check_ids=False)
        return {k: backend.to_host(v) for k, v in hid.items()}

    def _layer_indices(self, layers, arg: str) -> tuple:
        """``layers`` as a tuple of decoder layer indices, or ValueError naming ``arg`` and the first bad entry."""
        n = self.config.num_hidden_layers
        layers = tuple(layers)
        bad = [k for k in layers if not (isinstance(k, (int, np.integer)) and 0 <= k < n)]
        if bad:
            raise ValueError(f"{arg}: layer {bad[0]!r} is not a decoder layer index in [0, {n})")
        return layers

    def check_ids(self, token_ids, arg: str = "prompt_ids") -> np.ndarray:
        """Host int32 copy of a 1-d id sequence, or ValueError naming the offending id (``token_ids``)."""
        return token_ids_host(token_ids, self.config.vocab_size, arg)
