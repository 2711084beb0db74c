"""The HF key map: which checkpoint tensors make each engine array, and how (and back, for saving).

One row per engine array (``Target.w`` for the top rows, a layer dict of ``Target.layers`` for the layer rows):
its name(s), the HF key pattern(s) it is made from (layer keys sit under ``model.layers.{i}.``; ``{e}`` is the
routed expert), the shape of each of those tensors, the transform (a name in TRANSFORMS, which also holds its
inverse) and the configs it exists in (a name in WHEN). Shapes in dims of ``dims(cfg)``:
    H hidden, V vocab, Q q_lora_rank, Lkv kv_lora_rank, E routed experts, I / Is / F routed / shared / dense
    intermediate, NQ = N*(P+R) query rows, KVA = Lkv+R, NKV = N*(P+Vd) kv_b rows, NV = N*Vd
(N heads, P qk_nope, R qk_rope, Vd v_head dims).
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from ..kernels import rope


@dataclasses.dataclass(frozen=True)
class Row:
    engine: tuple        # engine array name(s) the row makes
    hf: tuple            # HF key pattern(s) it is made from
    shape: tuple         # the shape of every one of those HF tensors, in dims
    transform: str       # a key of TRANSFORMS
    when: str            # a key of WHEN

    @property
    def per_expert(self) -> bool:
        return "{e}" in self.hf[0]


def _row(engine, hf, shape, transform="plain", when="always"):
    return Row(tuple(engine.split()), tuple(hf.split()), tuple(shape.split(",")), transform, when)


TOP_ROWS = (
    #    engine array    HF key(s)                                              shape      transform   when
    _row("embed",        "model.embed_tokens.weight",                           "V,H"),
    _row("norm",         "model.norm.weight",                                   "H"),
    _row("lm_head",      "lm_head.weight",                                      "V,H",     "plain",    "untied"),
)
LAYER_ROWS = (   # HF keys under model.layers.{i}.
    _row("in_norm",      "input_layernorm.weight",                              "H"),
    _row("post_norm",    "post_attention_layernorm.weight",                     "H"),
    _row("q",            "self_attn.q_proj.weight",                             "NQ,H",    "rope_q",   "no_q_lora"),
    _row("q_a",          "self_attn.q_a_proj.weight",                           "Q,H",     "plain",    "q_lora"),
    _row("q_a_norm",     "self_attn.q_a_layernorm.weight",                      "Q",       "plain",    "q_lora"),
    _row("q_b",          "self_attn.q_b_proj.weight",                           "NQ,Q",    "rope_q",   "q_lora"),
    _row("kv_a",         "self_attn.kv_a_proj_with_mqa.weight",                 "KVA,H",   "rope_kv"),
    _row("kv_a_norm",    "self_attn.kv_a_layernorm.weight",                     "Lkv"),
    _row("w_uk w_uv_t",  "self_attn.kv_b_proj.weight",                          "NKV,Lkv", "split_kv_b"),
    _row("o",            "self_attn.o_proj.weight",                             "H,NV"),
    _row("gate",         "mlp.gate.weight",                                     "E,H",     "plain",    "moe"),
    _row("bias",         "mlp.gate.e_score_correction_bias",                    "E",       "plain",    "moe"),
    _row("experts_gu",   "mlp.experts.{e}.gate_proj.weight mlp.experts.{e}.up_proj.weight",
                                                                                "I,H",     "stack_gu", "moe"),
    _row("experts_down", "mlp.experts.{e}.down_proj.weight",                    "H,I",     "stack",    "moe"),
    _row("shared_gu",    "mlp.shared_experts.gate_proj.weight mlp.shared_experts.up_proj.weight",
                                                                                "Is,H",    "fuse_gu",  "shared"),
    _row("shared_down",  "mlp.shared_experts.down_proj.weight",                 "H,Is",    "plain",    "shared"),
    _row("gu",           "mlp.gate_proj.weight mlp.up_proj.weight",             "F,H",     "fuse_gu",  "dense"),
    _row("down",         "mlp.down_proj.weight",                                "H,F",     "plain",    "dense"),
)

WHEN = {    # (cfg, layer index or None for the top rows) -> whether the row exists
    "always": lambda cfg, i: True,
    "untied": lambda cfg, i: not cfg.tie_word_embeddings,
    "q_lora": lambda cfg, i: cfg.q_lora_rank is not None,
    "no_q_lora": lambda cfg, i: cfg.q_lora_rank is None,
    "moe": lambda cfg, i: cfg.is_moe_layer(i),
    "shared": lambda cfg, i: cfg.is_moe_layer(i) and bool(cfg.n_shared_experts),
    "dense": lambda cfg, i: not cfg.is_moe_layer(i),
}


def dims(cfg) -> dict[str, int]:
    N, P, R, Vd, Lkv = (cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim,
                        cfg.kv_lora_rank)
    I = cfg.moe_intermediate_size
    return dict(H=cfg.hidden_size, V=cfg.vocab_size, Q=cfg.q_lora_rank, Lkv=Lkv, E=cfg.n_routed_experts, I=I,
                Is=I * cfg.n_shared_experts, F=cfg.intermediate_size, NQ=N * (P + R), KVA=Lkv + R,
                NKV=N * (P + Vd), NV=N * Vd)


# ------------------------------------------------------------------------------------------------ transforms
# load(cfg, tensors) -> engine arrays (fresh float32 host copies: the target never aliases the state dict);
# save(cfg, engine arrays as host copies) -> HF tensors. A per-expert row gets / gives one tuple of its HF
# tensors per expert.
_f32 = lambda a: np.array(a, dtype=np.float32)                          # noqa: E731  (a copy)
_c = np.ascontiguousarray


def _q_starts(cfg):
    P, R = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
    return [h * (P + R) + P for h in range(cfg.num_attention_heads)]


def _rope_rows(starts_of):
    """Rope rows interleaved -> NeoX at load, back at save (when the checkpoint interleaves: rope_interleave)."""
    def load(cfg, t):
        w = _f32(t[0])
        return [rope.permute_rope_rows(w, starts_of(cfg), cfg.qk_rope_head_dim) if cfg.rope_interleave else w]

    def save(cfg, a):
        return [rope.permute_rope_rows(a[0], starts_of(cfg), cfg.qk_rope_head_dim, inverse=True)
                if cfg.rope_interleave else a[0]]
    return load, save


def _split_kv_b_load(cfg, t):
    N, P, Vd = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
    kv_b = _f32(t[0]).reshape(N, P + Vd, cfg.kv_lora_rank)
    return [kv_b[:, :P], _c(kv_b[:, P:].transpose(0, 2, 1))]             # W_UK [N, P, Lkv], W_UV^T [N, Lkv, Vd]


def _split_kv_b_save(cfg, a):
    N, P, Vd = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
    kv_b = np.concatenate([a[0], a[1].transpose(0, 2, 1)], axis=1)        # [N, P+Vd, Lkv]
    return [_c(kv_b.reshape(N * (P + Vd), cfg.kv_lora_rank))]


def _halves(g):
    return [_c(g[:g.shape[0] // 2]), _c(g[g.shape[0] // 2:])]


TRANSFORMS = {   # name -> (load, save)
    "plain": (lambda cfg, t: [_f32(t[0])], lambda cfg, a: [a[0]]),
    "rope_q": _rope_rows(_q_starts),                                       # rope rows of every head's q
    "rope_kv": _rope_rows(lambda cfg: [cfg.kv_lora_rank]),                  # the k_rot rows after the latent
    "split_kv_b": (_split_kv_b_load, _split_kv_b_save),
    "fuse_gu": (lambda cfg, t: [np.concatenate(t).astype(np.float32)],      # [gate; up]
                lambda cfg, a: _halves(a[0])),
    "stack_gu": (lambda cfg, ts: [np.stack([np.concatenate(t) for t in ts]).astype(np.float32)],   # [E, 2I, H]
                 lambda cfg, a: [_halves(g) for g in a[0]]),
    "stack": (lambda cfg, ts: [np.stack([t[0] for t in ts]).astype(np.float32)],                   # [E, H, I]
              lambda cfg, a: [[_c(w)] for w in a[0]]),
}


# ------------------------------------------------------------------------------------------------ walking the table
def rows(cfg, i=None):
    """The rows of layer ``i`` (the top rows when None) that exist for ``cfg``."""
    return [r for r in (TOP_ROWS if i is None else LAYER_ROWS) if WHEN[r.when](cfg, i)]


def _prefix(i):
    return "" if i is None else f"model.layers.{i}."


def iter_keys(cfg):
    """(HF key, shape) of every tensor of the layout, top-level first, then layer by layer; a layer's per-expert
    keys expert by expert. Lazy: a config may claim 2**62 layers or experts."""
    d = dims(cfg)
    for i in itertools.chain([None], range(cfg.num_hidden_layers)):
        p = _prefix(i)
        for per_expert, group in itertools.groupby(rows(cfg, i), key=lambda r: r.per_expert):
            group = list(group)
            for e in range(cfg.n_routed_experts) if per_expert else [None]:
                for r in group:
                    for pattern in r.hf:
                        yield p + pattern.format(e=e), tuple(d[s] for s in r.shape)


def _keys_of(r, p, e=None):
    return [p + pattern.format(e=e) for pattern in r.hf]


def to_engine(cfg, state, i=None) -> dict:
    """Layer ``i``'s engine arrays (the top ones when None) from the HF ``state`` (keys and shapes checked)."""
    p, out = _prefix(i), {}
    for r in rows(cfg, i):
        if r.per_expert:
            t = [[state[k] for k in _keys_of(r, p, e)] for e in range(cfg.n_routed_experts)]
        else:
            t = [state[k] for k in _keys_of(r, p)]
        out.update(zip(r.engine, TRANSFORMS[r.transform][0](cfg, t)))
    return out


def to_hf(cfg, arrays, host, i=None) -> dict:
    """The HF tensors of layer ``i`` (the top ones when None) from its engine ``arrays``; ``host(a)`` gives a
    fresh host copy of an engine array."""
    p, out = _prefix(i), {}
    for r in rows(cfg, i):
        made = TRANSFORMS[r.transform][1](cfg, [host(arrays[n]) for n in r.engine])
        if r.per_expert:
            for e, tensors in enumerate(made):
                out.update(zip(_keys_of(r, p, e), tensors))
        else:
            out.update(zip(_keys_of(r, p), made))
    return out
