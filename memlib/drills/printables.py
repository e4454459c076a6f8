"""The printables: a question-only sheet and a one-page "numbers to know" table, every number computed by memlib
(Drills part).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.cluster import allreduce_time_s, critical_batch, train_days
from ..core.configs import load_config
from ..core.dtypes import GB, GiB
from ..core.hardware import get_gpu
from ..core.inference import kv_cache_bytes
from ..core.parallel import bubble_fraction, korthikanti_layer_bytes
from ..core.params import count_params
from ..core.serve import decode_latency_s, serve_kv_bytes_per_token
from .bank import TOPICS
from .concepts import questions

__all__ = ["Fact", "question_sheet_markdown", "numbers_to_know"]


@dataclass(frozen=True)
class Fact:
    """One line of the numbers-to-know sheet: the rule, an example and memlib's value for it."""

    rule: str
    example: str
    value: str


def question_sheet_markdown(lang: str = "both", frequency: str | None = None) -> str:
    """The questions only (no answers), grouped by topic and numbered, for a mock interview on paper.

    Args:
        lang: ``"en"``, ``"zh"`` or ``"both"`` (English, then the Chinese in parentheses).
        frequency: only questions of this frequency (``"high"``...), or all.
    """
    lines: list[str] = []
    n = 0
    for topic, zh in TOPICS.items():
        qs = questions(topic=topic, frequency=frequency)
        if not qs:
            continue
        lines.append(f"\n## {topic} ({zh})\n")
        for q in qs:
            n += 1
            text = {"en": q.text, "zh": q.text_zh, "both": f"{q.text} ({q.text_zh})"}[lang]
            lines.append(f"{n}. [{q.difficulty}] {text}")
    return "\n".join(lines).strip() + "\n"


def numbers_to_know() -> list[Fact]:
    """The rules of thumb an interview expects, each with an example worked by memlib."""
    psi = count_params("llama-2-7b").params
    h100 = get_gpu("h100-sxm")
    cfg = load_config("llama-2-7b")
    gb = lambda n: f"{n / GB:,.1f} GB"  # noqa: E731
    return [
        Fact("Mixed-precision Adam: 16Ψ bytes of model states (2 + 2 + 12)", "Llama-2-7B", gb(16 * psi)),
        Fact("ZeRO-1 per GPU: 4Ψ + 12Ψ/N", "Llama-2-7B, N = 8", gb(4 * psi + 12 * psi / 8)),
        Fact("ZeRO-2 per GPU: 2Ψ + 14Ψ/N", "Llama-2-7B, N = 8", gb(2 * psi + 14 * psi / 8)),
        Fact("ZeRO-3 per GPU: 16Ψ/N", "Llama-2-7B, N = 8", gb(16 * psi / 8)),
        Fact("Inference weights: 2 bytes per parameter (fp16), 0.5 (int4)", "Llama-2-7B fp16", gb(2 * psi)),
        Fact("KV cache = 2 · L · n_kv · d · s · b · bytes", "Llama-2-70B, 4096 tokens, b = 1, fp16",
             gb(kv_cache_bytes("llama-2-70b", 4096))),
        Fact("KV per token (GQA: 8 KV heads)", "Llama-3-8B, fp16", f"{serve_kv_bytes_per_token('llama-3-8b') / 1024:,.0f} KiB"),
        Fact("KV per token (MLA: latent 512 + RoPE key 64)", "DeepSeek-V3, fp16",
             f"{serve_kv_bytes_per_token('deepseek-v3') / 1024:,.1f} KiB"),
        Fact("Activations per layer: s·b·h·(34 + 5·a·s/h) bytes (16-bit)", "Llama-2-7B layer, 1 × 4096",
             f"{korthikanti_layer_bytes(4096, 1, cfg.hidden_size, cfg.num_heads, 1, False) / GiB:,.2f} GiB"),
        Fact("Training FLOPs ≈ 6N per token (inference 2N)", "7B parameters", f"{6 * 7e9:.1e} FLOPs"),
        Fact("Training days = 6·N·D ÷ (GPUs · peak · MFU)", "7B, 1T tokens, 64 H100, 40 % MFU",
             f"{train_days(7e9, 1e12, 64, 'h100-sxm', 0.4):.0f} days"),
        Fact("Pipeline bubble (p − 1)/(m + p − 1)", "p = 8, m = 32, 1F1B", f"{100 * bubble_fraction(8, 32, '1f1b'):.1f} %"),
        Fact("Ring all-reduce: 2(N − 1)/N × bytes per GPU", "7B bf16 gradients, 64 GPUs, 400 Gb/s",
             f"{allreduce_time_s(14e9, 64, 50e9):.2f} s"),
        Fact("H100 SXM: dense bf16 peak and HBM bandwidth", "datasheet",
             f"{h100.peak_flops('bf16') / 1e12:,.1f} TFLOP/s, {h100.bandwidth_gb_s / 1e3:.2f} TB/s"),
        Fact("Ridge point = peak ÷ bandwidth: decode turns compute-bound at batch ≈", "H100 SXM, bf16 weights",
             f"{critical_batch('h100-sxm')}"),
        Fact("Decode time per token ≥ weight bytes ÷ bandwidth", "Llama-3-8B fp16, H100, batch 1",
             f"{1e3 * decode_latency_s('llama-3-8b', gpu='h100-sxm'):.1f} ms"),
    ]
