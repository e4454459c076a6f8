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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .configs import shipped_models
from .dtypes import GB, GiB
from .errors import MemlibError, check_choice
from .estimate import OPTIMIZERS, PRECISIONS, TrainingEstimate, estimate_training
from .inference import reserve_bytes
from .plots import CATEGORY_COLORS, peak_composition
from .widgets_drills import CardState, check_card, next_card, reveal_card

__all__ = ["LIVE_KINDS", "LIVE_MODULES", "render", "training_verdict"]

#: memlib's modules the live calculators import (shipped to the browser as one zip by the book build).
LIVE_MODULES: tuple[str, ...] = (
    "__init__", "categories", "configs", "drills", "dtypes", "errors", "estimate", "flops", "gpus", "inference",
    "live", "lora", "params", "plots", "search", "serve", "widgets_drills",
)

SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
ZERO_STAGES = (0, 1, 2, 3)
NUM_GPUS = (1, 2, 4, 8, 16, 32, 64)
GPU_MEMORY_GIB = (16.0, 24.0, 40.0, 48.0, 80.0, 141.0)
_CATEGORY_NAMES = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer states",
                   "activations": "activations", "temp": "temporaries"}


# ------------------------------------------------------------------------------------------- helpers
def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _disabled(live: bool) -> str:
    return "" if live else " disabled"


def _select(name: str, label: str, options: Sequence[object], value: object, live: bool) -> str:
    opts = "".join(f'<option value="{_e(o)}"{" selected" if str(o) == str(value) else ""}>{_e(o)}</option>'
                   for o in options)
    return (f'<label class="memlib-live-field"><span>{_e(label)}</span>'
            f'<select name="{_e(name)}"{_disabled(live)}>{opts}</select></label>')


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
    reserve (:func:`memlib.inference.reserve_bytes`: CUDA context + 5 % fragmentation) is within that memory.

    Args:
        est: a result of :func:`memlib.estimate.estimate_training`.
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
    model = _choice(params, "model", "llama-2-7b", models)
    batch_size = _int(params, "batch_size", 4)
    if not 1 <= batch_size <= 64:
        raise MemlibError(f"batch_size {batch_size} out of range; expected 1..64")
    seq_len = int(_choice(params, "seq_len", 4096, SEQ_LENS))
    precision = _choice(params, "precision", "bf16-mixed", PRECISIONS)
    optimizer = _choice(params, "optimizer", "adamw", OPTIMIZERS)
    zero_stage = int(_choice(params, "zero_stage", 0, ZERO_STAGES))
    num_gpus = int(_choice(params, "num_gpus", 1, NUM_GPUS))
    gpu_memory_gib = float(_choice(params, "gpu_memory_gib", 80.0, GPU_MEMORY_GIB))
    controls = (_select("model", "model", models, model, live)
                + _range("batch_size", "batch", 1, 64, batch_size, live)
                + _select("seq_len", "sequence", SEQ_LENS, seq_len, live)
                + _select("precision", "precision", PRECISIONS, precision, live)
                + _select("optimizer", "optimizer", OPTIMIZERS, optimizer, live)
                + _select("zero_stage", "ZeRO stage", ZERO_STAGES, zero_stage, live)
                + _select("num_gpus", "GPUs", NUM_GPUS, num_gpus, live)
                + _select("gpu_memory_gib", "GPU memory (GiB)", GPU_MEMORY_GIB, gpu_memory_gib, live))
    try:
        est = estimate_training(model, batch_size=batch_size, seq_len=seq_len, precision=precision,
                                optimizer=optimizer, zero_stage=zero_stage, num_gpus=num_gpus)
    except MemlibError as err:  # e.g. a sequence longer than the model's positions
        result = f'<p class="memlib-live-refused">refused: {_e(err)}</p>'
        return _root("training", controls, result, live, _STATIC_NOTE)
    parts = peak_composition(est)
    verdict = training_verdict(est, gpu_memory_gib)
    rows = "".join(f'<tr><td><span class="memlib-live-swatch" style="background:{CATEGORY_COLORS[c]}"></span>'
                   f'{_e(_CATEGORY_NAMES[c])}</td><td>{b / GB:.1f} GB</td></tr>' for c, b in parts.items())
    result = (_training_svg(parts, int(gpu_memory_gib * GiB))
              + f'<table class="memlib-live-table"><thead><tr><th>live at the peak, per GPU</th><th>GB (10⁹ B)'
                f'</th></tr></thead><tbody>{rows}</tbody></table>'
              + f'<p class="memlib-live-verdict"><b>{_e(verdict)}</b></p>')
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


# ------------------------------------------------------------------------------------------ dispatch
_STATIC_NOTE = "Static copy: on the book's web page these controls run memlib in the browser."
_KINDS: dict[str, Callable[[Mapping[str, Any], bool], str]] = {"training": _training, "drill": _drill}
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
            ``reveal`` or ``next``).
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
