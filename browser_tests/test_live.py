"""The live calculators (memlib under Pyodide) work in the built book, offline: moving a control changes the result.

Chapter 1 and the numeric drills (the issue's CI check), Chapter 2 (a number's bits), Chapter 7 (offload time),
Chapter 11 (the serving fit), Chapter 13 (the planner) and Chapter 14 (a vLLM-style serving budget).

Each test opens a page in Debian's chromium with every request outside the local server aborted, acts on the
page's ``.memlib-live`` calculator as a reader would, and checks the result the browser shows against memlib
run here in CPython: the same code gives the same numbers. The startup (first use to first result) and update
times are printed, not asserted (``bench/live_startup.py`` prints them as a table).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from checker import book_pages
from live_check import LiveRun, Step, run_live

from memlib.core import formats as fm
from memlib.core.dtypes import GiB
from memlib.core.estimate import estimate_training
from memlib.core.inference import max_batch_size
from memlib.viz.live import offload_breakdown, plan_verdict, training_verdict
from memlib.core.params import count_params
from memlib.core.plan import plan
from memlib.core.serve import serve
from memlib.drills.widgets import next_card, reveal_card


def _page(site: Path, prefix: str) -> str:
    return next(p for p in book_pages(site) if p.startswith(prefix))


def _report(run: LiveRun) -> None:
    print(f"\n{run.page}: first result {run.startup_ms / 1000:.1f} s after first use; later updates "
          + ", ".join(f"{ms:.0f} ms" for ms in run.update_ms[1:]) + " (page's own count)")


def _clean(run: LiveRun) -> None:
    assert not run.blocked, f"requests outside the site: {run.blocked}"
    assert not run.errors, f"console/page errors: {run.errors}"
    assert run.enabled and run.status_before.startswith("Live:"), run.status_before
    assert run.status_after.startswith("Live: memlib ran in your browser"), run.status_after


def test_chapter_1_calculator_recomputes_in_the_browser(site: Path) -> None:
    # ZeRO-3 needs a framework that has it (PyTorch's own is ZeroRedundancyOptimizer, stage 1): DeepSpeed first
    run = run_live(site, _page(site, "chapters/01_"), [Step("select", "select[name=framework]", "deepspeed"),
                                                       Step("select", "select[name=zero_stage]", "3"),
                                                       Step("select", "select[name=num_gpus]", "8")])
    _report(run)
    _clean(run)
    first, after_deepspeed, after_zero3, after_8_gpus = run.results
    assert first != after_deepspeed != after_zero3 != after_8_gpus
    for text, framework, stage, gpus in ((first, "pytorch", 0, 1), (after_deepspeed, "deepspeed", 0, 1),
                                         (after_zero3, "deepspeed", 3, 1), (after_8_gpus, "deepspeed", 3, 8)):
        est = estimate_training("llama-2-7b", batch_size=4, seq_len=4096, precision="bf16-mixed", optimizer="adamw",
                                zero_stage=stage, num_gpus=gpus, framework=framework)
        assert training_verdict(est, 80.0) in text, text  # the browser's number is CPython's number


def test_numeric_drill_checks_reveals_and_draws_a_new_question(site: Path) -> None:
    card = next_card(2026).drill
    run = run_live(site, _page(site, "drills/02_numeric"), [Step("fill", "input[name=answer]", str(card.answer * 3)),
                                                            Step("click", "button[value=reveal]"),
                                                            Step("click", "button[value=next]")])
    _report(run)
    _clean(run)
    before, checked, revealed, after_next = run.results
    assert card.answer_text not in before + run.controls[0]  # the page does not give the answer away
    assert checked.startswith("Not quite") and "too high" in checked
    assert revealed == reveal_card(card).message
    assert run.controls[3] != run.controls[2] and next_card(2027).drill.question in run.controls[3]
    assert after_next == ""


def test_without_webassembly_the_static_copy_stays_and_says_why(site: Path) -> None:
    run = run_live(site, _page(site, "chapters/01_"), [], webassembly=False)
    assert not run.enabled
    assert "no WebAssembly" in run.status_before and "static" in run.status_before
    assert "GiB per GPU" in run.results[0]  # the static result is still there


def test_chapter_11_serving_fit_follows_the_controls(site: Path) -> None:
    run = run_live(site, _page(site, "chapters/11_"), [Step("select", "select[name=weights]", "int8")])
    _report(run)
    _clean(run)
    before, after = run.results
    assert before != after
    batch = max_batch_size("llama-7b", 24 * GiB, seq_len=2048, weights="int8")
    assert f"at 2,048 tokens the largest batch is {batch:,}" in after, after


def test_chapter_14_serving_budget_follows_the_controls(site: Path) -> None:
    run = run_live(site, _page(site, "chapters/14_"), [Step("select", "select[name=kv_dtype]", "fp8"),
                                                       Step("select", "select[name=gpu]", "h200")])
    _report(run)
    _clean(run)
    assert len(set(run.results)) == 3
    for text, kw in zip(run.results, ({}, {"kv_dtype": "fp8"}, {"kv_dtype": "fp8", "gpu": "h200"})):
        fit = serve("llama-3-8b", max_model_len=8192, **{"gpu": "h100-sxm", **kw})
        assert f"{fit.max_concurrent_seqs} requests of 8,192 tokens" in text, (kw, text)


def test_chapter_14_serving_budget_follows_a_vllm_release(site: Path) -> None:
    run = run_live(site, _page(site, "chapters/14_"), [Step("select", "select[name=vllm_version]", "0.34")])
    _report(run)
    _clean(run)
    before, after = run.results
    fit = serve("llama-3-8b", max_model_len=8192, gpu="h100-sxm", vllm_version="0.34")
    assert f"vLLM 0.34 logs {fit.vllm_tokens:,} tokens" in after and "vLLM" not in before.split("requests")[-1], after


def test_chapter_13_planner_follows_the_controls(site: Path) -> None:
    run = run_live(site, _page(site, "chapters/13_"), [Step("select", "select[name=num_gpus]", "1")])
    _report(run)
    _clean(run)
    before, after = run.results
    assert before != after
    for text, gpus in ((before, 8), (after, 1)):
        result = plan("llama-2-7b", num_gpus=gpus, gpu_memory=80 * GiB, batch_size=4, seq_len=2048)
        assert plan_verdict(result).split(";")[0] in text.replace("\n", " "), (gpus, text)


@pytest.mark.parametrize("prefix", ["chapters/01_", "chapters/02_", "chapters/07_", "chapters/11_", "chapters/13_",
                                    "chapters/14_", "drills/02_numeric"])
def test_page_has_one_calculator_with_the_contract_classes(site: Path, prefix: str) -> None:
    text = (site / _page(site, prefix)).read_text(encoding="utf-8")
    assert text.count('class="memlib-live"') == 1 and text.count('class="memlib-live-result"') == 1
    assert "window.MEMLIB_LIVE" in text and "memlib-live.js" in text


def test_chapter_2_number_shows_its_bits_in_every_format(site: Path) -> None:
    run = run_live(site, _page(site, "chapters/02_"), [Step("fill", "input[name=value]", "65520")])
    _report(run)
    _clean(run)
    before, after = run.results
    assert before != after
    for name in fm.FORMAT_NAMES:
        b = fm.encode(65520.0, name)
        assert b.grouped in after and f"{b.value:.10g}" in after, (name, after)


def test_chapter_7_offload_model_follows_the_controls(site: Path) -> None:
    run = run_live(site, _page(site, "chapters/07_"), [Step("select", "select[name=link]", "pcie3"),
                                                       Step("select", "select[name=tokens_per_step]", "16384")])
    _report(run)
    _clean(run)
    assert len(set(run.results)) == 3
    _, off = offload_breakdown(count_params("llama-2-7b").params, link="pcie3", tokens_per_step=16384)
    assert f"step {off.step_s:.2f} s" in run.results[-1] and f"overhead {off.overhead:+.0%}" in run.results[-1]
