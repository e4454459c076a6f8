"""FP8 recipes, fused/chunked losses and block formats (Chapter 17): estimates against CPU traces."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib.core.configs import load_config
from memlib.core.errors import MemlibError
from memlib.core.estimate import estimate_training
from memlib.core.formats import block_bytes_per_element

TINY = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=2048)


def _tiny_cfg() -> dict:
    raw = dict(load_config("llama-3.1-8b").raw)
    raw.update(TINY)
    return raw


def test_block_formats_bytes_per_element() -> None:
    assert block_bytes_per_element("mxfp8") == 1.03125
    assert block_bytes_per_element("nvfp4") == 0.5625
    assert block_bytes_per_element("nvfp4", numel=1024) == 0.5625 + 4 / 1024
    assert block_bytes_per_element("fp8-1x128") == 1 + 4 / 128
    with pytest.raises(MemlibError, match="unknown block format 'mxfp6'"):
        block_bytes_per_element("mxfp6")


def test_fp8_lowers_llama_3_8b_activations_at_8k() -> None:
    kw = dict(seq_len=8192)
    bf16 = estimate_training("llama-3.1-8b", precision="bf16-mixed", **kw)
    fp8 = estimate_training("llama-3.1-8b", precision="fp8-mixed", **kw)
    block = estimate_training("llama-3.1-8b", precision="fp8-mixed", fp8_recipe="blockwise", **kw)
    assert block.activations_bytes < fp8.activations_bytes < bf16.activations_bytes
    assert fp8.model_states_bytes == bf16.model_states_bytes  # FP8 changes what Linears save, not the states
    # tensorwise under autocast drops exactly the 16-bit copies of the decoder layers' Linear weights
    cfg = load_config("llama-3.1-8b")
    lin = cfg.hidden_size * cfg.q_dim * 2 + 2 * cfg.hidden_size * cfg.kv_dim + 3 * cfg.hidden_size * cfg.intermediate_size
    assert bf16.activations_bytes - fp8.activations_bytes == 2 * lin * cfg.num_layers


def test_logits_term_and_fused_loss() -> None:
    cfg = load_config("llama-3.1-8b")
    std = estimate_training("llama-3.1-8b", seq_len=8192)
    assert std.logits_bytes == 4 * 8192 * cfg.vocab_size  # 4.2 GB
    fused = estimate_training("llama-3.1-8b", seq_len=8192, loss="fused")
    chunked = estimate_training("llama-3.1-8b", seq_len=8192, loss="chunked", loss_chunk=1024)
    assert fused.logits_bytes <= 4 * 1024 * cfg.vocab_size and chunked.logits_bytes == 4 * 1024 * cfg.vocab_size
    # the saved fp32 log-softmax is gone; what replaces it is within a chunk's size (fused: the hidden gradient)
    for est, chunk in ((fused, fused.logits_bytes), (chunked, chunked.logits_bytes)):
        removed = std.activations_bytes - est.activations_bytes
        assert std.logits_bytes - removed <= chunk
        assert est.total_bytes < std.total_bytes


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(["llama-2-7b", "qwen2-0.5b", "mistral-7b", "gpt2"]), seq=st.integers(1, 1024),
       batch=st.integers(1, 4), framework=st.sampled_from(["pytorch", "deepspeed", "fsdp2", "megatron"]),
       loss=st.sampled_from(["chunked", "fused"]))
def test_chunked_and_fused_losses_never_raise_memory(model: str, seq: int, batch: int, framework: str,
                                                      loss: str) -> None:
    zero = 2 if framework == "fsdp2" else 0
    std = estimate_training(model, seq_len=seq, batch_size=batch, framework=framework, zero_stage=zero)
    other = estimate_training(model, seq_len=seq, batch_size=batch, framework=framework, zero_stage=zero, loss=loss)
    assert other.total_bytes <= std.total_bytes and other.logits_bytes <= std.logits_bytes


def test_bad_recipe_and_loss_are_one_line() -> None:
    with pytest.raises(MemlibError, match="unknown fp8 recipe 'delayed'; expected one of: tensorwise"):
        estimate_training("gpt2", precision="fp8-mixed", fp8_recipe="delayed")
    with pytest.raises(MemlibError, match="unknown loss 'focal'; expected one of: standard, chunked, fused"):
        estimate_training("gpt2", loss="focal")
    with pytest.raises(MemlibError, match="fp8 recipe 'blockwise' is derived for llama"):
        estimate_training("gpt2", precision="fp8-mixed", fp8_recipe="blockwise")


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_fp8_saved_activations_match_the_cpu_trace(recipe: str, attention: str) -> None:
    """torchao rowwise and the book's DeepSeek-V3 blockwise Linear, traced on CPU with bf16 weights (no autocast:
    torchao's Float8Linear looks only at CUDA autocast): the estimate (a 16-bit-weight framework) within 3 %."""
    torch = pytest.importorskip("torch")
    if recipe != "blockwise":
        pytest.importorskip("torchao")
    from memlib._book.ch17_kernels_and_compilers import saved_tensor_bytes, to_float8
    from memlib.measure.hf_config import build_model

    b, s = 2, 256
    torch.manual_seed(0)
    model = to_float8(build_model("llama-3.1-8b", device="cpu", dtype="bf16", attention=attention, overrides=TINY),
                      recipe)
    ids = torch.randint(0, TINY["vocab_size"], (b, s))
    traced = saved_tensor_bytes(lambda: model(input_ids=ids, labels=ids, use_cache=False).loss,
                                list(model.parameters()))
    est = estimate_training(_tiny_cfg(), batch_size=b, seq_len=s, precision="fp8-mixed", fp8_recipe=recipe,
                            framework="deepspeed", attention=attention)
    assert abs(est.activations_bytes - traced) / traced < 0.03


def test_chunked_loss_saves_no_logits_on_cpu() -> None:
    torch = pytest.importorskip("torch")
    from memlib._book.ch17_kernels_and_compilers import saved_tensor_bytes
    from memlib._book.ch17_kernels_and_compilers import chunked_cross_entropy

    torch.manual_seed(0)
    T, h, V = 512, 64, 4096
    x = torch.randn(T, h, requires_grad=True)
    w = torch.randn(V, h, requires_grad=True)
    y = torch.randint(0, V, (T,))
    full = saved_tensor_bytes(lambda: torch.nn.functional.cross_entropy((x @ w.t()).float(), y), [x, w])
    chunked = saved_tensor_bytes(lambda: chunked_cross_entropy(x, w, y, chunk=128), [x, w])
    assert full >= 4 * T * V and chunked < 4 * 128 * V
    ref = torch.nn.functional.cross_entropy(x @ w.t(), y)
    assert torch.allclose(chunked_cross_entropy(x, w, y, chunk=128), ref, atol=1e-5)
