"""Per-layer health: weight RMS, activation RMS and gradient norms, with outlier growth flagged.

    probe = GradientProbe(model)             # tensor hooks: this rank's own gradients, before any reduction
    probe.start(step) ... forward/backward of the step's micro-batches ... probe.local_norm() / per_layer()
    probe.start(step, record=False); ...; probe.recording = True; probe.arm()   # the loop: whoever reads asks
    health = LayerHealth(cfg.health, model)
    weights = health.start()                 # on a health step: activation hooks record the first micro-batch
    record, alarms = health.finish(step, weights, probe.per_layer())
                                             # {"event": "health", "layers": {...}}, [{"event": "health_alarm"}]

Layers: "embedding", "block.<i>" for each transformer block, "head" (final norm and output projection).
The gradient hooks sit on every parameter, ahead of DeepSpeed's accumulation hooks, so they see this
rank's gradient of each micro-batch before the all-reduce: the figure the SDC check compares across
ranks. A hook costs one norm of the gradient it sees, accumulated on the device (no sync until the
step's one gather). A layer's gradient norm is the root of its micro-batch gradients' summed squared
norms (exactly its gradient norm when a rank takes one micro-batch per step).

Both kinds of hooks are on the model only on the steps whose figures someone reads (a health step; every step
of an SDC check across ranks): on the others autograd calls no Python at all for them. They are put on when
first asked, after any hook a callback put on the new model (so they see what those did to the gradients).

A figure is flagged when it grew more than health.growth × over the median of its last health.history
values and more than health.growth × the typical growth of the same figure in the other layers:
outlier growth in one layer is the usual early warning of a loss spike (all layers growing together
early in training is not).
"""

from __future__ import annotations

import statistics
from collections import deque

import torch
from torch import nn

from trainer.health.config import HealthConfig


def layer_of(name: str) -> str:
    """transformer.blocks.3.attn.wq.weight -> block.3; tok_emb -> embedding; norm/head -> head."""
    parts = name.split(".")
    if "blocks" in parts:
        return f"block.{parts[parts.index('blocks') + 1]}"
    if "tok_emb" in parts:
        return "embedding"
    return "head"


def layer_names(model: nn.Module) -> list[str]:
    names: list[str] = []
    for name, _ in model.named_parameters():
        layer = layer_of(name)
        if layer not in names:
            names.append(layer)
    return names


class GradientProbe:
    def __init__(self, model: nn.Module):
        self.layers = layer_names(model)
        index = {layer: i for i, layer in enumerate(self.layers)}
        self.device = next(model.parameters()).device
        # One gradient norm per hook call, summed by layer when asked: a hook does a single norm (no
        # accumulation ops on the backward's critical path, no sync until the step's one gather).
        self._norms: list[torch.Tensor] = []
        self._layer_of: list[int] = []
        self.recording = False  # whether this step's gradients are read (start(), or a callback that asks)
        self.step = 0
        self._params = [(index[layer_of(name)], p) for name, p in model.named_parameters() if p.requires_grad]
        self._hooks: list = []  # the hooks' handles while they are on the parameters

    def _record(self, i: int):
        def hook(grad: torch.Tensor):
            if self.recording:
                self._norms.append(torch.linalg.vector_norm(grad, dtype=torch.float32))
                self._layer_of.append(i)
            return None
        return hook

    def start(self, step: int, *, record: bool = True) -> None:
        """A new step. `record=False`: no one has asked for its figures yet; a reader sets `recording` and the loop
        calls arm() before the first micro-batch (until then the hooks of a step that recorded stay on, idle, so a
        check that reads every step never takes them off and puts them back)."""
        self.step = step
        self.recording = record
        self._norms, self._layer_of = [], []
        if record:
            self.arm()

    def arm(self) -> None:
        """The hooks on the parameters exactly when this step records: put on when asked, taken off when not."""
        if self.recording and not self._hooks:
            self._hooks = [p.register_hook(self._record(i)) for i, p in self._params]
        elif not self.recording and self._hooks:
            for handle in self._hooks:
                handle.remove()
            self._hooks = []

    def _squares(self) -> torch.Tensor:
        """Per layer, the summed squared norms of every gradient seen this step (every micro-batch's)."""
        sq = torch.zeros(len(self.layers), dtype=torch.float32, device=self.device)
        if self._norms:
            index = torch.tensor(self._layer_of, device=self.device)
            sq.index_add_(0, index, torch.stack(self._norms).square())
        return sq

    def local_norm(self) -> torch.Tensor:
        """This rank's gradient norm of the step so far (a 0-d tensor on the device: no sync)."""
        if not self._norms:
            return torch.zeros((), dtype=torch.float32, device=self.device)
        return torch.stack(self._norms).square().sum().sqrt()

    def per_layer(self) -> dict[str, float]:
        return dict(zip(self.layers, self._squares().sqrt().tolist()))


class LayerHealth:
    def __init__(self, cfg: HealthConfig, model: nn.Module, *, zero_stage: int = 0):
        self.cfg, self.model = cfg, model
        self.layers = layer_names(model)
        self.zero3 = zero_stage == 3
        self.active = False
        self.act: dict[str, float] = {}
        self.history: dict[tuple[str, str], deque[float]] = {}
        self._hooks: list = []  # the activation hooks' handles, from start() to finish()

    def due(self, step: int) -> bool:
        return bool(self.cfg.interval) and step % self.cfg.interval == 0

    def _activation(self, layer: str):
        def hook(module, inputs, output):
            if self.active and layer not in self.act:  # the step's first micro-batch only
                with torch.no_grad():
                    self.act[layer] = float(output.detach().float().pow(2).mean().sqrt())
        return hook

    @torch.no_grad()
    def weight_rms(self) -> dict[str, float]:
        sums: dict[str, list[float]] = {}
        params = list(self.model.named_parameters())
        if self.zero3:
            # ZeRO-3 keeps a shard per rank: gather (every rank takes part, health steps are the same on all).
            import deepspeed

            with deepspeed.zero.GatheredParameters([p for _, p in params]):
                return self._rms(params, sums)
        return self._rms(params, sums)

    @staticmethod
    def _rms(params, sums) -> dict[str, float]:
        for name, p in params:
            s = sums.setdefault(layer_of(name), [0.0, 0])
            s[0] += float(p.detach().float().pow(2).sum())
            s[1] += p.numel()
        return {layer: (total / max(n, 1)) ** 0.5 for layer, (total, n) in sums.items()}

    def start(self) -> dict[str, float]:
        """At the start of a health step (before its forward): put the activation hooks on, read the weights."""
        self.active, self.act = True, {}
        if not self._hooks:
            self._hooks = [block.register_forward_hook(self._activation(f"block.{i}"))
                           for i, block in enumerate(self.model.transformer.blocks)]
        return self.weight_rms()

    def finish(self, step: int, weights: dict[str, float], grads: dict[str, float]) -> tuple[dict, list[dict]]:
        """After the step's backward (`grads`: GradientProbe.per_layer()): the record for the metrics, and the
        figures flagged for growth."""
        self.active = False
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        layers = {}
        for layer in self.layers:
            figures = {"weight_rms": weights.get(layer), "act_rms": self.act.get(layer), "grad_norm": grads.get(layer)}
            layers[layer] = {k: v for k, v in figures.items() if v is not None}
        # Growth of each figure over the median of its recent values ...
        growth: dict[tuple[str, str], tuple[float, float]] = {}
        for layer, figures in layers.items():
            for metric, value in figures.items():
                past = self.history.setdefault((layer, metric), deque(maxlen=self.cfg.history))
                if past and statistics.median(past) > 0:
                    growth[(layer, metric)] = (value / statistics.median(past), statistics.median(past))
                past.append(value)
        # ... flagged when it is large and out of line with the same figure's growth in the other layers
        # (early in training every layer's activations grow several-fold together: that is no warning).
        alarms = []
        for (layer, metric), (ratio, median) in growth.items():
            others = [r for (l, m), (r, _) in growth.items() if m == metric and l != layer]
            typical = statistics.median(others) if others else 1.0
            if ratio > self.cfg.growth and ratio > self.cfg.growth * max(typical, 1.0):
                value = layers[layer][metric]
                alarms.append({"event": "health_alarm", "step": step, "layer": layer, "metric": metric,
                               "value": value, "median": median, "growth": ratio, "others_growth": typical,
                               "message": f"{layer} {metric} {value:.4g} = {ratio:.3g}× its recent median {median:.4g} "
                                          f"(other layers: {typical:.3g}×; health.growth = {self.cfg.growth:g})"})
        return {"event": "health", "step": step, "layers": layers}, alarms
