"""The GPU suite: one script that measures every GPU part of the book on one CUDA GPU and records JSON.

Run from the repository root on a machine with one CUDA GPU (no internet needed):

    python labs/gpu_suite.py                 # everything, ≈ 8 minutes budget
    python labs/gpu_suite.py --only training checkpointing
    python labs/gpu_suite.py --dry-run       # no GPU: check that every part's function exists, list the files

Each part writes its JSON under ``labs/results/`` through ``memlib.measure.results`` (the measured values and
one provenance record: device, torch and CUDA versions, UTC date, this command), the file the chapter or lab
shows when it runs without a GPU. Parts are independent: a failing part is recorded with its
error and the others still run. ``labs/results/gpu_suite.json`` lists what ran, how long it took, and the
table of estimate vs meta trace vs ``torch.cuda.max_memory_allocated`` for the training cases.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

SUITE_VERSION = 1
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "labs" / "results"

# (model, overrides, batch, seq, precision, attention, recompute): sizes that fit a 40 GB+ GPU in seconds
TRAINING_CASES: list[tuple[str, dict[str, Any] | None, int, int, str, str, str]] = [
    ("gpt2", None, 8, 1024, "bf16-mixed", "sdpa", "none"),
    ("gpt2", None, 8, 1024, "bf16-mixed", "eager", "none"),
    ("gpt2", None, 8, 1024, "bf16", "sdpa", "full"),
    ("gpt2-medium", None, 4, 1024, "bf16-mixed", "sdpa", "none"),
    ("qwen2-0.5b", None, 4, 2048, "bf16-mixed", "sdpa", "none"),
    ("qwen2-0.5b", None, 4, 2048, "bf16-mixed", "sdpa", "full"),
    ("llama-2-7b", {"num_hidden_layers": 4}, 2, 2048, "bf16-mixed", "sdpa", "none"),
    ("llama-2-7b", {"num_hidden_layers": 4}, 2, 2048, "bf16-mixed", "eager", "none"),
    ("llama-2-7b", {"num_hidden_layers": 4}, 2, 2048, "bf16", "sdpa", "full"),
    ("llama-3-8b", {"num_hidden_layers": 4}, 2, 2048, "bf16-mixed", "sdpa", "none"),
]


def _env() -> dict[str, Any]:
    """What the suite report adds to the provenance record: the suite version, GPU memory and driver."""
    import torch

    props = torch.cuda.get_device_properties(0)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        smi = ""
    return {"suite_version": SUITE_VERSION, "memory_bytes": int(props.total_memory), "driver": smi}


def _record(name: str, measure: Callable[[], dict[str, Any]], command: str) -> list[Path]:
    """Measure now and write ``labs/results/<name>.json`` with its provenance (memlib.measure.results)."""
    from memlib.measure.results import load_or_measure

    recorded = load_or_measure(name, measure, command=command, available=True, report=None)
    assert recorded is not None  # available=True: measured and saved
    return [recorded.path]


def part_training(command: str) -> list[Path]:
    """Estimate vs meta trace vs the CUDA allocator for real training steps (Chapter 1's question, on a GPU)."""
    import torch

    from memlib.core.configs import load_config
    from memlib.core.estimate import estimate_training
    from memlib.measure.trace import trace_training

    def measure() -> dict[str, Any]:
        rows = [training_row(*case) for case in TRAINING_CASES]
        errors = [abs(r["error_estimate_vs_allocated"]) for r in rows]
        return {"rows": rows, "median_abs_error": statistics.median(errors), "max_abs_error": max(errors)}

    def training_row(model: str, overrides: dict[str, Any] | None, b: int, s: int, precision: str,
                      attention: str, recompute: str) -> dict[str, Any]:
        kw: dict[str, Any] = dict(batch_size=b, seq_len=s, precision=precision, attention=attention,
                                  recompute=recompute)
        meta = trace_training(model, overrides=overrides, **kw)
        cfg = model if overrides is None else {**load_config(model).raw, **overrides}
        est = estimate_training(cfg, **kw)
        torch.cuda.empty_cache()
        cuda = trace_training(model, overrides=overrides, device="cuda", **kw)
        allocated = cuda.settings["cuda_max_memory_allocated"]
        row = {"model": model, "overrides": overrides, **kw, "estimate": est.total_bytes,
               "meta_trace": meta.peak_bytes, "cuda_trace": cuda.peak_bytes,
               "cuda_max_memory_allocated": allocated,
               "cuda_max_memory_reserved": cuda.settings["cuda_max_memory_reserved"],
               "error_estimate_vs_allocated": (est.total_bytes - allocated) / allocated}
        del cuda
        torch.cuda.empty_cache()
        return row

    return _record("gpu_training", measure, command)


def part_checkpointing(command: str) -> list[Path]:
    """Chapter 4's lab: largest batch with and without recomputation (OOM-catching search) vs memlib."""
    from memlib.measure.checkpointing import gpu_checkpointing_results

    return _record("checkpointing", gpu_checkpointing_results, command)


def part_accumulation(command: str) -> list[Path]:
    """Chapter 5: peak memory vs micro-batch and accumulation steps, with the CUDA allocator's peak."""
    from memlib._book.ch05_gradient_accumulation import memory_sweep

    return _record("05_accumulation_memory",
                   lambda: {"rows": memory_sweep("gpt2", seq_len=512, overrides={"n_layer": 4}, device="cuda")},
                   command)


def part_offload(command: str) -> list[Path]:
    """Chapter 7: FSDP2 with and without CPUOffloadPolicy, CPU Adam throughput."""
    from memlib.measure.offload import offload_gpu_results

    return _record("07_offload", offload_gpu_results, command)


def part_paged(command: str) -> list[Path]:
    """Chapter 9: bitsandbytes PagedAdamW vs AdamW."""
    from memlib.measure.quant import paged_adamw_gpu_results

    return _record("09_paged_adamw", paged_adamw_gpu_results, command)


def part_inference(command: str) -> list[Path]:
    """Chapter 11: weights, KV cache and peak of a real prefill + decode."""
    from memlib._book.ch11_inference_memory import measure_serving

    return _record("inference_serving", lambda: measure_serving("qwen2-0.5b", device="cuda", batch_size=8,
                                                                prompt_len=512, new_tokens=64, dtype="bf16"),
                   command)


def part_profiling(command: str) -> list[Path]:
    """Chapter 12 and its lab: ops report, MFU of real steps, a CUDA memory snapshot timeline."""
    from memlib.measure.profiling import write_gpu_results
    from memlib.measure.results import Provenance, save_recorded

    provenance = Provenance.of_this_run(command)
    out = []
    with tempfile.TemporaryDirectory() as tmp:  # profiling writes its three files; they are recorded from there
        for path in write_gpu_results(tmp):
            data = json.loads(Path(path).read_text())
            out.append(save_recorded(Path(path).stem, data, provenance).path)
    return out


# Lab 1's cases (labs/01_measure_a_step.ipynb): (model, batch, seq, precision, framework)
LAB1_CASES: list[tuple[str, int, int, str, str]] = [
    ("gpt2", 8, 1024, "bf16", "pytorch"), ("gpt2-medium", 4, 1024, "bf16-mixed", "deepspeed"),
    ("qwen2-0.5b", 2, 2048, "bf16", "pytorch")]


def part_allocator(command: str) -> list[Path]:
    """Chapter 16: max_memory_reserved of Lab 1's steps vs the allocator simulator, with and without expandable segments."""
    import torch

    from memlib.measure.trace import trace_training

    def measure() -> dict[str, Any]:
        rows = []
        for model, b, s, prec, fw in LAB1_CASES:
            kw: dict[str, Any] = dict(batch_size=b, seq_len=s, precision=prec, framework=fw)
            sim = trace_training(model, reserved=True, expandable_segments=True, **kw)
            row: dict[str, Any] = {"model": model, **kw, "meta_trace": sim.peak_bytes,
                                   "simulated_reserved": sim.reserved_peak_bytes,
                                   "simulated_reserved_expandable": sim.reserved_peak_expandable_bytes}
            for expandable in (False, True):
                torch.cuda.empty_cache()  # a fresh cache, as the replay starts from
                torch.cuda.memory._set_allocator_settings(f"expandable_segments:{expandable}")
                cuda = trace_training(model, device="cuda", **kw)
                key = "_expandable" if expandable else ""
                row[f"cuda_max_memory_allocated{key}"] = cuda.settings["cuda_max_memory_allocated"]
                row[f"cuda_max_memory_reserved{key}"] = reserved = cuda.settings["cuda_max_memory_reserved"]
                row[f"error_simulated_vs_reserved{key}"] = (row[f"simulated_reserved{key}"] - reserved) / reserved
                del cuda
            torch.cuda.memory._set_allocator_settings("expandable_segments:False")
            torch.cuda.empty_cache()
            rows.append(row)
        return {"rows": rows}

    return _record("gpu_allocator", measure, command)


def part_notebook_labs(command: str) -> list[Path]:
    """Labs 1, 3 and 10 measure on the GPU inside the notebook and write their JSON: run copies of them."""
    import nbformat
    from nbclient import NotebookClient

    out = []
    for name, result in (("01_measure_a_step", "measure_step.json"), ("03_amp_lab", "amp.json"),
                         ("10_attention_lab", "attention.json")):
        nb = nbformat.read(ROOT / "labs" / f"{name}.ipynb", as_version=4)
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT / "labs")}}).execute()
        out.append(RESULTS / result)
    return out


PARTS: dict[str, Callable[[str], list[Path]]] = {
    "training": part_training, "checkpointing": part_checkpointing, "accumulation": part_accumulation,
    "offload": part_offload, "paged": part_paged, "inference": part_inference, "profiling": part_profiling,
    "allocator": part_allocator, "notebook_labs": part_notebook_labs,
}

# the functions each part calls, checked by --dry-run (and by tests/test_gpu_suite.py) without a GPU
CALLS = {"training": ["memlib.measure.trace:trace_training", "memlib.core.estimate:estimate_training"],
         "checkpointing": ["memlib.measure.checkpointing:gpu_checkpointing_results"],
         "accumulation": ["memlib._book.ch05_gradient_accumulation:memory_sweep"],
         "offload": ["memlib.measure.offload:offload_gpu_results"],
         "paged": ["memlib.measure.quant:paged_adamw_gpu_results"],
         "inference": ["memlib._book.ch11_inference_memory:measure_serving"],
         "profiling": ["memlib.measure.profiling:write_gpu_results"],
         "allocator": ["memlib.measure.trace:trace_training", "memlib.core.allocator:replay"],
         "results": ["memlib.measure.results:load_or_measure", "memlib.measure.results:save_recorded"],
         "notebook_labs": ["nbclient:NotebookClient", "nbformat:read"]}


def dry_run(parts: list[str]) -> int:
    """Resolve every function the chosen parts call; print the plan. Needs no GPU."""
    import importlib

    missing = []
    for part in parts:
        for ref in CALLS[part] + CALLS["results"]:
            module, name = ref.split(":")
            if not hasattr(importlib.import_module(module), name):
                missing.append(ref)
        summary = (PARTS[part].__doc__ or "").splitlines()[0]
        print(f"{part:<14} {summary}")
    for notebook in ("01_measure_a_step", "03_amp_lab", "10_attention_lab"):
        if not (ROOT / "labs" / f"{notebook}.ipynb").exists():
            missing.append(f"labs/{notebook}.ipynb")
    if missing:
        print("missing: " + ", ".join(missing))
        return 1
    print(f"dry run: {len(parts)} parts ready; results go to {RESULTS.relative_to(ROOT)}/")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(PARTS), help="run these parts only")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds; later parts are skipped past it")
    parser.add_argument("--dry-run", action="store_true", help="check the parts without a GPU")
    args = parser.parse_args(argv)
    parts = args.only or list(PARTS)
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    if args.dry_run:
        return dry_run(parts)
    import torch

    if not torch.cuda.is_available():
        print("gpu_suite: no CUDA GPU here; nothing measured (use --dry-run to check the parts)", file=sys.stderr)
        return 2
    from memlib.measure.results import Provenance, save_recorded

    command = shlex.join(["python", "labs/gpu_suite.py", *(sys.argv[1:] if argv is None else argv)])
    provenance = Provenance.of_this_run(command)
    start = time.perf_counter()
    report = []
    for part in parts:
        elapsed = time.perf_counter() - start
        if elapsed > args.budget:
            report.append({"part": part, "status": "skipped (budget)", "seconds": 0.0, "files": []})
            continue
        t0 = time.perf_counter()
        try:
            files = PARTS[part](command)
            status, error = "ok", None
        except Exception as exc:  # noqa: BLE001 - one part's failure must not stop the suite
            files, status, error = [], "failed", "".join(traceback.format_exception(exc))[-2000:]
        finally:
            torch.cuda.empty_cache()
        seconds = time.perf_counter() - t0
        report.append({"part": part, "status": status, "seconds": round(seconds, 1),
                       "files": [str(Path(f).relative_to(ROOT)) if Path(f).is_absolute() else str(f) for f in files],
                       **({"error": error} if error else {})})
        print(f"{part:<14} {status:<8} {seconds:7.1f} s  {', '.join(report[-1]['files'])}", flush=True)
    save_recorded("gpu_suite", {**_env(), "parts": report, "seconds": round(time.perf_counter() - start, 1)},
                  provenance)
    training = RESULTS / "gpu_training.json"
    if training.exists() and any(r["part"] == "training" and r["status"] == "ok" for r in report):
        data = json.loads(training.read_text())
        print(f"\n{'model':<12}{'b×s':>10} {'precision':<11}{'attn':<6}{'recomp':<7}{'estimate':>10}{'allocated':>11}"
              f"{'error':>8}")
        for r in data["rows"]:
            print(f"{r['model']:<12}{str(r['batch_size']) + '×' + str(r['seq_len']):>10} {r['precision']:<11}"
                  f"{r['attention']:<6}{r['recompute']:<7}{r['estimate'] / 1e9:>9.2f}G"
                  f"{r['cuda_max_memory_allocated'] / 1e9:>10.2f}G{100 * r['error_estimate_vs_allocated']:>+7.1f}%")
        print(f"median |error| {100 * data['median_abs_error']:.1f} %")
    return 0 if all(r["status"] == "ok" for r in report) else 1


if __name__ == "__main__":
    sys.exit(main())
