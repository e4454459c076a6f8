"""memlib.core.serve: vLLM-style KV-block budget, its properties, bad input and the `memlib serve` command."""
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib.cli import main
from memlib.core.configs import load_config, shipped_models
from memlib.core.dtypes import GiB, MiB
from memlib.core.errors import MemlibError
from memlib.core.estimate import estimate_inference
from memlib.core.hardware import get_gpu
from memlib.core.inference import forward_activation_bytes, kv_bytes_per_token
from memlib.core.serve import (DEFAULT_CUDA_GRAPH, DEFAULT_NON_TORCH, SERVE_KV_DTYPES, decode_bytes_per_step,
                          decode_latency_s, serve, serve_kv_bytes_per_token)


def test_llama3_8b_on_h100_at_8k_worked_example() -> None:
    fit = serve("llama-3-8b", gpu="h100-sxm", max_model_len=8192)
    assert fit.budget_bytes == int(0.9 * 80 * GiB)
    assert fit.weights_bytes == estimate_inference("llama-3-8b", seq_len=1).weights_bytes
    assert fit.activation_bytes == forward_activation_bytes("llama-3-8b", 2048, 256)
    assert fit.kv_budget_bytes == (fit.budget_bytes - fit.weights_bytes - fit.activation_bytes
                                   - DEFAULT_NON_TORCH - DEFAULT_CUDA_GRAPH)
    assert fit.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 128 * 1024  # 128 KiB per token
    assert fit.block_bytes == 2 * MiB
    assert fit.num_blocks == fit.kv_budget_bytes // (2 * MiB) == 28_321
    assert fit.blocks_per_seq == 8192 // 16 == 512
    assert fit.max_concurrent_seqs == (28_321 - 1) // 512 == 55
    assert fit.fits and fit.reasons == ()


def test_matches_inference_kv_bytes_for_float_formats() -> None:
    for model in ("llama-2-7b", "mistral-7b", "gpt2"):
        for dt in ("fp16", "bf16", "fp8"):
            assert serve_kv_bytes_per_token(model, dt) == kv_bytes_per_token(model, dt)


def test_int_kv_formats_carry_scales() -> None:
    fp16 = serve_kv_bytes_per_token("llama-3-8b", "fp16")
    int8 = serve_kv_bytes_per_token("llama-3-8b", "int8")
    int4 = serve_kv_bytes_per_token("llama-3-8b", "int4")
    vectors = 2 * 32 * 8
    assert int8 == fp16 // 2 + vectors * 4 and int4 == fp16 // 4 + vectors * 4
    assert serve("llama-3-8b", gpu="h100", max_model_len=8192, kv_dtype="int4").max_concurrent_seqs > 3 * 55


def test_tensor_parallel_splits_weights_and_kv() -> None:
    one = serve("llama-3-70b", gpu="h100", max_model_len=8192)
    four = serve("llama-3-70b", gpu="h100", max_model_len=8192, tensor_parallel=4)
    assert not one.fits and "no memory left for the KV cache" in one.reasons[0]
    assert four.fits and four.weights_bytes == -(-one.weights_bytes // 4)
    assert four.kv_bytes_per_token == one.kv_bytes_per_token // 4
    with pytest.raises(MemlibError, match="expected one of"):
        serve("llama-3-70b", gpu="h100", max_model_len=8192, tensor_parallel=3)


def test_pipeline_parallel_holds_the_fullest_stage() -> None:
    one = serve("llama-3-70b", gpu="h100", max_model_len=8192)
    three = serve("llama-3-70b", gpu="h100", max_model_len=8192, pipeline_parallel=3)
    stage = -(-80 // 3)  # 27 of the 80 layers on the fullest stage
    assert three.kv_bytes_per_token == one.kv_bytes_per_token * stage // 80
    assert three.weights_bytes == -(-one.weights_bytes * stage // 80)
    with pytest.raises(MemlibError, match="expected at most 80"):
        serve("llama-3-70b", gpu="h100", max_model_len=8192, pipeline_parallel=81)


def test_fragmentation_holds_the_tensors_to_budget_over_one_plus_f() -> None:
    plain = serve("llama-3-8b", gpu="h100", max_model_len=8192, gpu_memory_utilization=1.0)
    frag = serve("llama-3-8b", gpu="h100", max_model_len=8192, gpu_memory_utilization=1.0, fragmentation=0.05)
    held = plain.budget_bytes - DEFAULT_NON_TORCH - DEFAULT_CUDA_GRAPH
    assert frag.kv_budget_bytes == held * 100 // 105 - frag.weights_bytes - frag.activation_bytes
    assert frag.num_blocks < plain.num_blocks
    with pytest.raises(MemlibError, match=r"fragmentation 1.0 is outside \[0, 1\)"):
        serve("llama-3-8b", gpu="h100", max_model_len=8192, fragmentation=1.0)


@pytest.mark.parametrize("model,b,s,kw", [
    ("llama-7b", 8, 2048, {}), ("llama-7b", 8, 2048, {"prefill_tokens": 2048}),
    ("llama-3-70b", 1, 2048, {"weights": "nf4", "kv_dtype": "fp8", "tensor_parallel": 4}),
    ("llama-3-70b", 1, 2048, {"pipeline_parallel": 3}), ("gpt2", 4, 1024, {"kv_dtype": "fp32", "layout": "mha"}),
    ("llama-2-7b", 4, 2048, {"weights": "int8", "layout": "mqa"})])
def test_the_static_fit_of_chapter_11_is_a_question_to_serve(model: str, b: int, s: int, kw: dict) -> None:
    """One serving fit: serving_fit's terms are serve's, asked with the whole GPU, one-token blocks and 5 %."""
    from memlib.core.inference import reserve_bytes, serving_fit
    fit = serving_fit(model, 24 * GiB, batch_size=b, seq_len=s, **kw)
    pre = kw.get("prefill_tokens") or b * s
    sv = serve(model, gpu_memory=24 * GiB, max_model_len=s, gpu_memory_utilization=1.0, block_size=1,
               max_num_batched_tokens=pre, max_num_seqs=b, non_torch_bytes=DEFAULT_NON_TORCH, cuda_graph_bytes=0,
               fragmentation=0.05, tensor_parallel=kw.get("tensor_parallel", 1),
               pipeline_parallel=kw.get("pipeline_parallel", 1), layout=kw.get("layout"),
               weights=kw.get("weights", "fp16"), kv_dtype=kw.get("kv_dtype", "fp16"))
    assert (fit.weights_bytes, fit.activation_bytes) == (sv.weights_bytes, sv.activation_bytes)
    assert fit.kv_cache_bytes == b * s * sv.kv_bytes_per_token
    held = fit.weights_bytes + fit.kv_cache_bytes + fit.activation_bytes
    assert fit.total_bytes == held + reserve_bytes(held)
    # serve's verdict and the static one agree up to the rounding of the 5 % (a few bytes of KV)
    assert fit.fits == (fit.kv_cache_bytes <= sv.kv_budget_bytes) or abs(fit.kv_cache_bytes - sv.kv_budget_bytes) < 64


def test_speculative_decoding_costs_draft_weights_kv_and_lookahead() -> None:
    base = serve("llama-2-13b", gpu="a100-80gb", max_model_len=4096)
    spec = serve("llama-2-13b", gpu="a100-80gb", max_model_len=4096, draft="llama-2-7b", num_speculative_tokens=4)
    assert spec.draft_weights_bytes == estimate_inference("llama-2-7b", seq_len=1).weights_bytes
    assert spec.kv_bytes_per_token == base.kv_bytes_per_token + kv_bytes_per_token("llama-2-7b")
    assert spec.blocks_per_seq == -(-(4096 + 4) // 16) == 257
    assert spec.max_concurrent_seqs < base.max_concurrent_seqs


def test_prefix_cache_shares_full_blocks() -> None:
    plain = serve("llama-3-8b", gpu="l40s", max_model_len=4096)
    shared = serve("llama-3-8b", gpu="l40s", max_model_len=4096, prefix_cache_hit_rate=0.5)
    usable = shared.num_blocks - 1
    assert shared.max_concurrent_seqs == plain.max_concurrent_seqs
    assert shared.max_concurrent_seqs_prefix == (usable - 128) // 128 > 2 * plain.max_concurrent_seqs - 2


def test_too_long_for_the_blocks_says_why_and_the_longest_that_fits() -> None:
    fit = serve("llama-3-8b", gpu_memory="19GiB", max_model_len=8192)
    assert not fit.fits and fit.max_concurrent_seqs == 0
    assert "the longest request that fits is" in fit.reasons[0]
    assert 0 < fit.max_model_len_fits < 8192
    assert serve("llama-3-8b", gpu_memory="19GiB", max_model_len=fit.max_model_len_fits).max_concurrent_seqs == 1


@pytest.mark.parametrize("kwargs, pattern", [
    ({"block_size": 12}, r"block_size 12 is not a power of two .*expected one of: 1, 2, 4"),
    ({"block_size": 1024}, r"expected one of"),
    ({"gpu_memory_utilization": 0.0}, r"outside \(0, 1\]"),
    ({"gpu_memory_utilization": 1.5}, r"outside \(0, 1\]"),
    ({"max_model_len": 8193}, r"expected max_model_len ≤ 8,192"),
    ({"draft": "gpt2", "num_speculative_tokens": 4}, r"expected a draft with the same vocabulary \(128,256"),
    ({"draft": "llama-3-8b"}, r"needs num_speculative_tokens ≥ 1"),
    ({"num_speculative_tokens": 3}, r"needs a draft model"),
    ({"kv_dtype": "fp4"}, r"expected one of: fp32, fp16, bf16, fp8, int8, int4"),
    ({"prefix_cache_hit_rate": 1.0}, r"outside \[0, 1\)"),
    ({"gpu": None}, r"give a GPU name or a GPU memory size"),
])
def test_bad_input_is_one_memlib_error(kwargs: dict, pattern: str) -> None:
    args = {"gpu": "h100", "max_model_len": 8192, **kwargs}
    with pytest.raises(MemlibError, match=pattern):
        serve("llama-3-8b", **args)


@pytest.mark.parametrize("model", shipped_models() + ["gemma-2-9b", "gemma-3-27b", "phi-3-mini", "pythia-1.4b",
                                                     "falcon-7b"])
def test_answers_for_every_shipped_model(model: str) -> None:
    cfg = load_config(model)
    fit = serve(model, gpu="h200", max_model_len=min(cfg.max_positions, 4096), tensor_parallel=1)
    assert fit.kv_budget_bytes == (fit.budget_bytes - fit.weights_bytes - fit.activation_bytes
                                   - fit.non_torch_bytes - fit.cuda_graph_bytes)
    assert fit.fits == (fit.max_concurrent_seqs >= 1)
    assert fit.fits or fit.reasons


_models = st.sampled_from(["llama-3-8b", "mistral-7b", "gpt2-xl", "qwen2-0.5b", "llama-2-13b", "gemma-2-9b"])


@settings(max_examples=40, deadline=None)
@given(model=_models, gib=st.integers(8, 200), util=st.floats(0.05, 0.95), extra=st.floats(0.0, 0.05),
       length=st.integers(1, 1024), bs_exp=st.integers(0, 7), kv=st.sampled_from(sorted(SERVE_KV_DTYPES)))
def test_properties(model: str, gib: int, util: float, extra: float, length: int, bs_exp: int, kv: str) -> None:
    kw = dict(gpu_memory=gib * GiB, max_model_len=length, block_size=1 << bs_exp, kv_dtype=kv)
    fit = serve(model, gpu_memory_utilization=util, **kw)
    more = serve(model, gpu_memory_utilization=util + extra, **kw)
    assert more.num_blocks >= fit.num_blocks  # more utilization never fewer blocks
    assert more.max_concurrent_seqs >= fit.max_concurrent_seqs
    assert fit.num_blocks * fit.block_size * fit.kv_bytes_per_token <= max(fit.kv_budget_bytes, 0)
    assert fit.kv_cache_bytes <= max(fit.kv_budget_bytes, 0) < fit.kv_cache_bytes + fit.block_bytes or \
        fit.kv_budget_bytes <= 0
    assert fit.max_concurrent_seqs * fit.blocks_per_seq <= max(fit.num_blocks - 1, 0)
    assert fit.max_concurrent_seqs_prefix >= fit.max_concurrent_seqs


def test_decode_latency_is_bytes_over_bandwidth() -> None:
    moved = decode_bytes_per_step("llama-3-8b", batch_size=8, context_len=4096)
    assert moved == estimate_inference("llama-3-8b", seq_len=1).weights_bytes + 8 * 4096 * 128 * 1024
    t = decode_latency_s("llama-3-8b", gpu="h100", batch_size=8, context_len=4096)
    assert t == pytest.approx(moved / get_gpu("h100").bandwidth_bytes_per_s)
    assert decode_latency_s("llama-3-8b", gpu="h100", batch_size=8, context_len=4096, mbu=0.5) == pytest.approx(2 * t)
    with pytest.raises(MemlibError, match="mbu"):
        decode_latency_s("llama-3-8b", gpu="h100", mbu=0)


def test_cli_serve_json(capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", "llama-3-8b", "--gpu", "h100", "--max-model-len", "8192", "--json",
                 "--vllm-version", "book"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["num_blocks"] == 28_321 and data["max_concurrent_seqs"] == 55 and data["fits"] is True
    assert data["kv_cache_bytes"] == 28_321 * 2 * MiB


def test_cli_serve_text_and_not_fitting(capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", "llama-3-70b", "--gpu-mem", "80GiB", "--max-model-len", "8192"]) == 0
    out = capsys.readouterr().out
    assert "kv_budget_bytes" in out and "does not fit: no memory left for the KV cache" in out


@pytest.mark.parametrize("args, pattern", [
    (["--gpu", "h100", "--max-model-len", "8192", "--block-size", "12"], "not a power of two"),
    (["--gpu", "h100", "--max-model-len", "8192", "--gpu-memory-utilization", "1.2"], "outside (0, 1]"),
    (["--gpu", "h100", "--max-model-len", "100000"], "expected max_model_len ≤ 8,192"),
    (["--gpu", "h100", "--max-model-len", "8192", "--draft", "gpt2", "--num-speculative-tokens", "3"],
     "same vocabulary"),
    (["--max-model-len", "8192"], "give --gpu NAME or --gpu-mem SIZE"),
    (["--gpu", "h1000", "--max-model-len", "8192"], "unknown GPU 'h1000'; expected one of:"),
    (["--gpu", "h100", "--max-model-len", "8192", "--prefix-cache-hit-rate", "1"], "outside [0, 1)"),
])
def test_cli_serve_bad_input_exit_2(args: list[str], pattern: str) -> None:
    res = subprocess.run([sys.executable, "-m", "memlib", "serve", "llama-3-8b", *args], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and pattern in lines[0]
