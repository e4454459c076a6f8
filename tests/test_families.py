"""Dense families of issue 20 (Gemma 2, Gemma 3, Phi-3, GPT-NeoX, Falcon): configs, counts, activations, KV, CLI."""
from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib import MemlibError
from memlib.cli import main
from memlib.core.configs import DENSE_FAMILIES, load_config, shipped_models
from memlib.core.estimate import activation_terms, estimate_inference, estimate_training
from memlib.core.inference import kv_bytes_per_token, kv_cache_bytes, kv_cached_tokens
from memlib.core.params import count_params
from memlib.measure.hf_config import count_built as _count_built
from memlib.core.serve import serve

#: The shipped configs of the dense families (every test below iterates over these).
DENSE_MODELS = [m for m in shipped_models(all_models=True)
                if load_config(m, any_family=True).model_type in DENSE_FAMILIES]

TINY = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512}
TINY_DENSE = {
    "gemma2": {**TINY, "model_type": "gemma2", "head_dim": 16, "sliding_window": 32},
    "gemma3_text": {**TINY, "model_type": "gemma3_text", "head_dim": 16, "sliding_window": 32,
                    "sliding_window_pattern": 2},
    "phi3": {**TINY, "model_type": "phi3", "pad_token_id": 0, "sliding_window": 32},
    "phi3 (MHA, dropout)": {**TINY, "model_type": "phi3", "pad_token_id": 0, "num_key_value_heads": 4,
                            "resid_pdrop": 0.1, "attention_dropout": 0.1},
    "gpt_neox": {**TINY, "model_type": "gpt_neox", "num_key_value_heads": 4},
    "gpt_neox (sequential, dropout)": {**TINY, "model_type": "gpt_neox", "use_parallel_residual": False,
                                       "hidden_dropout": 0.1, "attention_dropout": 0.1},
    "falcon": {**TINY, "model_type": "falcon"},
    "falcon (new decoder architecture)": {**TINY, "model_type": "falcon", "new_decoder_architecture": True,
                                          "num_kv_heads": 2},
    "falcon (sequential, MHA, bias)": {**TINY, "model_type": "falcon", "parallel_attn": False, "multi_query": False,
                                       "bias": True, "hidden_dropout": 0.1},
}


def test_the_six_shipped_dense_models_are_loaded_natively() -> None:
    assert DENSE_MODELS == ["falcon-7b", "gemma-2-27b", "gemma-2-9b", "gemma-3-27b", "phi-3-mini", "pythia-1.4b"]
    assert all(load_config(m).native for m in DENSE_MODELS)


def test_config_fields() -> None:
    g2 = load_config("gemma-2-9b")
    assert g2.layer_types[:4] == ("sliding_attention", "full_attention") * 2 and g2.sliding_window == 4096
    assert (g2.attn_softcap, g2.final_softcap, g2.post_norms, g2.head_dim) == (50.0, 30.0, True, 256)
    g3 = load_config("gemma-3-27b")  # sliding_window_pattern 6: five local layers, then one global
    assert g3.layer_types[:6] == ("sliding_attention",) * 5 + ("full_attention",)
    assert g3.layer_types.count("full_attention") == 10 and g3.qk_norm and g3.attn_softcap is None
    assert load_config({**TINY_DENSE["gemma3_text"], "layer_types": ["full_attention"] * 4}).layer_types == (
        "full_attention",) * 4
    neox = load_config("pythia-1.4b")
    assert (neox.rotary_dim, neox.parallel_residual, neox.norm, neox.qkv_bias, neox.mlp) == (
        32, True, "layernorm", True, "gelu")  # rotary_pct 0.25 of head_dim 128
    falcon = load_config("falcon-7b")
    assert (falcon.num_kv_heads, falcon.head_dim, falcon.intermediate_size, falcon.parallel_residual) == (
        1, 64, 4 * 4544, True)  # multi-query, ffn_hidden_size 4h
    new = load_config(TINY_DENSE["falcon (new decoder architecture)"])
    assert new.num_kv_heads == 2 and new.num_norms_in == 2
    assert load_config({**TINY_DENSE["falcon"], "multi_query": False}).num_kv_heads == 4
    phi = load_config("phi-3-mini")
    assert phi.sliding_window == 2047 and phi.num_kv_heads == 32 and not phi.layer_types


@pytest.mark.parametrize("raw, pattern", [
    ({**TINY_DENSE["gpt_neox"], "num_attention_heads": 5}, "num_attention_heads 5 does not divide hidden_size 64"),
    ({**TINY_DENSE["falcon"], "num_attention_heads": 3}, "num_attention_heads 3 does not divide hidden_size 64"),
    ({**TINY_DENSE["falcon (new decoder architecture)"], "num_kv_heads": 3},
     "num_kv_heads 3 does not divide num_attention_heads 4"),
    ({**TINY_DENSE["phi3"], "num_key_value_heads": 3}, "num_key_value_heads 3 does not divide num_attention_heads 4"),
    ({**TINY_DENSE["gemma2"], "layer_types": ["sliding_attention"]}, "'layer_types' must list 4 entries"),
    ({**TINY_DENSE["gemma2"], "attn_logit_softcapping": -1}, "'attn_logit_softcapping' must be a positive number"),
    ({**TINY_DENSE["gemma2"], "query_pre_attn_scalar": 0}, "'query_pre_attn_scalar' must be a positive number, got 0"),
    ({**TINY_DENSE["gemma3_text"], "sliding_window_pattern": 0}, "'sliding_window_pattern' must be a positive integer"),
    ({**TINY_DENSE["gpt_neox"], "rotary_pct": 1.5}, r"rotary fraction .* must be in \(0, 1\], got 1.5"),
    ({**TINY_DENSE["falcon"], "multi_query": "yes"}, "'multi_query' must be true or false, got 'yes'"),
    ({**TINY_DENSE["phi3"], "resid_pdrop": 1.0}, r"'resid_pdrop' must be a probability in \[0, 1\), got 1.0"),
    ({**TINY_DENSE["falcon"], "activation": "relu"}, "unsupported activation 'relu' for falcon; expected one of: gelu"),
])
def test_bad_configs_give_one_clear_line(raw: dict, pattern: str) -> None:
    with pytest.raises(MemlibError, match=pattern) as info:
        load_config(raw)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", DENSE_MODELS + sorted(TINY_DENSE))
def test_param_formula_equals_the_built_class(name: str) -> None:
    pytest.importorskip("torch")
    cfg = load_config(TINY_DENSE.get(name, name))
    assert count_params(cfg) == _count_built(cfg)  # total and every component, tensor count, small tensors


def test_param_counts_of_the_shipped_dense_models() -> None:
    counts = {m: count_params(m).params for m in DENSE_MODELS}
    assert counts == {"falcon-7b": 6_921_720_704, "gemma-2-27b": 27_227_128_320, "gemma-2-9b": 9_241_705_984,
                      "gemma-3-27b": 27_009_346_304, "phi-3-mini": 3_821_079_552, "pythia-1.4b": 1_414_647_808}


@pytest.mark.parametrize("name", sorted(TINY_DENSE))
def test_estimate_equals_the_meta_trace_of_tiny_configs(name: str) -> None:
    """Estimate vs the traced peak within 0.5 % (measured: ≤ 0.1 %), eager and sdpa, batch 1 and 4."""
    pytest.importorskip("transformers")
    from memlib.measure.trace import trace_training

    cfg = TINY_DENSE[name]
    for attention in ("eager", "sdpa"):
        if attention == "sdpa" and cfg["model_type"] == "gemma2":
            continue
        for batch in (1, 4):
            kw = dict(batch_size=batch, seq_len=64, precision="bf16", optimizer="adamw", attention=attention)
            est, traced = estimate_training(cfg, **kw), trace_training(cfg, **kw)
            assert abs(est.total_bytes - traced.peak_bytes) <= 0.005 * traced.peak_bytes, (attention, batch)


def test_gemma2_terms_softcapping_and_windows() -> None:
    terms: dict[str, int] = {}
    for t in activation_terms("gemma-2-9b", batch_size=1, seq_len=4096, attention="eager"):
        key = t.name.split(" [")[0]  # local and global layers, each with its share of the layers
        terms[key] = terms.get(key, 0) + t.bytes
    b, s, a, V = 1, 4096, 16, 256000
    assert terms["scores soft-capped before the softmax: tanh output"] == 2 * b * a * s * s
    assert terms["soft-capped logits: tanh output"] == 2 * b * s * V
    assert terms["Gemma RMSNorms: fp32 inputs and normalized ×4"] == 4 * 8 * b * s * 3584
    with pytest.raises(MemlibError, match="attention 'sdpa' does not exist for gemma2 .* expected attention: eager"):
        activation_terms("gemma-2-9b", attention="sdpa")


def test_gemma3_local_layers_keep_a_mask_past_the_window_global_layers_do_not() -> None:
    def masks(seq: int) -> int:
        terms = activation_terms("gemma-3-27b", batch_size=1, seq_len=seq, attention="sdpa")
        return sum(t.bytes for t in terms if "mask" in t.name)

    assert masks(1023) == 0  # shorter than the 1,024-token window: causal, no mask
    # 52 of 62 layers are local: the per-layer term carries their share
    assert masks(2048) * 62 == pytest.approx(52 * 2 * 2048 * 2048, rel=1e-6)


def test_falcon_alibi_and_dense_lora_are_refused() -> None:
    with pytest.raises(MemlibError, match="falcon with alibi=true is not derived"):
        estimate_training({**TINY_DENSE["falcon"], "alibi": True})
    with pytest.raises(MemlibError, match="method 'lora' is estimated for .* not phi3"):
        estimate_training("phi-3-mini", method="lora")


@pytest.mark.parametrize("model", DENSE_MODELS)
def test_train_answers_for_every_shipped_dense_model(model: str) -> None:
    cfg = load_config(model)
    attention = "eager" if cfg.model_type == "gemma2" else "sdpa"
    est = estimate_training(model, batch_size=1, seq_len=min(4096, cfg.max_positions), attention=attention)
    assert est.activations_bytes and est.total_bytes > est.model_states_bytes > 16 * count_params(model).params - 1


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(DENSE_MODELS), batch=st.integers(1, 8), seq=st.integers(1, 8192),
       eager=st.booleans())
def test_recomputation_and_longer_sequences_never_lower_the_estimate_order(model: str, batch: int, seq: int,
                                                                           eager: bool) -> None:
    cfg = load_config(model)
    attention = "eager" if eager or cfg.model_type == "gemma2" else "sdpa"
    seq = min(seq, cfg.max_positions - 1)
    acts = [estimate_training(model, batch_size=batch, seq_len=seq, attention=attention, recompute=r).activations_bytes
            for r in ("none", "selective", "full")]
    assert acts[0] >= acts[1] >= acts[2] > 0
    longer = estimate_training(model, batch_size=batch, seq_len=seq + 1, attention=attention).activations_bytes
    assert longer > acts[0]


# --- inference KV ----------------------------------------------------------------------------------------------

def test_gemma2_kv_per_token_below_and_above_the_window() -> None:
    # Gemma-2-9B: 42 layers, 8 KV heads × 256, fp16: 2 × 42 × 8 × 256 × 2 = 344,064 B per token while every layer
    # caches every token (up to the 4,096-token window); at 8,192 tokens the 21 local layers hold 4,096 only:
    # (21 × 8,192 + 21 × 4,096) × 2 × 8 × 256 × 2 / 8,192 = 258,048 B per token on average.
    assert kv_bytes_per_token("gemma-2-9b") == 344_064
    assert kv_bytes_per_token("gemma-2-9b", seq_len=2048) == 344_064
    assert kv_bytes_per_token("gemma-2-9b", seq_len=4096) == 344_064
    assert kv_bytes_per_token("gemma-2-9b", seq_len=8192) == 258_048
    assert estimate_inference("gemma-2-9b", seq_len=8192, batch_size=2).kv_cache_bytes == 2 * 8192 * 258_048
    assert kv_cached_tokens("gemma-2-9b", 8192)[:2] == (4096, 8192)


def test_gemma3_caps_five_layers_in_six() -> None:
    per_layer = 2 * 16 * 128 * 2  # K and V, 16 KV heads × 128, fp16
    assert kv_cache_bytes("gemma-3-27b", 32768) == per_layer * (52 * 1024 + 10 * 32768)
    assert kv_cache_bytes("gemma-3-27b", 1000) == per_layer * 62 * 1000


def test_falcon_and_pythia_kv() -> None:
    assert kv_bytes_per_token("falcon-7b") == 2 * 32 * 1 * 64 * 2  # multi-query: one KV head
    new = TINY_DENSE["falcon (new decoder architecture)"]
    assert kv_bytes_per_token(new) == 2 * 4 * 2 * 16 * 2  # the new decoder architecture: its num_kv_heads groups
    assert kv_bytes_per_token("pythia-1.4b") == 2 * 24 * 16 * 128 * 2  # full multi-head attention


@pytest.mark.parametrize("model,window", [("mistral-7b", 4096), ("phi-3-mini", 2047)])
def test_a_window_over_every_layer_caps_every_layer(model: str, window: int) -> None:
    """transformers' DynamicCache makes every layer with a sliding_window a sliding layer (and vLLM too)."""
    cfg = load_config(model)
    full = kv_bytes_per_token(model)
    assert kv_bytes_per_token(model, seq_len=window) == full  # up to the window every token is cached
    s = min(8192, cfg.max_positions)
    assert estimate_inference(model, seq_len=s, batch_size=3).kv_cache_bytes == 3 * window * full
    assert serve(model, gpu="h100-sxm", max_model_len=s).blocks_per_seq == -(-window // 16)


@pytest.mark.parametrize("model", ["llama-2-7b", "qwen2-0.5b", "gpt2"])
def test_models_without_sliding_layers_keep_their_kv(model: str) -> None:
    cfg = load_config(model)
    s = min(8192, cfg.max_positions)
    assert kv_bytes_per_token(model, seq_len=s) == kv_bytes_per_token(model) == 2 * cfg.num_layers * cfg.kv_dim * 2
    assert estimate_inference(model, seq_len=s, batch_size=3).kv_cache_bytes == 3 * s * kv_bytes_per_token(model)


def test_serve_gemma2_counts_capped_blocks() -> None:
    fit = serve("gemma-2-9b", gpu="h100-sxm", max_model_len=8192)
    assert fit.kv_bytes_per_token == 344_064  # one block page holds every layer's K and V of its tokens
    assert fit.blocks_per_seq == 384  # 8,192 × 258,048 / (16 × 344,064): the local layers stop at 4,096
    assert fit.fits and fit.max_concurrent_seqs == (fit.num_blocks - 1) // 384
    short = serve("gemma-2-9b", gpu="h100-sxm", max_model_len=4096)
    assert short.blocks_per_seq == 4096 // 16


@pytest.mark.parametrize("model", DENSE_MODELS)
def test_serve_and_infer_answer_for_every_shipped_dense_model(model: str) -> None:
    cfg = load_config(model)
    fit = serve(model, gpu="h200", max_model_len=min(cfg.max_positions, 4096))
    assert fit.fits or fit.reasons
    assert estimate_inference(model, seq_len=min(cfg.max_positions, 4096)).kv_cache_bytes > 0


# --- CLI -------------------------------------------------------------------------------------------------------

def test_cli_train_gemma2_runs_eager_by_default(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "gemma-2-9b", "--batch-size", "1", "--seq-len", "4096"]) == 0
    out = capsys.readouterr().out
    assert "attention=eager" in out and "seq_len=4096" in out and "total_bytes" in out
    assert main(["train", "gemma-2-9b", "--attention", "sdpa"]) == 2
    assert "expected attention: eager" in capsys.readouterr().err


def test_cli_serve_and_infer_gemma2(capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", "gemma-2-9b", "--gpu", "h100-sxm", "--max-model-len", "8192", "--vllm-version", "book"]) == 0
    assert "blocks_per_seq                        384" in capsys.readouterr().out
    # vLLM (get_batch_defaults: 8192 batched tokens on an H100): the window admits min(4095 + 8192, 8192) tokens,
    # so both groups of 21 layers need a full request's blocks, + 1 for the window's unaligned start
    assert main(["serve", "gemma-2-9b", "--gpu", "h100-sxm", "--max-model-len", "8192"]) == 0
    assert "blocks_per_seq                      1,025" in capsys.readouterr().out
    assert main(["infer", "gemma-2-9b", "--seq-len", "8192", "--json"]) == 0
    assert '"kv_cache_bytes": 2113929216' in capsys.readouterr().out  # 8,192 × 258,048


def test_dense_families_need_no_torch() -> None:
    code = ("import sys; from memlib.core.estimate import activation_terms, estimate_inference; "
            "from memlib.core.params import count_params; activation_terms('gemma-3-27b'); count_params('falcon-7b'); "
            "estimate_inference('gemma-2-9b', seq_len=8192); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
