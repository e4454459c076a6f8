"""LoRA accounting (memlib.core.lora, estimate_training(method=...)) against peft 0.21 and a traced LoRA step."""
from __future__ import annotations

import logging

import pytest

from memlib.core.configs import load_config, shipped_models
from memlib.core.errors import MemlibError
from memlib.core.estimate import activation_terms, estimate_training
from memlib.core.lora import lora_params, qlora_base_bytes, targeted_linears as _targeted

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
from memlib.measure.quant import peft_lora_model, peft_trainable_params
from memlib._book.ch09_lora_qlora import trace_lora_step

TINY_LLAMA = {**load_config("llama-2-7b").raw, "num_hidden_layers": 2, "hidden_size": 256,
              "intermediate_size": 688, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024}
TINY_GPT2 = {**load_config("gpt2").raw, "n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 512,
             "n_positions": 128}


@pytest.mark.parametrize("targets", ["all-linear", "attention", "qv"])
@pytest.mark.parametrize("cfg", [TINY_LLAMA, TINY_GPT2], ids=["tiny-llama", "tiny-gpt2"])
@pytest.mark.parametrize("rank", [1, 16])
def test_lora_params_equals_peft_tiny(cfg: dict, targets: str, rank: int) -> None:
    assert lora_params(cfg, rank, targets) == peft_trainable_params(cfg, rank=rank, targets=targets)


@pytest.mark.parametrize("name", shipped_models())
def test_lora_params_equals_peft_shipped_one_layer(name: str) -> None:
    # lora_params is linear in the layer count: check every shipped architecture with one layer (fast on meta)
    raw = dict(load_config(name).raw)
    layers_key = "n_layer" if "n_layer" in raw else "num_hidden_layers"
    raw[layers_key] = 1
    for targets in ("all-linear", "attention"):
        assert lora_params(raw, 16, targets) == peft_trainable_params(raw, rank=16, targets=targets), (name, targets)
    assert lora_params(name, 16) == load_config(name).num_layers * lora_params(raw, 16)


def test_lora_params_llama2_7b_full_model() -> None:
    # peft on the full 32-layer model (meta, 9 s, run once by hand): get_nb_trainable_parameters() = (39976960, 6778392576)
    assert lora_params("llama-2-7b", 16, "all-linear") == 39_976_960
    assert lora_params("llama-2-7b", 8, "qv") == 32 * 8 * 2 * (4096 + 4096)  # the LoRA paper's choice: 4.2M


def test_peft_adapters_are_fp32_on_a_bf16_base() -> None:
    net = peft_lora_model(TINY_LLAMA, rank=8)
    trainable = {p.dtype for p in net.parameters() if p.requires_grad}
    frozen = {p.dtype for p in net.parameters() if not p.requires_grad}
    assert trainable == {torch.float32} and frozen == {torch.bfloat16}


def test_estimator_states_equal_traced_lora_states() -> None:
    res = trace_lora_step(TINY_LLAMA, rank=16, targets="all-linear", batch_size=2, seq_len=64)
    est = estimate_training(TINY_LLAMA, method="lora", lora_rank=16, precision="bf16-mixed", batch_size=2, seq_len=64)
    assert est.settings["trainable_params"] == res.settings["trainable_params"]
    assert est.params_bytes == res.by_category["params"]          # bf16 base + fp32 adapters
    assert est.optimizer_bytes == res.by_category["optimizer"]    # fp32 m, v of the adapters only


def _lora_activations(cfg: dict, targets: str, rank: int, batch_size: int, seq_len: int) -> int:
    """What a peft LoRA step saves (llama family, bf16 base, fp32 adapters, lora_dropout 0), from the trace.

    Full fine-tuning's terms, minus what only weight gradients needed (the RMSNorms' normalized and weighted
    outputs, the MLP product feeding down_proj, the final RMSNorm), plus per targeted Linear the fp32 copy of
    its input (peft casts x to the adapter's dtype) and the rank-r output of lora_A.
    """
    c = load_config(cfg)
    T, h, f = batch_size * seq_len, c.hidden_size, c.intermediate_size
    terms = activation_terms(cfg, batch_size=batch_size, seq_len=seq_len, precision="bf16")
    per_layer = sum(t.bytes for t in terms if t.per_layer)
    outside = sum(t.bytes for t in terms if not t.per_layer)
    adapters = sum(4 * T * i + 4 * T * rank for _, i, _ in _targeted(c, targets))
    layer = per_layer - 8 * T * h - 2 * T * f + adapters
    return c.num_layers * layer + outside - (8 * T * h + 4 * T)


@pytest.mark.parametrize("targets", ["all-linear", "attention", "qv"])
def test_traced_lora_activations_follow_the_frozen_weight_rule(targets: str) -> None:
    res = trace_lora_step(TINY_LLAMA, rank=16, targets=targets, batch_size=2, seq_len=128)
    traced = res.settings["activations_end_of_forward"]
    assert abs(traced - _lora_activations(TINY_LLAMA, targets, 16, 2, 128)) <= 64
    est = estimate_training(TINY_LLAMA, precision="bf16", batch_size=2, seq_len=128, method="lora", lora_rank=16,
                            lora_targets=targets).activations_bytes
    assert est == _lora_activations(TINY_LLAMA, targets, 16, 2, 128)  # the estimator applies the same rule
    full = estimate_training(TINY_LLAMA, precision="bf16", batch_size=2, seq_len=128).activations_bytes
    if targets == "all-linear":
        assert traced > 1.25 * full  # the fp32 input copies outweigh what frozen weights save
    else:
        assert traced < full


@pytest.mark.parametrize("double_quant", [True])
def test_qlora_base_bytes_equal_bitsandbytes_linear4bit(double_quant: bool) -> None:
    from memlib._book.ch09_lora_qlora import nf4_model_bytes, quantize_linears_nf4
    from memlib.measure.trace import build_model

    net = quantize_linears_nf4(build_model(TINY_LLAMA, device="cpu", dtype="bf16"), double_quant=double_quant)
    measured = nf4_model_bytes(net)
    n_tensors = 7 * load_config(TINY_LLAMA).num_layers
    # memlib counts 4.127 (or 4.5) bits per weight exactly; bitsandbytes adds per tensor an fp32 offset and a
    # partly filled second-level block: a few bytes per quantized matrix
    assert 0 <= measured - qlora_base_bytes(TINY_LLAMA, double_quant=double_quant) <= 8 * n_tensors
    assert sum(type(m).__name__ == "Linear4bit" for m in net.modules()) == n_tensors


def test_one_nf4_function_biases_stay_16_bit_as_bitsandbytes_keeps_them() -> None:
    # A biased model (Qwen2: q/k/v biases) quantized by bitsandbytes Linear4bit: the bias stays a bf16 parameter.
    from memlib.core.estimate import estimate_inference
    from memlib.core.lora import linear_bias_params, quantized_weight_bytes
    from memlib._book.ch09_lora_qlora import nf4_model_bytes, quantize_linears_nf4
    from memlib.measure.trace import build_model

    tiny = {**load_config("qwen2-0.5b").raw, "num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024}
    net = quantize_linears_nf4(build_model(tiny, device="cpu", dtype="bf16"))
    measured, n_tensors = nf4_model_bytes(net), 7 * 2
    biases = linear_bias_params(tiny)
    assert biases == sum(m.bias.numel() for m in net.modules() if type(m).__name__ == "Linear4bit"
                         and m.bias is not None) > 0
    assert all(m.bias.dtype == torch.bfloat16 for m in net.modules()
               if type(m).__name__ == "Linear4bit" and m.bias is not None)
    predicted = qlora_base_bytes(tiny)
    assert 0 <= measured - predicted <= 8 * n_tensors
    # the other policy (biases in NF4 too) misses the trace by 2 - 0.516 bytes per bias element
    assert measured - (predicted - 2 * biases + int(0.516 * biases)) > 8 * n_tensors
    # one function: the inference estimate's NF4 weights are QLoRA's frozen base
    for name in ("gpt2", "qwen2-0.5b", "llama-2-7b", "pythia-1.4b"):
        assert estimate_inference(name, weights="nf4", seq_len=512).weights_bytes == qlora_base_bytes(name)
        assert quantized_weight_bytes(name, "nf4") == qlora_base_bytes(name)


@pytest.mark.parametrize("name", ["gpt2", "pythia-1.4b", "qwen2-0.5b", "falcon-7b", "phi-3-mini", "llama-2-7b",
                                  "gemma-2-9b", "qwen3-8b", "olmo-2-7b"])
def test_quantized_elements_are_the_linear_weights_transformers_replaces(name: str) -> None:
    # replace_with_bnb_linear: every nn.Linear / Conv1D except the output embedding; weights only
    from transformers.pytorch_utils import Conv1D

    from memlib.core.lora import linear_bias_params
    from memlib.core.params import count_params
    from memlib.measure.trace import build_model

    net = build_model(name, device="meta", dtype="bf16", attention="eager")
    head = net.get_output_embeddings()
    linears = [m for m in net.modules() if isinstance(m, (torch.nn.Linear, Conv1D)) and m is not head]
    pc = count_params(name)
    assert sum(m.weight.numel() for m in linears) == pc.params - pc.embeddings - pc.lm_head - pc.norms - \
        linear_bias_params(name)
    assert sum(m.bias.numel() for m in linears if m.bias is not None) == linear_bias_params(name)


def test_qlora_base_bytes_and_bad_input() -> None:
    n = load_config("llama-7b")
    assert qlora_base_bytes("llama-7b") < qlora_base_bytes("llama-7b", double_quant=False) < 2 * 7e9
    with pytest.raises(MemlibError, match="lora targets"):
        lora_params("llama-7b", 16, "mlp")
    with pytest.raises(MemlibError, match="lora rank"):
        lora_params("llama-7b", 0)
    assert n.num_layers == 32
