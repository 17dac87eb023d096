"""``step_from_grads``: torch's optimizer step in foreach ops, bit for bit, and
``step()`` itself wherever something expects it to run (trainer/loop/dense_update.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from trainer.loop.dense_update import step_from_grads

CASES = [
    (torch.optim.SGD, {"lr": 0.1}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}),
    (torch.optim.Adagrad, {"lr": 0.1}),
    (torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1}),
    (torch.optim.Adam, {"lr": 0.01, "amsgrad": True}),
    (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
]


def two_models():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 1))
    return model, copy.deepcopy(model)


def train(model, optimizer, step, steps: int = 5, frozen: int | None = None) -> None:
    generator = torch.Generator().manual_seed(1)
    for index in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 5, generator=generator)).pow(2).mean().backward()
        if frozen is not None and index % 2:
            list(model.parameters())[frozen].grad = None  # a parameter without a gradient
        step(optimizer)


@pytest.mark.parametrize(("cls", "hyper"), CASES)
def test_values_and_state_equal_torchs_step_bit_for_bit(cls, hyper):
    reference, fast = two_models()
    torch_opt = cls(reference.parameters(), **hyper)
    fast_opt = cls(fast.parameters(), **hyper)
    train(reference, torch_opt, lambda o: o.step(), frozen=1)
    train(fast, fast_opt, step_from_grads, frozen=1)
    for a, b in zip(reference.parameters(), fast.parameters(), strict=True):
        assert torch.equal(a, b)
        for key, value in torch_opt.state[a].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(fast_opt.state[b][key]))


def test_param_groups_with_their_own_lr_and_a_changed_lr():
    reference, fast = two_models()
    optimizers = []
    for model in (reference, fast):
        first, second = list(model[0].parameters()), list(model[2].parameters())
        optimizers.append(torch.optim.Adagrad(
            [{"params": first}, {"params": second, "lr": 0.5}], lr=0.1
        ))
    train(reference, optimizers[0], lambda o: o.step(), steps=2)
    train(fast, optimizers[1], step_from_grads, steps=2)
    for optimizer in optimizers:
        optimizer.param_groups[0]["lr"] = 0.01
    train(reference, optimizers[0], lambda o: o.step(), steps=2)
    train(fast, optimizers[1], step_from_grads, steps=2)
    assert all(
        torch.equal(a, b) for a, b in zip(reference.parameters(), fast.parameters(), strict=True)
    )


def test_a_loaded_state_dict_is_the_one_updated():
    reference, fast = two_models()
    torch_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    fast_opt = torch.optim.Adam(fast.parameters(), lr=0.01)
    train(reference, torch_opt, lambda o: o.step(), steps=3)
    train(fast, fast_opt, step_from_grads, steps=3)
    fast_opt.load_state_dict(copy.deepcopy(torch_opt.state_dict()))  # new state tensors
    train(reference, torch_opt, lambda o: o.step(), steps=2)
    train(fast, fast_opt, step_from_grads, steps=2)
    assert all(
        torch.equal(a, b) for a, b in zip(reference.parameters(), fast.parameters(), strict=True)
    )
    assert fast_opt.state_dict()["state"][0]["step"].item() == 5.0


def test_hooks_and_other_optimizers_get_torchs_own_step():
    model, _ = two_models()
    calls = []
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.1)
    handle = optimizer.register_step_post_hook(lambda *args: calls.append("post"))
    train(model, optimizer, step_from_grads, steps=2)
    assert calls == ["post", "post"]
    handle.remove()
    train(model, optimizer, step_from_grads, steps=1)
    assert calls == ["post", "post"]
    rms = torch.optim.RMSprop(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    train(model, rms, step_from_grads, steps=1)
    assert len(rms.state) == len(before)  # RMSprop's own step made its state
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_an_lr_scheduler_sees_the_step_and_its_lr_is_used():
    reference, fast = two_models()
    schedulers = []
    optimizers = []
    for model in (reference, fast):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizers.append(optimizer)
        schedulers.append(torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5))
    for _ in range(3):
        train(reference, optimizers[0], lambda o: o.step(), steps=1)
        train(fast, optimizers[1], step_from_grads, steps=1)
        for scheduler in schedulers:
            scheduler.step()
    assert optimizers[1]._opt_called  # no "lr_scheduler.step() before optimizer.step()" warning
    assert optimizers[1].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)
    assert all(
        torch.equal(a, b) for a, b in zip(reference.parameters(), fast.parameters(), strict=True)
    )
