"""Chapter 12's GPU-machine measurements: operations commands, MFU of timed steps, the run that writes labs/results/.

Measurement module (torch imported lazily); re-exported by :mod:`memlib.measure.profiling`.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..core.configs import load_config
from ..core.errors import MemlibError
from ..core.profiling import downsample_timeline, snapshot_timeline
from .deps import require_torch
from .results import DATE_FORMAT

__all__ = ["gpu_ops_report", "mfu_run", "write_gpu_results"]

ModelLike = Any  # str | Path | dict | ModelConfig, as in memlib.measure.profiling


def _torch() -> Any:
    return require_torch("memlib.measure.profiling_gpu")


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
    from .profiling import time_training_step

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
    from .profiling import cuda_snapshot_training_step, matmul_benchmark

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
