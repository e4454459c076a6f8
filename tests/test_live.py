"""memlib.viz.live: the HTML calculators the book runs under Pyodide (pure; no browser needed here)."""
from __future__ import annotations

import json
import math
import re
import struct
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib.core.choices import FRAMEWORKS
from memlib.core.errors import MemlibError
from memlib.core.estimate import OPTIMIZERS, PRECISIONS, estimate_training
from memlib.core import formats as fm
from memlib.viz.live import (LIVE_DATA, LIVE_KINDS, LIVE_MODULES, OFFLOAD_PARTS, offload_breakdown, render,
                             training_verdict)
from memlib.core.offload import offload_step_time
from memlib.core.params import count_params
from memlib.viz.widgets import training_view
from memlib.drills.widgets import next_card, reveal_card

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "torch", "matplotlib", "ipywidgets", "transformers", "scipy", "pandas", "IPython")


def _controls(html: str) -> list[str]:
    return re.findall(r"<(?:select|input|button)\b[^>]*>", html)


@pytest.mark.parametrize("kind", LIVE_KINDS)
def test_one_root_with_the_contract_classes(kind: str) -> None:
    html = render(kind)
    assert html.startswith(f'<div class="memlib-live" data-kind="{kind}">') and html.endswith("</div>")
    assert html.count('class="memlib-live-result"') == 1 and html.count('class="memlib-live-controls"') == 1
    assert html.count('class="memlib-live-status"') == 1


@pytest.mark.parametrize("kind", LIVE_KINDS)
def test_static_copy_is_disabled_and_live_copy_is_not(kind: str) -> None:
    static, live = _controls(render(kind)), _controls(render(kind, live=True))
    named = [c for c in static if 'type="hidden"' not in c]
    assert named and all(" disabled" in c for c in named)
    assert not any(" disabled" in c for c in live)
    assert "Static copy" in render(kind) and "Static copy" not in render(kind, live=True)


def test_json_string_and_mapping_give_the_same_page() -> None:
    params = {"model": "gpt2", "batch_size": "8", "seq_len": "1024", "zero_stage": "2", "num_gpus": "4"}
    assert render("training", json.dumps(params), live=True) == render("training", params, live=True)
    assert render("training", "") == render("training") == render("training", {})


def test_training_verdict_is_the_widgets_verdict() -> None:
    est, fig, verdict = training_view("llama-2-7b", 1, 4096, "bf16-mixed", "adamw", 3, 8, 80.0, "deepspeed")
    fig.clf()
    assert verdict == training_verdict(est, 80.0) and "fits in 80 GiB" in verdict
    assert training_verdict(est, 16.0).endswith("does not fit in 16 GiB")


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 64), precision=st.sampled_from(PRECISIONS), optimizer=st.sampled_from(OPTIMIZERS),
       stage=st.sampled_from([0, 1, 2, 3]), gpus=st.sampled_from([1, 2, 8, 64]),
       memory=st.sampled_from([16.0, 80.0, 141.0]), framework=st.sampled_from(FRAMEWORKS))
def test_training_result_is_memlibs_estimate(batch: int, precision: str, optimizer: str, stage: int, gpus: int,
                                             memory: float, framework: str) -> None:
    params = {"model": "llama-2-7b", "batch_size": str(batch), "seq_len": "2048", "precision": precision,
              "optimizer": optimizer, "zero_stage": str(stage), "num_gpus": str(gpus), "gpu_memory_gib": str(memory),
              "framework": framework}
    html = render("training", params, live=True)
    assert f'<option value="{framework}" selected>' in html
    try:
        est = estimate_training("llama-2-7b", batch_size=batch, seq_len=2048, precision=precision, optimizer=optimizer,
                                zero_stage=stage, num_gpus=gpus, framework=framework)
    except MemlibError as err:  # a stage or precision the framework lacks: the card says so in one line
        assert "refused: " in html and ("valid combinations" in html or "expected" in html)
        assert "GiB per GPU" not in html
        assert str(err).split(";")[0].replace("'", "&#x27;") in html
        return
    assert training_verdict(est, memory).replace("'", "&#x27;") in html
    assert f'name="batch_size" min="1" max="64" step="1" value="{batch}"' in html  # the control keeps its value
    assert f'<option value="{precision}" selected>' in html and f'<option value="{memory}" selected>' in html


def test_refused_setup_is_shown_not_raised() -> None:
    html = render("training", {"model": "gpt2", "seq_len": "16384"})
    assert "refused:" in html and "1,024" in html and "GiB per GPU" not in html


@pytest.mark.parametrize("params, bad", [
    ({"precision": "fp12"}, "fp12"), ({"seq_len": "3000"}, "3000"), ({"batch_size": "0"}, "batch_size 0"),
    ({"batch_size": "four"}, "four"), ({"model": "gpt5"}, "gpt5"), ("[1, 2]", "not a JSON object"),
    ("{batch", "not JSON")])
def test_bad_params_name_the_value(params: object, bad: str) -> None:
    with pytest.raises(MemlibError, match=re.escape(bad)):
        render("training", params)  # type: ignore[arg-type]


def test_unknown_kind_lists_the_kinds() -> None:
    with pytest.raises(MemlibError, match="unknown kind 'serving'; expected one of: training, drill, format, offload, serving_fit, serve, plan"):
        render("serving")


@pytest.mark.parametrize("seed", range(2026, 2034))
def test_drill_card_does_not_give_the_answer_away(seed: int) -> None:
    card = next_card(seed).drill
    html = render("drill", {"seed": seed})
    assert card.question.replace("'", "&#x27;") in html
    assert reveal_card(card).message.replace("'", "&#x27;") not in html
    assert f"Answer: {card.answer_text}" not in html


def test_drill_check_reveal_next() -> None:
    card = next_card(2026).drill
    right = render("drill", {"seed": "2026", "answer": str(card.answer), "action": "check"}, live=True)
    assert 'class="memlib-live-correct">Correct:' in right and f'value="{card.answer}"' in right
    wrong = render("drill", {"seed": "2026", "answer": str(card.answer * 3), "action": "check"}, live=True)
    assert 'class="memlib-live-wrong">Not quite:' in wrong and "too high" in wrong
    shown = render("drill", {"seed": "2026", "action": "reveal"}, live=True)
    assert f"Answer: {card.answer_text}" in shown
    nxt = render("drill", {"seed": "2026", "answer": "12", "action": "next"}, live=True)
    assert 'name="seed" value="2027"' in nxt and 'name="answer" value=""' in nxt
    assert next_card(2027).drill.question.replace("'", "&#x27;") in nxt
    with pytest.raises(MemlibError, match="unknown action 'skip'"):
        render("drill", {"action": "skip"})


def test_the_browser_zip_imports_with_the_standard_library_only(tmp_path: Path) -> None:
    """The zip the book build ships (_ext/memlib_live.py) holds every module render needs, and no heavy import."""
    pytest.importorskip("sphinx")
    sys.path.insert(0, str(REPO / "_ext"))
    try:
        import memlib_live
    finally:
        sys.path.remove(str(REPO / "_ext"))
    data = memlib_live.memlib_zip()
    assert data == memlib_live.memlib_zip()  # reproducible: same sources, same bytes, same ?v= hash
    with zipfile.ZipFile(__import__("io").BytesIO(data)) as zf:
        names = zf.namelist()
        zf.extractall(tmp_path)
    assert {f"memlib/{m}.py" for m in LIVE_MODULES} <= set(names) and "memlib/core/configs/gpt2.json" in names
    assert "memlib/drills/bank.json" in names and "drills/bank.json" in LIVE_DATA  # the drill card's question bank
    code = (f"import sys\nfor m in {HEAVY!r}: sys.modules[m] = None\nsys.path.insert(0, {str(tmp_path)!r})\n"
            "import memlib.viz.live as L\nassert L.__file__.startswith(sys.path[0]), L.__file__\n"
            "for k in L.LIVE_KINDS: L.render(k, live=True)\n"
            "import memlib.drills as D\nassert D.__file__.startswith(sys.path[0]) and len(D.QUESTIONS) > 0\n"
            "import os\nprint(sorted(os.path.relpath(m.__file__, os.path.join(sys.path[0], 'memlib'))[:-3]\n"
            "             for n, m in sys.modules.items() if n == 'memlib' or n.startswith('memlib.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    imported = set(eval(out.stdout))  # noqa: S307 (our own subprocess's list)
    assert imported <= set(LIVE_MODULES) and "viz/live" in imported


def test_drill_answers_compute_with_the_browser_modules_only() -> None:
    """The drill card fills every model answer's numbers in the browser: without numpy or torch, importing only
    LIVE_MODULES (answers.py imports some core modules inside its functions, which the zip test does not reach)."""
    code = (f"import sys\nfor m in {HEAVY!r}: sys.modules[m] = None\n"
            "from memlib.drills import QUESTIONS\nfrom memlib.drills.concepts import render_answer\n"
            "assert all('{{' not in render_answer(q) for q in QUESTIONS)\nimport os\n"
            "root = os.path.dirname(sys.modules['memlib'].__file__)\n"
            "print(sorted(os.path.relpath(m.__file__, root)[:-3] for n, m in sys.modules.items()\n"
            "             if n == 'memlib' or n.startswith('memlib.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    imported = set(eval(out.stdout))  # noqa: S307 (our own subprocess's list)
    assert "drills/answers" in imported and imported <= set(LIVE_MODULES), imported - set(LIVE_MODULES)


# ------------------------------------------------------------------------------------- Chapter 2: format
SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 65504.0, 65519.0, 65520.0, 1e-9, 448.0, 464.0, 465.0, 500.0,
           57344.0, 61440.0, 1.7976931348623157e308, 5e-324, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 1 + 2**-11 + 2**-40,
           3.4028235677973366e38, 3.402823669209385e38, -1 / 3, 0.1]


@settings(max_examples=300, deadline=None)
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(SPECIAL),
                       st.integers(0, 2**64 - 1).map(lambda b: struct.unpack("<d", b.to_bytes(8, "little"))[0])),
       fmt=st.sampled_from(fm.FORMAT_NAMES), via_fp32=st.booleans())
def test_encode_without_numpy_gives_to_bits_pattern(value: float, fmt: str, via_fp32: bool) -> None:
    """encode's numpy-free path (the browser has no numpy) equals the array path bit for bit."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's cast warning for NaN/overflow
        expected = int(fm.to_bits(value, fmt, via_fp32=via_fp32))
    assert fm._pattern_scalar(value, fmt, via_fp32) == expected
    assert int(fm.encode(value, fmt, via_fp32=via_fp32).bits, 2) == expected


def test_format_calculator_shows_encode_for_every_format() -> None:
    html = render("format", {"value": "65520"}, live=True)
    for name in fm.FORMAT_NAMES:
        b = fm.encode(65520.0, name)
        assert f"<tr><td>{name}</td>" in html and f"<td>{b.value:.10g}</td><td>{b.kind}</td>" in html
        assert all(f">{field}</span>" in html for field in b.grouped.split(" "))
    assert "<td>inf</td><td>inf</td>" in html and "<td>448</td>" in html  # fp16 overflows, e4m3 saturates
    assert "cannot read abc as a number" in render("format", {"value": "abc"})


# ------------------------------------------------------------------------------------ Chapter 7: offload
def test_offload_breakdown_sums_to_the_modelled_steps() -> None:
    parts, off = offload_breakdown(7_000_000_000, tokens_per_step=16384, micro_tokens=4096, delayed_update=True)
    assert list(parts) == ["no offload", "ZeRO-Offload"] and all(len(v) == len(OFFLOAD_PARTS) for v in parts.values())
    assert math.isclose(sum(parts["ZeRO-Offload"]), off.step_s)
    base = offload_step_time(7_000_000_000, 4096, "none", gpu="h100", link="pcie5", grad_accum_steps=4,
                             cpu_adam_params_per_s=4e9)
    assert math.isclose(sum(parts["no offload"]), base.step_s) and all(v >= 0 for v in parts["ZeRO-Offload"])


def test_offload_calculator_shows_memlibs_overhead() -> None:
    html = render("offload", {"gpu": "v100", "link": "pcie3", "tokens_per_step": "16384"}, live=True)
    _, off = offload_breakdown(count_params("llama-2-7b").params, gpu="v100", link="pcie3", tokens_per_step=16384)
    assert f"step {off.step_s:.2f} s" in html and f"overhead {off.overhead:+.0%}, bound by {off.bound}" in html
    with pytest.raises(MemlibError, match="unknown link 'pcie7'"):
        render("offload", {"link": "pcie7"})


# ------------------------------------------------------------------------------ Chapter 11: serving fit
def test_serving_fit_calculator_shows_the_inference_limits() -> None:
    from memlib.core.inference import max_batch_size, max_seq_len
    from memlib.viz.widgets_inference import inference_view

    html = render("serving_fit", {"model": "llama-7b", "gpu_memory_gib": "24.0", "weights": "int8", "seq_len": "2048",
                            "batch_size": "16"}, live=True)
    gpu = 24 * 2**30
    batch = max_batch_size("llama-7b", gpu, seq_len=2048, weights="int8")
    longest = max_seq_len("llama-7b", gpu, batch_size=16, weights="int8")
    assert f"at 2,048 tokens the largest batch is {batch:,}; at batch 16 the longest context is {longest:,} tokens" in html
    limits, fig, _ = inference_view("llama-7b", 24.0, "int8", "fp16", 2048, 16)  # the widget agrees
    fig.clf()
    assert limits == {"max_batch": batch, "max_seq_len": longest}
    assert "maximum positions" in render("serving_fit", {"model": "gpt2", "seq_len": "32768"})


# ------------------------------------------------------------------------------- Chapter 14: vLLM budget
def test_serve_calculator_draws_serves_budget_and_users() -> None:
    from memlib.viz.live import serve_parts
    from memlib.core.serve import serve

    html = render("serve", {"model": "llama-3-8b", "gpu": "h100-sxm", "max_model_len": "8192"}, live=True)
    fit = serve("llama-3-8b", gpu="h100-sxm", max_model_len=8192)
    assert f"{fit.max_concurrent_seqs} requests of 8,192 tokens" in html and f"{fit.num_blocks:,} blocks" in html
    assert sum(serve_parts(fit).values()) <= fit.budget_bytes  # the parts are the budget, the blocks rounded down
    fp8 = render("serve", {"model": "llama-3-8b", "gpu": "h100-sxm", "max_model_len": "8192", "kv_dtype": "fp8"})
    more = serve("llama-3-8b", gpu="h100-sxm", max_model_len=8192, kv_dtype="fp8").max_concurrent_seqs
    assert more > fit.max_concurrent_seqs and f"{more} requests" in fp8
    assert "does not fit: no memory left for the KV cache" in render("serve", {"model": "llama-3-70b",
                                                                              "gpu": "h100-sxm"})
    assert "refused: tensor_parallel 8" in render("serve", {"model": "qwen2-0.5b", "tensor_parallel": "8"})
    with pytest.raises(MemlibError, match="expected one of"):
        render("serve", {"gpu": "tpu-v5"})


# ------------------------------------------------------------------------------------- Chapter 13: planner
def test_plan_calculator_shows_the_ladder_and_the_widgets_verdict() -> None:
    from memlib.viz.live import plan_verdict
    from memlib.core.plan import plan
    from memlib.viz.widgets_plan import plan_view

    html = render("plan", {"model": "llama-2-7b", "job": "train", "num_gpus": "8", "gpu_memory_gib": "80.0"},
                  live=True)
    result = plan("llama-2-7b", num_gpus=8, gpu_memory=80 * 2**30, batch_size=4, seq_len=2048)
    verdict = plan_verdict(result)
    assert result.fits and verdict.startswith("fits:") and verdict.replace("'", "&#x27;") in html
    assert html.count("<tr>") == 1 + sum(s.applicable for s in result.steps)  # header + one row per rung
    _, fig, widget_verdict = plan_view("llama-2-7b", "train", 8, 80.0, 4, 2048)
    fig.clf()
    assert widget_verdict == verdict  # one verdict for the widget and the page
    big = render("plan", {"model": "llama-2-70b", "num_gpus": "1", "gpu_memory_gib": "24.0"})
    assert "CPU offload" in big and "fits:" in big  # 70B on one 24 GiB card: only with everything offloaded
    none = render("plan", {"model": "llama-2-70b", "job": "infer", "num_gpus": "1", "gpu_memory_gib": "16.0",
                           "batch_size": "16", "seq_len": "4096"})
    assert "does not fit" in none and "needs" in none
    assert "refused:" in render("plan", {"model": "gpt2", "seq_len": "8192"})
    with pytest.raises(MemlibError, match="expected one of"):
        render("plan", {"job": "pretrain"})


def test_serve_calculator_follows_a_vllm_release() -> None:
    from memlib.core.serve import serve

    html = render("serve", {"model": "llama-3-8b", "gpu": "h100-sxm", "max_model_len": "8192", "vllm_version": "0.34"})
    fit = serve("llama-3-8b", gpu="h100-sxm", max_model_len=8192, vllm_version="0.34")
    assert f"vLLM 0.34 logs {fit.vllm_tokens:,} tokens" in html and "1,024 sequences" in html
    v0 = render("serve", {"model": "llama-3-8b", "gpu": "h100-sxm", "max_model_len": "8192", "vllm_version": "0.6"})
    assert "256 sequences" in v0  # V0's max_num_seqs, not get_batch_defaults' 1024
    assert "vLLM" not in render("serve", {"model": "llama-3-8b", "gpu": "h100-sxm"}).split("verdict")[-1]
