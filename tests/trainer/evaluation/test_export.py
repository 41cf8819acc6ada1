"""Export to the Hugging Face Llama format: transformers' LlamaForCausalLM gives the trainer's logits."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import SHARED_DATA
from trainer.model.config import ModelConfig
from trainer.evaluation.export import ExportError, export_hf_llama
from trainer.model.transformer import CausalLM

CFG = ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, rope_base=50000.0)


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_llama_for_causal_lm_reproduces_the_trainers_logits(tmp_path):
    import transformers
    torch.manual_seed(0)
    cfg = ModelConfig(**{**CFG.__dict__, "vocab_size": 50304})  # GPT-2's tokenizer, padded to a multiple of 64
    model = CausalLM(cfg).eval()
    for p in model.parameters():  # norm gains away from 1 so a swapped norm would show
        if p.ndim == 1:
            torch.nn.init.uniform_(p, 0.5, 1.5)
    out = export_hf_llama(model.state_dict(), cfg, tmp_path / "hf", seq_len=256,
                          tokenizer=SHARED_DATA / "tokenizers" / "gpt2" / "tokenizer.json")
    assert {p.name for p in out.iterdir()} == {"config.json", "generation_config.json", "model.safetensors",
                                               "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    # Loads with no extra arguments, special tokens and ids set (lm-eval needs a BOS/prefix id and a pad id).
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.pad_token_id) == ("<|endoftext|>", 50256, 50256)
    assert tokenizer("Hello world")["input_ids"] == [15496, 995]  # GPT-2's ids, nothing added around them
    generation = transformers.GenerationConfig.from_pretrained(out)
    assert (generation.bos_token_id, generation.eos_token_id, generation.pad_token_id) == (50256, 50256, 50256)
    hf = transformers.LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    assert hf.config.rope_parameters["rope_theta"] == 50000.0 and hf.config.num_key_value_heads == 2
    tokens = torch.randint(0, CFG.vocab_size, (2, 96))
    with torch.no_grad():
        ours = model.transformer(tokens)
        theirs = hf(tokens).logits
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False


def small_tokenizer(folder, vocab_size: int) -> str:
    """A byte-level BPE of at most vocab_size ids with the pipeline's EOS and PAD, trained on tinyshakespeare."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    text = (SHARED_DATA / "books" / "tinyshakespeare.txt").read_text().splitlines()[:2000]
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|pad|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = folder / "small-tokenizer.json"
    tok.save(str(path))
    return str(path)


@pytest.mark.slow  # loads transformers
def test_a_model_with_qk_norm_is_exported_as_qwen3_with_the_trainers_logits(tmp_path):
    """Llama has no QK-norm; Qwen3 is Llama's layout with it, so lm-eval's AutoModelForCausalLM loads the demo's model."""
    import transformers
    torch.manual_seed(0)
    cfg = ModelConfig(**{**CFG.__dict__, "qk_norm": True})
    model = CausalLM(cfg).eval()
    for p in model.parameters():  # norm gains away from 1 so a swapped or missing q_norm / k_norm would show
        if p.ndim == 1:
            torch.nn.init.uniform_(p, 0.5, 1.5)
    out = export_hf_llama(model.state_dict(), cfg, tmp_path / "hf", seq_len=256)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    tokens = torch.randint(0, cfg.vocab_size, (2, 96))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model.transformer(tokens), rtol=1e-4, atol=1e-4)


def test_a_state_dict_of_another_model_is_refused():
    cfg = ModelConfig(**{**CFG.__dict__, "qk_norm": True})
    with pytest.raises(ExportError, match="q_norm"):  # a model without QK-norm's weights, exported as one with it
        export_hf_llama(CausalLM(CFG).state_dict(), cfg, "/nonexistent")


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_pretrain_export_turns_a_zero_checkpoint_into_the_same_model(tmp_path, capsys):
    """ZeRO-1 bf16 run -> checkpoint -> `pretrain export`: HF's logits are those of the fp32 master weights."""
    import transformers

    from assets.cli import main
    from tests.trainer.conftest import run_dict
    from trainer.config import RunConfig, from_dict
    from trainer.train import Trainer
    from trainer.checkpoint.weights import checkpoint_weights

    cfg = from_dict(RunConfig, run_dict(tmp_path / "out", train_tokens=3 * 8 * 64,
                                        deepspeed={"zero_stage": 1, "bf16": True}))
    Trainer(cfg).fit()  # save_final: a committed step-3
    step = tmp_path / "out" / "checkpoints" / "step-00000003"
    # GPT-2's 50,257 ids do not fit this model's vocabulary: refused by name, not exported as a broken model.
    gpt2 = str(SHARED_DATA / "tokenizers" / "gpt2" / "tokenizer.json")
    assert main(["export", str(step), str(tmp_path / "hf"), "--tokenizer", gpt2]) == 2
    assert "larger than the model's (model.vocab_size" in capsys.readouterr().err
    assert main(["export", str(step), str(tmp_path / "hf"), "--tokenizer", small_tokenizer(tmp_path, cfg.model.vocab_size)]) == 0
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf").pad_token == "<|pad|>"
    state, manifest = checkpoint_weights(step)
    model = CausalLM(cfg.model).eval()
    model.load_state_dict(state)  # every parameter, by name, in fp32
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf", torch_dtype=torch.float32).eval()
    tokens = torch.randint(0, cfg.model.vocab_size, (1, 64))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model.transformer(tokens), rtol=1e-4, atol=1e-4)
    # A step folder that is not one, or a corrupt one, is refused by name.
    capsys.readouterr()
    assert main(["export", str(tmp_path / "out"), str(tmp_path / "hf2")]) == 2
    assert "step folder" in capsys.readouterr().err
    shard = next((step / "ds").glob("*optim_states.pt"))
    shard.write_bytes(shard.read_bytes()[:-10])
    assert main(["export", str(step), str(tmp_path / "hf3"), "--tokenizer", "x"]) == 2
    assert "corrupt" in capsys.readouterr().err
