"""Export the trainer's model as a Hugging Face Llama model: config.json, model.safetensors, tokenizer.json.

    export_hf_llama(state_dict, model_cfg, out_dir, tokenizer="tokenizer.json", seq_len=2048)

The architecture is Llama's, so the mapping is one name per tensor: RoPE uses the same rotate-half
layout (trainer/model.py apply_rope), SwiGLU is gate (w1) / up (w3) / down (w2), no biases, untied
head. What Llama cannot express is refused rather than exported wrongly: QK-norm (Llama has none)
and document-restarted positions do not matter for a single sequence, which is how HF runs it.
The file needs only torch and safetensors; transformers is used by the test that loads the result.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from trainer.config import ModelConfig


class ExportError(ValueError):
    pass


def hf_llama_config(cfg: ModelConfig, *, seq_len: int, eos_id: int | None = None, pad_id: int | None = None) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ff_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.norm_eps,
        "hidden_act": "silu",
        "max_position_embeddings": seq_len,
        # transformers >= 5 reads rope_parameters; older releases read rope_theta.
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base},
        "rope_theta": cfg.rope_base,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": cfg.init_std,
        "bos_token_id": eos_id,  # documents are separated by EOS only
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": "float32",
    }


def hf_llama_state_dict(state_dict: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our parameter names (CausalLM's, or Transformer's) -> Llama's, as contiguous fp32 tensors."""
    if cfg.qk_norm:
        raise ExportError("model.qk_norm: a Llama model has no QK-norm; this model cannot be exported as Llama")
    sd = {k.removeprefix("transformer."): v for k, v in state_dict.items()}
    names = {"tok_emb.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "head.weight": "lm_head.weight"}
    per_layer = {"attn_norm.weight": "input_layernorm.weight", "mlp_norm.weight": "post_attention_layernorm.weight",
                 "attn.wq.weight": "self_attn.q_proj.weight", "attn.wk.weight": "self_attn.k_proj.weight",
                 "attn.wv.weight": "self_attn.v_proj.weight", "attn.wo.weight": "self_attn.o_proj.weight",
                 "mlp.w1.weight": "mlp.gate_proj.weight", "mlp.w3.weight": "mlp.up_proj.weight",
                 "mlp.w2.weight": "mlp.down_proj.weight"}
    for i in range(cfg.n_layers):
        names.update({f"blocks.{i}.{ours}": f"model.layers.{i}.{theirs}" for ours, theirs in per_layer.items()})
    missing = sorted(set(names) - set(sd))
    extra = sorted(set(sd) - set(names))
    if missing or extra:
        raise ExportError(f"the state dict does not match model config: missing {missing[:5]}, unexpected {extra[:5]}")
    return {names[k]: v.detach().to(torch.float32).contiguous().clone() for k, v in sd.items()}


def export_hf_llama(state_dict: dict[str, torch.Tensor], cfg: ModelConfig, out_dir: str | Path, *,
                    tokenizer: str | Path | None = None, seq_len: int = 2048, eos_id: int | None = None,
                    pad_id: int | None = None) -> Path:
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = hf_llama_state_dict(state_dict, cfg)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = hf_llama_config(cfg, seq_len=seq_len, eos_id=eos_id, pad_id=pad_id)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer is not None:
        shutil.copyfile(tokenizer, out / "tokenizer.json")
    return out
