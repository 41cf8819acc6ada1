"""The model's settings (ModelConfig, a run.json's `model`) and its parameter and FLOP counts (ParameterCount,
count_parameters, flops_per_token), which the planner, MFU and the scaling ladder read. Pydantic only, no torch:
the planner and the recipe's checks import it without the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trainer.base_config import RunConfigSection


@dataclass(frozen=True)
class ParameterCount:
    """A Llama-style model's weights, counted once (count_parameters, through ModelConfig.parameter_count and the
    planner's ModelShape.parameter_count) for the planner, MFU and the scaling ladder, each reading its own figure:

    - `total`: every weight, each once (a tied head shares the embedding's): memory, optimizer state, checkpoints,
      and the N of the scaling ladder's law (Hoffmann et al. 2022's count; assets/scaling/section.py says why not
      Kaplan's non-embedding one at a ladder's sizes).
    - `non_embedding`: all but the input embedding and the output head (Kaplan et al. 2020's N), for comparison with
      laws fitted on that count.
    - `matmul`: the weights a token is multiplied through, all but the input embedding (a lookup, no FLOPs) with
      the head's matrix counted even where it is the embedding's: 6·matmul is the training FLOPs per token before
      attention's 12·L·T·d (flops_per_token: MFU and the planner's GPU-hours).
    """

    embedding: int  # the input embedding, vocab × d_model
    head: int  # the output head's own matrix: vocab × d_model, 0 when tied to the embedding
    body: int  # the blocks (attention, MLP, their norms) and the final norm
    tied: bool = False

    @property
    def total(self) -> int:
        return self.embedding + self.head + self.body

    @property
    def non_embedding(self) -> int:
        return self.body

    @property
    def matmul(self) -> int:
        return self.body + (self.embedding if self.tied else self.head)


def count_parameters(*, vocab: int, d_model: int, layers: int, heads: int, kv_heads: int, d_ff: int,
                     qk_norm: bool = False, tied: bool = False) -> ParameterCount:
    """The weights of trainer.model.transformer's layout (no biases, RMSNorm one gain vector; per layer q, k, v, o,
    the SwiGLU's gate, up and down, two norms and, with QK-norm, a gain of head_dim each on queries and keys)."""
    head_dim = d_model // heads
    attention = 2 * d_model * d_model + 2 * d_model * kv_heads * head_dim  # q and o; k and v (grouped)
    mlp = 3 * d_model * d_ff
    norms = 2 * d_model + (2 * head_dim if qk_norm else 0)
    matrix = vocab * d_model
    return ParameterCount(embedding=matrix, head=0 if tied else matrix,
                          body=layers * (attention + mlp + norms) + d_model, tied=tied)  # + d_model: the final norm


def flops_per_token(params: ParameterCount, *, layers: int, d_model: int, seq_len: int,
                    attention: bool = True) -> float:
    """Training FLOPs per token, forward and backward: 6 per weight multiplied through (params.matmul) plus
    12·L·T·d for the attention scores and their weighted sum (PaLM appendix B; not halved for causality).
    attention=False leaves that term out: the 6·N·D of cost tables."""
    return 6 * params.matmul + (12 * layers * seq_len * d_model if attention else 0)


class ModelConfig(RunConfigSection):
    """Llama-style decoder shape (RMSNorm pre-norm, SwiGLU, RoPE, GQA, no biases, untied head)."""

    vocab_size: int = 50257
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None = n_heads (plain multi-head attention)
    d_ff: int | None = None  # None = 8/3 · d_model rounded up to a multiple of 64 (Llama's rule)
    rope_base: float = 10000.0  # long-context stages raise it
    qk_norm: bool = False
    z_loss: float = 0.0  # coefficient of log²Z, the squared log of the softmax normalizer
    norm_eps: float = 1e-5
    init_std: float = 0.02
    attention: Literal["auto", "flex", "sdpa"] = "auto"  # auto: FlexAttention on CUDA, SDPA elsewhere
    doc_positions: bool = True  # RoPE positions restart at each document of a packed sequence
    # Recompute activations in the backward pass instead of keeping them (memory for ~1/3 more compute):
    # none; full: whole blocks, every `checkpoint_every`-th one (1: all); selective: the attention half of every
    # block (its norm, projections and attention), the MLP's activations kept.
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    checkpoint_every: int = 1
    # torch.compile of every block (names and checkpoints unchanged); None: on CUDA only, where it pays for its
    # compile time (on a CPU it costs more than a short run gains).
    compile: bool | None = None
    # standard: today's model (init_std everywhere, 1/sqrt(head dim) attention, one LR). mup: Tensor Programs V's
    # μP for Adam (trainer.model.transformer.Transformer.width_mult): the model at d_model = mup_base_width (same
    # n_heads, n_layers) is the standard one, and an LR tuned there holds at other widths. Changes the model's
    # function, so a checkpoint resumes, continues or initialises only a run of the same mup settings.
    parametrization: Literal["standard", "mup"] = "standard"
    mup_base_width: int | None = None  # the width the LR was tuned at (mup only, where it is required)
    # The base model's head dim, which the attention scale √(base d_head)/d_head keeps at the base width's. None:
    # mup_base_width / n_heads (the heads keep their number and grow). Give it where the heads keep their size and
    # grow in number (a ladder of d_model 64 with 4 heads, 128 with 8): their head dim, so the scale stays 1/√d_head.
    mup_base_head_dim: int | None = None

    def _check(self) -> None:
        if self.parametrization == "mup":
            if self.mup_base_width is None:
                raise ValueError("model.mup_base_width: required with model.parametrization = \"mup\" (the width "
                                 "whose tuned learning rate the run takes over)")
            if self.mup_base_width < 1:
                raise ValueError(f"model.mup_base_width must be >= 1, got {self.mup_base_width}")
            if self.mup_base_head_dim is None and self.mup_base_width % self.n_heads:
                raise ValueError(f"model.mup_base_width ({self.mup_base_width}) must be a multiple of model.n_heads "
                                 f"({self.n_heads}) unless model.mup_base_head_dim is given: the base model's head dim "
                                 "is mup_base_width / n_heads")
            if self.mup_base_head_dim is not None and self.mup_base_head_dim < 1:
                raise ValueError(f"model.mup_base_head_dim must be >= 1, got {self.mup_base_head_dim}")
        else:
            for name in ("mup_base_width", "mup_base_head_dim"):
                if getattr(self, name) is not None:
                    raise ValueError(f"model.{name} is read only with model.parametrization = \"mup\" (this run is "
                                     "\"standard\")")
        if self.checkpoint_every < 1:
            raise ValueError(f"model.checkpoint_every must be >= 1, got {self.checkpoint_every}")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"model: head dim d_model/n_heads = {self.d_model // self.n_heads} must be even for RoPE")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"model.n_heads ({self.n_heads}) must be divisible by model.n_kv_heads ({self.kv_heads})")
        if self.z_loss < 0:
            raise ValueError(f"model.z_loss must be >= 0, got {self.z_loss}")

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ff_dim(self) -> int:
        return self.d_ff if self.d_ff is not None else -(-(8 * self.d_model // 3) // 64) * 64

    def parameter_count(self) -> ParameterCount:
        """The model's weights by use (ParameterCount): the head is never tied here."""
        return count_parameters(vocab=self.vocab_size, d_model=self.d_model, layers=self.n_layers, heads=self.n_heads,
                                kv_heads=self.kv_heads, d_ff=self.ff_dim, qk_norm=self.qk_norm)
