"""Llama-style decoder: RMSNorm pre-norm, SwiGLU, RoPE, GQA, no biases, untied embedding and head.

    model = Transformer(ModelConfig(d_model=256, n_layers=4, n_heads=4))
    logits = model(tokens, doc_ids=doc_ids, positions=positions)   # (B, T) -> (B, T, V)
    loss, ce = lm_loss(logits, targets, z_loss=1e-4)

Packed sequences: attention never crosses a document boundary. FlexAttention with a document block
mask runs on CUDA (compiled); elsewhere SDPA gets an explicit block-diagonal causal mask built from
doc_ids (FlexAttention runs on CPU only unfused and eagerly, far slower than SDPA there).

μP (model.parametrization "mup"): Tensor Programs V (Yang et al. 2022, arXiv 2203.03466), Table 8, its
formulation with an output multiplier, for Adam, relative to the base width (m = d_model / mup_base_width):
    hidden weights (every block's matrices)   each by its own fan-in ratio r to the base model's (TP5, the mup
                                              package): init variance ∝ 1/fan_in (std × 1/√r), Adam LR × 1/r;
                                              r = m but for mlp.w2, whose fan-in is the MLP width: the default
                                              rounding (Llama's 8/3 · d_model to a multiple of 64) grows it 5.5×
                                              from 32 to 256 while m = 8
    input weights (the embedding), norm gains init and Adam LR as at the base width
    output weights (the head)                 init and Adam LR as at the base width, logits × 1/m
    attention                                 q·k / d_head (TP5's rule) instead of / √d_head, × √(base d_head):
                                              the scale is √(base d_head)/d_head, so m = 1 keeps 1/√d_head
So at d_model = mup_base_width the model, its initialisation and its learning rates are the standard ones.
The learning rates are per parameter group (trainer.optim.param_groups: `lr_scale`, which the schedule multiplies).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer.model.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # The mean square in fp32: in bf16 it loses the precision the normalisation depends on.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


def rope_angles(positions: torch.Tensor, head_dim: int, base: float):
    """cos, sin of shape (B, 1, T, head_dim/2) for integer positions (B, T)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[..., None] * inv_freq  # (B, T, hd/2)
    return angles.cos()[:, None], angles.sin()[:, None]


def apply_rope(x, cos, sin):
    """Rotate pairs (x[..., :hd/2], x[..., hd/2:]) (the Llama/NeoX 'rotate half' layout)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def document_causal_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) document ids -> (B, 1, T, T) bool: query i sees key j iff j <= i and same document."""
    T = doc_ids.shape[1]
    same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()
    return (same_doc & causal)[:, None]


def document_mask_mod(doc_ids: torch.Tensor):
    """The same rule as document_causal_mask, as a FlexAttention mask_mod."""

    def doc_causal(b, h, q_idx, kv_idx):
        return (doc_ids[b, q_idx] == doc_ids[b, kv_idx]) & (q_idx >= kv_idx)

    return doc_causal


_compiled_flex = None


def flex_document_mask(doc_ids: torch.Tensor):
    """The FlexAttention BlockMask of a batch, built once per forward and shared by the layers."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, T = doc_ids.shape
    return create_block_mask(document_mask_mod(doc_ids), B, None, T, T, device=doc_ids.device)


def _flex_attention(q, k, v, block_mask, scale=None):
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if _compiled_flex is None:
        # Uncompiled, FlexAttention materialises the full score matrix; compiled it skips masked blocks.
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex(q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1], scale=scale)


def attention_scale(cfg: ModelConfig) -> float | None:
    """The factor on q·k: None (SDPA's and FlexAttention's default 1/√d_head) for the standard model; under μP
    √(base d_head)/d_head, 1/d_head as TP5 asks (q and k grow correlated in training, so q·k grows like d_head, not
    √d_head), times the constant that makes it 1/√d_head at the base width (base d_head: model.mup_base_head_dim,
    else mup_base_width / n_heads)."""
    if cfg.parametrization == "standard":
        return None
    base = cfg.mup_base_head_dim if cfg.mup_base_head_dim is not None else cfg.mup_base_width // cfg.n_heads
    return math.sqrt(base) / cfg.head_dim


def width_mult(cfg: ModelConfig) -> float:
    """m = d_model / mup_base_width under μP (1.0 for the standard model)."""
    return cfg.d_model / cfg.mup_base_width if cfg.parametrization == "mup" else 1.0


def mlp_width_mult(cfg: ModelConfig) -> float:
    """The MLP width's ratio to the base model's under μP: mlp.w2's fan-in ratio. With the default d_ff the base's is
    the same rounding at mup_base_width; a d_ff given is taken to scale with d_model (the ratio is m)."""
    if cfg.parametrization != "mup" or cfg.d_ff is not None:
        return width_mult(cfg)
    return cfg.ff_dim / cfg.model_copy(update={"d_model": cfg.mup_base_width}).ff_dim


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.scale = attention_scale(cfg)
        hd = cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.d_model, bias=False)
        self.q_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None

    def forward(self, x, cos, sin, mask, sp=None):
        """mask: None (plain causal), a (B, 1, T, T) bool tensor for SDPA, or a FlexAttention BlockMask (of the
        whole sequence under sequence parallelism `sp`, where x holds this rank's T/k positions)."""
        B, T, _ = x.shape
        hd = self.cfg.head_dim
        # -1: the heads this rank holds (all of them; H/T and KV/T of them under tensor parallelism)
        q = self.wq(x).view(B, T, -1, hd).transpose(1, 2)  # (B, H, T, hd)
        k = self.wk(x).view(B, T, -1, hd).transpose(1, 2)  # (B, KV, T, hd)
        v = self.wv(x).view(B, T, -1, hd).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if sp is not None:  # Ulysses: (B, T/k, H, hd) -> attention on H/k heads of the whole sequence -> back
            local = _attention_bthd if self.scale is None else functools.partial(_attention_bthd, scale=self.scale)
            y = sp.attention(local)(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0, None, mask)
            return self.wo(y.reshape(B, T, -1))
        return self.wo(_attention(q, k, v, mask, self.scale).transpose(1, 2).reshape(B, T, -1))


def _attention(q, k, v, mask, scale=None):
    """q (B, H, T, hd), k and v (B, KV, T, hd) -> (B, H, T, hd); mask as Attention.forward's; scale on q·k (None:
    1/√hd)."""
    gqa = q.shape[1] != k.shape[1]
    if mask is not None and not isinstance(mask, torch.Tensor):
        return _flex_attention(q, k, v, mask, scale)
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa, scale=scale)


def _attention_bthd(q, k, v, mask, scale=None):
    """_attention on (B, T, heads, hd) tensors, the layout DeepSpeed's Ulysses attention hands over."""
    return _attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, scale).transpose(1, 2)


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.ff_dim, bias=False)  # gate
        self.w3 = nn.Linear(cfg.d_model, cfg.ff_dim, bias=False)  # up
        self.w2 = nn.Linear(cfg.ff_dim, cfg.d_model, bias=False)  # down (an output projection)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x, cos, sin, mask, recompute: str = "none", sp=None):
        """recompute: "none"; "block": this block's activations are recomputed in backward; "attention": only
        its attention half's (non-reentrant torch checkpointing: the same ops again, so the same gradients)."""
        if recompute == "block":
            return checkpoint(self._forward, x, cos, sin, mask, sp, use_reentrant=False)
        if recompute == "attention":
            x = x + checkpoint(self._attention, x, cos, sin, mask, sp, use_reentrant=False)
        else:
            x = x + self._attention(x, cos, sin, mask, sp)
        return x + self.mlp(self.mlp_norm(x))

    def _attention(self, x, cos, sin, mask, sp=None):
        return self.attn(self.attn_norm(x), cos, sin, mask, sp)

    def _forward(self, x, cos, sin, mask, sp=None):
        x = x + self._attention(x, cos, sin, mask, sp)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.width_mult = width_mult(cfg)  # μP's m (1.0 standard): the logits scale by it, most hidden matrices too
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        # normal(0, 0.02); the projections that write into the residual stream scaled by 1/sqrt(2L)
        # so the residual's variance does not grow with depth (GPT-2 / Megatron).
        std, out_std = self.cfg.init_std, self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)
        ratios = self.fan_in_ratios()
        for name, p in self.named_parameters():
            if p.ndim < 2:
                continue  # norm gains stay 1
            s = out_std if name.endswith(("attn.wo.weight", "mlp.w2.weight")) else std
            # μP: a hidden weight's variance goes as 1/fan_in (TP5 Table 8), the base model's at ratio 1.
            nn.init.normal_(p, mean=0.0, std=s / math.sqrt(ratios.get(id(p), 1.0)))

    def hidden_matrices(self) -> list[nn.Parameter]:
        """μP's hidden weights: the matrices whose two sides both grow with width (every block's projections). Not the
        embedding (its input side is the vocabulary) nor the head (its output side is): those are vector-like."""
        return [p for p in self.blocks.parameters() if p.ndim >= 2]

    def fan_in_ratios(self) -> dict[int, float]:
        """{id(hidden matrix): its fan-in over the base model's} under μP (empty for the standard model): m for
        every projection whose input is the model width or the heads, the MLP width's ratio for mlp.w2."""
        if self.cfg.parametrization != "mup":
            return {}
        ratios = {id(p): self.width_mult for p in self.hidden_matrices()}
        ratios.update({id(block.mlp.w2.weight): mlp_width_mult(self.cfg) for block in self.blocks})
        return ratios

    def forward(self, tokens, doc_ids=None, positions=None, sp=None):
        """tokens (B, T) -> logits (B, T, V). doc_ids (B, T) confine attention to each document;
        positions (B, T) are RoPE positions (default 0..T-1, or per document when doc_positions).
        sp: a SequenceParallel group (trainer/parallel/sequence.py) whose ranks split each sequence; the inputs
        are then this rank's T/k positions of it."""
        B, T = tokens.shape
        if positions is None or not self.cfg.doc_positions:
            start = sp.offset(T) if sp is not None else 0
            positions = torch.arange(start, start + T, device=tokens.device).expand(B, T)
        cos, sin = rope_angles(positions, self.cfg.head_dim, self.cfg.rope_base)
        use_flex = self.cfg.attention == "flex" or (self.cfg.attention == "auto" and tokens.is_cuda)
        mask = None
        if doc_ids is not None:
            whole = sp.full(doc_ids) if sp is not None else doc_ids  # attention sees the whole sequence
            mask = flex_document_mask(whole) if use_flex else document_causal_mask(whole)
        elif sp is not None:  # plain causal over the whole sequence: one document
            mask = document_causal_mask(torch.zeros(B, T * sp.size, dtype=torch.long, device=tokens.device))
        x = self.tok_emb(tokens)  # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, mask, recompute=self.recompute(i) if torch.is_grad_enabled() else "none", sp=sp)
        logits = self.head(self.norm(x))  # (B, T, V)
        # μP's output multiplier 1/m (TP5 Table 8): the head's update moves each logit by O(1), not O(width).
        return logits if self.cfg.parametrization == "standard" else logits * (1.0 / self.width_mult)

    def compile_blocks(self) -> None:
        """torch.compile each block in place (parameter names stay, so do checkpoints): fused kernels for the
        norms, SwiGLU and RoPE, one compiled graph reused by every layer."""
        for block in self.blocks:
            block.compile(dynamic=False)

    def recompute(self, layer: int) -> str:
        """What block `layer` recomputes in backward (model.activation_checkpointing, checkpoint_every)."""
        mode = self.cfg.activation_checkpointing
        if mode == "full":
            return "block" if layer % self.cfg.checkpoint_every == 0 else "none"
        return "attention" if mode == "selective" else "none"


def lm_loss(logits, targets, z_loss: float = 0.0):
    """Mean next-token cross-entropy in fp32, plus z_loss · mean(log²Z). Returns (loss, ce)."""
    logits = logits.float().flatten(0, 1)  # (B·T, V)
    ce = F.cross_entropy(logits, targets.flatten())
    if z_loss == 0.0:
        return ce, ce
    # log Z drifting away from 0 makes bf16 logits lose precision; the penalty keeps it near 0 (PaLM).
    log_z = torch.logsumexp(logits, dim=-1)
    return ce + z_loss * log_z.pow(2).mean(), ce


class CausalLM(nn.Module):
    """The transformer plus its loss, so DeepSpeed's engine(batch) returns what backward needs."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.transformer = Transformer(cfg)

    def forward(self, inputs, targets, doc_ids=None, positions=None, sp=None):
        logits = self.transformer(inputs, doc_ids=doc_ids, positions=positions, sp=sp)
        loss, ce = lm_loss(logits, targets, self.transformer.cfg.z_loss)
        return loss, ce.detach()


def standard_weights(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The weights (CausalLM's or Transformer's names) of the standard model that computes what the μP model `cfg`
    computes with `state`, for a format that knows neither μP multiplier (the Hugging Face export): the logits' 1/m
    folded into the head, the attention's factor over 1/√d_head into wq (RoPE rotates q linearly, so a constant
    passes through it), or into q_norm's gain with QK-norm. The state itself when the model is standard."""
    if cfg.parametrization == "standard":
        return state
    q_factor = attention_scale(cfg) * math.sqrt(cfg.head_dim)
    q_weight = "attn.q_norm.weight" if cfg.qk_norm else "attn.wq.weight"
    out = {}
    for name, t in state.items():
        if name.removeprefix("transformer.") == "head.weight":
            t = t * (1.0 / width_mult(cfg))
        elif name.endswith(q_weight):
            t = t * q_factor
        out[name] = t
    return out
