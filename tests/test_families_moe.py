"""MoE and MLA families (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3): configs, exact parameters without torch,
total vs active parameters, the estimator against traces, the MLA KV cache (issue 20)."""
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memlib
from memlib.core.configs import MOE_MODEL_TYPES, load_config, shipped_models
from memlib.core.estimate import activation_terms, estimate_inference, estimate_training
from memlib.core.families_moe import count_params_moe, kv_elements_per_token, moe_params
from memlib.core.inference import kv_bytes_per_token
from memlib.core.params import count_params
from memlib.core.serve import serve, serve_kv_bytes_per_token

BASE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512}
TINY = {
    "mixtral": {**BASE, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {**BASE, "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "mlp_only_layers": [2]},
    "qwen3_moe": {**BASE, "model_type": "qwen3_moe", "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32, "norm_topk_prob": True},
    "deepseek_v2": {**BASE, "model_type": "deepseek_v2", "num_key_value_heads": 4, "n_routed_experts": 4,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 2,
                    "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": None, "qk_rope_head_dim": 8,
                    "qk_nope_head_dim": 8, "v_head_dim": 12},
    "deepseek_v3": {**BASE, "model_type": "deepseek_v3", "num_key_value_heads": 4, "n_routed_experts": 4,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
                    "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8,
                    "qk_nope_head_dim": 8, "v_head_dim": 16, "n_group": 2, "topk_group": 1},
}
SHIPPED = [m for m in shipped_models(all_models=True) if load_config(m, any_family=True).model_type in MOE_MODEL_TYPES]


def test_shipped_moe_configs_load_natively() -> None:
    assert {"mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "deepseek-v2-lite", "deepseek-v3"} <= set(SHIPPED)
    for name in SHIPPED:
        cfg = load_config(name)  # no any_family: memlib derives these families itself
        assert cfg.native and cfg.moe is not None
    v2, v3 = load_config("deepseek-v2-lite"), load_config("deepseek-v3")
    assert v2.mla is not None and v2.mla.q_lora_rank is None and v2.moe is not None and v2.moe.moe_layers[0] == 1
    assert v3.mla is not None and v3.mla.q_lora_rank == 1536 and v3.moe is not None and v3.moe.router == "sigmoid"
    assert len(v3.moe.moe_layers) == 61 - 3  # first_k_dense_replace = 3
    assert load_config(TINY["qwen2_moe"]).moe.moe_layers == (0, 1, 3)  # type: ignore[union-attr]  # mlp_only_layers


@pytest.mark.parametrize(("change", "message"), [
    ({"num_experts_per_tok": 5}, "num_experts_per_tok 5 exceeds the 4 experts (n_routed_experts); expected 1 to 4"),
    ({"n_group": 3}, "n_group 3 must divide the 4 routed experts"),
    ({"kv_lora_rank": 0}, "config field 'kv_lora_rank' must be a positive integer, got 0"),
    ({"q_lora_rank": "big"}, "config field 'q_lora_rank' must be a positive integer, got 'big'"),
    ({"first_k_dense_replace": -1}, "config field 'first_k_dense_replace' must be an integer ≥ 0, got -1"),
])
def test_bad_moe_fields_give_one_line(change: dict, message: str) -> None:
    with pytest.raises(memlib.MemlibError) as err:
        load_config({**TINY["deepseek_v3"], **change})
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", SHIPPED + sorted(TINY))
def test_params_equal_the_built_class(name: str) -> None:
    pytest.importorskip("transformers")
    from memlib.measure.hf_config import count_built as _count_built

    cfg = load_config(TINY.get(name, name))
    # the pure formula (count_params dispatches to it) equals the class built on the meta device, field by field
    assert count_params(cfg) == count_params_moe(cfg) == _count_built(cfg)


def test_total_and_active_params() -> None:
    mx = moe_params("mixtral-8x7b")
    h, f = 4096, 14336
    assert mx.total == count_params("mixtral-8x7b").params
    assert mx.total - mx.active == 32 * (8 - 2) * 3 * h * f  # 6 idle experts in each of 32 layers
    assert (mx.num_experts, mx.top_k, mx.moe_layers) == (8, 2, 32)
    v3 = moe_params("deepseek-v3")
    assert v3.total - v3.active == 58 * (256 - 8) * 3 * 7168 * 2048
    dense = moe_params("llama-2-7b")
    assert dense.active == dense.total == count_params("llama-2-7b").params and dense.routed_experts == 0


@settings(max_examples=30, deadline=None)
@given(experts=st.integers(2, 16), top_k=st.integers(1, 2), dense=st.integers(0, 3), shared=st.integers(0, 2))
def test_param_count_grows_by_one_expert_per_moe_layer(experts: int, top_k: int, dense: int, shared: int) -> None:
    cfg = {**TINY["deepseek_v3"], "n_routed_experts": experts, "num_experts_per_tok": top_k, "n_group": 1,
           "topk_group": 1, "first_k_dense_replace": dense, "n_shared_experts": shared}
    h, fe, L = 64, 32, 4
    n_moe = L - dense
    one_more = count_params({**cfg, "n_routed_experts": experts + 1}).params - count_params(cfg).params
    assert one_more == n_moe * (3 * h * fe + h)  # the expert's three matrices and its router row
    p = moe_params(cfg)
    assert p.active <= p.total and p.total - p.active == n_moe * (experts - top_k) * 3 * h * fe


@pytest.mark.parametrize("family", sorted(TINY))
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_estimate_equals_meta_trace(family: str, attention: str) -> None:
    pytest.importorskip("transformers")
    from memlib.measure.trace import trace_training

    for batch in (1, 4):
        kw = dict(batch_size=batch, seq_len=128, precision="bf16", optimizer="sgd", attention=attention)
        est = estimate_training(TINY[family], **kw)
        traced = trace_training(TINY[family], **kw)
        # balanced routing on meta: within 1 % (the terms are exact; the backward temporaries are estimated)
        assert abs(est.total_bytes - traced.peak_bytes) <= 0.01 * traced.peak_bytes, (batch, est, traced)


@pytest.mark.parametrize("family", ["mixtral", "deepseek_v3"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_estimate_equals_meta_trace_other_precisions(family: str, precision: str) -> None:
    pytest.importorskip("transformers")
    from memlib.measure.trace import trace_training

    # fp32: 4-byte activations (the routing weights and DeepSeek's fp32 router copies change with it)
    kw = dict(batch_size=2, seq_len=128, precision=precision, optimizer="adamw", attention="sdpa")
    if precision.endswith("-mixed"):  # the MoE families' autocast terms are approximate: DeepSpeed's 16-bit model
        kw["framework"] = "deepspeed"
    est, traced = estimate_training(TINY[family], **kw), trace_training(TINY[family], **kw)
    assert abs(est.total_bytes - traced.peak_bytes) <= 0.01 * traced.peak_bytes


@pytest.mark.parametrize("first_dense", [0, 3])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_moe_peak_late_in_the_backward(first_dense: int, attention: str) -> None:
    pytest.importorskip("transformers")
    from memlib.measure.trace import trace_training

    # A shallow DeepSeek-V3 (6 layers, full width): each MoE layer's gradients (all 256 experts) outweigh its
    # activations, so the peak sits at the bottom of the backward sweep (memlib.core.families_moe.bottom_backward_bytes)
    cfg = {**load_config("deepseek-v3").raw, "num_hidden_layers": 6, "first_k_dense_replace": first_dense}
    kw = dict(batch_size=4, seq_len=2048, precision="bf16", optimizer="sgd", attention=attention)
    est, traced = estimate_training(cfg, **kw), trace_training(cfg, **kw)
    assert abs(est.total_bytes - traced.peak_bytes) <= 0.03 * traced.peak_bytes


@pytest.mark.parametrize("family", ["mixtral", "deepseek_v3"])
def test_estimate_within_10_percent_of_real_routing_on_cpu(family: str) -> None:
    pytest.importorskip("transformers")
    from memlib.measure.trace import trace_training

    kw = dict(batch_size=4, seq_len=64, precision="bf16", optimizer="adamw", attention="sdpa")
    cpu = trace_training(TINY[family], device="cpu", **kw)  # real tensors, the router's own (unbalanced) choice
    est = estimate_training(TINY[family], **kw)
    assert abs(est.total_bytes - cpu.peak_bytes) <= 0.10 * cpu.peak_bytes


def test_moe_terms_follow_routing_and_dense_layers() -> None:
    def terms(cfg: dict, **kw: int) -> dict[str, int]:
        return {t.name: t.bytes for t in activation_terms(cfg, seq_len=64, **kw)}

    base = terms(TINY["mixtral"])
    assert base["top-k expert indices (int64)"] == 8 * 64 * 2
    # every token visits k experts: the experts' rows double from top-1 to top-2
    top1 = terms({**TINY["mixtral"], "num_experts_per_tok": 1})
    key = "experts: gate_up output, act(gate), product"
    assert base[key] == 2 * top1[key] == 4 * 2 * 64 * 2 * 96
    # the expert rows do not depend on the number of experts (balanced or not, b·s·k rows in all)
    assert terms({**TINY["mixtral"], "num_local_experts": 8})[key] == base[key]
    v3 = terms(TINY["deepseek_v3"])
    dense_fix = "dense-MLP layers (1): dense MLP in place of the MoE block"
    assert dense_fix in v3 and "dense-MLP layers" not in " ".join(base)


def test_lora_is_refused_for_moe() -> None:
    with pytest.raises(memlib.MemlibError, match="method 'lora' is estimated for .*, not mixtral; expected method 'full'"):
        estimate_training("mixtral-8x7b", method="lora")


def test_mla_caches_the_latent() -> None:
    v2 = load_config("deepseek-v2-lite")
    assert kv_elements_per_token(v2) == 27 * (512 + 64)
    assert kv_bytes_per_token(v2) == 27 * 576 * 2 == serve_kv_bytes_per_token(v2)
    assert serve_kv_bytes_per_token(v2, tensor_parallel=2) == 27 * 576 * 2  # replicated, not split
    assert estimate_inference(v2, batch_size=2, seq_len=1024).kv_cache_bytes == 2 * 1024 * 27 * 576 * 2
    v3 = load_config("deepseek-v3")
    mha = kv_bytes_per_token(v3, layout="mha")  # what per-head K and V would take
    assert kv_bytes_per_token(v3) == 61 * 576 * 2 and mha // kv_bytes_per_token(v3) > 50
    # Mixtral and Qwen-MoE: GQA K/V as usual; existing families unchanged
    assert kv_bytes_per_token("mixtral-8x7b") == 2 * 32 * 8 * 128 * 2
    assert kv_bytes_per_token("qwen3-30b-a3b") == 2 * 48 * 4 * 128 * 2
    assert kv_bytes_per_token("llama-2-7b") == 2 * 32 * 32 * 128 * 2 == 524_288
    assert kv_elements_per_token(load_config("mixtral-8x7b")) is None


def test_serve_deepseek_v2_lite() -> None:
    fit = serve("deepseek-v2-lite", gpu="h100-sxm", max_model_len=8192)
    assert fit.kv_bytes_per_token == 27 * 576 * 2 and fit.max_concurrent_seqs > 0
    out = subprocess.run([sys.executable, "-m", "memlib", "serve", "deepseek-v2-lite", "--gpu", "h100-sxm",
                          "--max-model-len", "8192"], capture_output=True, text=True)
    assert out.returncode == 0 and "fits:" in out.stdout


@pytest.mark.parametrize("command", [["train", "--seq", "2048"], ["infer"], ["params"]])
def test_cli_answers_for_every_shipped_moe_model(command: list[str]) -> None:
    from memlib.cli import main

    for name in SHIPPED:
        assert main([command[0], name, *command[1:], "--json"]) == 0


def test_families_moe_is_pure() -> None:
    code = ("import sys, memlib.core.families_moe, memlib.core.estimate; memlib.core.estimate.estimate_training('deepseek-v3'); "
            "assert 'torch' not in sys.modules, 'heavy import'")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
