"""Benchmark: the trainer against a plain GPT-style PyTorch loop of the same model and batches, step by step
and over a whole run.

    .venv/bin/python bench/train_step.py [--steps 10] [--rounds 3] [--d-model 128] [--layers 4] [--seq 64]
                                         [--batch 16] [--run-steps 256] [--run-rounds 3] [--two-process] [--smoke]

Model: the Llama-style decoder (trainer.model.transformer), by default 4 layers, d=128, 4 heads, seq 64, 16 sequences a
step, vocabulary the 8,192 most frequent GPT-2 tokens of tinyshakespeare (../shared/data). Every runner
draws the same samples from the same source with the same initial weights, in the precision the trainer
picks on this machine (deepspeed.bf16: auto; the baseline autocasts to bf16 exactly when the trainer runs in
bf16), one process, the same torch threads.

- baseline: what one writes by hand: `is_causal` SDPA (no document mask, positions 0..T-1), AdamW,
  clip_grad_norm_(1.0); no DeepSpeed, no per-step checks.
- baseline + document mask: the same loop with the packed documents' mask and restarting positions.
- trainer: trainer.train.Trainer.step() as the demo runs it (ZeRO-1 with one process, document mask, the
  spike guard, the SDC/straggler figures, the watchdog, health every health.interval steps), then the same
  with one check turned off at a time (what each costs), with ZeRO-0 (what ZeRO-1's buffers cost), and with
  activation checkpointing full and selective (the time each costs; the activation bytes autograd keeps for one
  step's backward, with and without, are printed as the memory saved).
Steps of every runner interleave one by one (steps × rounds each, the order reversed every round) so load from
other processes hits all alike; each figure is the median step. The step-only ratios (trainer tokens/s ÷ baseline tokens/s) are printed for
ZeRO-1 and ZeRO-0.

The whole run: `python -m trainer --config run.json` (ZeRO-1, every check at its default interval, validation
every RUN_EVAL_INTERVAL steps and at the end, a progress line every RUN_LOG_INTERVAL steps, TensorBoard, the final
checkpoint) against the baseline loop run as a script of its own (this file with --baseline-run: imports, data,
model, the same steps, the same validation at the same steps, its loss printed as often, its model and optimizer
saved at the end), one process each, each timed from its interpreter's start to its exit. The two run side by side
but never at once, in turns of TURN_S seconds (in_turns): load from other processes falls on both alike, as it does
on the interleaved steps. --run-rounds pairs of runs; the figure is the median of the rounds' ratios.
--two-process adds the trainer's ZeRO-1 on 2 processes (torchrun), against the trainer's own one process (no
baseline runs on two).
Last line: `ratio: X.XX` = the baseline's whole-run seconds ÷ the trainer's (target ≥ 0.95); the step-only
ratios are the two lines before the whole run's.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This folder holds scripts named like stdlib modules (bench/tokenize.py): never import from it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
sys.path.insert(0, str(REPO))
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))

import torch  # noqa: E402

from trainer.config import RunConfig, from_dict  # noqa: E402

VOCAB = 8192
# Each trainer variant turns one check off, to show what it costs (run-config sections merged over the default).
CHECKS = {
    "spike guard": {"guard": {"enabled": False}},
    "SDC figures": {"sdc": {"enabled": False}},
    "straggler figures": {"straggler": {"enabled": False}},
    "step watchdog": {"watchdog": {"enabled": False}},
    "layer health": {"health": {"interval": 0}},
}


def run_dict(out: Path, args, train_tokens: int, *, zero_stage: int = 1, micro_batch: int | None = None,
             **sections) -> dict:
    run = {
        "data": {"text": str(DATA / "books" / "tinyshakespeare.txt"),
                 "tokenizer": str(DATA / "tokenizers" / "gpt2" / "tokenizer.json"), "top_tokens": VOCAB},
        "train_tokens": train_tokens, "output_dir": str(out),
        "model": {"vocab_size": VOCAB, "d_model": args.d_model, "n_layers": args.layers, "n_heads": 4},
        "schedule": {"kind": "constant"},
        "batch": {"global_batch": args.batch, "micro_batch": micro_batch or args.batch, "seq_len": args.seq},
        "deepspeed": {"zero_stage": zero_stage, "bf16": "auto"},
        "metrics": {"log_interval": 5, "tensorboard": False, "eval_batches": 0},
        "guard": {"max_skipped": 10**6},
        "health": {"interval": 100},  # the default: one step in a hundred gathers per-layer figures
    }
    for key, value in sections.items():
        run[key] = {**run.get(key, {}), **value}
    return run


class Baseline:
    """The baseline: what one would write by hand for the same model (optionally with the document mask)."""

    def __init__(self, cfg: RunConfig, source, *, batch: int, bf16: bool, doc_mask: bool):
        from trainer.model.transformer import CausalLM
        from trainer.optim import param_groups

        torch.manual_seed(cfg.seed)
        self.model = CausalLM(cfg.model)
        self.opt = torch.optim.AdamW(param_groups(self.model, cfg.optim), lr=cfg.optim.lr, betas=cfg.optim.betas,
                                     eps=cfg.optim.eps)
        self.source, self.next, self.batch = source, 0, batch
        self.bf16, self.doc_mask = bf16, doc_mask

    def _forward(self, b: dict):
        tokens = torch.as_tensor(b["tokens"])
        doc_ids = torch.as_tensor(b["doc_ids"])[:, :-1] if self.doc_mask else None
        positions = torch.as_tensor(b["positions"])[:, :-1] if self.doc_mask else None
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()
        with autocast:
            return self.model(tokens[:, :-1], tokens[:, 1:], doc_ids, positions)

    def step(self) -> torch.Tensor:
        b = self.source.batch(list(range(self.next, self.next + self.batch)))
        self.next += self.batch
        loss, _ = self._forward(b)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    @torch.no_grad()
    def validation_loss(self, source, samples: int, micro: int) -> float:
        """The mean cross-entropy of the held-out samples 0..samples-1, as Trainer.evaluate takes it."""
        self.model.eval()
        total = 0.0
        for i in range(0, samples, micro):
            n = min(micro, samples - i)
            _, ce = self._forward(source.batch(list(range(i, i + n))))
            total += float(ce) * n
        self.model.train()
        return total / samples


RECOMPUTE = ("full", "selective")
# The whole run: about 30 s of the bench's model on 2 free cores, of which start-up is 3-4 s; validation and progress
# lines as often as the demo's main stage has them (eval_interval 64, 2 batches; log_interval 16).
RUN_STEPS = 256
RUN_EVAL_INTERVAL = 64
RUN_EVAL_BATCHES = 2
RUN_LOG_INTERVAL = 16
TURN_S = 0.25  # the whole runs take turns this long (in_turns)
# How in_turns starts a command: the wrapper stops itself before it execs the command, so nothing of the command runs
# before its first turn, and it dies with the bench (PR_SET_PDEATHSIG, kept across exec): a bench killed by a timeout
# leaves no stopped run behind.
TURN_WRAPPER = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
                "os.kill(os.getpid(), signal.SIGSTOP); os.execv(sys.argv[1], sys.argv[1:])")


def kept_activation_bytes(cfg: RunConfig, source, batch: int, bf16: bool, mode: str) -> int:
    """Bytes of the tensors autograd keeps for backward in one forward of the model (parameters not counted)."""
    from trainer.model.transformer import CausalLM

    model = CausalLM(cfg.model.model_copy(update={"activation_checkpointing": mode}))
    params = {p.data_ptr() for p in model.parameters()}
    b = source.batch(list(range(batch)))
    tokens = torch.as_tensor(b["tokens"])
    kept: dict[int, int] = {}

    def pack(t):
        if t.data_ptr() not in params:
            kept[t.data_ptr()] = t.numel() * t.element_size()  # a tensor saved twice is held once
        return t

    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        loss, _ = model(tokens[:, :-1], tokens[:, 1:], torch.as_tensor(b["doc_ids"])[:, :-1],
                        torch.as_tensor(b["positions"])[:, :-1])
    loss.backward()
    return sum(kept.values())


def step_seconds(step) -> float:
    t = time.perf_counter()
    step()
    return time.perf_counter() - t


def two_process(work: Path, args) -> float:
    out = work / "two"
    cfg = work / "two.json"
    cfg.write_text(json.dumps(run_dict(out, args, (args.steps + 6) * args.batch * args.seq,
                                       micro_batch=args.batch // 2)))
    torchrun = Path(sys.executable).parent / "torchrun"
    subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "trainer", "--config", str(cfg)],
                   cwd=REPO, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    return max(r["tokens_per_s"] for r in records if r["event"] == "train" and r["step"] > 5)


def whole_run_dict(out: Path, args) -> dict:
    """The whole run both sides make: args.run_steps steps of the bench's model, validation every
    args.run_eval_interval steps and at the end, a progress line every RUN_LOG_INTERVAL steps. The trainer's
    checks, TensorBoard and final checkpoint stay at their defaults (on), as a run of the demo has them."""
    return run_dict(out, args, args.run_steps * args.batch * args.seq,
                    metrics={"log_interval": RUN_LOG_INTERVAL, "eval_interval": args.run_eval_interval,
                             "eval_batches": RUN_EVAL_BATCHES, "tensorboard": True})


def baseline_run(run_json: str, bf16: bool) -> None:
    """--baseline-run: the baseline loop's whole run, in this process as a hand-written script makes it: the data, the
    model and its optimizer, the config's steps with the loss printed every metrics.log_interval steps, validation
    every metrics.eval_interval steps and at the end (the trainer's samples), the model and optimizer saved at the
    end."""
    from trainer.config import load_run_config
    from trainer.data.text_source import TextSource, TextSourceConfig

    cfg = load_run_config(run_json)
    d, b, m = cfg.data, cfg.batch, cfg.metrics

    def text(split: str) -> TextSource:
        return TextSource(TextSourceConfig(path=d.text, tokenizer=d.tokenizer, seq_len=b.seq_len, seed=cfg.seed,
                                           split=split, val_fraction=d.val_fraction, top_tokens=d.top_tokens))

    train, val = text("train"), text("val")
    loop = Baseline(cfg, train, batch=b.global_batch, bf16=bf16, doc_mask=False)
    steps = cfg.train_tokens // (b.global_batch * b.seq_len)
    for step in range(1, steps + 1):
        loss = loop.step()
        if step % m.log_interval == 0 or step == steps:
            print(f"step {step} | loss {loss.item():.4f}", flush=True)
        if m.eval_batches and (step == steps or (m.eval_interval and step % m.eval_interval == 0)):
            held_out = loop.validation_loss(val, m.eval_batches * b.global_batch, b.micro_batch)
            print(f"step {step} | validation {held_out:.4f}", flush=True)
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    torch.save({"model": loop.model.state_dict(), "optimizer": loop.opt.state_dict()},
               Path(cfg.output_dir) / "final.pt")


def in_turns(commands: dict[str, list[str]], folder: Path) -> dict[str, float]:
    """Run the commands side by side but never at once: in turns of TURN_S seconds, the others stopped (SIGSTOP), each
    from its interpreter's start to its exit. Returns the seconds each one ran. On two shared cores another user's
    job slows whatever runs while it does; in short turns it falls on every side alike, as the interleaved steps above
    do, where runs one after the other would each meet a different load. stdout and stderr go to <name>.out/.err."""
    procs: dict[str, subprocess.Popen] = {}
    try:
        for name, command in commands.items():
            procs[name] = subprocess.Popen([sys.executable, "-c", TURN_WRAPPER, *command], cwd=REPO,
                                           stdout=(folder / f"{name}.out").open("w"),
                                           stderr=(folder / f"{name}.err").open("w"))
            os.waitpid(procs[name].pid, os.WUNTRACED)
        ran = dict.fromkeys(commands, 0.0)
        running = list(commands)
        while running:
            for name in list(running):
                proc = procs[name]
                began = time.perf_counter()
                os.kill(proc.pid, signal.SIGCONT)
                try:
                    proc.wait(timeout=TURN_S)
                    running.remove(name)
                except subprocess.TimeoutExpired:
                    if not _stopped(proc):  # it ended as its turn did
                        running.remove(name)
                ran[name] += time.perf_counter() - began
    finally:
        for proc in procs.values():
            if proc.returncode is None:  # the bench itself was stopped: no run stays behind, stopped forever
                proc.kill()
                os.kill(proc.pid, signal.SIGCONT)
                proc.wait()
    for name, proc in procs.items():
        if proc.returncode != 0:
            sys.exit(f"the {name}'s whole run exited {proc.returncode}; stderr ends:\n"
                     f"{(folder / f'{name}.err').read_text()[-3000:]}")
    return ran


def _stopped(proc: subprocess.Popen) -> bool:
    """Stop the process and wait until it is; False when it exited first (its exit status is then recorded)."""
    os.kill(proc.pid, signal.SIGSTOP)
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    if os.WIFSTOPPED(status):
        return True
    proc.returncode = os.waitstatus_to_exitcode(status)
    return False


def whole_runs(work: Path, args, bf16: bool) -> dict[str, list[float]]:
    """Each side's whole-run seconds, args.run_rounds times (in turns: in_turns)."""
    seconds: dict[str, list[float]] = {"baseline": [], "trainer": []}
    for round_ in range(args.run_rounds):
        folder = work / f"whole-{round_}"
        commands = {}
        for side in seconds:
            (folder / side).mkdir(parents=True)
            run_json = folder / side / "run.json"
            run_json.write_text(json.dumps(whole_run_dict(folder / side / "out", args)))
            commands[side] = ([sys.executable, "-m", "trainer", "--config", str(run_json)] if side == "trainer" else
                              [sys.executable, str(Path(__file__).resolve()), "--baseline-run", str(run_json),
                               *(["--bf16"] if bf16 else [])])
        # Who takes the first turn alternates (its first turn starts on a machine the other has not touched yet).
        order = list(commands) if round_ % 2 == 0 else list(reversed(commands))
        ran = in_turns({side: commands[side] for side in order}, folder)
        for side, s in ran.items():
            seconds[side].append(s)
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--run-steps", type=int, default=RUN_STEPS, help="the whole run's steps")
    parser.add_argument("--run-eval-interval", type=int, default=RUN_EVAL_INTERVAL)
    parser.add_argument("--run-rounds", type=int, default=3, help="pairs of whole runs")
    parser.add_argument("--two-process", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="a tiny run that only shows the script works")
    parser.add_argument("--baseline-run", metavar="RUN_JSON", help=argparse.SUPPRESS)  # the baseline's whole run
    parser.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)  # ... autocast to bf16
    args = parser.parse_args()
    if args.baseline_run:
        return baseline_run(args.baseline_run, args.bf16)
    if args.smoke:
        args.steps, args.rounds, args.d_model, args.layers, args.seq, args.batch = 2, 1, 64, 1, 32, 4
        args.run_steps, args.run_eval_interval, args.run_rounds = 4, 2, 1

    from trainer.train import Trainer, build_sources

    work = Path(tempfile.mkdtemp(prefix="bench-train-step-"))
    os.environ.setdefault("PRETRAIN_HOME", str(work / "home"))  # the measured CPU peak is cached there
    tokens = args.batch * args.seq
    budget = (args.steps * args.rounds + 10) * tokens * 4
    base_cfg = from_dict(RunConfig, run_dict(work / "base", args, budget))
    source, _ = build_sources(base_cfg)
    trainers = {"trainer": Trainer(base_cfg, train_source=source, val_sources={})}
    for check, section in CHECKS.items():
        cfg = from_dict(RunConfig, run_dict(work / check.replace(" ", "-"), args, budget, **section))
        trainers[f"trainer without {check}"] = Trainer(cfg, train_source=source, val_sources={})
    # ZeRO-1 on one process shards nothing: what its flat buffers and copies cost against plain DeepSpeed.
    trainers["trainer, ZeRO-0"] = Trainer(from_dict(RunConfig, run_dict(work / "zero0", args, budget, zero_stage=0)),
                                          train_source=source, val_sources={})
    for mode in RECOMPUTE:
        cfg = from_dict(RunConfig, run_dict(work / f"ac-{mode}", args, budget, model={"activation_checkpointing": mode}))
        trainers[f"trainer, {mode} recompute"] = Trainer(cfg, train_source=source, val_sources={})
    precision = trainers["trainer"].precision
    runners = {
        "baseline": Baseline(base_cfg, source, batch=args.batch, bf16=precision.bf16, doc_mask=False).step,
        "baseline + document mask": Baseline(base_cfg, source, batch=args.batch, bf16=precision.bf16,
                                             doc_mask=True).step,
        **{name: t.step for name, t in trainers.items()},
    }
    n_params = trainers["trainer"].n_params
    print(f"model: {n_params:,} parameters, {args.layers} layers, d={args.d_model}, batch {args.batch} × {args.seq} "
          f"tokens; {precision.dtype} ({precision.reason}); torch threads {torch.get_num_threads()}")
    for step in runners.values():
        for _ in range(3):
            step()  # warm-up: allocator, first Adam step
    # Steps interleave one by one and each runner's figure is its median step: the 2 cores are shared,
    # and load from elsewhere then falls on all alike. The order reverses every round: a step pays for the caches
    # the runner before it left (a fixed order put 4-7 ms, 5%, on whichever runner followed the baselines).
    times = {name: [] for name in runners}
    for round_ in range(args.steps * args.rounds):
        for name in list(runners) if round_ % 2 == 0 else reversed(runners):
            times[name].append(step_seconds(runners[name]))
    median = {name: statistics.median(t) for name, t in times.items()}
    rate = {name: tokens / s for name, s in median.items()}
    base = rate["baseline"]
    for name, r in rate.items():
        print(f"{name:36s} {r:10,.0f} tokens/s  {r / base:5.2f}×  {1e3 * median[name]:7.2f} ms/step")
    print(f"document mask costs {1e3 * (median['baseline + document mask'] - median['baseline']):+.2f} ms/step "
          f"in the baseline")
    for check in CHECKS:
        cost = median["trainer"] - median[f"trainer without {check}"]
        print(f"{check:20s} costs {1e3 * cost:+.2f} ms/step in the trainer")
    plain = kept_activation_bytes(base_cfg, source, args.batch, precision.bf16, "none")
    for mode in RECOMPUTE:
        kept = kept_activation_bytes(base_cfg, source, args.batch, precision.bf16, mode)
        cost = median[f"trainer, {mode} recompute"] - median["trainer"]
        print(f"{mode} recompute keeps {kept / 2**20:.1f} MiB of activations for backward instead of "
              f"{plain / 2**20:.1f} MiB ({1 - kept / plain:.0%} saved) and costs {1e3 * cost:+.2f} ms/step "
              f"({cost / median['trainer']:+.0%})")
    if args.two_process:
        two = two_process(work, args)
        # Against the trainer's own one process (no baseline runs on two): what a second rank adds.
        print(f"{'trainer ZeRO-1, 2 processes':36s} {two:10,.0f} tokens/s  {two / rate['trainer']:5.2f}× the "
              f"trainer's one process (whole job)")
    for t in trainers.values():
        t.watchdog.close()
        t.checkpointer.close(wait=False)
        t.metrics.close()
    print(f"step-only ratio, ZeRO-1 (the demo's): {rate['trainer'] / base:.2f}")
    print(f"step-only ratio, ZeRO-0:              {rate['trainer, ZeRO-0'] / base:.2f}")
    seconds = whole_runs(work, args, precision.bf16)
    ratios = [b / t for b, t in zip(seconds["baseline"], seconds["trainer"])]
    print(f"whole run: {args.run_steps} steps, validation every {args.run_eval_interval} steps and at the end, one "
          f"process each, in turns of {TURN_S} s: baseline {statistics.median(seconds['baseline']):.2f} s, trainer "
          f"{statistics.median(seconds['trainer']):.2f} s (medians of {args.run_rounds}); each round's ratio "
          f"{', '.join(f'{r:.3f}' for r in ratios)}")
    print(f"ratio: {statistics.median(ratios):.2f}")

if __name__ == "__main__":
    main()
