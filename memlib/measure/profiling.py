"""Measure FLOPs, time and memory of training steps: FlopCounterMode, profilers, CUDA snapshots (Chapter 12).

Measurement module: torch (and transformers, DeepSpeed) are imported lazily inside the functions. Nothing here
downloads anything: models are built from configs (``memlib.measure.trace.build_model``), on the ``meta`` device when
only shapes matter (FLOP counting of 70B models), on CPU for small timed runs, on CUDA when there is a GPU.

The CUDA functions (:func:`record_memory_history`, :func:`dump_memory_snapshot`,
:func:`cuda_snapshot_training_step`, :func:`gpu_ops_report`) need a GPU; a later GPU run calls them and writes
``labs/results/*.json``, which the book's GPU cells load. FLOPs by depth, DeepSpeed's flops profiler and the
meta-device memory snapshot, which only Chapter 12 uses, are book helpers (:mod:`memlib._book.ch12_profiling`).
"""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.choices import MODEL_DTYPES
from ..core.configs import ModelConfig, load_config
from ..core.errors import MemlibError, check_choice, check_positive
from ..core.profiling import MemoryTimeline, downsample_timeline, load_snapshot, snapshot_timeline
from .deps import require_torch
from .results import DATE_FORMAT

__all__ = [
    "MeasuredFlops",
    "OpRow",
    "CpuProfile",
    "MatmulBenchmark",
    "StepTiming",
    "MemoryTimeline",
    "count_training_flops",
    "profile_training_step",
    "matmul_benchmark",
    "time_training_step",
    "record_memory_history",
    "dump_memory_snapshot",
    "cuda_snapshot_training_step",
    "snapshot_timeline",
    "load_snapshot",
    "gpu_ops_report",
    "mfu_run",
    "downsample_timeline",
    "write_gpu_results",
]

ModelLike = str | Path | dict[str, Any] | ModelConfig


def _torch() -> Any:
    return require_torch("memlib.measure.profiling")


@contextlib.contextmanager
def _quiet_stderr_fd() -> Iterator[None]:
    """Silence file descriptor 2 (Kineto prints "profiler_start/stop" lines with timestamps there from C++)."""
    try:
        saved = os.dup(2)
    except OSError:  # pragma: no cover - no fd 2
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _enable_recompute(net: Any) -> None:
    if hasattr(net, "activation_checkpointing_enable"):  # transformers ≥ 5.x name
        net.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:  # pragma: no cover - older transformers
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


# ----------------------------------------------------------------------------------------------------------
# FLOPs: FlopCounterMode
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeasuredFlops:
    """FLOPs of one training step counted by ``torch.utils.flop_counter.FlopCounterMode``. Chapter 12.

    Attributes:
        total: FLOPs of forward + loss + backward.
        by_op: FLOPs per aten op (``aten.mm``, ``aten.bmm``, ``aten.addmm``...).
        forward: FLOPs counted during the forward pass (loss included).
        settings: model, batch_size, seq_len, attention, recompute, num_layers.
    """

    total: int
    by_op: dict[str, int]
    forward: int
    settings: dict[str, Any] = field(default_factory=dict)


def count_training_flops(model: ModelLike, *, batch_size: int = 1, seq_len: int = 512, attention: str = "eager",
                         recompute: str = "none", device: str = "meta",
                         overrides: dict[str, Any] | None = None) -> MeasuredFlops:
    """Count the FLOPs of one training step of the transformers model with ``FlopCounterMode``.

    Introduced in Chapter 12. Builds the model from its config (on ``meta`` by default: no memory, so a
    70B model works on a laptop), runs forward with ``labels`` (transformers' loss) and backward. FlopCounterMode
    counts matmuls and attention kernels only (mm, addmm, bmm, convolution, SDPA); element-wise ops count 0.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        batch_size: sequences per step.
        seq_len: tokens per sequence.
        attention: ``"eager"`` or ``"sdpa"``. On meta both run the math path (QKᵀ and PV as ``bmm`` over all
            T×T scores); on CPU/CUDA ``sdpa`` runs a fused kernel that FlopCounterMode counts with its own formula.
        recompute: ``"none"`` or ``"full"`` (transformers' activation checkpointing, ``use_reentrant=False``).
        device: ``"meta"`` or ``"cpu"``.
        overrides: config fields to replace (e.g. ``{"num_hidden_layers": 2}``).

    Returns:
        The total and its breakdown by op.
    """
    torch = _torch()
    from torch.utils.flop_counter import FlopCounterMode

    from .trace import _patched, build_model

    cfg = load_config(model)
    batch_size = check_positive("batch_size", batch_size)
    seq_len = check_positive("seq_len", seq_len)
    check_choice("recompute", recompute, ("none", "full"))
    check_choice("device", device, ("meta", "cpu"))
    net = build_model(cfg, device=device, dtype="bf16" if device == "meta" else "fp32", attention=attention,
                      overrides=overrides)
    if recompute == "full":
        _enable_recompute(net)
    input_ids = torch.randint(0, int(net.config.vocab_size), (batch_size, seq_len), device=device)  # (B, T)
    counter = FlopCounterMode(display=False)
    with _patched(False), counter:
        loss = net(input_ids=input_ids, labels=input_ids).loss
        forward = counter.get_total_flops()
        loss.backward()
    by_op = {str(k): int(v) for k, v in counter.get_flop_counts()["Global"].items()}
    settings = {"model": cfg.name, "batch_size": batch_size, "seq_len": seq_len, "attention": attention,
                "recompute": recompute, "num_layers": int(getattr(net.config, "num_hidden_layers", 0)
                                                          or net.config.n_layer)}
    return MeasuredFlops(total=int(counter.get_total_flops()), by_op=by_op, forward=int(forward), settings=settings)


# ----------------------------------------------------------------------------------------------------------
# torch.profiler
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpRow:
    """One row of the profiler's table, aggregated over calls. Chapter 12.

    Attributes:
        name: the op (``aten::mm``...).
        calls: number of calls.
        self_time_us: time in the op itself, children excluded (microseconds).
        total_time_us: time including children.
        self_memory_bytes: bytes allocated minus freed by the op itself (``profile_memory=True``).
        flops: FLOPs the profiler attributes to the op (``with_flops=True``; matmuls and convolutions only).
    """

    name: str
    calls: int
    self_time_us: float
    total_time_us: float
    self_memory_bytes: int
    flops: int


@dataclass(frozen=True)
class CpuProfile:
    """What ``torch.profiler`` saw in one training step. Chapter 12.

    Attributes:
        by_time: ops sorted by self time (longest first).
        by_memory: ops sorted by self memory allocated (largest first).
        total_flops: sum of the FLOPs the profiler attributes to ops.
        trace_path: the Chrome/Perfetto trace file written (open in ui.perfetto.dev or TensorBoard).
        trace_events: number of events in the trace file.
        device: ``"cpu"`` or ``"cuda"``.
    """

    by_time: list[OpRow]
    by_memory: list[OpRow]
    total_flops: int
    trace_path: str
    trace_events: int
    device: str


def profile_training_step(model: ModelLike, *, batch_size: int = 2, seq_len: int = 64, device: str = "cpu",
                          overrides: dict[str, Any] | None = None, trace_dir: str | Path | None = None,
                          row_limit: int = 10, seed: int = 0) -> CpuProfile:
    """Profile one training step (forward, loss, backward, AdamW step) with ``torch.profiler``.

    Introduced in Chapter 12. One warm-up step runs first (it creates the optimizer states and warms up the
    allocator), then the profiled step with ``record_shapes``, ``profile_memory`` and ``with_flops``. The
    trace is exported as a Chrome trace (JSON) to ``trace_dir`` (a new temporary folder by default).

    Args:
        model: shipped name, config.json path, dict or ModelConfig (keep it small on CPU).
        batch_size: sequences per step.
        seq_len: tokens per sequence.
        device: ``"cpu"`` or ``"cuda"``.
        overrides: config fields to replace.
        trace_dir: folder for the trace file.
        row_limit: rows kept in each table.
        seed: seed for weights and inputs.

    Returns:
        The tables and the trace file's path.
    """
    torch = _torch()
    from torch.profiler import ProfilerActivity, profile

    from .trace import build_model

    check_choice("device", device, ("cpu", "cuda"))
    torch.manual_seed(seed)
    net = build_model(model, device=device, dtype="fp32", attention="sdpa", overrides=overrides)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    ids = torch.randint(0, int(net.config.vocab_size), (check_positive("batch_size", batch_size),
                                                        check_positive("seq_len", seq_len)), device=device)

    def step() -> None:
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with _quiet_stderr_fd(), profile(activities=activities, record_shapes=True, profile_memory=True,
                                     with_flops=True) as prof:
        step()
        if device == "cuda":
            torch.cuda.synchronize()
    out = Path(trace_dir) if trace_dir is not None else Path(tempfile.mkdtemp(prefix="memlib_trace_"))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "train_step_trace.json"
    prof.export_chrome_trace(str(path))
    with open(path) as fh:
        events = len(json.load(fh).get("traceEvents", []))
    time_attr = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    rows = []
    for e in prof.key_averages():
        mem = getattr(e, "self_device_memory_usage" if device == "cuda" else "self_cpu_memory_usage", 0)
        rows.append(OpRow(name=e.key, calls=int(e.count), self_time_us=float(getattr(e, time_attr)),
                          total_time_us=float(e.cpu_time_total), self_memory_bytes=int(mem or 0),
                          flops=int(e.flops or 0)))
    by_time = sorted(rows, key=lambda r: -r.self_time_us)[:row_limit]
    by_memory = sorted(rows, key=lambda r: -r.self_memory_bytes)[:row_limit]
    return CpuProfile(by_time=by_time, by_memory=by_memory, total_flops=sum(r.flops for r in rows),
                      trace_path=str(path), trace_events=events, device=device)


# ----------------------------------------------------------------------------------------------------------
# DeepSpeed's flops profiler
# ----------------------------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------------------------
# Timing: matmul peak, training step
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MatmulBenchmark:
    """Best achieved FLOP/s of an n×n matmul. Chapter 12.

    Attributes:
        n: matrix size.
        dtype: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        device: ``"cpu"`` or ``"cuda"``.
        threads: torch's intra-op threads during the run (CPU).
        best_flops_per_s: 2n³ over the fastest repetition.
        median_flops_per_s: 2n³ over the median repetition.
    """

    n: int
    dtype: str
    device: str
    threads: int
    best_flops_per_s: float
    median_flops_per_s: float


def _sync(torch: Any, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def matmul_benchmark(n: int = 1024, *, dtype: str = "fp32", device: str = "cpu", repeats: int = 5,
                     seed: int = 0) -> MatmulBenchmark:
    """Time ``a @ b`` for n×n matrices: an estimate of the device's achievable matmul peak.

    Introduced in Chapter 12. A large square matmul is the most compute-bound kernel there is, so its best
    FLOP/s is the practical peak to divide by when the datasheet peak is unknown (a CPU's). On a GPU it tells
    how close the datasheet peak is reachable (typically 70–90 % for bf16).

    Args:
        n: matrix size (FLOPs 2n³).
        dtype: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        device: ``"cpu"`` or ``"cuda"``.
        repeats: timed repetitions after one warm-up.
        seed: seed for the inputs.

    Returns:
        The best and median FLOP/s.
    """
    torch = _torch()
    check_choice("dtype", dtype, MODEL_DTYPES)
    check_choice("device", device, ("cpu", "cuda"))
    n, repeats = check_positive("n", n), check_positive("repeats", repeats)
    tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=tdtype)  # (n, n)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=tdtype)  # (n, n)
    a @ b
    _sync(torch, device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        _sync(torch, device)
        times.append(time.perf_counter() - t0)
    flops = 2.0 * n ** 3
    return MatmulBenchmark(n=n, dtype=dtype, device=device, threads=int(torch.get_num_threads()),
                           best_flops_per_s=flops / min(times), median_flops_per_s=flops / statistics.median(times))


@dataclass(frozen=True)
class StepTiming:
    """Wall time of training steps. Chapter 12.

    Attributes:
        step_times_s: seconds of each timed step.
        median_s: median step time.
        tokens: tokens per step.
        settings: model, device, dtype, batch_size, seq_len, attention, recompute, num_params.
    """

    step_times_s: list[float]
    median_s: float
    tokens: int
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        """Tokens trained per second (median step)."""
        return self.tokens / self.median_s


def time_training_step(model: ModelLike, *, batch_size: int = 2, seq_len: int = 128, device: str = "cpu",
                       dtype: str = "fp32", attention: str = "sdpa", recompute: str = "none", steps: int = 3,
                       warmup: int = 1, overrides: dict[str, Any] | None = None, seed: int = 0) -> StepTiming:
    """Time full training steps (forward, loss, backward, AdamW step, zero_grad) of the transformers model.

    Introduced in Chapter 12 (its lab computes MFU from it). ``dtype="bf16"`` runs the whole model in bf16
    (pure bf16 training, the fastest setting on a GPU); fp32 is the CPU default.

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        batch_size: sequences per step.
        seq_len: tokens per sequence.
        device: ``"cpu"`` or ``"cuda"``.
        dtype: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        attention: ``"eager"`` or ``"sdpa"``.
        recompute: ``"none"`` or ``"full"``.
        steps: timed steps.
        warmup: untimed steps first.
        overrides: config fields to replace.
        seed: seed for weights and inputs.

    Returns:
        The step times.
    """
    torch = _torch()
    from .trace import build_model

    check_choice("device", device, ("cpu", "cuda"))
    check_choice("recompute", recompute, ("none", "full"))
    steps = check_positive("steps", steps)
    warmup = check_positive("warmup", warmup, allow_zero=True)
    torch.manual_seed(seed)
    cfg = load_config(model)
    net = build_model(cfg, device=device, dtype=dtype, attention=attention, overrides=overrides)
    if recompute == "full":
        _enable_recompute(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    ids = torch.randint(0, int(net.config.vocab_size), (check_positive("batch_size", batch_size),
                                                        check_positive("seq_len", seq_len)), device=device)
    times = []
    for i in range(warmup + steps):
        _sync(torch, device)
        t0 = time.perf_counter()
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(torch, device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    settings = {"model": cfg.name, "device": device, "dtype": dtype, "batch_size": batch_size, "seq_len": seq_len,
                "attention": attention, "recompute": recompute,
                "num_params": int(sum(p.numel() for p in net.parameters()))}
    return StepTiming(step_times_s=times, median_s=statistics.median(times), tokens=batch_size * seq_len,
                      settings=settings)


# ----------------------------------------------------------------------------------------------------------
# CUDA memory snapshots (and the same format from a meta-device trace)
# ----------------------------------------------------------------------------------------------------------


def record_memory_history(enabled: bool = True, max_entries: int = 100_000) -> None:
    """Start (or stop) recording CUDA allocator events: ``torch.cuda.memory._record_memory_history``.

    Introduced in Chapter 12. Every allocation and free, with its Python and C++ stack, goes into a ring buffer
    of ``max_entries`` events; :func:`dump_memory_snapshot` writes it out.

    Raises:
        MemlibError: no CUDA device.
    """
    torch = _torch()
    if not torch.cuda.is_available():
        raise MemlibError("recording CUDA memory history needs a CUDA device; none is available")
    torch.cuda.memory._record_memory_history(enabled="all" if enabled else None, max_entries=max_entries)


def dump_memory_snapshot(path: str | Path) -> Path:
    """Write the recorded CUDA memory history as a pickle: ``torch.cuda.memory._dump_snapshot``.

    Introduced in Chapter 12. Drag the file onto https://pytorch.org/memory_viz to explore it, or draw it with
    :func:`snapshot_timeline` and ``memlib.viz.plots_profiling.memory_timeline_figure``.
    """
    torch = _torch()
    if not torch.cuda.is_available():
        raise MemlibError("dumping a CUDA memory snapshot needs a CUDA device; none is available")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._dump_snapshot(str(out))
    return out


def cuda_snapshot_training_step(model: ModelLike, path: str | Path, *, batch_size: int = 1, seq_len: int = 512,
                                dtype: str = "bf16", steps: int = 2, overrides: dict[str, Any] | None = None,
                                seed: int = 0) -> Path:
    """Record the CUDA memory history of ``steps`` training steps (AdamW) and dump the snapshot pickle.

    Introduced in Chapter 12 (run on a GPU by the book's GPU suite). Recording starts before the model is
    built, so the timeline shows the weights arriving, the optimizer states appearing in the first step, and
    the saw-tooth of activations in every step.
    """
    torch = _torch()
    from .trace import build_model

    record_memory_history(True)
    try:
        torch.manual_seed(seed)
        net = build_model(model, device="cuda", dtype=dtype, attention="sdpa", overrides=overrides)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
        ids = torch.randint(0, int(net.config.vocab_size), (batch_size, seq_len), device="cuda")  # (B, T)
        for _ in range(check_positive("steps", steps)):
            loss = net(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return dump_memory_snapshot(path)
    finally:
        record_memory_history(False)


# --- the GPU lab's measurements (were memlib.measure.profiling_gpu) ---
def _run(cmd: list[str], timeout: float = 60) -> dict[str, Any]:
    if shutil.which(cmd[0]) is None:
        return {"command": " ".join(cmd), "returncode": None, "output": f"{cmd[0]}: not found"}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"command": " ".join(cmd), "returncode": None, "output": "timed out"}
    return {"command": " ".join(cmd), "returncode": p.returncode, "output": (p.stdout + p.stderr)[-20000:]}


def gpu_ops_report() -> dict[str, Any]:
    """Run the Strategies notes' operations commands and collect their output (for ``labs/results/12_ops.json``).

    Introduced in Chapter 12. ``nvidia-smi``, ``nvidia-smi topo -m``, ``nvidia-smi dmon -c 5``,
    ``ds_report``, and ``torch.cuda.get_device_properties`` for each device (the PyTorch equivalent of the
    CUDA samples' ``deviceQuery``). Commands that are missing are reported as such, not skipped silently.
    """
    torch = _torch()
    report: dict[str, Any] = {"date_utc": time.strftime(DATE_FORMAT, time.gmtime()),
                              "torch": torch.__version__, "cuda_available": bool(torch.cuda.is_available())}
    report["commands"] = [_run(["nvidia-smi"]), _run(["nvidia-smi", "topo", "-m"]),
                          _run(["nvidia-smi", "dmon", "-c", "5"]), _run(["ds_report"], timeout=180)]
    props = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            props.append({"index": i, "name": p.name, "total_memory": int(p.total_memory),
                          "capability": f"{p.major}.{p.minor}", "multi_processor_count": int(p.multi_processor_count),
                          "text": str(p)})
    report["device_properties"] = props
    return report


# ----------------------------------------------------------------------------------------------------------
# MFU of a timed step, and the GPU suite that writes labs/results/
# ----------------------------------------------------------------------------------------------------------


def mfu_run(model: ModelLike, *, batch_size: int, seq_len: int, device: str = "cuda", dtype: str = "bf16",
            peak_flops_per_s: float | None = None, steps: int = 5, warmup: int = 2, recompute: str = "none",
            overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Time training steps and compute achieved TFLOP/s, MFU and HFU: the record Chapter 12's lab stores.

    Introduced in Chapter 12. Model FLOPs are :func:`memlib.core.flops.training_flops` with all T×T scores (PaLM's
    convention); on CUDA the peak is the dense ``dtype`` peak of the matching entry of :mod:`memlib.core.hardware`
    unless ``peak_flops_per_s`` is given (required on CPU: estimate it with :func:`matmul_benchmark`).

    Returns:
        A JSON-ready dict: settings, device name, step times, tokens/s, model and hardware FLOPs per step,
        achieved TFLOP/s, peak, MFU, HFU, torch version and UTC date.
    """
    torch = _torch()
    from ..core.flops import hfu, mfu, training_flops
    from ..core.hardware import match_gpu
    timing = time_training_step(model, batch_size=batch_size, seq_len=seq_len, device=device, dtype=dtype,
                                recompute=recompute, steps=steps, warmup=warmup, overrides=overrides)
    cfg = load_config(model)
    raw = dict(cfg.raw)
    raw.update(overrides or {})
    flops = training_flops(raw, batch_size, seq_len, recompute=recompute)
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    if peak_flops_per_s is None:
        spec = match_gpu(device_name) if device == "cuda" else None
        if spec is None:
            raise MemlibError(f"no peak FLOP/s known for device {device_name!r}; pass peak_flops_per_s")
        peak_flops_per_s = spec.peak_flops(dtype)
    out: dict[str, Any] = dict(timing.settings)
    out.update({"device_name": device_name, "torch": torch.__version__,
                "date_utc": time.strftime(DATE_FORMAT, time.gmtime()),
                "step_times_s": timing.step_times_s, "median_step_s": timing.median_s,
                "tokens_per_s": timing.tokens_per_s, "model_flops_per_step": flops.model_flops,
                "hardware_flops_per_step": flops.hardware_flops,
                "achieved_tflops": flops.model_flops / timing.median_s / 1e12,
                "peak_tflops": peak_flops_per_s / 1e12,
                "mfu": mfu(flops.model_flops, timing.median_s, peak_flops_per_s),
                "hfu": hfu(flops.hardware_flops, timing.median_s, peak_flops_per_s)})
    if device == "cuda":
        out["cuda_max_memory_allocated"] = int(torch.cuda.max_memory_allocated())
    return out


def write_gpu_results(results_dir: str | Path = "labs/results") -> list[Path]:
    """Run Chapter 12's GPU measurements and write their JSON records (one call on a lent GPU).

    Introduced in Chapter 12. Writes ``12_ops.json`` (:func:`gpu_ops_report`), ``12_mfu.json`` (:func:`mfu_run`
    on Qwen2-0.5B, batch 8 × 2048 tokens, bf16, and GPT-2 XL, batch 8 × 1024) and ``12_memory_timeline.json``
    (a CUDA snapshot of two training steps of Qwen2-0.5B, drawn by the book). A few minutes on an A100/H100.

    Raises:
        MemlibError: no CUDA device.
    """
    torch = _torch()
    if not torch.cuda.is_available():
        raise MemlibError("write_gpu_results needs a CUDA device; none is available")
    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    path = out / "12_ops.json"
    path.write_text(json.dumps(gpu_ops_report(), indent=1))
    written.append(path)
    runs = []
    for model, b, s in (("qwen2-0.5b", 8, 2048), ("gpt2-xl", 8, 1024)):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        runs.append(mfu_run(model, batch_size=b, seq_len=s))
    mm = matmul_benchmark(8192, dtype="bf16", device="cuda", repeats=10)
    path = out / "12_mfu.json"
    path.write_text(json.dumps({"runs": runs, "matmul_8192_bf16": asdict(mm)}, indent=1))
    written.append(path)
    torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory() as tmp:
        snap = cuda_snapshot_training_step("qwen2-0.5b", Path(tmp) / "snap.pickle", batch_size=4, seq_len=1024)
        timeline = snapshot_timeline(snap)
    record = downsample_timeline(timeline)
    record.update({"model": "qwen2-0.5b", "batch_size": 4, "seq_len": 1024, "dtype": "bf16", "steps": 2,
                   "device_name": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "date_utc": time.strftime(DATE_FORMAT, time.gmtime())})
    path = out / "12_memory_timeline.json"
    path.write_text(json.dumps(record))
    written.append(path)
    return written
