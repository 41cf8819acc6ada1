"""Export the trainer's model as a Hugging Face Llama model: config.json, generation_config.json,
model.safetensors and, with a tokenizer, tokenizer.json, tokenizer_config.json and special_tokens_map.json, so
`AutoModelForCausalLM` and `AutoTokenizer` (and lm-evaluation-harness) load it with no extra arguments.

    export_hf_llama(state_dict, model_cfg, out_dir, tokenizer="tokenizer.json", seq_len=2048)
    export_checkpoint("checkpoints/step-00000100", out_dir, tokenizer="tokenizer.json")  # a committed step

The architecture is Llama's, so the mapping is one name per tensor: RoPE uses the same rotate-half
layout (trainer/model/transformer.py apply_rope), SwiGLU is gate (w1) / up (w3) / down (w2), no biases, untied
head. A model with QK-norm (model.qk_norm), which Llama cannot express, is exported as Qwen3, Llama's layout with an
RMSNorm over each head's queries and keys before RoPE, as ours (q_norm / k_norm, one gain per head dimension).
Document-restarted positions do not matter for a single sequence, which is how HF runs it.
The special tokens come from the tokenizer: its EOS (the pipeline's "<|endoftext|>", or the names other
tokenizers use) is also BOS, since documents are separated by EOS only, and the model's "<|pad|>" (else EOS) pads.
The file needs only torch and safetensors; transformers is used by the test that loads the result.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from trainer.model.config import ModelConfig
from trainer.model.transformer import standard_weights


class ExportError(ValueError):
    pass


def hf_llama_config(cfg: ModelConfig, *, seq_len: int, eos_id: int | None = None, pad_id: int | None = None) -> dict:
    # Qwen3 is Llama with QK-norm; its sliding window stays off, so every layer attends to the whole sequence.
    qwen3 = {"use_sliding_window": False, "sliding_window": None, "max_window_layers": cfg.n_layers}
    return {
        "architectures": ["Qwen3ForCausalLM" if cfg.qk_norm else "LlamaForCausalLM"],
        "model_type": "qwen3" if cfg.qk_norm else "llama",
        **(qwen3 if cfg.qk_norm else {}),
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
    """Our parameter names (CausalLM's, or Transformer's) -> Llama's (Qwen3's with QK-norm), contiguous fp32."""
    # A μP model's output and attention multipliers, which Llama does not have, folded into its weights.
    sd = {k.removeprefix("transformer."): v for k, v in standard_weights(state_dict, cfg).items()}
    names = {"tok_emb.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "head.weight": "lm_head.weight"}
    per_layer = {"attn_norm.weight": "input_layernorm.weight", "mlp_norm.weight": "post_attention_layernorm.weight",
                 "attn.wq.weight": "self_attn.q_proj.weight", "attn.wk.weight": "self_attn.k_proj.weight",
                 "attn.wv.weight": "self_attn.v_proj.weight", "attn.wo.weight": "self_attn.o_proj.weight",
                 "mlp.w1.weight": "mlp.gate_proj.weight", "mlp.w3.weight": "mlp.up_proj.weight",
                 "mlp.w2.weight": "mlp.down_proj.weight"}
    if cfg.qk_norm:
        per_layer.update({"attn.q_norm.weight": "self_attn.q_norm.weight", "attn.k_norm.weight": "self_attn.k_norm.weight"})
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
    if tokenizer is not None:
        eos_token, pad_token, eos_id, pad_id = special_tokens(tokenizer, vocab_size=cfg.vocab_size)
        shutil.copyfile(tokenizer, out / "tokenizer.json")
        (out / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": seq_len,
            "bos_token": eos_token, "eos_token": eos_token, "pad_token": pad_token,
            "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        }, indent=2) + "\n")
        (out / "special_tokens_map.json").write_text(json.dumps(
            {"bos_token": eos_token, "eos_token": eos_token, "pad_token": pad_token}, indent=2) + "\n")
    config = hf_llama_config(cfg, seq_len=seq_len, eos_id=eos_id, pad_id=pad_id)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": pad_id}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return out


def export_checkpoint(step_folder: str | Path, out_dir: str | Path, *, tokenizer: str | Path) -> Path:
    """A committed checkpoint step folder (any ZeRO stage, its fp32 weights) as a Hugging Face Llama model whose
    context length is the run's sequence length: what `pretrain export` and the lm-eval harness load."""
    from trainer.checkpoint.weights import checkpoint_weights, model_config

    state, manifest = checkpoint_weights(step_folder)
    return export_hf_llama(state, model_config(manifest), out_dir, tokenizer=tokenizer,
                           seq_len=manifest["config"]["batch"]["seq_len"])


PAD_NAMES = ("<|pad|>", "<pad>", "[PAD]")


def special_tokens(tokenizer: str | Path, *, vocab_size: int) -> tuple[str, str, int, int]:
    """(EOS string, PAD string, EOS id, PAD id) of a tokenizer.json; PAD is EOS when it has none. A tokenizer with
    more ids than the model's vocabulary is refused: the model could not embed its tokens."""
    from tokenizers import Tokenizer

    from trainer.data.text_source import EOS_NAMES

    tok = Tokenizer.from_file(str(tokenizer))
    if tok.get_vocab_size() > vocab_size:
        raise ExportError(f"{tokenizer}: its vocabulary ({tok.get_vocab_size():,} ids) is larger than the model's "
                          f"(model.vocab_size {vocab_size:,}): not the tokenizer this model was trained with")
    eos = next((name for name in EOS_NAMES if tok.token_to_id(name) is not None), None)
    if eos is None:
        raise ExportError(f"{tokenizer}: no EOS token among {EOS_NAMES}")
    pad = next((name for name in PAD_NAMES if tok.token_to_id(name) is not None), eos)
    return eos, pad, tok.token_to_id(eos), tok.token_to_id(pad)
