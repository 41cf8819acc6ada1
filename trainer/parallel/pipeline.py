"""Pipeline parallelism: our CausalLM as DeepSpeed's PipelineModule, trained by its PipelineEngine (1F1B).

    pipe = pipeline_module(model, stages=2)        # the blocks split evenly; embedding first, norm + head + loss last
    engine, *_ = deepspeed.initialize(model=pipe, optimizer=..., config=...)
    loss = engine.train_batch(iter(micro_batches))  # m micro-batches: forward, backward, the optimizer step

A micro-batch is ((inputs, doc_ids, positions), targets), as trainer.train_module.to_device gives them. Between
stages the pipeline sends a tuple of tensors: the residual stream x and the document ids and RoPE positions that
every block needs for its mask and rotation (integer tensors: DeepSpeed sends them without gradients). Each block
rebuilds its mask and angles from them, so no stage depends on another's buffers. The last stage's loss is
trainer.model.transformer.lm_loss of the same logits, z_loss included: the pipelined model computes what CausalLM computes.

The layers are the CausalLM's own modules (same seeded initialisation, same parameters), so a pipeline run and
an unpipelined one start from identical weights.
"""

from __future__ import annotations

import torch
from torch import nn

from trainer.model.transformer import CausalLM, document_causal_mask, flex_document_mask, lm_loss, rope_angles


class EmbeddingStage(nn.Module):
    """First layer: token embedding; passes the document ids and positions on (positions 0..T-1 when the model
    does not restart them at each document, as Transformer.forward)."""

    def __init__(self, model: CausalLM):
        super().__init__()
        self.cfg = model.transformer.cfg
        self.tok_emb = model.transformer.tok_emb

    def forward(self, inputs):
        tokens, doc_ids, positions = inputs
        if not self.cfg.doc_positions:
            B, T = tokens.shape
            positions = torch.arange(T, device=tokens.device).expand(B, T).contiguous()
        return self.tok_emb(tokens), doc_ids, positions


class BlockStage(nn.Module):
    """One transformer block with its document-causal mask (SDPA) and RoPE angles, rebuilt from what it receives."""

    def __init__(self, model: CausalLM, layer: int):
        super().__init__()
        self.cfg = model.transformer.cfg
        self.block = model.transformer.blocks[layer]

    def forward(self, inputs):
        x, doc_ids, positions = inputs
        cos, sin = rope_angles(positions, self.cfg.head_dim, self.cfg.rope_base)
        # The attention kernel Transformer.forward would choose (FlexAttention on CUDA under "auto").
        use_flex = self.cfg.attention == "flex" or (self.cfg.attention == "auto" and x.is_cuda)
        mask = flex_document_mask(doc_ids) if use_flex else document_causal_mask(doc_ids)
        return self.block(x, cos, sin, mask), doc_ids, positions


class HeadStage(nn.Module):
    """Last layer: final norm and head -> logits (the loss is the PipelineModule's loss_fn)."""

    def __init__(self, model: CausalLM):
        super().__init__()
        self.norm = model.transformer.norm
        self.head = model.transformer.head

    def forward(self, inputs):
        x, _, _ = inputs
        return self.head(self.norm(x))


class PipelineLoss:
    """CausalLM's training loss (cross-entropy plus z_loss) on the last stage's logits."""

    def __init__(self, z_loss: float):
        self.z_loss = z_loss

    def __call__(self, logits, targets):
        loss, ce = lm_loss(logits, targets, self.z_loss)
        # Without gradients (DeepSpeed's eval_batch: evaluation, the canary) the cross-entropy alone, which is
        # what CausalLM reports as its held-out loss.
        return loss if torch.is_grad_enabled() else ce


def pipeline_module(model: CausalLM, *, stages: int, topology=None):
    """`model`'s layers as a PipelineModule of `stages` stages. The partition counts only BlockStage layers
    (DeepSpeed's "type:" method), so every stage gets n_layers / stages blocks (±1); the embedding joins the
    first stage and the head the last. "parameters" would weigh the vocabulary-sized embedding and head as
    several blocks and leave the first and last stages with fewer blocks; "uniform" counts them as blocks."""
    from deepspeed.pipe import PipelineModule

    cfg = model.transformer.cfg
    if cfg.activation_checkpointing != "none":
        raise ValueError("parallel.pipeline: model.activation_checkpointing is not supported with a pipeline "
                         "(set it to \"none\")")
    layers = [EmbeddingStage(model), *(BlockStage(model, i) for i in range(cfg.n_layers)), HeadStage(model)]
    where = {"topology": topology} if topology is not None else {"num_stages": stages}
    return PipelineModule(layers=layers, loss_fn=PipelineLoss(cfg.z_loss), partition_method="type:BlockStage",
                          **where)


def causal_lm_weights(ds_folder) -> dict[str, torch.Tensor]:
    """CausalLM's state_dict from a pipeline step's DeepSpeed files (export, init_from, evaluation read weights so).
    DeepSpeed writes one layer_<i>-model_states.pt per layer of the PipelineModule, in pipeline_module's order:
    the embedding, the blocks, then the norm and head."""
    from pathlib import Path

    files = sorted(Path(ds_folder).glob("layer_*-model_states.pt"))
    last = len(files) - 1
    state = {}
    for i, file in enumerate(files):
        layer = torch.load(file, map_location="cpu", weights_only=True)
        for name, tensor in layer.items():
            if i == 0 or i == last:  # EmbeddingStage's tok_emb; HeadStage's norm and head
                state[f"transformer.{name}"] = tensor
            else:  # BlockStage's block.<...> is blocks.<i - 1>.<...>
                state[f"transformer.blocks.{i - 1}.{name.removeprefix('block.')}"] = tensor
    return state
