"""The DFlash block-diffusion drafter in torch: model, config, save/load (training side; `train` extra).

What: a small Qwen3-style stack that, given the frozen target's features of the committed context and a block
``[root, MASK, ..., MASK]``, predicts the next ``block_size - 1`` tokens in ONE non-causal pass. It owns no
embeddings and no lm_head: the target's ``model.embed_tokens`` and ``lm_head`` are used, frozen. The inference
engine re-implements ``block_logits`` in NumPy/numba and must match it to 1e-4, so every step below is exact.

Shapes: H hidden (= target's), nF = len(target_layer_ids), Nq / Nkv heads, D head_dim, I intermediate, V vocab,
B block size, C context rows.

Features (from the frozen target, HF ``output_hidden_states`` indexing): ``feat[s] = concat_k hs[k + 1][s]`` for k
in ``target_layer_ids``, i.e. the residual stream after decoder layer k (never the last layer, whose HF entry is
post-final-norm)                                                                   -> [S, nF*H]

One block (``block_logits``, float32)::

    ctx = hidden_norm(fc(ctx_feat))                          [C, H]   once; the same rows feed every layer
    h   = embed[block_ids]                                   [B, H]   block_ids = [root, MASK x (B-1)]
    per layer:
        x  = input_layernorm(h)                              [B, H]
        q  = q_norm(q_proj(x).view(B, Nq, D))                         per-head RMSNorm over D
        kv = cat([ctx, x])                                   [C+B, H] (ctx is NOT input-layernormed)
        k  = k_norm(k_proj(kv).view(C+B, Nkv, D));  v = v_proj(kv).view(C+B, Nkv, D)
        q  = rope(q, blk_pos);  k = rope(k, cat[ctx_pos, blk_pos])    NeoX rotate_half over all D,
                                                              inv_freq = 1 / theta^(2i/D) (float32)
        o  = softmax(q k^T * D^-0.5) v   over ALL C+B keys (non-causal); query head j uses kv head j // (Nq/Nkv)
        h  = h + o_proj(o.reshape(B, Nq*D))
        y  = post_attention_layernorm(h);  h = h + down_proj(silu(gate_proj(y)) * up_proj(y))
    logits = lm_head(norm(h))[1:]                            [B-1, V]  depth 1 .. B-1
RMSNorm(x) = x * rsqrt(mean(x^2, -1) + eps) * w, computed in float32.

Training forward (``forward``): Bt sequences of S tokens with their features and A anchors each; the block of
anchor a is ``[x_a, MASK x (B-1)]`` at positions a .. a+B-1. Keys per sequence = [S context rows ; A*B block rows];
block queries see context rows j < a and their own block (bidirectional), never another block: one SDPA call per
layer with the boolean mask ``[A*B, S + A*B]``. Row k of block a predicts x_{a+k}. ``weighted_block_loss``:
sum_k w_k CE_k / sum_k w_k with w_k = exp(-(k-1)/gamma) (gamma 7 for B = 16, 4 for B = 8).

Files (``save_pretrained`` / ``from_pretrained``): ``config.json`` (HF-style, ``model_type: qwen3``,
``architectures: [DFlashDraftModel]``, ``dflash_config: {target_layer_ids, mask_token_id}``) and
``model.safetensors`` (bfloat16 by default) with keys ``fc.weight``, ``hidden_norm.weight``, ``norm.weight`` and
per layer ``layers.i.self_attn.{q,k,v,o}_proj.weight``, ``layers.i.self_attn.{q,k}_norm.weight``,
``layers.i.mlp.{gate,up,down}_proj.weight``, ``layers.i.{input,post_attention}_layernorm.weight``. No biases.

Reproduce a check: ``DFlashDraftModel(cfg).block_logits(...)`` equals the training forward's logits for one anchor
(tests/train/test_training.py).
"""
from __future__ import annotations

import dataclasses
import json
import os

import torch
import torch.nn.functional as F
from torch import nn

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


# ------------------------------------------------------------------------------------------------ config
@dataclasses.dataclass
class DFlashConfig:
    """Drafter hyper-parameters; ``to_dict`` is the exact config.json layout the engine reads."""
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 2
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 32
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    vocab_size: int = 4096
    block_size: int = 16
    num_target_layers: int = 5
    target_layer_ids: tuple = (1, 2, 3)
    mask_token_id: int = 1
    dtype: str = "bfloat16"

    def __post_init__(self):
        self.target_layer_ids = tuple(int(k) for k in self.target_layer_ids)
        self.validate()

    def validate(self) -> None:
        def need(ok, what):
            if not ok:
                raise ValueError(f"DFlashConfig: {what}")
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size", "num_target_layers"):
            need(int(getattr(self, name)) > 0, f"{name} must be positive, got {getattr(self, name)}")
        need(self.num_attention_heads % self.num_key_value_heads == 0,
             f"num_attention_heads {self.num_attention_heads} not a multiple of num_key_value_heads "
             f"{self.num_key_value_heads}")
        need(self.head_dim % 2 == 0, f"head_dim must be even (rope), got {self.head_dim}")
        need(self.block_size >= 2, f"block_size must be >= 2, got {self.block_size}")
        need(len(self.target_layer_ids) >= 1, "target_layer_ids is empty")
        bad = [k for k in self.target_layer_ids if not 0 <= k < self.num_target_layers - 1]
        need(not bad, f"target_layer_ids {list(self.target_layer_ids)}: each must be in [0, "
                      f"{self.num_target_layers - 2}] (the last target layer's HF hidden state is post-norm)")
        need(0 <= self.mask_token_id < self.vocab_size, f"mask_token_id {self.mask_token_id} outside the vocab")

    @property
    def n_features(self) -> int:
        return len(self.target_layer_ids)

    def to_dict(self) -> dict:
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": int(self.hidden_size),
            "intermediate_size": int(self.intermediate_size),
            "num_hidden_layers": int(self.num_hidden_layers),
            "num_attention_heads": int(self.num_attention_heads),
            "num_key_value_heads": int(self.num_key_value_heads),
            "head_dim": int(self.head_dim),
            "rms_norm_eps": float(self.rms_norm_eps),
            "rope_theta": float(self.rope_theta),
            "rope_scaling": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": float(self.rope_theta)},
            "max_position_embeddings": int(self.max_position_embeddings),
            "vocab_size": int(self.vocab_size),
            "attention_bias": False,
            "hidden_act": "silu",
            "block_size": int(self.block_size),
            "num_target_layers": int(self.num_target_layers),
            "dflash_config": {"target_layer_ids": [int(k) for k in self.target_layer_ids],
                              "mask_token_id": int(self.mask_token_id)},
            "torch_dtype": self.dtype,
            "dtype": self.dtype,
            "tie_word_embeddings": False,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "DFlashConfig":
        if d.get("attention_bias"):
            raise ValueError("DFlashConfig: attention_bias=true is not supported")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"DFlashConfig: hidden_act {d['hidden_act']!r} is not supported (silu only)")
        rp = d.get("rope_parameters") or {}
        if d.get("rope_scaling") or rp.get("rope_type", "default") != "default":
            raise ValueError("DFlashConfig: only plain (default) rope is supported")
        dc = d.get("dflash_config") or {}
        theta = d.get("rope_theta", rp.get("rope_theta", 10000.0))
        return cls(hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
                   num_hidden_layers=d["num_hidden_layers"], num_attention_heads=d["num_attention_heads"],
                   num_key_value_heads=d.get("num_key_value_heads", d["num_attention_heads"]),
                   head_dim=d.get("head_dim", d["hidden_size"] // d["num_attention_heads"]),
                   rms_norm_eps=d.get("rms_norm_eps", 1e-6), rope_theta=theta,
                   max_position_embeddings=d.get("max_position_embeddings", 2048), vocab_size=d["vocab_size"],
                   block_size=d["block_size"], num_target_layers=d["num_target_layers"],
                   target_layer_ids=dc.get("target_layer_ids", (1, 2, 3)),
                   mask_token_id=dc.get("mask_token_id", 1),
                   dtype=d.get("dtype", d.get("torch_dtype", "bfloat16")))


def config_for_target(target_config, **overrides) -> DFlashConfig:
    """Default drafter config for a (HF DeepseekV3Config-like) target: hidden, vocab and layer count from it."""
    kw = dict(hidden_size=target_config.hidden_size, vocab_size=target_config.vocab_size,
              num_target_layers=target_config.num_hidden_layers,
              max_position_embeddings=getattr(target_config, "max_position_embeddings", 2048))
    kw.update({k: v for k, v in overrides.items() if v is not None})
    return DFlashConfig(**kw)


def default_gamma(block_size: int) -> float:
    """Loss-decay gamma: 7 for block 16, 4 for block 8 (SpecForge/DFlash); block/2 (at least 1) otherwise."""
    return {16: 7.0, 8: 4.0}.get(int(block_size), max(1.0, block_size / 2.0))


def position_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma) for block positions k = 1 .. block_size-1                     -> [block_size-1]"""
    g = default_gamma(block_size) if gamma is None else float(gamma)
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(k - 1.0) / g)


# ------------------------------------------------------------------------------------------------ pieces
class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2, -1) + eps) * w, all in float32 (output float32)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX rope tables for integer ``positions [...]`` -> cos, sin [..., D] (float32)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                             device=positions.device) / head_dim))      # [D/2]
    freqs = positions.float()[..., None] * inv_freq                                     # [..., D/2]
    emb = torch.cat([freqs, freqs], dim=-1)                                             # [..., D]
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., T, N, D] float32, cos/sin [..., T, D] -> rotated x (float32)."""
    return x * cos[..., None, :] + rotate_half(x) * sin[..., None, :]


class DFlashAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        H, D, Nq, Nkv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.q_proj = nn.Linear(H, Nq * D, bias=False)
        self.k_proj = nn.Linear(H, Nkv * D, bias=False)
        self.v_proj = nn.Linear(H, Nkv * D, bias=False)
        self.o_proj = nn.Linear(Nq * D, H, bias=False)
        self.q_norm = RMSNorm(D, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(D, cfg.rms_norm_eps)


class DFlashMLP(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.self_attn = DFlashAttention(cfg)
        self.mlp = DFlashMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


# ------------------------------------------------------------------------------------------------ model
class DFlashDraftModel(nn.Module):
    """The drafter. ``forward`` is the batched anchored-block training pass, ``block_logits`` one inference block."""

    def __init__(self, config: DFlashConfig, init_std: float = 0.02):
        super().__init__()
        self.config = config
        H = config.hidden_size
        self.fc = nn.Linear(config.n_features * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, config.rms_norm_eps)
        self.layers = nn.ModuleList([DFlashLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(H, config.rms_norm_eps)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=init_std)

    # ---------------------------------------------------------------------------------- shared pieces
    def _qkv(self, layer: DFlashLayer, x: torch.Tensor, ctx: torch.Tensor):
        """x [..., Q, H] (normed block rows), ctx [..., C, H] -> q [..., Q, Nq, D], k, v [..., C+Q, Nkv, D]."""
        cfg, a = self.config, layer.self_attn
        D = cfg.head_dim
        q = a.q_norm(a.q_proj(x).unflatten(-1, (cfg.num_attention_heads, D)))           # [..., Q, Nq, D] f32
        kv_in = torch.cat([ctx, x], dim=-2)                                            # [..., C+Q, H]
        k = a.k_norm(a.k_proj(kv_in).unflatten(-1, (cfg.num_key_value_heads, D)))       # [..., C+Q, Nkv, D] f32
        v = a.v_proj(kv_in).unflatten(-1, (cfg.num_key_value_heads, D))                 # [..., C+Q, Nkv, D]
        return q, k, v

    # ---------------------------------------------------------------------------------- inference block
    def block_logits(self, ctx_feat, ctx_pos, block_ids, blk_pos, embed, lm_head) -> torch.Tensor:
        """Logits of depths 1..B-1 for one block, in float32 with explicit softmax (the engine's reference).

        ctx_feat [C, nF*H], ctx_pos [C] ints, block_ids [B] = [root, MASK, ...], blk_pos [B] ints,
        embed [V, H] (target embed_tokens weight), lm_head [V, H] (target lm_head weight)  ->  [B-1, V] float32.
        """
        cfg = self.config
        dev = self.fc.weight.device
        Nq, Nkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        ctx_pos = torch.as_tensor(ctx_pos, device=dev).long().reshape(-1)                # [C]
        blk_pos = torch.as_tensor(blk_pos, device=dev).long().reshape(-1)                # [B]
        block_ids = torch.as_tensor(block_ids, device=dev).long().reshape(-1)            # [B]
        embed = torch.as_tensor(embed, device=dev).float()                               # [V, H]
        lm_head = torch.as_tensor(lm_head, device=dev).float()                           # [V, H]
        ctx_feat = torch.as_tensor(ctx_feat, device=dev).float().reshape(len(ctx_pos), self.fc.in_features)
        with torch.autocast(device_type=dev.type, enabled=False):                       # ctx_feat [C, nF*H]
            ctx = self.hidden_norm(F.linear(ctx_feat, self.fc.weight.float()))          # [C, H]
            h = embed[block_ids]                                                         # [B, H]
            cq, sq = rope_cos_sin(blk_pos, D, cfg.rope_theta)                            # [B, D]
            ck, sk = rope_cos_sin(torch.cat([ctx_pos, blk_pos]), D, cfg.rope_theta)      # [C+B, D]
            for layer in self.layers:
                a = layer.self_attn
                x = layer.input_layernorm(h)                                             # [B, H]
                q = a.q_norm(F.linear(x, a.q_proj.weight.float()).view(-1, Nq, D))       # [B, Nq, D]
                kv_in = torch.cat([ctx, x], dim=0)                                       # [C+B, H]
                k = a.k_norm(F.linear(kv_in, a.k_proj.weight.float()).view(-1, Nkv, D))  # [C+B, Nkv, D]
                v = F.linear(kv_in, a.v_proj.weight.float()).view(-1, Nkv, D)            # [C+B, Nkv, D]
                q, k = apply_rope(q, cq, sq), apply_rope(k, ck, sk)
                rep = Nq // Nkv
                k = k.repeat_interleave(rep, dim=1)                                      # [C+B, Nq, D]
                v = v.repeat_interleave(rep, dim=1)                                      # [C+B, Nq, D]
                s = torch.einsum("qhd,khd->hqk", q, k) * (D ** -0.5)                     # [Nq, B, C+B]
                p = torch.softmax(s, dim=-1)
                o = torch.einsum("hqk,khd->qhd", p, v).reshape(-1, Nq * D)               # [B, Nq*D]
                h = h + F.linear(o, a.o_proj.weight.float())                             # [B, H]
                y = layer.post_attention_layernorm(h)
                m = layer.mlp
                g = F.silu(F.linear(y, m.gate_proj.weight.float())) * F.linear(y, m.up_proj.weight.float())  # [B, I]
                h = h + F.linear(g, m.down_proj.weight.float())                          # [B, H]
            return F.linear(self.norm(h)[1:], lm_head)                                   # [B-1, V]

    # ---------------------------------------------------------------------------------- training pass
    @staticmethod
    def anchored_mask(anchors: torch.Tensor, seq_len: int, block_size: int) -> torch.Tensor:
        """Boolean attention mask (True = attend) for the anchored-block training pass.

        anchors [Bt, A]  ->  [Bt, 1, A*bs, S + A*bs]: block row (a, k) sees context rows j < a and the rows of its
        own block, nothing else.
        """
        Bt, A = anchors.shape
        dev = anchors.device
        row_anchor = anchors.repeat_interleave(block_size, dim=1)                        # [Bt, A*bs]
        ctx_ok = torch.arange(seq_len, device=dev)[None, None, :] < row_anchor[:, :, None]   # [Bt, A*bs, S]
        blk = torch.arange(A, device=dev).repeat_interleave(block_size)                  # [A*bs]
        blk_ok = (blk[:, None] == blk[None, :]).expand(Bt, -1, -1)                       # [Bt, A*bs, A*bs]
        return torch.cat([ctx_ok, blk_ok], dim=-1)[:, None]                              # [Bt, 1, A*bs, S+A*bs]

    def forward(self, feat, ids, anchors, embed, lm_head) -> torch.Tensor:
        """Anchored-block training forward.

        feat [Bt, S, nF*H] target features, ids [Bt, S] tokens, anchors [Bt, A] in [1, S - bs],
        embed / lm_head [V, H] frozen target weights  ->  logits [Bt, A, bs-1, V] (row k predicts ids[a + k]).
        """
        cfg = self.config
        bs, D = cfg.block_size, cfg.head_dim
        Nq, Nkv = cfg.num_attention_heads, cfg.num_key_value_heads
        Bt, S = ids.shape
        A = anchors.shape[1]
        dev = ids.device
        offs = torch.arange(bs, device=dev)                                              # [bs]
        blk_pos = (anchors[:, :, None] + offs).reshape(Bt, A * bs)                       # [Bt, A*bs]
        block_ids = torch.full((Bt, A, bs), cfg.mask_token_id, dtype=torch.long, device=dev)
        block_ids[:, :, 0] = torch.gather(ids, 1, anchors)                               # [Bt, A, bs]
        ctx = self.hidden_norm(self.fc(feat))                                            # [Bt, S, H] f32
        h = F.embedding(block_ids.reshape(Bt, A * bs), embed).float()                    # [Bt, A*bs, H]
        cq, sq = rope_cos_sin(blk_pos, D, cfg.rope_theta)                                # [Bt, A*bs, D]
        ctx_pos = torch.arange(S, device=dev).expand(Bt, S)                              # [Bt, S]
        ck, sk = rope_cos_sin(torch.cat([ctx_pos, blk_pos], dim=1), D, cfg.rope_theta)   # [Bt, S+A*bs, D]
        mask = self.anchored_mask(anchors, S, bs)                                        # [Bt, 1, A*bs, S+A*bs]
        rep = Nq // Nkv
        for layer in self.layers:
            a = layer.self_attn
            x = layer.input_layernorm(h)                                                 # [Bt, A*bs, H] f32
            q, k, v = self._qkv(layer, x, ctx)
            q, k = apply_rope(q, cq, sq), apply_rope(k, ck, sk)                          # f32
            cdt = v.dtype                                                                # bf16 under autocast
            q = q.to(cdt).transpose(1, 2)                                                # [Bt, Nq, A*bs, D]
            k = k.to(cdt).repeat_interleave(rep, dim=2).transpose(1, 2)                  # [Bt, Nq, S+A*bs, D]
            v = v.repeat_interleave(rep, dim=2).transpose(1, 2)                          # [Bt, Nq, S+A*bs, D]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)                  # [Bt, Nq, A*bs, D]
            o = o.transpose(1, 2).reshape(Bt, A * bs, Nq * D)                            # [Bt, A*bs, Nq*D]
            h = h + a.o_proj(o)
            h = h + layer.mlp(layer.post_attention_layernorm(h))                         # [Bt, A*bs, H]
        h = h.view(Bt, A, bs, -1)[:, :, 1:]                                              # [Bt, A, bs-1, H]
        return F.linear(self.norm(h), lm_head)                                           # [Bt, A, bs-1, V]

    # ---------------------------------------------------------------------------------- save / load
    def save_pretrained(self, path, dtype: torch.dtype = torch.bfloat16) -> None:
        """Write ``config.json`` + ``model.safetensors`` (weights cast to ``dtype``, bfloat16 by default)."""
        from safetensors.torch import save_file

        os.makedirs(path, exist_ok=True)
        cfg = dataclasses.replace(self.config, dtype=str(dtype).replace("torch.", ""))
        with open(os.path.join(path, CONFIG_NAME), "w") as f:
            json.dump(cfg.to_dict(), f, indent=2)
            f.write("\n")
        state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()}
        save_file(state, os.path.join(path, WEIGHTS_NAME), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(cls, path, dtype: torch.dtype = torch.float32, device="cpu") -> "DFlashDraftModel":
        """Read a directory written by ``save_pretrained``; weights are cast to ``dtype`` (float32 by default)."""
        from safetensors.torch import load_file

        with open(os.path.join(path, CONFIG_NAME)) as f:
            cfg = DFlashConfig.from_dict(json.load(f))
        model = cls(cfg)
        state = load_file(os.path.join(path, WEIGHTS_NAME))
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{path}: drafter weights do not match the config (missing {missing[:4]}, "
                             f"unexpected {unexpected[:4]})")
        return model.to(device=device, dtype=dtype)


def weighted_block_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor):
    """sum_k w_k CE_k / sum_k w_k over every (sequence, anchor, k); also per-position top-1 accuracy.

    logits [..., bs-1, V], labels [..., bs-1], weights [bs-1]  ->  (loss scalar, correct [..., bs-1] bool)
    """
    V = logits.shape[-1]
    ce = F.cross_entropy(logits.float().reshape(-1, V), labels.reshape(-1), reduction="none")
    ce = ce.view(labels.shape)                                                           # [..., bs-1]
    w = weights.to(ce.device).expand_as(ce)
    loss = (ce * w).sum() / w.sum()
    correct = logits.argmax(-1) == labels                                                # [..., bs-1]
    return loss, correct


def block_labels(ids: torch.Tensor, anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """ids [Bt, S], anchors [Bt, A] -> labels [Bt, A, bs-1] = ids[a + k], k = 1 .. bs-1."""
    k = torch.arange(1, block_size, device=ids.device)
    idx = (anchors[:, :, None] + k).reshape(ids.shape[0], -1)                            # [Bt, A*(bs-1)]
    return torch.gather(ids, 1, idx).view(*anchors.shape, block_size - 1)


def chain_accept_length(correct: torch.Tensor) -> torch.Tensor:
    """Mean tokens a greedy chain draft commits per round (root + accepted): 1 + sum_k prod_{j<=k} correct_j.

    correct [..., bs-1] bool -> scalar.
    """
    return 1.0 + torch.cumprod(correct.float(), dim=-1).sum(-1).mean()


__all__ = ["DFlashConfig", "DFlashDraftModel", "config_for_target", "default_gamma", "position_weights",
           "weighted_block_loss", "block_labels", "chain_accept_length", "RMSNorm", "rope_cos_sin"]
