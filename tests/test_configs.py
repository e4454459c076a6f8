"""Model families beyond memlib's own: configs, traces of any causal LM transformers builds, shipped configs."""
import json

import pytest

import memlib
from memlib.core.configs import BOOK_MODELS, load_config, shipped_models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from memlib.core.estimate import estimate_training  # noqa: E402
from memlib.core.params import count_params  # noqa: E402
from memlib.measure.trace import build_model, trace_training  # noqa: E402

BASE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256}
TINY = {
    "qwen3": {**BASE, "model_type": "qwen3", "head_dim": 16},
    "gemma2": {**BASE, "model_type": "gemma2", "head_dim": 16, "sliding_window": 8},
    "gemma3_text": {**BASE, "model_type": "gemma3_text", "head_dim": 16, "sliding_window": 8},
    "phi3": {**BASE, "model_type": "phi3", "pad_token_id": 0},
    "mixtral": {**BASE, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    "olmo2": {**BASE, "model_type": "olmo2", "pad_token_id": 0},
    "gpt_neox": {**BASE, "model_type": "gpt_neox", "num_key_value_heads": 4},
    "falcon": {**BASE, "model_type": "falcon", "num_key_value_heads": 4},
    "qwen2_moe": {**BASE, "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48},
    "deepseek_v3": {**BASE, "model_type": "deepseek_v3", "num_key_value_heads": 4, "n_routed_experts": 4,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
                    "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8,
                    "qk_nope_head_dim": 8, "v_head_dim": 16, "n_group": 2, "topk_group": 1, "num_hidden_layers": 3},
}
TINY_MISTRAL_SLIDING = {**BASE, "model_type": "mistral", "sliding_window": 8}

#: Parameter counts of the shipped current models, from their transformers classes on the meta device; the
#: published totals agree (Llama 3.1: 8.03B/70.6B/405.9B; Mixtral 46.7B/140.6B; DeepSeek-V3 671B without MTP).
SHIPPED_PARAMS = {
    "llama-3.1-8b": 8_030_261_248, "llama-3.1-70b": 70_553_706_496, "llama-3.1-405b": 405_853_388_800,
    "qwen2.5-7b": 7_615_616_512, "qwen2.5-72b": 72_706_203_648, "qwen3-8b": 8_190_735_360,
    "qwen3-32b": 32_762_123_264, "gemma-2-9b": 9_241_705_984, "gemma-2-27b": 27_227_128_320,
    "gemma-3-27b": 27_009_346_304, "phi-3-mini": 3_821_079_552, "mixtral-8x7b": 46_702_792_704,
    "mixtral-8x22b": 140_630_071_296, "deepseek-v2-lite": 15_706_484_224, "deepseek-v3": 671_026_404_352,
    "olmo-2-7b": 7_298_617_344, "pythia-1.4b": 1_414_647_808, "falcon-7b": 6_921_720_704,
}


@pytest.mark.parametrize("family", sorted(TINY))
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_any_family_traces_on_meta_as_on_cpu(family: str, attention: str) -> None:
    cfg = TINY[family]
    if family == "gemma2" and attention == "sdpa":
        with pytest.raises(memlib.MemlibError, match="cannot build model_type 'gemma2' with attention 'sdpa'"):
            trace_training(cfg, attention=attention, seq_len=32)
        return
    kw = dict(batch_size=2, seq_len=32, precision="bf16", attention=attention)
    meta = trace_training(cfg, device="meta", **kw)
    cpu = trace_training(cfg, device="cpu", **kw)
    # CPU LayerNorms (gpt_neox, falcon) keep bf16 statistics where meta/CUDA keep fp32; MoE routing helpers
    # (histc) differ by a few bytes: the two agree within 0.5 %.
    assert abs(meta.peak_bytes - cpu.peak_bytes) <= 0.005 * cpu.peak_bytes
    assert meta.params_bytes == cpu.params_bytes == 2 * count_params(cfg).params


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "deepseek_v3"])
def test_moe_traces_in_fp32_on_meta(family: str) -> None:
    # PyTorch's meta grouped_mm takes only bf16; memlib supplies one with the same shapes for other dtypes.
    kw = dict(batch_size=2, seq_len=32, precision="fp32")
    meta = trace_training(TINY[family], device="meta", **kw)
    cpu = trace_training(TINY[family], device="cpu", **kw)
    assert abs(meta.peak_bytes - cpu.peak_bytes) <= 0.005 * cpu.peak_bytes


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_sliding_window_sdpa_traces_on_cpu(device: str) -> None:
    # A sliding window shorter than the sequence makes transformers pass a boolean mask; torch's SDPA turns it
    # into an additive mask in the query's dtype before its kernels, and so does the traced flash route.
    kw = dict(batch_size=2, seq_len=32, precision="bf16", attention="sdpa")
    res = trace_training(TINY_MISTRAL_SLIDING, device=device, **kw)
    assert res.peak_bytes == trace_training(TINY_MISTRAL_SLIDING, device="meta", **kw).peak_bytes


def test_extrapolation_for_other_families() -> None:
    deep = {**TINY["qwen3"], "num_hidden_layers": 8}
    kw = dict(batch_size=2, seq_len=32, precision="bf16")
    fast = trace_training(deep, **kw)
    assert fast.method == "extrapolated"
    full = trace_training(deep, extrapolate=False, **kw)
    assert (fast.peak_bytes, fast.by_category, fast.peak_phase) == (full.peak_bytes, full.by_category, full.peak_phase)
    # layers that differ (Gemma 3's 5 local : 1 global, Qwen2-MoE's MoE every other layer): the full trace runs
    moe_every_2 = {**TINY["qwen2_moe"], "num_hidden_layers": 8, "decoder_sparse_step": 2}
    for cfg in ({**TINY["gemma3_text"], "num_hidden_layers": 8}, moe_every_2):
        res = trace_training(cfg, **kw)
        assert res.method == "full"
        assert res.peak_bytes == trace_training(cfg, extrapolate=False, **kw).peak_bytes
    # DeepSeek's dense first layer, then identical MoE layers: extrapolated from 4, 5 and 6 layers, exactly
    deep_v3 = {**TINY["deepseek_v3"], "num_hidden_layers": 8}
    fast = trace_training(deep_v3, **kw)
    assert fast.method == "extrapolated"
    assert fast.as_dict() == trace_training(deep_v3, extrapolate=False, **kw).as_dict()


def test_shipped_models_default_is_the_books_set() -> None:
    assert shipped_models() == sorted(BOOK_MODELS)
    assert set(SHIPPED_PARAMS) <= set(shipped_models(all_models=True))


@pytest.mark.parametrize("name", sorted(SHIPPED_PARAMS))
def test_shipped_current_models_are_counted_exactly(name: str) -> None:
    raw = load_config(name, any_family=True).raw
    cfg = transformers.AutoConfig.for_model(raw["model_type"], **{k: v for k, v in raw.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    with torch.device("meta"):
        net = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    assert count_params(name).params == sum(p.numel() for p in net.parameters()) == SHIPPED_PARAMS[name]


def test_count_breakdown_adds_up_for_other_families() -> None:
    for name in ("mixtral-8x7b", "deepseek-v2-lite", "falcon-7b", "gemma-2-9b"):
        pc = count_params(name)
        assert pc.embeddings + pc.attention + pc.mlp + pc.norms + pc.lm_head == pc.params
    assert count_params("gemma-2-9b").lm_head == 0  # tied
    assert count_params("deepseek-v3").per_layer > count_params({**load_config("deepseek-v3", any_family=True).raw,
                                                                  "num_hidden_layers": 3}).per_layer


def test_native_families_keep_their_own_counter() -> None:
    assert load_config("llama-3.1-8b").native and load_config("qwen3-8b").native and load_config("olmo-2-7b").native
    assert load_config("mixtral-8x7b").native and load_config("deepseek-v3").native  # memlib.core.families_moe
    assert load_config("llama-3.1-8b").max_positions == 131_072  # llama3 rope scaling: 8 × 8,192 stated already
    assert load_config({**TINY["qwen3"], "head_dim": None}).head_dim == 128  # Qwen3Config's default


def test_estimator_refuses_families_it_has_not_derived() -> None:
    with pytest.raises(memlib.MemlibError, match=r"unsupported model_type 'starcoder2'; expected one of: gpt2, llama, "
                                                 r"mistral, qwen2, gemma, qwen3, olmo2, .*\(memlib trace"):
        estimate_training({**BASE, "model_type": "starcoder2"})


@pytest.mark.parametrize("precision", ["bf16", "bf16-mixed", "fp32"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_qwen3_and_olmo2_estimates_equal_traces(precision: str, attention: str) -> None:
    # Qwen3: q_norm and k_norm keep their fp32 inputs, rsqrt and normalized outputs (all Qwen3 adds to Llama).
    # OLMo 2: post-norms multiplying in fp32, q_norm/k_norm over all heads.
    for model in ("qwen3-8b", "olmo-2-7b"):
        for batch, seq in ((1, 512), (4, 2048)):
            kw = dict(batch_size=batch, seq_len=seq, precision=precision, attention=attention)
            est = estimate_training(model, **kw)
            traced = trace_training(model, **kw)
            assert abs(est.total_bytes - traced.peak_bytes) <= 1e-4 * traced.peak_bytes, (model, batch, seq)
            assert est.peak_phase == traced.peak_phase


def test_olmo2_lora_is_not_estimated() -> None:
    with pytest.raises(memlib.MemlibError, match="method 'lora' is estimated for gpt2, .* not olmo2"):
        estimate_training("olmo-2-7b", method="lora")


@pytest.mark.parametrize("precision", ["bf16", "bf16-mixed"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_gemma_fp32_norm_copies_are_estimated(precision: str, attention: str) -> None:
    # GemmaRMSNorm multiplies by (1 + w) in fp32: its fp32 normalized tensor is kept, ≈ (4 − 2)·b·s·h per norm
    kw = dict(batch_size=2, seq_len=1024, precision=precision, attention=attention)
    est = estimate_training("gemma-2b", **kw)
    assert abs(est.total_bytes - trace_training("gemma-2b", **kw).peak_bytes) <= 1e-5 * est.total_bytes


def test_unknown_model_type_names_the_families_and_params(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = {"model_type": "nosuch_lm", "hidden_size": 8}
    with pytest.raises(memlib.MemlibError, match=r"unsupported model_type 'nosuch_lm'; expected one of: gpt2, "
                                                 r"llama, mistral, qwen2, gemma, qwen3, olmo2, (.+, )?or a causal-LM model_type "
                                                 r"transformers knows; for model states only, give --params N"):
        trace_training(bad)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(memlib.MemlibError, match="unsupported model_type 'nosuch_lm'"):
        count_params(path)
    # gpt_neox is read by memlib itself now (configs._dense_family_config): its own one-line check
    with pytest.raises(memlib.MemlibError, match="^num_attention_heads 3 does not divide hidden_size 64; choose heads"):
        count_params({**TINY["gpt_neox"], "num_attention_heads": 3})


def test_build_model_of_another_family() -> None:
    net = build_model(TINY["olmo2"], device="meta", dtype="bf16")
    assert type(net).__name__ == "Olmo2ForCausalLM" and net.training


@pytest.mark.parametrize("precision", ["bf16", "bf16-mixed"])
def test_sliding_window_sdpa_mask_is_estimated(precision: str) -> None:
    # From seq_len = window on, each layer keeps an additive (b, 1, s, s) mask and k, v repeated to all heads
    for batch, seq in ((1, 4095), (1, 4096), (2, 8192)):
        kw = dict(batch_size=batch, seq_len=seq, precision=precision, attention="sdpa")
        est = estimate_training("mistral-7b", **kw)
        traced = trace_training("mistral-7b", **kw)
        assert abs(est.total_bytes - traced.peak_bytes) <= 1e-5 * traced.peak_bytes
    terms = {t.name: t.bytes for t in memlib.core.estimate.activation_terms("mistral-7b", batch_size=1, seq_len=4096)}
    assert terms["sliding-window additive mask"] == 2 * 4096**2
    assert "sliding-window additive mask" not in {t.name for t in memlib.core.estimate.activation_terms(
        "mistral-7b", batch_size=1, seq_len=4095)}


def test_mla_with_narrower_value_heads_traces() -> None:
    # DeepSeek's MLA: q/k heads are qk_nope + qk_rope wide, v heads v_head_dim (narrower)
    cfg = {**TINY["deepseek_v3"], "qk_nope_head_dim": 16}
    kw = dict(batch_size=2, seq_len=32, precision="bf16", attention="sdpa")
    assert trace_training(cfg, **kw).peak_bytes == trace_training(cfg, device="cpu", **kw).peak_bytes


def test_eager_only_family_extrapolates_or_traces_in_full() -> None:
    # Gemma 2 has no sdpa in transformers: the layer check builds the model with the attention asked for
    deep = {**TINY["gemma2"], "num_hidden_layers": 7}
    res = trace_training(deep, batch_size=1, seq_len=16, precision="bf16", attention="eager")
    assert res.method == "full"  # alternating sliding and global layers
