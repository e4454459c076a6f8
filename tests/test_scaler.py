"""memlib.core.scaler.DynamicLossScaler against torch.amp.GradScaler("cpu"), step for step (Chapter 3)."""
from __future__ import annotations

import math
import random

import pytest
import torch

from memlib.core.errors import MemlibError
from memlib.core.scaler import DynamicLossScaler, has_inf_or_nan, scale_history


def grad_scaler_run(found_inf: list[bool], seed: int = 0, **kwargs: float) -> tuple[list[float], list[bool]]:
    """Train a tiny linear model with GradScaler; on the flagged steps a gradient entry is set to inf/NaN.

    Returns:
        ``get_scale()`` after every ``update()``, and whether each step was skipped (weights unchanged).
    """
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", **kwargs)
    assert scaler.is_enabled()
    x = torch.randn(8, 4)  # (B, C)
    scales, skipped = [], []
    for bad in found_inf:
        opt.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        scaler.scale(loss).backward()
        if bad:
            model.weight.grad[0, rng.randrange(4)] = rng.choice([math.inf, -math.inf, math.nan])
        before = model.weight.detach().clone()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        skipped.append(torch.equal(before, model.weight.detach()))
    return scales, skipped


def test_matches_grad_scaler_on_random_sequence() -> None:
    rng = random.Random(2024)
    seq = [rng.random() < 0.12 for _ in range(1500)]
    torch_scales, torch_skipped = grad_scaler_run(seq, growth_interval=7)
    mine = DynamicLossScaler(growth_interval=7)
    for step, bad in enumerate(seq):
        stepped = mine.update(bad)
        assert mine.scale == torch_scales[step], f"step {step}"
        assert stepped == (not torch_skipped[step]), f"step {step}"
    assert torch_skipped == seq  # GradScaler skipped exactly the steps with inf/NaN
    assert mine.skipped_steps == sum(seq) and mine.steps == len(seq)
    assert len(set(torch_scales)) > 20  # the sequence both grows and backs off many times
    assert scale_history(seq, growth_interval=7) == torch_scales


def test_matches_grad_scaler_with_defaults() -> None:
    seq = [False] * 2100
    seq[10] = seq[40] = seq[41] = True
    torch_scales, _ = grad_scaler_run(seq)
    mine = scale_history(seq)
    assert mine == torch_scales
    assert mine[0] == 2.0**16 and mine[10] == 2.0**15 and mine[41] == 2.0**13
    assert mine[41 + 2000] == 2.0**14  # grows after 2000 finite steps in a row
    assert mine[-1] == 2.0**14


@pytest.mark.parametrize("kwargs", [
    {"growth_factor": 1.7, "backoff_factor": 0.3, "growth_interval": 3, "init_scale": 1000.0},  # float32 rounding
    {"init_scale": 2.0**126, "growth_interval": 2},  # growth to inf is refused
    {"init_scale": 3.0, "growth_factor": 3.0, "backoff_factor": 0.1, "growth_interval": 2},
])
def test_matches_grad_scaler_edge_cases(kwargs: dict[str, float]) -> None:
    rng = random.Random(7)
    seq = [rng.random() < 0.3 for _ in range(150)]
    torch_scales, skipped = grad_scaler_run(seq, **kwargs)
    assert skipped == seq
    assert scale_history(seq, **kwargs) == torch_scales


def test_growth_and_backoff_rules() -> None:
    s = DynamicLossScaler(init_scale=8.0, growth_interval=3)
    assert [s.update(False) for _ in range(2)] == [True, True] and s.scale == 8.0 and s.growth_tracker == 2
    assert s.update(False) and s.scale == 16.0 and s.growth_tracker == 0  # third finite step in a row: grow
    assert not s.update(True) and s.scale == 8.0 and s.growth_tracker == 0  # overflow: skip and halve
    s.update(False), s.update(False)
    assert not s.update(True) and s.scale == 4.0  # the run is broken: no growth, back off again
    assert scale_history([False] * 7, init_scale=1.0, growth_interval=2) == [1, 2, 2, 4, 4, 8, 8]
    assert scale_history([True] * 3, init_scale=1.0) == [0.5, 0.25, 0.125]
    assert scale_history([False] * 4, init_scale=2.0**127, growth_interval=1) == [2.0**127] * 4  # stays finite


def test_state_dict_keys_match_grad_scaler() -> None:
    ref = torch.amp.GradScaler("cpu", growth_interval=5)
    ref.scale(torch.tensor(1.0))
    mine = DynamicLossScaler(growth_interval=5)
    assert mine.state_dict() == ref.state_dict()


def test_scale_loss_and_unscale() -> None:
    s = DynamicLossScaler(init_scale=1024.0)
    assert s.scale_loss(0.5) == 512.0
    grads, found_inf = s.unscale([1024.0, 2048.0])
    assert grads == [1.0, 2.0] and not found_inf
    assert s.unscale([1.0, math.inf])[1] and s.unscale([math.nan])[1]
    assert has_inf_or_nan([1.0, -math.inf]) and not has_inf_or_nan([0.0, 1e38])


@pytest.mark.parametrize("kwargs, message", [
    ({"init_scale": 0.0}, r"init_scale must be a finite number > 0, got 0\.0"),
    ({"init_scale": math.inf}, r"init_scale must be a finite number > 0, got inf"),
    ({"growth_factor": 1.0}, r"growth_factor must be a finite number > 1, got 1\.0"),
    ({"backoff_factor": 1.5}, r"backoff_factor must be a number in \(0, 1\), got 1\.5"),
    ({"growth_interval": 0}, r"growth_interval must be an integer ≥ 1, got 0"),
    ({"growth_interval": 2.5}, r"growth_interval must be an integer, got 2\.5"),
])
def test_bad_arguments(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(MemlibError, match=message):
        DynamicLossScaler(**kwargs)  # type: ignore[arg-type]
