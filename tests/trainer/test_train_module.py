"""trainer.train_module: the model's hooks in order, batches to the device, the per-rank gather alone."""

from types import SimpleNamespace

import torch

from trainer.train_module import gather_floats, to_device


def test_to_device_shifts_targets_by_one():
    batch = {"tokens": torch.arange(10).reshape(2, 5), "doc_ids": torch.zeros(2, 5, dtype=torch.long),
             "positions": torch.arange(5).expand(2, 5)}
    inputs, targets, doc_ids, positions = to_device(batch, torch.device("cpu"))
    assert inputs.tolist() == [[0, 1, 2, 3], [5, 6, 7, 8]] and targets.tolist() == [[1, 2, 3, 4], [6, 7, 8, 9]]
    assert doc_ids.shape == positions.shape == (2, 4)


def test_gather_floats_alone_is_this_ranks_figures():
    figures = [torch.tensor(1.5), torch.tensor(2, dtype=torch.int32), torch.tensor([3.0])]
    assert gather_floats(figures, SimpleNamespace(world_size=1)) == [[1.5, 2.0, 3.0]]


def test_a_callbacks_gradient_hook_goes_before_the_probes(tmp_path):
    from tests.trainer.conftest import run_dict
    from trainer.config import RunConfig, from_dict
    from trainer.train_module import TrainModule

    cfg = from_dict(RunConfig, run_dict(tmp_path, model={"n_layers": 1}))
    dist = SimpleNamespace(device=torch.device("cpu"), world_size=1, rank=0)

    def scale_first_gradient(model):
        next(model.parameters()).register_hook(lambda g: g * 0)

    a = TrainModule(cfg, dist, on_model=scale_first_gradient)
    b = TrainModule(cfg, dist)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))  # seeded alike
    for module in (a, b):
        module.probe.start(0)
        tokens = torch.randint(0, 512, (1, 9), generator=torch.Generator().manual_seed(0))
        loss, _ = module.model(tokens[:, :-1], tokens[:, 1:], torch.zeros(1, 8, dtype=torch.long),
                               torch.arange(8)[None])
        loss.backward()
    assert a.probe.per_layer()["embedding"] == 0.0 < b.probe.per_layer()["embedding"]
