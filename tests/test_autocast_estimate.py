"""The estimator under torch.autocast (PyTorch AMP): the activation terms, and a real CPU autocast trace agrees."""
import contextlib
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib import MemlibError, load_config
from memlib.core.activations import _activation_terms, _sum_terms, activation_terms
from memlib.core.autocast import (WEIGHT_COPIES, autocast_activation_terms, autocast_forward_extra,
                                  linear_weight_params, setup_activation_terms)
from memlib.core.estimate import backward_peak_bytes, estimate_training, saved_activations
from memlib.core.params import count_params
from memlib.core.setup import TrainingSetup

DERIVED = ["llama-2-7b", "mistral-7b", "qwen2-0.5b", "gemma-2b", "qwen3-8b", "olmo-2-7b"]


def _shipped(name: str) -> str:
    try:
        load_config(name)
    except Exception:  # a family's shipped name differs: skip that one rather than guess
        pytest.skip(f"{name} is not shipped")
    return name


@pytest.mark.parametrize("model", DERIVED)
def test_autocast_saves_more_than_pure_bf16(model: str) -> None:
    kw = dict(batch_size=2, seq_len=1024)
    amp = saved_activations(load_config(_shipped(model)), TrainingSetup(**kw))
    pure = saved_activations(load_config(model), TrainingSetup(precision="bf16", **kw))
    assert TrainingSetup(**kw).autocast and not TrainingSetup(precision="bf16", **kw).autocast
    assert amp.bytes > pure.bytes
    # more than the 16-bit weight copies alone (2 bytes for every Linear weight, the LM head's included): the
    # fp32 residual stream, fp32 normalized tensors and one bf16 input copy per Linear add to them
    cfg = load_config(model)
    assert amp.bytes - pure.bytes > 2 * (cfg.num_layers * linear_weight_params(cfg) + cfg.vocab_size * cfg.hidden_size)


@pytest.mark.parametrize("model", ["llama-2-7b", "mistral-7b", "qwen2-0.5b", "gemma-2b"])
def test_weight_copies_are_two_bytes_per_linear_weight(model: str) -> None:
    cfg = load_config(model)
    terms = autocast_activation_terms(cfg, 1, 128, "sdpa", True)
    copies = {t.name: t for t in terms if t.name.startswith(WEIGHT_COPIES)}
    layer, head = copies[WEIGHT_COPIES], copies[f"{WEIGHT_COPIES} (LM head)"]
    assert layer.per_layer and not head.per_layer
    # every parameter that is not in a Linear: the embedding (once, tied or not), the norms, the biases
    pc = count_params(cfg)
    h, L = cfg.hidden_size, cfg.num_layers
    biases = (cfg.q_dim + 2 * cfg.kv_dim) if cfg.qkv_bias else 0
    others = cfg.vocab_size * h + L * (2 * h + biases) + h
    linear = pc.params - others + (cfg.vocab_size * h if cfg.tie_word_embeddings else 0)  # a tied head is copied too
    assert L * layer.bytes + head.bytes == 2 * linear


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("every", [1, 3])
def test_full_recomputation_keeps_fp32_layer_inputs(attention: str, every: int) -> None:
    cfg = load_config("llama-2-7b")
    b, s = 2, 512
    setup = TrainingSetup(batch_size=b, seq_len=s, recompute="full", attention=attention, checkpoint_every=every)
    acts = saved_activations(cfg, setup)
    outside = _sum_terms(acts.terms)[1]
    kept = -(-cfg.num_layers // every)
    mask = 4 * b * s * s if attention == "eager" else 0  # eager: the fp32 additive causal mask each layer receives
    assert acts.bytes - outside == kept * 4 * b * s * cfg.hidden_size + 8 * s + mask
    pure = saved_activations(cfg, dataclasses.replace(setup, precision="bf16"))
    assert pure.bytes - _sum_terms(pure.terms)[1] == kept * 2 * b * s * cfg.hidden_size
    # the segment re-materialized in the backward pass holds its layers' weight copies again
    assert acts.live_layer >= every * 2 * linear_weight_params(cfg)


def test_lora_and_other_frameworks_keep_the_dtype_terms() -> None:
    cfg = load_config("llama-2-7b")
    for setup in (TrainingSetup(method="lora"), TrainingSetup(framework="deepspeed"), TrainingSetup(precision="bf16")):
        assert setup_activation_terms(cfg, setup) == _activation_terms(cfg, 1, 512, 2, "sdpa", True)
        assert autocast_forward_extra(cfg, setup) == 0
    assert setup_activation_terms(cfg, TrainingSetup()) == autocast_activation_terms(cfg, 1, 512, "sdpa", True)


def test_activation_terms_autocast_flag() -> None:
    cfg = load_config("qwen2-0.5b")
    assert activation_terms(cfg, seq_len=256, autocast=True) == autocast_activation_terms(cfg, 1, 256, "sdpa", True)
    assert activation_terms(cfg, seq_len=256) == _activation_terms(cfg, 1, 256, 2, "sdpa", True)
    with pytest.raises(MemlibError, match="autocast needs precision bf16-mixed or fp16-mixed"):
        activation_terms(cfg, precision="bf16", autocast=True)


@pytest.mark.parametrize("model", ["mixtral-8x7b", "phi-3-mini"])
def test_other_families_fall_back_to_fp32_terms_plus_weight_copies(model: str) -> None:
    cfg = load_config(_shipped(model))
    terms = autocast_activation_terms(cfg, 1, 256, "sdpa", True)
    fp32 = _activation_terms(cfg, 1, 256, 4, "sdpa", True)
    assert terms[:len(fp32)] == fp32
    extra = terms[len(fp32):]
    assert [t.name for t in extra] == [WEIGHT_COPIES, f"{WEIGHT_COPIES} (LM head)"]
    assert extra[0].bytes == 2 * count_params(cfg).per_layer
    amp, pure = (estimate_training(model, seq_len=256, precision=p).activations_bytes for p in ("bf16-mixed", "bf16"))
    assert amp is not None and pure is not None and amp > pure


def test_full_recomputation_holds_the_weight_copies_until_the_forward_pass_ends() -> None:
    # autocast's cache keeps every checkpointed layer's 16-bit weight copies until the autocast block exits: with
    # full recomputation the end of the forward pass, not the loss's backward, holds the most activations
    cfg = load_config("llama-2-7b")
    setup = TrainingSetup(seq_len=1024, recompute="full")
    extra = autocast_forward_extra(cfg, setup)
    T, V = 1024, cfg.vocab_size
    assert extra - cfg.num_layers * 2 * linear_weight_params(cfg) == 6 * T * V + 4 * T * cfg.hidden_size + 8 * 1025
    assert extra > 2 * 4 * T * V  # more than the loss's backward adds
    none = autocast_forward_extra(cfg, dataclasses.replace(setup, recompute="none"))
    assert extra - none == cfg.num_layers * 2 * linear_weight_params(cfg)
    pc = count_params(cfg)
    acts = saved_activations(cfg, setup)
    peak = backward_peak_bytes(cfg, setup, acts, 4 * pc.params, pc.params, pc.params, pc.per_layer)
    assert peak >= acts.bytes + extra
    assert peak >= 4 * pc.params  # every fp32 gradient at the end of the backward pass


def _check_amp_ordering(model: str, batch: int, seq: int, attention: str) -> tuple:
    """Under autocast: no recomputation ≥ selective ≥ full, and more saved than pure bf16. Returns (cfg, kw)."""
    cfg = load_config(model)
    kw = dict(batch_size=batch, seq_len=seq, attention=attention)
    amp = [saved_activations(cfg, TrainingSetup(recompute=r, **kw)).bytes for r in ("none", "selective", "full")]
    assert amp[0] >= amp[1] >= amp[2]
    assert amp[0] > saved_activations(cfg, TrainingSetup(precision="bf16", **kw)).bytes
    return cfg, kw


def _weight_copy_bytes(cfg) -> int:  # type: ignore[no-untyped-def]
    """The 16-bit copies autocast makes of every Linear weight and of the LM head (batch-independent)."""
    return 2 * (cfg.num_layers * linear_weight_params(cfg) + cfg.vocab_size * cfg.hidden_size)


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(["llama-2-7b", "mistral-7b", "qwen2-0.5b", "gemma-2b"]), batch=st.integers(1, 8),
       seq=st.integers(1, 4096), attention=st.sampled_from(["eager", "sdpa"]))
def test_autocast_activations_properties(model, batch, seq, attention) -> None:  # type: ignore[no-untyped-def]
    cfg, kw = _check_amp_ordering(model, batch, seq, attention)
    # linear in the batch (from 2 sequences: MQA's eager attention saves v unrepeated for one) but for the weight
    # copies, the rotary tables and Gemma's fp32 (1 + w), which do not depend on it
    copies = _weight_copy_bytes(cfg)
    copies += (2 * cfg.num_layers + 1) * 4 * cfg.hidden_size if cfg.model_type == "gemma" else 0
    once, twice = (saved_activations(cfg, TrainingSetup(**{**kw, "batch_size": k * (batch + 1)})).bytes for k in (1, 2))
    assert 2 * once - twice == copies + 2 * 4 * seq * cfg.head_dim


# ---------------------------------------------------------------------------------- a real CPU autocast trace
TINY = {
    "llama": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
              "max_position_embeddings": 256},
    "qwen2": {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 384,
              "max_position_embeddings": 256, "tie_word_embeddings": True},
    "gemma": {"model_type": "gemma", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 512,
              "max_position_embeddings": 256},
}


def _amp_trace(cfg: dict, *, batch_size: int, seq_len: int, attention: str, recompute: str,
               device: str = "cpu") -> dict:
    """One step of the fp32 model: forward + loss under torch.autocast("cpu", bfloat16), backward, AdamW (foreach).

    The step of ``memlib.measure.trace._trace_once`` with the fp32 model and the autocast block (the integrator
    switches this to ``trace_training(framework="pytorch", device="cpu")``). SDPA is torch's own: the tracer's
    routing to the CPU flash op bypasses autocast's cast of q, k, v; torch's SDPA casts, then picks the flash
    kernel for these inputs. ``device="meta"``: under the autocast emulation with CUDA's op lists (as
    trace_training), the optimizer states made without a step, and no optimizer step traced (no ``"peak"``).
    """
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from memlib.core.categories import MemCategory as C
    from memlib.measure.autocast import emulated
    from memlib.measure.trace import _init_fused_state, _make_optimizer, _patched, build_model
    from memlib.measure.tracker import MemoryTracker

    meta = device == "meta"
    torch.manual_seed(0)
    tracker = MemoryTracker(device)
    net = build_model(cfg, device=device, dtype="fp32", attention=attention)
    if recompute == "full":
        net.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    params = [p for p in net.parameters() if p.requires_grad]
    tracker.track_model(net)
    opt = _make_optimizer("adamw", params, "foreach")
    if meta:
        _init_fused_state(opt)
    else:
        for p in params:  # warm-up: the optimizer states, as a first step makes them
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
    ids = torch.randint(0, int(net.config.vocab_size), (batch_size, seq_len), device=device)  # (B, T)
    tracker.track_inputs(ids)
    out: dict = {}
    emulation = emulated("cuda") if meta else contextlib.nullcontext()
    with _patched(meta and attention == "sdpa"), tracker.mode(), emulation:
        tracker.track_optimizer(opt)
        tracker.reset_peak()
        states = tracker.totals[C.PARAM] + tracker.totals[C.OPTIMIZER] + tracker.totals[C.BUFFER]
        with tracker.forward():
            with torch.autocast("cpu", dtype=torch.bfloat16):  # on meta the emulation acts while CPU autocast is on
                loss = net(input_ids=ids, labels=ids).loss
                out["acts_in_autocast"] = tracker.totals[C.ACTIVATION]
            out["acts"] = tracker.totals[C.ACTIVATION]
        with tracker.backward():
            loss.backward()
            del loss
        out["forward_backward_peak"] = tracker.peak - states
        if not meta:
            with tracker.optimizer_step():
                opt.step()
                opt.zero_grad(set_to_none=True)
            out["peak"] = tracker.peak
    return out


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma"])
def test_estimate_agrees_with_a_cpu_autocast_trace(family: str, attention: str, recompute: str) -> None:
    _check_against_trace(TINY[family], 2, 64, attention, recompute)


@pytest.mark.parametrize("cfg, b, s, recompute", [
    ({**TINY["gemma"], "head_dim": 24}, 1, 128, "none"),  # MQA with one sequence: v is saved unrepeated
    ({**TINY["llama"], "attention_dropout": 0.1}, 1, 128, "full"),  # the recomputed eager core with dropout
], ids=["gemma-mqa-batch1", "llama-dropout-full"])
def test_estimate_agrees_with_a_cpu_autocast_trace_eager_cases(cfg: dict, b: int, s: int, recompute: str) -> None:
    _check_against_trace(cfg, b, s, "eager", recompute)


def test_mqa_batch_one_saves_v_unrepeated() -> None:
    cfg = load_config("gemma-2b")  # one key/value head
    one = autocast_activation_terms(cfg, 1, 256, "eager", True)
    two = autocast_activation_terms(cfg, 2, 256, "eager", True)
    view = [t for t in one if t.name.startswith("v not repeated")]
    assert len(view) == 1 and view[0].bytes == -2 * 256 * (cfg.q_dim - cfg.kv_dim)
    assert not [t for t in two if t.name.startswith("v not repeated")]
    assert not [t for t in autocast_activation_terms(cfg, 1, 256, "sdpa", True) if t.name.startswith("v not")]


def _check_against_trace(raw: dict, b: int, s: int, attention: str, recompute: str) -> None:
    traced = _amp_trace(raw, batch_size=b, seq_len=s, attention=attention, recompute=recompute)
    cfg = load_config(raw)
    setup = TrainingSetup(batch_size=b, seq_len=s, attention=attention, recompute=recompute)
    assert setup.autocast
    pc = count_params(cfg)
    n = pc.params
    acts = saved_activations(cfg, setup)
    extra = backward_peak_bytes(cfg, setup, acts, 4 * n, n, n, pc.per_layer)
    # PyTorch AMP's states (fp32 weights, fp32 gradients, AdamW's fp32 m and v) and foreach's sqrt(v) buffer
    total = max(12 * n + extra, 16 * n + 4 * n)
    assert abs(acts.bytes - traced["acts"]) / traced["acts"] < 0.01
    assert abs(extra - traced["forward_backward_peak"]) / traced["forward_backward_peak"] < 0.03
    assert abs(total - traced["peak"]) / traced["peak"] < 0.03
    # the weight copies are activations to the tracer too: with full recomputation the graph dropped the layers'
    # copies, and autocast's cache frees them when the block exits
    cached = traced["acts_in_autocast"] - traced["acts"]
    biases = (cfg.q_dim + 2 * cfg.kv_dim) * cfg.num_layers * 2 if cfg.qkv_bias else 0
    layers = cfg.num_layers * 2 * linear_weight_params(cfg) if recompute == "full" else 0
    assert cached == layers + biases


# ------------------------------------------------------------------------ GPT-2: derived, checked on meta (CUDA lists)
TINY_GPT2 = {"model_type": "gpt2", "n_layer": 3, "n_embd": 64, "n_head": 4, "vocab_size": 96, "n_positions": 256,
             "attn_pdrop": 0.1, "resid_pdrop": 0.1, "embd_pdrop": 0.1}
GPT2_CASES = {
    "shipped-dropout": TINY_GPT2,
    "no-dropout": {**TINY_GPT2, "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0},
    "big-vocab": {**TINY_GPT2, "n_layer": 2, "vocab_size": 384},  # the loss's backward is the peak
    "long-heads": {**TINY_GPT2, "n_embd": 32, "n_head": 8, "vocab_size": 64},  # the eager core's backward is
}


def _amp_meta_trace(raw: dict, *, batch_size: int, seq_len: int, attention: str, recompute: str) -> dict:
    """:func:`_amp_trace` on the meta device under the autocast emulation with CUDA's op lists (as trace_training)."""
    return _amp_trace(raw, batch_size=batch_size, seq_len=seq_len, attention=attention, recompute=recompute,
                      device="meta")


@pytest.mark.parametrize("b, s", [(2, 48), (1, 96)])
@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("case", list(GPT2_CASES))
def test_gpt2_autocast_terms_equal_the_meta_trace(case: str, attention: str, recompute: str, b: int, s: int) -> None:
    raw = GPT2_CASES[case]
    traced = _amp_meta_trace(raw, batch_size=b, seq_len=s, attention=attention, recompute=recompute)
    cfg = load_config(raw)
    setup = TrainingSetup(batch_size=b, seq_len=s, attention=attention, recompute=recompute)
    pc = count_params(cfg)
    n = pc.params
    acts = saved_activations(cfg, setup)
    extra = backward_peak_bytes(cfg, setup, acts, 4 * n, n, n, pc.per_layer)
    # byte for byte but the loss's scalars (the loss and nll_loss's total weight) and, for one sequence, 8 more
    # bytes the trace holds beside the position ids
    assert 0 <= traced["acts"] - acts.bytes <= 16
    assert 0 <= traced["forward_backward_peak"] - extra <= 16
    cached = traced["acts_in_autocast"] - traced["acts"]  # the bias copies, and the checkpointed layers' weights
    assert cached == autocast_forward_extra(cfg, setup) - autocast_forward_extra(
        cfg, dataclasses.replace(setup, recompute="none")) + 2 * cfg.num_layers * (5 * cfg.hidden_size + cfg.intermediate_size)


def test_gpt2_autocast_terms_cuda_lists() -> None:
    # gelu_new's pow runs in fp32 on CUDA: the MLP keeps three fp32 and two 16-bit b·s·f tensors (16 bytes per
    # element of b·s·f), LayerNorm's fp32 output is cast for the Conv1D (addmm) that reads it
    cfg = load_config("gpt2")
    b, s = 2, 256
    T, h, f = b * s, cfg.hidden_size, cfg.intermediate_size
    terms = {t.name: t for t in autocast_activation_terms(cfg, b, s, "sdpa", True)}
    assert sum(t.bytes for name, t in terms.items() if name.startswith("gelu_new")) == 16 * T * f
    assert terms["LayerNorm inputs: the fp32 residual stream ×2"].bytes == 2 * 4 * T * h
    assert terms["position ids (int64)"].bytes == 8 * s
    # GPT-2's Linears are Conv1D: c_attn (h × 3h), c_proj (h × h), c_fc (h × f), c_proj (f × h); its head is tied
    assert linear_weight_params(cfg) == 4 * h * h + 2 * h * f
    pc = count_params(cfg)
    layer_norms_biases = 4 * h + 3 * h + h + f + h
    assert linear_weight_params(cfg) == pc.per_layer - layer_norms_biases
    assert terms[WEIGHT_COPIES].bytes == 2 * linear_weight_params(cfg)
    assert terms[f"{WEIGHT_COPIES} (LM head)"].bytes == 2 * cfg.vocab_size * h
    # eager: the fp32 softmax, the bool dropout mask, the 16-bit dropped-out probabilities; no dropout, no mask
    eager = {t.name: t.bytes for t in autocast_activation_terms(cfg, b, s, "eager", True)}
    bas2 = b * cfg.num_heads * s * s
    assert eager["softmax probabilities (fp32)"] == 4 * bas2 and eager["attention dropout mask (bool)"] == bas2
    assert not [n for n in autocast_activation_terms(cfg, b, s, "eager", False) if "mask" in n.name]


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(["gpt2", "gpt2-medium"]), batch=st.integers(1, 8), seq=st.integers(1, 1024),
       attention=st.sampled_from(["eager", "sdpa"]))
def test_gpt2_autocast_properties(model, batch, seq, attention) -> None:  # type: ignore[no-untyped-def]
    cfg, kw = _check_amp_ordering(model, batch, seq, attention)
    # linear in the batch but for the weight copies and the position ids, which do not depend on it
    copies = _weight_copy_bytes(cfg)
    once, twice = (saved_activations(cfg, TrainingSetup(**{**kw, "batch_size": k * batch})).bytes for k in (1, 2))
    assert 2 * once - twice == copies + 8 * seq


@pytest.mark.parametrize("model, b, s, attention, recompute, precision", [
    ("gpt2", 4, 1024, "sdpa", "none", "bf16-mixed"), ("gpt2", 4, 1024, "eager", "full", "bf16-mixed"),
    ("gpt2", 4, 1024, "sdpa", "full", "fp16-mixed"), ("gpt2-medium", 2, 1024, "eager", "none", "bf16-mixed"),
])
def test_gpt2_amp_estimate_matches_the_meta_trace(model: str, b: int, s: int, attention: str, recompute: str,
                                                  precision: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from memlib.measure.trace import trace_training

    kw = dict(batch_size=b, seq_len=s, precision=precision, attention=attention, recompute=recompute)
    traced = trace_training(model, framework="pytorch", **kw)
    est = estimate_training(model, framework="pytorch", **kw)
    assert traced.peak_phase == "backward"  # the activations, not the optimizer step, set these peaks
    assert abs(est.total_bytes - traced.peak_bytes) / traced.peak_bytes < 1e-4
