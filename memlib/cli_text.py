"""What ``memlib`` prints: the tables, the plans, and the at-a-glance fit verdict with its bar (Chapter 1).

The text half of :mod:`memlib.cli`, which parses the arguments, runs memlib and hands the results here; ``--json``
prints the same results as data instead.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from .core.dtypes import GB, GiB

__all__: list[str] = []


def _table(rows: list[tuple[str, Any]], title: str) -> str:
    lines = [title]
    for name, value in rows:
        if isinstance(value, int) and name.endswith("bytes"):
            shown = f"{value:>20,d} B  {value / GB:10.2f} GB  {value / GiB:10.2f} GiB"
        elif isinstance(value, int):
            shown = f"{value:>20,d}"
        else:
            shown = f"{value!s:>20}"
        lines.append(f"  {name:<20} {shown}")
    return "\n".join(lines)


def _plan_text(result: Any) -> str:
    inp = result.inputs
    unit = "sequences" if inp["job"] == "infer" else "sequences per GPU per step"
    lines = [f"plan for {inp['model']}: {inp['job']} on {inp['num_gpus']} GPU(s) × {inp['gpu_memory'] / GiB:.2f} GiB "
             f"(reserve {inp['reserve'] / GiB:.2f} GiB + {100 * inp['fragmentation']:g} % of the estimate), "
             f"{inp['batch_size']} {unit} × {inp['seq_len']} tokens",
             f"  {'#':>2}  {'technique':<26} {'per GPU (GiB)':>13} {'w/ reserve':>10} {'CPU (GiB)':>9}  {'fits':<4}  "
             f"{'needed':<6}  cost"]
    for i, st in enumerate(result.steps):
        needed = "" if st.needed is None else ("yes" if st.needed else "no")
        fits = "-" if not st.applicable else ("yes" if st.fits else "no")
        lines.append(f"  {i:>2}  {st.technique:<26} {st.per_gpu_bytes / GiB:>13.2f} {st.total_bytes / GiB:>10.2f} "
                     f"{st.cpu_bytes / GiB:>9.2f}  {fits:<4}  {needed:<6}  {st.cost}")
    if result.fits:
        ch = result.chosen
        keys = ("framework", "precision", "attention", "batch_size", "accumulation_steps", "recompute",
                "gradient_as_bucket_view", "zero_stage",
                "optimizer", "method", "offload", "weights", "kv_dtype", "tensor_parallel", "pipeline_parallel")
        what = ", ".join(f"{k}={ch.settings[k]}" for k in keys if k in ch.settings)
        lines.append(f"fits: {what}")
        lines.append(f"  {ch.per_gpu_bytes / GiB:.2f} GiB per GPU + {ch.reserve_bytes / GiB:.2f} GiB reserve, headroom "
                     f"{(inp['gpu_memory'] - ch.total_bytes) / GiB:.2f} GiB"
                     + (f"; {ch.cpu_bytes / GiB:.2f} GiB of CPU memory" if ch.cpu_bytes else ""))
    else:
        cl = result.closest
        more = (f"; it would need {result.min_gpus} GPUs of this size" if result.min_gpus
                else "; more GPUs would not help (each still holds one micro-batch's activations)"
                if inp["job"] != "infer" else "")
        lines.append(f"does not fit: closest is '{cl.technique}' at {cl.total_bytes / GiB:.2f} GiB per GPU with the "
                     f"reserve, {(cl.total_bytes - inp['gpu_memory']) / GiB:.2f} GiB over{more}")
    lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines)


def _parallel_plan_text(result: Any) -> str:
    inp = result.inputs
    lines = [f"3D/4D plan for {inp['model']}: {inp['num_gpus']} GPU(s) × {inp['gpu_memory'] / GiB:.2f} GiB, "
             f"{inp['gpus_per_node']} per node, micro-batch {inp['batch_size']} × {inp['seq_len']} tokens",
             f"  {'#':>2}  {'rung':<28} {'tp':>3} {'pp':>3} {'cp':>3} {'dp':>5} {'zero':>4} {'recompute':<9} "
             f"{'per GPU (GiB)':>13}  fits"]
    moe = any("ep" in st.settings for st in result.steps)
    if moe:  # MoE models: an ep column after dp (dense plans print as before)
        lines[-1] = lines[-1].replace(f"{'dp':>5} ", f"{'dp':>5} {'ep':>3} ")
    for i, st in enumerate(result.steps):
        x = st.settings
        ep = f"{x['ep']:>3} " if moe else ""
        lines.append(f"  {i:>2}  {st.technique:<28} {x['tp']:>3} {x['pp']:>3} {x['cp']:>3} {x['dp']:>5} {ep}"
                     f"{x['zero_stage']:>4} {x['recompute']:<9} {st.per_gpu_bytes / GiB:>13.2f}  "
                     f"{'yes' if st.fits else 'no'}")
    if result.fits:
        x = result.chosen.settings
        lines.append(f"fits: tp={x['tp']} (sequence parallel), pp={x['pp']} ({x['pp_schedule']}, m={x['micro_batches']}), "
                     f"cp={x['cp']}, dp={x['dp']} with ZeRO-{x['zero_stage']}, recompute={x['recompute']}"
                     + (f", ep={x['ep']} (experts split over ep of the dp ranks)" if x.get("ep", 1) > 1 else ""))
    else:
        lines.append("does not fit" + (f"; it would need {result.min_gpus} GPUs of this size" if result.min_gpus
                                       else "; no layout up to 16384 GPUs fits"))
    lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines)


def _gpu_label(gpu: str | None, capacity: int) -> str:
    from .core.hardware import get_gpu

    return get_gpu(gpu).full_name if gpu else f"{capacity / GiB:.2f} GiB GPU"


def _share(part: int, whole: int) -> str:
    """``part`` as a whole percentage of ``whole``; ``<1 %`` for a nonzero part that rounds to 0."""
    pct = 100 * part / whole
    return "<1 %" if 0 < pct < 0.5 else f"{pct:.0f} %"


def _bar(parts: dict[str, int], capacity: int | None, width: int = 40) -> tuple[str, dict[str, str]]:
    """A text bar of ``parts`` (one symbol per category) against ``capacity``, and the symbol of each part.

    Block characters on a UTF-8 terminal, letters otherwise; ``|`` marks the capacity when the parts pass it.
    """
    utf8 = "utf" in (getattr(sys.stdout, "encoding", None) or "").lower()
    glyphs = "█▓▒░▚▞" if utf8 else "#=+-~*"
    marks = {k: glyphs[i % len(glyphs)] for i, k in enumerate(parts)}
    total = sum(parts.values())
    scale = max(total, capacity or 0) or 1
    cells = "".join(marks[k] * round(width * v / scale) for k, v in parts.items())
    cells = cells[:width].ljust(width, "." if capacity else " ")
    if capacity and total > capacity:
        cut = round(width * capacity / scale)
        cells = cells[:cut] + "|" + cells[cut:]
    return f"[{cells}]", marks


def _glance(data: dict[str, Any], estimate: int, parts: dict[str, int], args: argparse.Namespace,
            per_gpu: bool = False) -> str:
    """The lines ``train`` and ``infer`` print first: the fit verdict (or the common cards it fits), shares, bar.

    Adds ``fit`` (with --gpu) and ``fits_on`` to ``data`` (the --json output): keys added, none changed.
    """
    from .core.dtypes import parse_size
    from .core.fit import COMMON_GPUS, fits_on, gpu_fit
    from .core.hardware import get_gpu

    reserve = parse_size(args.reserve)
    on = fits_on(estimate, cuda_context_bytes=reserve)
    data["fits_on"] = on
    lines = []
    if args.gpu is not None:
        fit = gpu_fit(estimate, args.gpu, cuda_context_bytes=reserve)
        data["fit"] = fit.as_dict()
        where = f"{'each of ' if per_gpu else ''}{args.gpus if per_gpu else 1} x {get_gpu(args.gpu).full_name}"
        rule = (f"{fit.usable_bytes / GiB:.2f} GiB usable after {reserve / GiB:.2f} GiB reserve; estimate "
                f"{estimate / GiB:.2f} GiB + 5 % fragmentation = {fit.needed_bytes / GiB:.2f} GiB")
        lines.append(f"fits on {where} with {fit.spare_bytes / GiB:.2f} GiB to spare ({rule})" if fit.fits else
                     f"does not fit on {where}: needs {-fit.spare_bytes / GiB:.2f} GiB more ({rule})")
        capacity: int | None = fit.usable_bytes
    else:
        yes = [get_gpu(g).full_name for g in COMMON_GPUS if on.get(g)]
        no = [get_gpu(g).full_name for g in COMMON_GPUS if not on.get(g)]
        lines.append((f"fits on: {', '.join(yes)}" if yes else "fits on none of the common cards")
                     + (f" (not: {', '.join(no)})" if yes and no else f" ({', '.join(no)})" if no else "")
                     + f" [{'per GPU; ' if per_gpu else ''}estimate {estimate / GiB:.2f} GiB + {reserve / GiB:g} "
                     f"GiB + 5 %; --gpu NAME for the margin]")
        capacity = None
    total = sum(parts.values()) or 1
    bar, marks = _bar({k: v for k, v in parts.items() if v}, capacity)
    shares = "  ".join(f"{marks[k]} {k} {_share(v, total)}" for k, v in parts.items() if v)
    lines.append(f"{bar} {estimate / GiB:.2f} GiB" + (f" of {capacity / GiB:.2f} usable" if capacity else ""))
    lines.append(f"  {shares}")
    return "\n".join(lines)


def _serve_glance(fit: Any, gpu: str | None) -> str:
    """``serve``'s first lines: the verdict on one GPU (vLLM's budget), the budget's shares and a bar."""
    st = fit.settings
    where = f"{st['tensor_parallel']} x {_gpu_label(gpu, fit.gpu_memory_bytes)}"
    if fit.fits:
        line = (f"fits on {where}: {fit.max_concurrent_seqs:,} requests of {st['max_model_len']:,} tokens at once, "
                f"{fit.kv_cache_bytes / GiB:.2f} GiB of KV blocks in a budget of {fit.budget_bytes / GiB:.2f} GiB "
                f"({st['gpu_memory_utilization']:g} of the GPU)")
    else:
        short = max(0, -fit.kv_budget_bytes)
        line = (f"does not fit on {where}" + (f": needs {short / GiB:.2f} GiB more" if short else "")
                + f" ({'; '.join(fit.reasons)})")
    parts = {"weights": fit.weights_bytes + fit.draft_weights_bytes, "activations": fit.activation_bytes,
             "non-torch + graphs": fit.non_torch_bytes + fit.cuda_graph_bytes, "kv_cache": fit.kv_cache_bytes}
    used = sum(parts.values()) or 1
    bar, marks = _bar({k: v for k, v in parts.items() if v}, fit.gpu_memory_bytes)
    shares = "  ".join(f"{marks[k]} {k} {_share(v, used)}" for k, v in parts.items() if v)
    return "\n".join([line, f"{bar} {used / GiB:.2f} of {fit.gpu_memory_bytes / GiB:.2f} GiB", f"  {shares}"])


def _serve_text(fit: Any) -> str:
    st = fit.settings
    head = (f"serving {st['model']} at max-model-len {st['max_model_len']:,} on "
            f"{fit.gpu_memory_bytes / GiB:.2f} GiB × {st['gpu_memory_utilization']:g} "
            f"(weights {st['weights']}, KV {st['kv_dtype']}, tp {st['tensor_parallel']})")
    rows: list[tuple[str, Any]] = [
        ("budget_bytes", fit.budget_bytes), ("weights_bytes", fit.weights_bytes)]
    if fit.draft_weights_bytes:
        rows.append(("draft_weights_bytes", fit.draft_weights_bytes))
    rows += [("activation_bytes", fit.activation_bytes), ("non_torch_bytes", fit.non_torch_bytes),
             ("cuda_graph_bytes", fit.cuda_graph_bytes), ("kv_budget_bytes", fit.kv_budget_bytes),
             ("kv_cache_bytes", fit.kv_cache_bytes), ("kv_bytes_per_token", fit.kv_bytes_per_token),
             ("block_size", fit.block_size), ("num_blocks", fit.num_blocks), ("blocks_per_seq", fit.blocks_per_seq),
             ("max_concurrent_seqs", fit.max_concurrent_seqs)]
    if st["prefix_cache_hit_rate"]:
        rows.append(("max_concurrent_seqs_prefix", fit.max_concurrent_seqs_prefix))
    if fit.vllm_tokens is not None:
        head += f", vLLM {st['vllm_version']} (row {st['vllm_release_row']})"
        rows += [("max_num_batched_tokens", st["max_num_batched_tokens"]), ("max_num_seqs", st["max_num_seqs"]),
                 ("vllm_kv_tokens", fit.vllm_tokens), ("vllm_max_concurrency", fit.vllm_concurrency)]
    lines = [_table(rows, head)]
    if fit.fits:
        slots = fit.kv_tokens if fit.vllm_tokens is None else fit.vllm_tokens
        lines.append(f"fits: {fit.max_concurrent_seqs:,} requests of {st['max_model_len']:,} tokens at once "
                     f"({slots:,} token slots in {fit.num_blocks:,} blocks)")
    else:
        lines.extend(f"does not fit: {r}" for r in fit.reasons)
    return "\n".join(lines)
