"""trainer.parallel.engine: the DeepSpeed config the run's config makes, and what a real engine built from it does with
gradients under bf16 (fp32 reduction and accumulation), and the fp32 weights read back from its checkpoint."""

import pytest
import torch

from tests.trainer.conftest import run_dict
from trainer.config import RunConfig, from_dict
from trainer.parallel.engine import deepspeed_config


def _cfg(tmp_path, **sections):
    return from_dict(RunConfig, run_dict(tmp_path, **sections))


def test_accumulation_clipping_and_precision_from_the_run(tmp_path):
    ds = deepspeed_config(_cfg(tmp_path, deepspeed={"zero_stage": 1, "bf16": True}), world_size=2)
    sizes = ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
    assert sizes == (8, 2, 2)
    assert ds["bf16"] == {"enabled": True} and ds["zero_optimization"] == {"stage": 1}
    assert ds["gradient_clipping"] == 1.0 and "checkpoint" not in ds


def test_fp32_zero0_clips_in_the_gate_and_universal_loading_is_asked_for(tmp_path):
    ds = deepspeed_config(_cfg(tmp_path, deepspeed={"zero_stage": 0, "bf16": False}), world_size=1,
                          load_universal=True)
    assert ds["gradient_clipping"] == 0.0 and ds["checkpoint"] == {"load_universal": True}


def test_precision_must_be_resolved_first(tmp_path):
    with pytest.raises(AssertionError, match="resolve deepspeed.bf16"):
        deepspeed_config(_cfg(tmp_path), world_size=1)


def _engine(tmp_path, stage: int, bf16: bool):
    """A real DeepSpeed engine of the run (one rank), as the trainer builds it."""
    from trainer.parallel.engine import init_distributed
    from trainer.train_module import TrainModule

    module = TrainModule(_cfg(tmp_path, deepspeed={"zero_stage": stage, "bf16": bf16}), init_distributed())
    module.build_engine()
    return module


@pytest.mark.slow  # DeepSpeed engines: seconds each on 2 cores
@pytest.mark.parametrize("stage, optimizer", [(1, "BF16_Optimizer"), (2, "DeepSpeedZeroOptimizer")])
def test_bf16_reduces_and_accumulates_gradients_in_fp32(tmp_path, stage, optimizer):
    engine = _engine(tmp_path, stage, bf16=True).engine
    assert engine.get_data_types() == (torch.bfloat16, torch.float32)  # bf16 weights, fp32 accumulation
    assert engine.communication_data_type == torch.float32  # DeepSpeed's default under bf16 is bf16
    assert type(engine.optimizer).__name__ == optimizer
    if stage == 1:  # the bf16 optimizer keeps an fp32 gradient per parameter partition
        assert all(g.dtype == torch.float32 for g in engine.optimizer.fp32_groups_gradients_flat)
    else:  # ZeRO-2 accumulates the reduced gradient partitions in fp32
        assert engine.optimizer.gradient_accumulation_dtype == torch.float32


@pytest.mark.slow  # DeepSpeed engines: seconds each on 2 cores
def test_zero0_bf16_reduces_in_fp32_and_fp32_runs_keep_deepspeeds_defaults(tmp_path):
    zero0 = _engine(tmp_path / "bf16", 0, bf16=True).engine
    # DeepSpeed 0.19.8 has no fp32 accumulation for bf16 without ZeRO (it raises NotImplementedError): reduction only.
    assert zero0.communication_data_type == torch.float32 and zero0.get_data_types() == (torch.bfloat16,) * 2
    fp32 = _engine(tmp_path / "fp32", 1, bf16=False).engine
    assert fp32.communication_data_type == torch.float32 and fp32.get_data_types() == (torch.float32,) * 2
    assert "data_types" not in deepspeed_config(_cfg(tmp_path, deepspeed={"zero_stage": 1, "bf16": False}), 1)


@pytest.mark.slow  # two trainers of three steps each per case
@pytest.mark.parametrize("stage, bf16, skipped", [(0, False, True), (1, True, True), (1, False, False)])
def test_alone_the_gradient_all_reduce_is_skipped_where_it_only_communicates_and_nothing_changes(tmp_path, stage, bf16,
                                                                                                 skipped):
    """One rank: ZeRO-0's and the bf16 optimizer's all-reduce (flatten, scale by 1/1, reduce over one rank, copy back) is
    skipped, bit for bit the same steps (accumulation over 4 micro-batches included); ZeRO-1's own optimizer moves the
    gradients into its partition there and keeps it."""
    from trainer.train import Trainer

    runs = []
    for forced in (False, True):
        trainer = Trainer(_cfg(tmp_path / str(forced), deepspeed={"zero_stage": stage, "bf16": bf16},
                               checkpoint={"save_final": False}))
        assert trainer.engine.enable_backward_allreduce is not skipped
        if forced:
            trainer.engine.enable_backward_allreduce = True  # what DeepSpeed does by itself
        losses = [trainer.step().loss for _ in range(3)]
        runs.append((losses, torch.cat([p.detach().float().flatten() for p in trainer.model.parameters()])))
        trainer.close()
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])


@pytest.mark.slow  # a DeepSpeed engine, one step and a checkpoint
def test_the_fp32_weights_of_a_bf16_zero1_checkpoint_are_its_master_weights(tmp_path):
    from deepspeed.utils import safe_get_full_fp32_param

    from tests.trainer.conftest import TEXT, TOKENIZER, TOP_TOKENS
    from trainer.parallel.engine import zero_fp32_weights
    from trainer.data.text_source import TextSource, TextSourceConfig

    module = _engine(tmp_path, 1, bf16=True)
    source = TextSource(TextSourceConfig(path=str(TEXT), tokenizer=str(TOKENIZER), seq_len=64, top_tokens=TOP_TOKENS))
    module.optimizer.gate = lambda: True
    for m in range(4):  # one optimizer step: the master weights move away from the bf16 copies' values
        loss = module.forward(source.batch([2 * m, 2 * m + 1]), last=m == 3)
        module.backward(loss)
    module.engine.step()
    module.engine.save_checkpoint(str(tmp_path / "ckpt"), tag="ds")
    weights = zero_fp32_weights(tmp_path / "ckpt" / "ds")
    params = dict(module.model.named_parameters())
    assert set(weights) == set(params)
    assert any(not torch.equal(weights[name], param.float()) for name, param in params.items())  # not the bf16 copies
    for name, param in params.items():
        assert weights[name].dtype == torch.float32
        assert torch.equal(weights[name], safe_get_full_fp32_param(param)), name


@pytest.mark.slow  # a 2-rank trainer run (torchrun, gloo)
def test_the_fp32_weights_of_a_two_rank_bf16_zero1_checkpoint_round_to_its_bf16_weights(tmp_path):
    """Each rank's shard holds a slice of the flat fp32 masters: put together in rank order, they round to exactly
    the bf16 weights the model computed with (the optimizer's copy back to the model is that rounding)."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO
    from tests.trainer.conftest import write_run
    from trainer.parallel.engine import zero_fp32_weights

    run = write_run(tmp_path / "run.json", train_tokens=2 * 8 * 64, deepspeed={"zero_stage": 1, "bf16": True},
                    metrics={"eval_batches": 0, "tensorboard": False})
    torchrun = (os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone", "--nproc_per_node", "2")
    result = subprocess.run([*torchrun, "-m", "trainer", "--config", str(run)], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ds = tmp_path / "out" / "checkpoints" / "step-00000002" / "ds"
    assert len(list(ds.glob("bf16_zero_pp_rank_*_optim_states.pt"))) == 2
    weights = zero_fp32_weights(ds)
    module = torch.load(ds / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["module"]
    assert set(weights) == set(module)
    for name, bf16 in module.items():
        assert bf16.dtype == torch.bfloat16 and torch.equal(weights[name].to(torch.bfloat16), bf16), name
    assert any(not torch.equal(weights[name], bf16.float()) for name, bf16 in module.items())  # fp32, not the copies


PROBE = """
import os, sys
import torch
from trainer.parallel.engine import _import_deepspeed_muon_uncompiled
_import_deepspeed_muon_uncompiled()
assert "deepspeed.runtime.zero.muon.muon_optimizer" in sys.modules
assert "torch._inductor.compile_fx" not in sys.modules, "importing Muon compiled its kernels"
assert os.environ.get("TORCHDYNAMO_DISABLE") == sys.argv[1] or (sys.argv[1] == "" and "TORCHDYNAMO_DISABLE" not in os.environ)
from torch._dynamo.utils import counters
double = torch.compile(lambda x: x * 2, backend="eager")
assert torch.equal(double(torch.ones(3)), torch.full((3,), 2.0))
print("compiled frames", counters["frames"]["ok"])
"""


@pytest.mark.parametrize("disable", ["", "0"])
def test_deepspeeds_muon_is_imported_without_compiling_and_compiling_still_works_after(disable):
    """The ZeRO check's Muon import costs no inductor import (1.3-1.7 s a rank), the environment is as it was, and
    torch.compile afterwards still compiles (flex attention and compiled blocks rely on it)."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    env = {k: v for k, v in os.environ.items() if k != "TORCHDYNAMO_DISABLE"}
    if disable:
        env["TORCHDYNAMO_DISABLE"] = disable
    done = subprocess.run([sys.executable, "-c", PROBE, disable], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) >= 1, done.stdout
