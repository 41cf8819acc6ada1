"""Zero-shot evaluation during training (metrics.downstream_interval): records at the right steps and token counts,
the same figures as the final-checkpoint evaluator gives the same weights, and off (said once) without benchmarks."""

import pytest

from tests.conftest import SHARED_DATA
from tests.trainer.conftest import read_metrics, run_dict
from trainer.config import RunConfig, from_dict

BENCHMARKS = SHARED_DATA / "benchmarks"
DOWNSTREAM = {"downstream_interval": 2, "downstream_tasks": ["lambada_openai", "piqa"], "downstream_limit": 6,
              "downstream_benchmarks": str(BENCHMARKS)}


@pytest.mark.slow  # a DeepSpeed engine, 5 steps and 3 evaluations
def test_zero_shot_records_every_interval_and_at_the_end_as_the_evaluator_scores_the_weights(tmp_path):
    from trainer.evaluation.evaluate import zero_shot
    from trainer.model.transformer import Transformer
    from trainer.train import Trainer
    from trainer.checkpoint.weights import checkpoint_weights

    # fp32 ZeRO-0: the checkpoint's weights are exactly those the last evaluation ran on.
    cfg = from_dict(RunConfig, run_dict(tmp_path / "out", train_tokens=5 * 8 * 64, deepspeed={"zero_stage": 0, "bf16": False},
                                        metrics={"log_interval": 1, "eval_batches": 1, "tensorboard": False, **DOWNSTREAM}))
    trainer = Trainer(cfg)
    trainer.fit()
    records = read_metrics(tmp_path / "out")
    downstream = [r for r in records if r["event"] == "downstream"]
    assert [r["step"] for r in downstream] == [2, 4, 5]  # every 2 steps, and the last
    tokens = {r["step"]: r["tokens"] for r in records if r["event"] == "train"}
    assert all(r["tokens"] == tokens[r["step"]] == r["step"] * 8 * 64 for r in downstream)
    for r in downstream:
        assert set(r["tasks"]) == {"lambada_openai", "piqa"} and r["seconds"] > 0
        assert r["tasks"]["lambada_openai"]["metric"] == "acc" and r["tasks"]["piqa"]["metric"] == "acc_norm"
        assert all(t["n"] == 6 and 0 <= t["acc"] <= 1 for t in r["tasks"].values())
        assert r["tasks"]["lambada_openai"]["perplexity"] > 1 and r["tasks"]["piqa"]["chance"] == 0.5

    # The final checkpoint, evaluated offline as the evaluation asset does, gives the last record's figures.
    state, _ = checkpoint_weights(tmp_path / "out" / "checkpoints" / "step-00000005")
    model = Transformer(cfg.model)
    model.load_state_dict({k.removeprefix("transformer."): v for k, v in state.items()})
    offline = zero_shot(model.eval(), trainer.train_source.encoder(), ["lambada_openai", "piqa"], BENCHMARKS, limit=6,
                        max_len=64)
    last = downstream[-1]["tasks"]
    for task, figures in offline.items():
        assert figures["acc"] == last[task]["acc"] and figures["n"] == last[task]["n"]
        for key in ("acc_norm", "perplexity"):
            if key in figures:
                assert last[task][key] == pytest.approx(figures[key], rel=1e-5), (task, key)


@pytest.mark.slow  # a DeepSpeed engine and 2 steps
def test_without_the_benchmark_folder_the_run_goes_on_and_says_so_once(tmp_path):
    from trainer.train import Trainer

    metrics = {**DOWNSTREAM, "downstream_interval": 1, "downstream_benchmarks": None, "tensorboard": False}
    Trainer(from_dict(RunConfig, run_dict(tmp_path / "out", train_tokens=2 * 8 * 64, metrics=metrics))).fit()
    records = read_metrics(tmp_path / "out")
    off = [r for r in records if r["event"] == "downstream_off"]
    assert len(off) == 1 and "metrics.downstream_benchmarks" in off[0]["reason"]
    assert not [r for r in records if r["event"] == "downstream"]
    assert [r["step"] for r in records if r["event"] == "train"] == [1, 2]


def test_the_renumbering_encoder_gives_the_ids_the_model_was_trained_on():
    from tests.trainer.conftest import TEXT, TOKENIZER, TOP_TOKENS
    from trainer.data.text_source import TextSource, TextSourceConfig

    source = TextSource(TextSourceConfig(path=str(TEXT), tokenizer=str(TOKENIZER), seq_len=64, top_tokens=TOP_TOKENS))
    first = TEXT.read_text(encoding="utf-8").split("\n\n")[0].strip()
    ids = source.encoder().encode(first).ids
    # The file's first document is the first tokens of the stream, the same ids the trainer saw, then EOS.
    assert len(ids) > 5 and ids == source.tokens[:len(ids)].tolist() and source.tokens[len(ids)] == source.eos
    assert max(source.encoder().encode("Zyzzyva quetzalcoatl").ids) < TOP_TOKENS  # rare words: "other", in range


def test_a_bad_downstream_setting_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match="metrics.downstream_tasks"):
        from_dict(RunConfig, run_dict(tmp_path, metrics={"downstream_tasks": ["mmlu_pro"]}))
    with pytest.raises(ValueError, match="metrics.downstream_limit"):
        from_dict(RunConfig, run_dict(tmp_path, metrics={"downstream_limit": 0}))



@pytest.mark.slow  # a 2-rank trainer run (torchrun, gloo)
def test_under_zero3_every_rank_runs_the_same_forwards_and_the_run_goes_on(tmp_path):
    """ZeRO-3 gathers each layer's weights from every rank at every forward: unequal shares would hang."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO
    from tests.trainer.conftest import write_run

    # 5 lambada_openai items are 5 requests, an odd number: the second rank's share is padded to the first's length.
    metrics = {**DOWNSTREAM, "downstream_tasks": ["lambada_openai", "piqa"], "downstream_limit": 5, "tensorboard": False}
    run = write_run(tmp_path / "run.json", train_tokens=4 * 8 * 64, deepspeed={"zero_stage": 3, "bf16": True},
                    metrics={"log_interval": 1, "eval_batches": 1, **metrics})
    torchrun = (os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone", "--nproc_per_node", "2")
    result = subprocess.run([*torchrun, "-m", "trainer", "--config", str(run)], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = read_metrics(tmp_path / "out")
    downstream = [r for r in records if r["event"] == "downstream"]
    assert [r["step"] for r in downstream] == [2, 4]
    assert all(t["n"] == 5 for r in downstream for t in r["tasks"].values())
    assert [r["step"] for r in records if r["event"] == "train"] == [1, 2, 3, 4]
