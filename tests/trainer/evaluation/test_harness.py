"""The in-training evaluator (trainer/evaluation/evaluate.py) against lm-evaluation-harness itself (trainer/evaluation/harness.py): a small
model trained on real text, exported, scored by lm-eval with its per-item samples logged and by our evaluator on the
same items: the same requests to the character, the same log-likelihoods, the same choice picked on every item."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, SHARED_DATA
from tests.trainer.conftest import run_dict

BENCH = SHARED_DATA / "benchmarks"
ITEMS = 20  # per task: ~480 requests, every task lm-eval and our evaluator share
SEQ_LEN = 128  # most BoolQ, MMLU and some ARC, HellaSwag prompts are cut from the left, as lm-eval cuts them;
# every continuation fits (a longer one lm-eval refuses: a PIQA answer is up to 128 tokens of this 512-id BPE)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-layer model trained 60 steps on tinyshakespeare with a real BPE tokenizer (the ids the export ships), fp32."""
    from tests.trainer.evaluation.test_export import small_tokenizer
    from trainer.config import RunConfig, from_dict
    from trainer.train import Trainer

    tmp = tmp_path_factory.mktemp("harness")
    tokenizer = small_tokenizer(tmp, 512)
    cfg = from_dict(RunConfig, run_dict(tmp / "out", data={"tokenizer": tokenizer, "top_tokens": None},
                                        train_tokens=60 * 8 * SEQ_LEN, batch={"seq_len": SEQ_LEN},
                                        deepspeed={"zero_stage": 0, "bf16": False}))
    summary = Trainer(cfg).fit()
    return tmp, tokenizer, cfg, summary


@pytest.mark.slow  # 20-45 s: 60 training steps, the export, lm-eval over 8 tasks, our evaluator on the same items
def test_our_evaluator_picks_what_lm_eval_picks_on_every_item(trained, monkeypatch, capsys):
    import torch
    from tokenizers import Tokenizer

    from trainer.evaluation.evaluate import picks, score_items, task_result
    from trainer.evaluation.tasks import TASKS, load_task
    from trainer.evaluation.harness import lm_eval_checkpoint
    from trainer.model.transformer import Transformer
    from trainer.checkpoint.weights import checkpoint_weights

    tmp, tokenizer, cfg, summary = trained
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert summary["val_loss"]["text"] < 5.5  # it learnt something (uniform over 512 ids: 6.24): few near-ties
    step = tmp / "out" / "checkpoints" / f"step-{60:08d}"
    tasks = list(TASKS)
    # In a fresh (spawned) process, as the evaluation asset runs it: something under lm-eval forks, and a fork of
    # this test session, whose earlier tests left threads holding locks, hung in the full suite (passed alone).
    import multiprocessing

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):  # the trainer's, not lm-eval's
        monkeypatch.delenv(name, raising=False)
    from concurrent.futures import ProcessPoolExecutor

    # Not a multiprocessing Pool: its workers are daemons, which may not have the children lm-eval starts.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        theirs = pool.submit(lm_eval_checkpoint, step, tokenizer=tokenizer, benchmarks=BENCH, tasks=tasks, limit=ITEMS,
                             work=tmp / "lm-eval", log_samples=True, bootstrap_iters=1000).result()

    state, _ = checkpoint_weights(step)
    model = Transformer(cfg.model)
    model.load_state_dict({k.removeprefix("transformer."): v for k, v in state.items()})
    model.eval()
    tok = Tokenizer.from_file(tokenizer)
    report = []
    for name in tasks:
        items = load_task(name, BENCH, ITEMS)
        with torch.no_grad():
            ours = score_items(model, tok, items, max_len=SEQ_LEN, batch_size=16)
        samples = sorted(theirs["samples"][name], key=lambda s: s["doc_id"])
        assert len(samples) == len(items) == ITEMS, name
        same_pick, largest = 0, 0.0
        for i, (item, scores, sample) in enumerate(zip(items, ours, samples)):
            where = f"{name} item {i}"
            # The same prompts: every (context, continuation) request, to the character.
            assert [tuple(a) for a in sample["arguments"]] == item.requests, where
            lls = np.array([float(r[0]) for r in sample["filtered_resps"]])
            assert [ll for ll, _ in scores] == pytest.approx(lls.tolist(), abs=1e-4), where  # measured: <= 1.5e-5
            largest = max(largest, float(np.abs(np.array([ll for ll, _ in scores]) - lls).max()))
            if len(item.requests) == 1:  # LAMBADA: the target word greedily, and its log-likelihood
                assert scores[0][1] == bool(sample["filtered_resps"][0][1]) == bool(sample["acc"]), where
                same_pick += 1
                continue
            lengths = np.array([float(len(c)) for c in item.choices])
            pick, pick_norm = picks(item, scores)
            assert pick == int(np.argmax(lls)), where
            assert pick_norm == int(np.argmax(lls / lengths)), where
            assert float(pick == item.gold) == sample["acc"], where  # lm-eval's gold is ours
            if "acc_norm" in sample:
                assert float(pick_norm == item.gold) == sample["acc_norm"], where
            same_pick += 1
        # And the task's figures are lm-eval's.
        figures = task_result(name, items, ours)
        for metric in TASKS[name].metrics:
            assert figures[metric] == pytest.approx(theirs["results"][name][f"{metric},none"], rel=1e-3), (name, metric)
            assert f"{metric}_stderr,none" in theirs["results"][name]
        headline = TASKS[name].metrics[0]
        report.append(f"{name}: {same_pick}/{len(items)} items pick the same choice, log-likelihoods within "
                      f"{largest:.1e}, {headline} {figures[headline]:.3f} (lm-eval {theirs['results'][name][headline + ',none']:.3f})")
    with capsys.disabled():
        print("\n" + "\n".join(report))
    json.dumps(theirs)  # the results are JSON as they are: what the evaluation asset stores
    assert "|" in theirs["table"] and set(theirs["headline"]) == set(tasks)


def test_a_bad_task_a_missing_file_or_a_too_long_continuation_is_named_before_lm_eval_runs(tmp_path):
    from trainer.evaluation.harness import check_fits, check_known, task_config

    with pytest.raises(ValueError, match="unknown lm-eval task 'piqa2'"):
        check_known(["piqa", "piqa2"])
    with pytest.raises(ValueError, match="piqa: benchmark file .*piqa_val.jsonl not found"):
        task_config("piqa", tmp_path, tmp_path / "cache", tmp_path)
    config = task_config("hellaswag", BENCH, tmp_path / "cache", tmp_path / "tasks")
    # lm-eval's own YAML, only the data source changed: a local JSON file, its cache in scratch space.
    assert config["include"] == str(tmp_path / "tasks" / "hellaswag" / "hellaswag.yaml")
    assert config["dataset_path"] == "json" and config["test_split"] == "train"
    assert config["dataset_kwargs"] == {"data_files": str(BENCH / "hellaswag_val.jsonl.gz"),
                                        "cache_dir": str(tmp_path / "cache")}
    # A model whose context is shorter than an answer: lm-eval would fail on an assertion; named here instead.
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 24}))
    (tmp_path / "tokenizer.json").write_bytes((SHARED_DATA / "tokenizers" / "gpt2" / "tokenizer.json").read_bytes())
    check_fits(tmp_path, ["arc_easy"], benchmarks=BENCH, limit=3)
    with pytest.raises(ValueError, match=r"piqa: item 0 has a continuation of \d+ tokens, more than the model's "
                                         r"context \(24\)"):
        check_fits(tmp_path, ["piqa"], benchmarks=BENCH, limit=3)


def test_lm_eval_runs_as_one_process_whatever_rank_variables_this_process_holds():
    """A one-rank trainer run in the process (trainer.parallel.engine sets LOCAL_RANK) made `pretrain eval`'s
    Accelerate wait for other ranks (seen in test_training after such a test on its pytest worker). Accelerate itself
    decides, in a process of its own: LOCAL_RANK and MASTER_ADDR set, then one_process(), then the variables back."""
    probe = "\n".join([
        "import os",
        "from trainer.evaluation.harness import one_process",
        "with one_process():",
        "    from accelerate import PartialState",
        "    print(PartialState(cpu=True).distributed_type)",
        "print(os.environ['LOCAL_RANK'], os.environ['MASTER_ADDR'], 'RANK' in os.environ)",
    ])
    env = {**os.environ, "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    env.pop("RANK", None)
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["DistributedType.NO", "0 127.0.0.1 False"], done.stdout


def test_lm_eval_bootstraps_its_stderrs_without_forking_a_pool(monkeypatch):
    """A pool forked from a process with threads running (torch's, the trainer's watchdog) hung the suite in lm-eval's
    "bootstrapping for stddev": inside one_process() the bootstrap runs serially, and the environment is back after."""
    import multiprocessing

    from lm_eval.api.metrics import bootstrap_stderr, perplexity

    from trainer.evaluation.harness import one_process

    def no_pool(*args, **kwargs):
        raise AssertionError("lm-eval forked a multiprocessing pool")

    monkeypatch.setattr(multiprocessing, "Pool", no_pool)
    monkeypatch.delenv("DISABLE_MULTIPROC", raising=False)
    losses = [-2.0, -3.5, -1.25, -4.0, -2.75, -3.0]
    with one_process():
        stderr = bootstrap_stderr(perplexity, losses, 2000)
    assert 0 < stderr < perplexity(losses)  # a spread of the resampled perplexities, below the perplexity itself
    assert "DISABLE_MULTIPROC" not in os.environ
