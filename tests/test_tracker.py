"""MemoryTracker attaches itself to a model, its optimizer and the inputs, and counts bytes by category."""
import pytest

torch = pytest.importorskip("torch")

from memlib.core.categories import MemCategory  # noqa: E402
from memlib.measure.tracker import MemoryTracker  # noqa: E402


def _net() -> "torch.nn.Module":
    torch.manual_seed(0)
    # Linear 8→16 (144 floats), BatchNorm 16 (32 floats; buffers: 2×16 floats + one int64), Linear 16→1 (17 floats)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


PARAM_BYTES = 4 * (8 * 16 + 16 + 2 * 16 + 16 + 1)
BUFFER_BYTES = 4 * 2 * 16 + 8


def _step(tr: MemoryTracker, net: "torch.nn.Module", opt: "torch.optim.Optimizer", x: "torch.Tensor") -> None:
    with tr.forward():
        loss = net(x).square().mean()
    with tr.backward():
        loss.backward()
        del loss
    with tr.optimizer_step():
        opt.step()
        opt.zero_grad(set_to_none=True)


def test_track_model_counts_params_buffers_and_gradients() -> None:
    net = _net()
    tr = MemoryTracker("cpu")
    assert tr.track_model(net) == PARAM_BYTES
    assert tr.totals[MemCategory.BUFFER] == BUFFER_BYTES
    x = torch.randn(32, 8)
    tr.track_inputs(x)
    assert tr.totals[MemCategory.ACTIVATION] == 32 * 8 * 4
    with tr.mode(), tr.forward():
        loss = net(x).square().mean()
    with tr.mode(), tr.backward():
        loss.backward()
    assert tr.totals[MemCategory.GRAD] == PARAM_BYTES  # every accumulated .grad moved to GRAD by its hook
    assert tr.peak_phase in ("forward", "backward")


def test_track_optimizer_counts_states_and_forgets_step_counters() -> None:
    net = _net()
    tr = MemoryTracker("cpu")
    tr.track_model(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, foreach=True)
    x = torch.randn(32, 8)
    tr.track_inputs(x)
    with tr.mode():
        _step(tr, net, opt, x)
        tr.track_optimizer(opt)
        assert tr.totals[MemCategory.OPTIMIZER] == 2 * PARAM_BYTES  # exp_avg and exp_avg_sq; no step counters
        assert tr.totals[MemCategory.GRAD] == 0  # set_to_none freed them
        tr.reset_peak()
        _step(tr, net, opt, x)
    by = tr.peak_by_category()
    assert by["params"] == PARAM_BYTES and by["optimizer"] == 2 * PARAM_BYTES and by["buffers"] == BUFFER_BYTES
    assert tr.peak == sum(by.values()) and tr.peak_phase in ("forward", "backward", "optimizer")


def test_set_to_none_false_gradients_count_as_grad() -> None:
    net = _net()
    tr = MemoryTracker("cpu")
    tr.track_model(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for p in net.parameters():
        p.grad = torch.zeros_like(p)  # made outside the tracker, as a warm-up step leaves them
    opt.step()
    opt.zero_grad(set_to_none=False)
    tr.track_optimizer(opt)
    assert tr.totals[MemCategory.GRAD] == PARAM_BYTES
    assert tr.totals[MemCategory.OPTIMIZER] == PARAM_BYTES  # one momentum buffer per parameter


def test_detach_removes_the_gradient_hooks() -> None:
    net = _net()
    tr = MemoryTracker("cpu")
    tr.track_model(net)
    tr.detach()
    with tr.mode(), tr.backward():
        net(torch.randn(4, 8)).sum().backward()
    assert tr.totals[MemCategory.GRAD] == 0 and tr.totals[MemCategory.TEMP] >= PARAM_BYTES


def test_on_event_logs_every_alloc_and_free_and_activation_peak() -> None:
    events: list[tuple[str, int]] = []
    tr = MemoryTracker("cpu", activation_peak=True, on_event=lambda action, key, n: events.append((action, n)))
    w = torch.zeros(256, requires_grad=True)  # 1 KiB
    tr.track_model(torch.nn.ParameterList([w]), grad_hooks=False)
    with tr.mode():
        y = w * 2  # 1 KiB activation
        z = y + 1  # 1 KiB
        del y, z
    assert events == [("alloc", 1024), ("alloc", 1024), ("alloc", 1024), ("free", 1024), ("free", 1024)]
    assert tr.act_peak == 2048 and tr.peak == 3072 and tr.total == 1024


def test_meta_mode_with_and_without_the_cache_counts_the_same() -> None:
    def peak(cache: bool) -> int:
        tr = MemoryTracker("meta")
        with tr.mode(cache=cache):
            a = torch.randn(64, 64, device="meta", requires_grad=True)
            (a @ a).relu().sum().backward()
        return tr.peak

    assert peak(True) == peak(False) > 64 * 64 * 4
