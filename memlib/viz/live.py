"""Live calculators for the book's static pages: controls and result as HTML/SVG drawn from memlib's estimates.

Introduced in Chapter 1. The published book has no kernel; ``_static/memlib-live.js`` runs this module under
Pyodide (CPython in WebAssembly) in the reader's browser and calls :func:`render` again whenever a control
changes. The notebook cell that puts a calculator on the page calls the same :func:`render` (``live=False``:
the controls are drawn disabled until the script enables them), so the static page shows exactly what the
live one starts from. JavaScript only loads Pyodide and this package and wires events; every number comes from
the same memlib function the notebooks call (no formula here or in JavaScript).

The HTML contract with the script: the root element has class ``memlib-live`` and ``data-kind``; its controls
(``<select>``, ``<input>``, ``<button name="action">``) live in a ``<form class="memlib-live-controls">`` and
their ``name``/``value`` pairs are the next call's ``params``; the result is the element with class
``memlib-live-result``; ``memlib-live-status`` is the script's line (loading progress, or why the page stays
static).

Only the standard library and memlib's pure modules (:data:`LIVE_MODULES`) are imported here: no numpy, torch,
matplotlib or ipywidgets, which the browser does not have.
"""
from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core.configs import load_config, shipped_models
from ..core.hub import hub_ids, shipped_for_id
from ..core.dtypes import GB, WEIGHT_FORMATS, GiB
from ..core.errors import MemlibError, check_choice
from ..core.choices import FRAMEWORKS, KV_DTYPES, LOSSES, OPTIMIZERS, PRECISIONS, ZERO_STAGES
from ..core.estimate import TrainingEstimate, estimate_training
from ..core.formats import FORMAT_NAMES, encode
from ..core.hardware import GPU_MEMORY_MENU_GIB, SERVE_GPUS  # the menus, defined once
from ..core.offload import GPU_PEAK_FLOPS, OffloadTime, offload_step_time
from ..core.params import count_params
from ..core.plan import JOBS, Plan, plan
from ..core.serve import ServeFit, serve
from ..core.vllm_engine import VLLM_RELEASES
from ..core.inference import max_batch_size, max_seq_len, reserve_bytes
from .plots import CATEGORY_COLORS, peak_composition
from ..drills.widgets import CardState, check_card, next_card, reveal_card

__all__ = ["LIVE_DATA", "LIVE_KINDS", "LIVE_MODULES", "OFFLOAD_PARTS", "offload_breakdown", "plan_verdict",
           "render", "serve_parts", "training_verdict"]

#: memlib's modules the live calculators import, as paths under memlib/ without .py (shipped to the browser as one
#: zip by the book build).
LIVE_MODULES: tuple[str, ...] = (
    "__init__", "core/__init__", "core/activations", "core/allocator", "core/attention_terms", "core/autocast", "core/categories",
    "core/checkpointing", "core/choices", "core/cluster", "core/configs", "core/dtypes", "core/errors", "core/estimate",
    "core/families_dense", "core/families_moe", "core/flash", "core/flops", "core/formats", "core/fp8", "core/frameworks/__init__",
    "core/frameworks/base", "core/frameworks/deepspeed", "core/frameworks/deepspeed_client",
    "core/frameworks/fsdp2", "core/frameworks/megatron", "core/frameworks/pytorch", "core/frameworks/torchtitan",
    "core/frameworks/zero3_fetch", "core/hardware",
    "core/hub", "core/inference", "core/lora", "core/losses", "core/offload", "core/parallel",
    "core/params", "core/plan", "core/rl", "core/scaler", "core/schedules", "core/search", "core/serve", "core/serving_terms", "core/setup", "core/states",
    "core/terms", "core/vllm_engine", "drills/__init__", "drills/answers", "drills/bank", "drills/concepts", "drills/engine", "drills/numeric", "drills/widgets", "viz/__init__",
    "viz/live", "viz/plots",
)
#: Data files the live calculators read, as glob patterns under memlib/ (shipped in the same zip): the model
#: configs and the drills' question bank.
LIVE_DATA: tuple[str, ...] = ("core/configs/*.json", "drills/bank.json")

SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
NUM_GPUS = (1, 2, 4, 8, 16, 32, 64)
GPU_MEMORY_GIB = GPU_MEMORY_MENU_GIB
_CATEGORY_NAMES = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer states",
                   "activations": "activations", "temp": "temporaries"}


# ------------------------------------------------------------------------------------------- helpers
def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _disabled(live: bool) -> str:
    return "" if live else " disabled"


def _select(name: str, label: str, options: Sequence[object], value: object, live: bool,
            labels: Mapping[str, str] | None = None) -> str:
    shown = labels or {}
    opts = "".join(f'<option value="{_e(o)}"{" selected" if str(o) == str(value) else ""}>{_e(shown.get(str(o), o))}'
                   f'</option>' for o in options)
    return (f'<label class="memlib-live-field"><span>{_e(label)}</span>'
            f'<select name="{_e(name)}"{_disabled(live)}>{opts}</select></label>')


def _model(params: Mapping[str, Any], default: str, models: Sequence[str]) -> str:
    """The model control's value: a shipped name, or a Hugging Face id of one (``meta-llama/Llama-2-7b-hf``)."""
    value = str(params.get("model", default))
    hit = shipped_for_id(value)
    if hit is not None and not hit[1]:  # an id whose config.json is the shipped one
        value = hit[0]
    check_choice("model", value, list(models))
    return value


def _model_select(models: Sequence[str], value: str, live: bool) -> str:
    """The model list, each shipped name shown with its Hugging Face id."""
    labels = {m: f"{m} · {hub_ids(m)[0]}" for m in models if hub_ids(m)}
    return _select("model", "model", models, value, live, labels)


def _range(name: str, label: str, lo: int, hi: int, value: int, live: bool) -> str:
    return (f'<label class="memlib-live-field"><span>{_e(label)} <output>{value}</output></span>'
            f'<input type="range" name="{_e(name)}" min="{lo}" max="{hi}" step="1" value="{value}"'
            f'{_disabled(live)}></label>')


def _root(kind: str, controls: str, result: str, live: bool, note: str) -> str:
    status = "" if live else _e(note)
    return (f'<div class="memlib-live" data-kind="{_e(kind)}">'
            f'<form class="memlib-live-controls" onsubmit="return false">{controls}</form>'
            f'<div class="memlib-live-result" aria-live="polite">{result}</div>'
            f'<p class="memlib-live-status">{status}</p></div>')


def _int(params: Mapping[str, Any], name: str, default: int) -> int:
    raw = params.get(name, default)
    try:
        return int(str(raw).strip())
    except ValueError:
        raise MemlibError(f"{name} must be an integer, got {raw!r}") from None


def _float(params: Mapping[str, Any], name: str, default: float) -> float:
    raw = params.get(name, default)
    try:
        return float(str(raw).strip())
    except ValueError:
        raise MemlibError(f"{name} must be a number, got {raw!r}") from None


def _choice(params: Mapping[str, Any], name: str, default: object, choices: Sequence[object]) -> str:
    value = str(params.get(name, default))
    check_choice(name, value, [str(c) for c in choices])
    return value


# ------------------------------------------------------------------------------------------ training
def training_verdict(est: TrainingEstimate, gpu_memory_gib: float) -> str:
    """One line: the estimate per GPU plus the book's reserve, and whether it fits. Introduced in Chapter 1.

    A GPU's memory is binary (an "80 GB" card holds 80 GiB). The estimate fits when it plus the book's one
    reserve (:func:`memlib.core.inference.reserve_bytes`: CUDA context + 5 % fragmentation) is within that memory.

    Args:
        est: a result of :func:`memlib.core.estimate.estimate_training`.
        gpu_memory_gib: the GPU's memory in GiB.

    Returns:
        The verdict, e.g. ``"31.4 GiB per GPU + 2.6 GiB reserve (peak in the backward): fits in 80 GiB"``.
    """
    capacity = int(gpu_memory_gib * GiB)
    reserve = reserve_bytes(est.total_bytes)
    fits = est.total_bytes + reserve <= capacity
    return (f"{est.total_bytes / GiB:.1f} GiB per GPU + {reserve / GiB:.1f} GiB reserve (peak in the "
            f"{est.peak_phase}): {'fits' if fits else 'does not fit'} in {gpu_memory_gib:.0f} GiB")


def _training_svg(parts: Mapping[str, int], capacity_bytes: int) -> str:
    """One stacked bar of the peak composition (GB) with the GPU's memory as a dashed line."""
    width, left, bar_w = 640, 8, 600
    total = sum(parts.values())
    scale = bar_w / (max(total, capacity_bytes) * 1.05)
    x = float(left)
    rects = []
    for cat, b in parts.items():
        if b <= 0:
            continue
        w = b * scale
        rects.append(f'<rect x="{x:.1f}" y="10" width="{w:.1f}" height="34" fill="{CATEGORY_COLORS[cat]}">'
                     f'<title>{_e(_CATEGORY_NAMES[cat])}: {b / GB:.1f} GB</title></rect>')
        x += w
    cap_x = left + capacity_bytes * scale
    return (f'<svg class="memlib-live-bar" viewBox="0 0 {width} 72" role="img" '
            f'aria-label="peak memory {total / GB:.1f} GB per GPU against {capacity_bytes / GB:.1f} GB">'
            + "".join(rects)
            + f'<line x1="{cap_x:.1f}" x2="{cap_x:.1f}" y1="4" y2="50" stroke="currentColor" '
              f'stroke-dasharray="4 3" stroke-width="1.5"/>'
            + f'<text x="{min(cap_x, width - 4):.1f}" y="64" font-size="11" text-anchor="end" fill="currentColor">'
              f'GPU: {capacity_bytes / GB:.1f} GB</text>'
            + f'<text x="{left}" y="64" font-size="11" fill="currentColor">peak {total / GB:.1f} GB</text></svg>')


def _training(params: Mapping[str, Any], live: bool) -> str:
    models = shipped_models()
    model = _model(params, "llama-2-7b", models)
    batch_size = _int(params, "batch_size", 4)
    if not 1 <= batch_size <= 64:
        raise MemlibError(f"batch_size {batch_size} out of range; expected 1..64")
    seq_len = int(_choice(params, "seq_len", 4096, SEQ_LENS))
    precision = _choice(params, "precision", "bf16-mixed", PRECISIONS)
    loss = _choice(params, "loss", "standard", LOSSES)  # Chapter 17
    optimizer = _choice(params, "optimizer", "adamw", OPTIMIZERS)
    framework = _choice(params, "framework", "pytorch", FRAMEWORKS)
    zero_stage = int(_choice(params, "zero_stage", 0, ZERO_STAGES))
    num_gpus = int(_choice(params, "num_gpus", 1, NUM_GPUS))
    gpu_memory_gib = float(_choice(params, "gpu_memory_gib", 80.0, GPU_MEMORY_GIB))
    controls = (_model_select(models, model, live)
                + _range("batch_size", "batch", 1, 64, batch_size, live)
                + _select("seq_len", "sequence", SEQ_LENS, seq_len, live)
                + _select("precision", "precision", PRECISIONS, precision, live)
                + _select("loss", "loss", LOSSES, loss, live)
                + _select("optimizer", "optimizer", OPTIMIZERS, optimizer, live)
                + _select("framework", "framework", FRAMEWORKS, framework, live)
                + _select("zero_stage", "ZeRO stage", ZERO_STAGES, zero_stage, live)
                + _select("num_gpus", "GPUs", NUM_GPUS, num_gpus, live)
                + _select("gpu_memory_gib", "GPU memory (GiB)", GPU_MEMORY_GIB, gpu_memory_gib, live))
    try:
        est = estimate_training(model, batch_size=batch_size, seq_len=seq_len, precision=precision,
                                optimizer=optimizer, zero_stage=zero_stage, num_gpus=num_gpus, framework=framework,
                                loss=loss)
    except MemlibError as err:  # e.g. a sequence longer than the model's positions, pytorch with ZeRO-2
        result = f'<p class="memlib-live-refused">refused: {_e(err)}</p>'
        return _root("training", controls, result, live, _STATIC_NOTE)
    parts = peak_composition(est)
    verdict = training_verdict(est, gpu_memory_gib)
    rows = "".join(f'<tr><td><span class="memlib-live-swatch" style="background:{CATEGORY_COLORS[c]}"></span>'
                   f'{_e(_CATEGORY_NAMES[c])}</td><td>{b / GB:.1f} GB</td></tr>' for c, b in parts.items())
    result = (_training_svg(parts, int(gpu_memory_gib * GiB))
              + f'<table class="memlib-live-table"><thead><tr><th>live at the peak, per GPU</th><th>GB (10⁹ B)'
                f'</th></tr></thead><tbody>{rows}</tbody></table>'
              + f'<p class="memlib-live-verdict"><b>{_e(verdict)}</b></p>'
              + f'<p>fp32 logits at the loss ({_e(loss)}): {est.logits_bytes / GB:.2f} GB</p>')
    return _root("training", controls, result, live, _STATIC_NOTE)


# --------------------------------------------------------------------------------------------- drill
def _drill(params: Mapping[str, Any], live: bool) -> str:
    seed = _int(params, "seed", 2026)
    action = _choice(params, "action", "", ("", "check", "reveal", "next"))
    answer = str(params.get("answer", ""))
    card: CardState = next_card(seed)
    if action == "next":
        seed, answer = seed + 1, ""
        card = next_card(seed)
    elif action == "check":
        card = check_card(card.drill, answer)
    elif action == "reveal":
        card = reveal_card(card.drill)
    d = card.drill
    question = (f'<p class="memlib-live-question"><b>[{_e(d.difficulty)}] {_e(d.kind)}</b> (seed {seed}): '
                f'{_e(d.question)} <i>Answer in {_e(d.unit)}.</i></p>')
    controls = (question + f'<input type="hidden" name="seed" value="{seed}">'
                + f'<label class="memlib-live-field"><span>your answer</span><input type="text" name="answer" '
                  f'value="{_e(answer)}" placeholder="e.g. 21.5, 20 GiB or 7.4M" autocomplete="off" data-enter="check"'
                  f'{_disabled(live)}></label>'
                + "".join(f'<button type="button" name="action" value="{a}"{_disabled(live)}>{a.title()}</button>'
                          for a in ("check", "reveal", "next")))
    state = {True: "correct", False: "wrong", None: "neutral"}[card.correct]
    result = f'<p class="memlib-live-{state}">{_e(card.message)}</p>' if card.message else ""
    return _root("drill", controls, result, live, _STATIC_NOTE)


# -------------------------------------------------------------------------------------------- format
_FIELD_COLORS = {"sign": "#e15759", "exponent": "#4e79a7", "mantissa": "#59a14f"}  # Chapter 2's figure


def _format(params: Mapping[str, Any], live: bool) -> str:
    text = str(params.get("value", "0.1")).strip()
    field = (f'<label class="memlib-live-field"><span>number</span><input type="text" name="value" '
             f'value="{_e(text)}" inputmode="decimal" autocomplete="off" data-recompute="change"'
             f'{_disabled(live)}></label>')
    try:
        value = float(text.replace("_", "").replace(",", ""))
    except ValueError:
        result = (f'<p class="memlib-live-refused">cannot read {_e(text)!s} as a number; expected e.g. 0.1, -3, '
                  f'1e-9, 65520, inf or nan</p>')
        return _root("format", field, result, live, _STATIC_NOTE)
    rows = []
    for name in FORMAT_NAMES:
        b = encode(value, name)
        sign, exp, man = b.grouped.split(" ")
        bits = " ".join(f'<span style="color:{_FIELD_COLORS[k]}">{v}</span>'
                       for k, v in (("sign", sign), ("exponent", exp), ("mantissa", man)))
        err = "" if math.isnan(b.relative_error) else f"{b.relative_error:.2e}"  # NaN: zero/inf/NaN input
        rows.append(f"<tr><td>{name}</td><td><code>{bits}</code></td><td>{b.value:.10g}</td><td>{b.kind}</td>"
                    f"<td>{err}</td></tr>")
    legend = " ".join(f'<span style="color:{c}">{k}</span>' for k, c in _FIELD_COLORS.items())
    result = (f'<table class="memlib-live-table"><thead><tr><th>format</th><th>bits ({legend})</th>'
              f'<th>stored value</th><th>kind</th><th>relative error</th></tr></thead><tbody>{"".join(rows)}'
              f'</tbody></table>')
    return _root("format", field, result, live, _STATIC_NOTE)


# ------------------------------------------------------------------------------------------- offload
#: The segments of :func:`offload_breakdown`'s bars, in order.
OFFLOAD_PARTS = ("GPU compute", "copies not hidden", "optimizer step (GPU / CPU)", "weights up")
_PART_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")  # matplotlib's C0..C3, as Chapter 7's figure
OFFLOAD_LINKS = ("pcie3", "pcie4", "pcie5", "nvlink-c2c")
OFFLOAD_TOKENS = tuple(2**k for k in range(11, 21))  # tokens per optimizer step per GPU: 2k … 1M
OFFLOAD_MICRO = tuple(2**k for k in range(10, 17))  # tokens per micro-batch: 1k … 64k
OFFLOAD_CPU_ADAM = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)  # 10⁹ parameters/s
OFFLOAD_MFU = (0.2, 0.3, 0.4, 0.5, 0.6)


def offload_breakdown(params: int, *, gpu: str = "h100", link: str = "pcie5", tokens_per_step: int = 65536,
                      micro_tokens: int = 16384, cpu_adam_gparams: float = 4.0, mfu: float = 0.4,
                      delayed_update: bool = False) -> tuple[dict[str, list[float]], OffloadTime]:
    """Where one optimizer step's time goes, with and without ZeRO-Offload. Introduced in Chapter 7.

    Both bars come from :func:`memlib.core.offload.offload_step_time` (``mode="none"`` and ``"optimizer"``) with
    ``tokens_per_step // micro_tokens`` micro-batches: GPU compute, the copies not hidden behind it, the
    optimizer step (on the GPU, or on the CPU and not overlapped) and the upload of the updated weights.

    Args:
        params: Ψ, the model's parameter count.
        gpu: a :data:`memlib.core.offload.GPU_PEAK_FLOPS` key.
        link: a :data:`memlib.core.offload.LINK_BANDWIDTH` key.
        tokens_per_step: tokens per optimizer step per GPU.
        micro_tokens: tokens per micro-batch (capped at ``tokens_per_step``).
        cpu_adam_gparams: CPU Adam throughput in 10⁹ parameters/s.
        mfu: model FLOPs utilization of the GPU compute.
        delayed_update: DeepSpeed's one-step delayed parameter update.

    Returns:
        ``{"no offload": [...], "ZeRO-Offload": [...]}`` in seconds per :data:`OFFLOAD_PARTS` (each list sums to
        that setup's ``step_s``), and the offload setup's :class:`~memlib.core.offload.OffloadTime`.
    """
    micro = min(micro_tokens, tokens_per_step)
    steps = max(1, tokens_per_step // micro)
    kw: dict[str, Any] = {"gpu": gpu, "link": link, "mfu": mfu, "grad_accum_steps": steps,
                          "cpu_adam_params_per_s": cpu_adam_gparams * 1e9}
    off = offload_step_time(params, micro, "optimizer", delayed_update=delayed_update, **kw)
    base = offload_step_time(params, micro, "none", **kw)
    work = off.micro_s * steps  # all micro-batches, with their copies
    tail = max(off.step_s - work, 0.0)  # what the CPU step and the upload add
    parts = {"no offload": [base.compute_s, 0.0, base.step_s - base.compute_s, 0.0],
             "ZeRO-Offload": [off.compute_s, work - off.compute_s, tail - min(off.upload_s, tail),
                              min(off.upload_s, tail)]}
    return parts, off


def _offload(params: Mapping[str, Any], live: bool) -> str:
    gpus = sorted(GPU_PEAK_FLOPS)
    gpu = _choice(params, "gpu", "h100", gpus)
    link = _choice(params, "link", "pcie5", OFFLOAD_LINKS)
    tokens = int(_choice(params, "tokens_per_step", 65536, OFFLOAD_TOKENS))
    micro = int(_choice(params, "micro_tokens", 16384, OFFLOAD_MICRO))
    adam = float(_choice(params, "cpu_adam_gparams", 4.0, OFFLOAD_CPU_ADAM))
    mfu = float(_choice(params, "mfu", 0.4, OFFLOAD_MFU))
    dpu = _choice(params, "delayed_update", "no", ("no", "yes")) == "yes"
    controls = (_select("gpu", "GPU", gpus, gpu, live) + _select("link", "link", OFFLOAD_LINKS, link, live)
                + _select("tokens_per_step", "tokens per step", OFFLOAD_TOKENS, tokens, live)
                + _select("micro_tokens", "tokens per micro-batch", OFFLOAD_MICRO, micro, live)
                + _select("cpu_adam_gparams", "CPU Adam (10⁹ params/s)", OFFLOAD_CPU_ADAM, adam, live)
                + _select("mfu", "MFU", OFFLOAD_MFU, mfu, live)
                + _select("delayed_update", "delayed update", ("no", "yes"), "yes" if dpu else "no", live))
    psi = count_params("llama-2-7b").params
    parts, off = offload_breakdown(psi, gpu=gpu, link=link, tokens_per_step=tokens, micro_tokens=micro,
                                   cpu_adam_gparams=adam, mfu=mfu, delayed_update=dpu)
    longest = max(sum(v) for v in parts.values())
    left, bar_w = 110, 500
    rows = []
    for i, (name, vals) in enumerate(parts.items()):
        x, y = float(left), 8 + 34 * i
        rows.append(f'<text x="{left - 6}" y="{y + 17}" font-size="12" text-anchor="end" fill="currentColor">'
                    f'{_e(name)}</text>')
        for label, v, color in zip(OFFLOAD_PARTS, vals, _PART_COLORS):
            w = v / longest * bar_w
            if w > 0:
                rows.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="26" fill="{color}"><title>'
                            f'{_e(label)}: {v:.2f} s</title></rect>')
            x += w
        rows.append(f'<text x="{x + 4:.1f}" y="{y + 17}" font-size="11" fill="currentColor">{sum(vals):.2f} s'
                    f'</text>')
    svg = (f'<svg class="memlib-live-bar" viewBox="0 0 660 80" role="img" aria-label="seconds per optimizer step">'
           + "".join(rows) + "</svg>")
    legend = "".join(f'<span class="memlib-live-swatch" style="background:{c}"></span>{_e(label)} '
                     for label, c in zip(OFFLOAD_PARTS, _PART_COLORS))
    base_s = sum(parts["no offload"])
    verdict = (f"Llama-2-7B, {gpu} + {link}, {tokens:,} tokens/step: step {off.step_s:.2f} s vs {base_s:.2f} s "
               f"without offload, overhead {off.overhead:+.0%}, bound by {off.bound}")
    result = svg + f'<p>{legend}</p><p class="memlib-live-verdict"><b>{_e(verdict)}</b></p>'
    return _root("offload", controls, result, live, _STATIC_NOTE)


# ------------------------------------------------------------------------------------- serving (Ch. 11)
SERVE_GPU_GIB = (16.0, 24.0, 32.0, 40.0, 48.0, 80.0, 96.0, 140.0)
SERVE_SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384, 32768)


def _serving_fit(params: Mapping[str, Any], live: bool) -> str:
    """Chapter 11's serving fit: the largest batch and the longest context that fit."""
    models = shipped_models()
    model = _model(params, "llama-7b", models)
    memory = float(_choice(params, "gpu_memory_gib", 24.0, SERVE_GPU_GIB))
    weights = _choice(params, "weights", "fp16", list(WEIGHT_FORMATS))
    kv_dtype = _choice(params, "kv_dtype", "fp16", list(KV_DTYPES))
    seq_len = int(_choice(params, "seq_len", 2048, SERVE_SEQ_LENS))
    batch_size = _int(params, "batch_size", 8)
    if not 1 <= batch_size <= 128:
        raise MemlibError(f"batch_size {batch_size} out of range; expected 1..128")
    controls = (_model_select(models, model, live)
                + _select("gpu_memory_gib", "GPU memory (GiB)", SERVE_GPU_GIB, memory, live)
                + _select("weights", "weights", list(WEIGHT_FORMATS), weights, live)
                + _select("kv_dtype", "KV cache", list(KV_DTYPES), kv_dtype, live)
                + _select("seq_len", "context (tokens)", SERVE_SEQ_LENS, seq_len, live)
                + _range("batch_size", "batch", 1, 128, batch_size, live))
    gpu = int(memory * GiB)
    limit = load_config(model).max_positions
    longest = max_seq_len(model, gpu, batch_size=batch_size, weights=weights, kv_dtype=kv_dtype)
    if seq_len > limit:
        line = (f"{model} takes at most {limit:,} tokens per sequence (its maximum positions), not {seq_len:,}; "
                f"at batch {batch_size} the longest context that fits is {longest:,} tokens")
    else:
        batch = max_batch_size(model, gpu, seq_len=seq_len, weights=weights, kv_dtype=kv_dtype)
        line = (f"{model}, {weights} weights, {kv_dtype} KV on {memory:g} GiB: at {seq_len:,} tokens the largest "
                f"batch is {batch:,}; at batch {batch_size} the longest context is {longest:,} tokens"
                if batch or longest else f"{model} with {weights} weights does not fit in {memory:g} GiB at all")
    result = f'<p class="memlib-live-verdict"><b>{_e(line)}</b></p>'
    return _root("serving_fit", controls, result, live, _STATIC_NOTE)


# ------------------------------------------------------------------------------ vLLM-style serving (Ch. 14)
SERVE_LENS = (2048, 4096, 8192, 16384, 32768, 131072)
SERVE_UTILS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)
SERVE_TP = (1, 2, 4, 8)
SERVE_WEIGHTS = ("fp16", "int8", "int4")
SERVE_KV = ("fp16", "fp8", "int8", "int4")
#: The accounting the serve calculator follows: Chapter 14's simple model, or a vLLM release's start-up accounting.
SERVE_VERSIONS = ("book",) + tuple(VLLM_RELEASES)
_SERVE_PARTS = (("weights", "#4c72b0"), ("prefill activations", "#dd8452"), ("non-torch + CUDA graphs", "#8c8c8c"),
                ("KV blocks", "#55a868"))


def serve_parts(fit: ServeFit) -> dict[str, int]:
    """The budget of a :func:`memlib.core.serve.serve` result, part by part, in bytes per GPU. Chapter 14."""
    return {"weights": fit.weights_bytes + fit.draft_weights_bytes, "prefill activations": fit.activation_bytes,
            "non-torch + CUDA graphs": fit.non_torch_bytes + fit.cuda_graph_bytes, "KV blocks": fit.kv_cache_bytes}


def _serve(params: Mapping[str, Any], live: bool) -> str:
    models = shipped_models()
    model = _model(params, "llama-3-8b", models)
    gpu = _choice(params, "gpu", "h100-sxm", SERVE_GPUS)
    length = int(_choice(params, "max_model_len", 8192, SERVE_LENS))
    util = float(_choice(params, "gpu_memory_utilization", 0.9, SERVE_UTILS))
    weights = _choice(params, "weights", "fp16", SERVE_WEIGHTS)
    kv = _choice(params, "kv_dtype", "fp16", SERVE_KV)
    tp = int(_choice(params, "tensor_parallel", 1, SERVE_TP))
    version = _choice(params, "vllm_version", "book", SERVE_VERSIONS)
    controls = (_model_select(models, model, live) + _select("gpu", "GPU", SERVE_GPUS, gpu, live)
                + _select("max_model_len", "max-model-len", SERVE_LENS, length, live)
                + _select("gpu_memory_utilization", "gpu_memory_utilization", SERVE_UTILS, util, live)
                + _select("weights", "weights", SERVE_WEIGHTS, weights, live)
                + _select("kv_dtype", "KV cache", SERVE_KV, kv, live)
                + _select("tensor_parallel", "tensor parallel", SERVE_TP, tp, live)
                + _select("vllm_version", "vLLM version", SERVE_VERSIONS, version, live))
    try:
        fit = serve(model, gpu=gpu, max_model_len=length, gpu_memory_utilization=util, weights=weights,
                    kv_dtype=kv, tensor_parallel=tp, vllm_version=None if version == "book" else version)
    except MemlibError as err:  # a length beyond the model's positions, a degree the heads do not allow
        return _root("serve", controls, f'<p class="memlib-live-refused">refused: {_e(err)}</p>', live,
                     _STATIC_NOTE)
    parts = serve_parts(fit)
    width, left, bar_w = 640, 8, 600
    scale = bar_w / (max(sum(parts.values()), fit.gpu_memory_bytes) * 1.02)
    x, rects = float(left), []
    for (name, color) in _SERVE_PARTS:
        w = parts[name] * scale
        if w > 0:
            rects.append(f'<rect x="{x:.1f}" y="10" width="{w:.1f}" height="34" fill="{color}"><title>{_e(name)}: '
                         f'{parts[name] / GiB:.2f} GiB</title></rect>')
            x += w
    budget_x, cap_x = left + fit.budget_bytes * scale, left + fit.gpu_memory_bytes * scale
    svg = (f'<svg class="memlib-live-bar" viewBox="0 0 {width} 72" role="img" aria-label="serving budget of '
           f'{_e(model)} on {_e(gpu)}">' + "".join(rects)
           + f'<line x1="{budget_x:.1f}" x2="{budget_x:.1f}" y1="4" y2="50" stroke="currentColor" '
             f'stroke-dasharray="4 3" stroke-width="1.5"/>'
           + f'<line x1="{cap_x:.1f}" x2="{cap_x:.1f}" y1="4" y2="50" stroke="currentColor" stroke-width="1.5"/>'
           + f'<text x="{min(cap_x, width - 4):.1f}" y="64" font-size="11" text-anchor="end" fill="currentColor">'
             f'GPU {fit.gpu_memory_bytes / GiB:.0f} GiB; dashed: × {util:g}</text></svg>')
    legend = "".join(f'<span class="memlib-live-swatch" style="background:{c}"></span>{_e(n)} '
                     f'{parts[n] / GiB:.2f} GiB ' for n, c in _SERVE_PARTS)
    if fit.fits:
        verdict = (f"{fit.max_concurrent_seqs} requests of {length:,} tokens at once per replica: "
                   f"{fit.num_blocks:,} blocks of {fit.block_size} tokens, {fit.kv_bytes_per_token / 1024:g} KiB "
                   f"of KV per token")
        if fit.vllm_tokens is not None:
            pad = fit.settings.get("padding_layers")
            verdict += (f"; vLLM {version} logs {fit.vllm_tokens:,} tokens, concurrency {fit.vllm_concurrency:g}x "
                        f"({fit.settings['max_num_batched_tokens']:,} batched tokens, "
                        f"{fit.settings['max_num_seqs']:,} sequences"
                        + (f", {pad} padding layers" if pad else "") + ")")
    else:
        verdict = f"does not fit: {fit.reasons[0]}"
    result = svg + f'<p>{legend}</p><p class="memlib-live-verdict"><b>{_e(verdict)}</b></p>'
    return _root("serve", controls, result, live, _STATIC_NOTE)


# ------------------------------------------------------------------------------------- planner (Ch. 13)
PLAN_GPUS = (1, 2, 4, 8, 16, 32, 64)
PLAN_GPU_GIB = GPU_MEMORY_MENU_GIB
PLAN_BATCH = (1, 2, 4, 8, 16)
PLAN_SEQ = (512, 1024, 2048, 4096, 8192)


def plan_verdict(result: Plan) -> str:
    """One line: what the plan turns on and the memory per GPU with the reserve, or why nothing fits. Chapter 13.

    The widget (:func:`memlib.viz.widgets_plan.plan_view`) and the live calculator print it.
    """
    if result.fits:
        ch = result.chosen
        assert ch is not None  # plan() sets chosen whenever fits is True
        rungs = [s.technique for s in result.steps if s.needed or s.technique in ("bf16 mixed precision",
                                                                                   "FlashAttention")]
        verdict = (f"fits: {ch.total_bytes / GiB:.1f} GiB per GPU with the reserve, with "
                   + " + ".join(rungs or ["nothing"]))
    else:
        verdict = (f"does not fit: closest {result.closest.technique} at {result.closest.total_bytes / GiB:.1f} GiB "
                   "with the reserve" + (f"; needs {result.min_gpus} GPUs" if result.min_gpus else ""))
    return verdict + "".join(f"; {n}" for n in result.notes)


def _plan(params: Mapping[str, Any], live: bool) -> str:
    models = shipped_models()
    model = _model(params, "llama-2-7b", models)
    job = _choice(params, "job", "train", JOBS)
    num_gpus = int(_choice(params, "num_gpus", 8, PLAN_GPUS))
    memory = float(_choice(params, "gpu_memory_gib", 80.0, PLAN_GPU_GIB))
    batch_size = int(_choice(params, "batch_size", 4, PLAN_BATCH))
    seq_len = int(_choice(params, "seq_len", 2048, PLAN_SEQ))
    framework = _choice(params, "framework", "pytorch", FRAMEWORKS)
    controls = (_model_select(models, model, live) + _select("job", "job", JOBS, job, live)
                + _select("framework", "framework", FRAMEWORKS, framework, live)
                + _select("num_gpus", "GPUs", PLAN_GPUS, num_gpus, live)
                + _select("gpu_memory_gib", "GPU memory (GiB)", PLAN_GPU_GIB, memory, live)
                + _select("batch_size", "batch per GPU", PLAN_BATCH, batch_size, live)
                + _select("seq_len", "sequence", PLAN_SEQ, seq_len, live))
    try:
        result = plan(model, job=job, num_gpus=num_gpus, gpu_memory=int(memory * GiB), batch_size=batch_size,
                      seq_len=seq_len, framework=framework)
    except MemlibError as err:  # e.g. a sequence longer than the model's positions
        return _root("plan", controls, f'<p class="memlib-live-refused">refused: {_e(err)}</p>', live, _STATIC_NOTE)
    rows = "".join(
        f'<tr><td>{_e(s.technique)}</td><td>{s.total_bytes / GiB:.1f}</td>'
        f'<td>{"yes" if s.fits else "no"}</td><td>{_e(s.cost)}</td></tr>' for s in result.steps if s.applicable)
    result_html = (f'<table class="memlib-live-table"><thead><tr><th>rung (on top of the ones above)</th>'
                   f'<th>GiB per GPU with the reserve</th><th>fits {memory:g} GiB</th><th>cost</th></tr></thead>'
                   f'<tbody>{rows}</tbody></table>'
                   f'<p class="memlib-live-verdict"><b>{_e(plan_verdict(result))}</b></p>')
    return _root("plan", controls, result_html, live, _STATIC_NOTE)


# ------------------------------------------------------------------------------------------ dispatch
_STATIC_NOTE = "Static copy: on the book's web page these controls run memlib in the browser."
_KINDS: dict[str, Callable[[Mapping[str, Any], bool], str]] = {"training": _training, "drill": _drill,
                                                               "format": _format, "offload": _offload,
                                                               "serving_fit": _serving_fit, "serve": _serve,
                                                               "plan": _plan}
#: The calculators :func:`render` draws.
LIVE_KINDS: tuple[str, ...] = tuple(_KINDS)


def render(kind: str, params: str | Mapping[str, Any] | None = None, live: bool = False) -> str:
    """The calculator ``kind`` as HTML: its controls set to ``params`` and the result memlib computes for them.

    Introduced in Chapter 1. ``_static/memlib-live.js`` calls it in the browser (``live=True``) with the
    controls' ``name``/``value`` pairs, as JSON, each time one changes; the notebooks call it once with the
    defaults to put the static copy on the page. Values arrive as strings (form fields) or as numbers.

    Args:
        kind: one of :data:`LIVE_KINDS`: ``training`` (Chapter 1: model, batch, sequence, precision,
            optimizer, ZeRO stage, GPUs and GPU memory → what is live at the peak and the verdict) or
            ``drill`` (the numeric drills' flashcard: ``seed``, ``answer`` and ``action`` = ``check``,
            ``reveal`` or ``next``) or ``format`` (Chapter 2: ``value``, a number as text → its bits,
            stored value, kind and relative error in every format of :data:`memlib.core.formats.FORMAT_NAMES`) or
            ``offload`` (Chapter 7: GPU, link, tokens per step and micro-batch, CPU Adam speed, MFU, delayed
            update → :func:`offload_breakdown` of Llama-2-7B's step) or ``serve`` (Chapter 11: model, GPU
            memory, weight and KV formats, context, batch → the largest batch and the longest context that
            fit, from :func:`memlib.core.inference.max_batch_size` and :func:`memlib.core.inference.max_seq_len`).
        params: a JSON object (string) or mapping; missing keys take the defaults.
        live: draw the controls enabled (the browser) or disabled (the static copy).

    Returns:
        One ``<div class="memlib-live">`` element.

    Raises:
        MemlibError: for an unknown kind, a value outside a control's choices or unreadable JSON. A setup the
            estimator refuses (e.g. a sequence longer than the model's) is not an error: the result says
            "refused: ..." as the widget does.
    """
    check_choice("kind", kind, LIVE_KINDS)
    if params is None:
        values: Mapping[str, Any] = {}
    elif isinstance(params, str):
        try:
            values = json.loads(params) if params.strip() else {}
        except json.JSONDecodeError:
            raise MemlibError(f"params {params[:60]!r} is not JSON; expected an object such as "
                              f'{{"batch_size": 4}}') from None
        if not isinstance(values, dict):
            raise MemlibError(f"params {params[:60]!r} is not a JSON object; expected e.g. {{\"batch_size\": 4}}")
    else:
        values = params
    return _KINDS[kind](values, live)
