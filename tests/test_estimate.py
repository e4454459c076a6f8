"""The estimator: ZeRO paper's Table 1, the examples of the two source notes, invariants (hypothesis), bad input."""
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib import GB, MemlibError, load_config
from memlib.core.choices import FRAMEWORK_SUPPORT, FRAMEWORKS
from memlib.core.estimate import (
    OPTIMIZERS,
    PRECISIONS,
    activation_terms,
    estimate_inference,
    estimate_training,
    korthikanti_activation_bytes,
    state_bytes_per_param,
)

# ZeRO (Rajbhandari et al. 2020) Table 1, GB per device: P_os / P_os+g / P_os+g+p. The 7.5B column is
# rounded to the printed digits; the 128B and 1T columns are rounded down.
TABLE1 = {
    7.5e9: {1: ("120", "120", "120"), 4: ("52.5", "41.3", "30"), 16: ("35.6", "21.6", "7.5"),
            64: ("31.4", "16.6", "1.88"), 256: ("30.4", "15.4", "0.47"), 1024: ("30.1", "15.1", "0.12")},
    128e9: {1: ("2048", "2048", "2048"), 4: ("896", "704", "512"), 16: ("608", "368", "128"),
            64: ("536", "284", "32"), 256: ("518", "263", "8"), 1024: ("513", "257", "2")},
    1e12: {1: ("16000", "16000", "16000"), 4: ("7000", "5500", "4000"), 16: ("4750", "2875", "1000"),
           64: ("4187", "2218", "250"), 256: ("4046", "2054", "62.5"), 1024: ("4011", "2013", "15.6")},
}
CASES = [(psi, dp, stage, printed) for psi, rows in TABLE1.items() for dp, cells in rows.items()
         for stage, printed in zip((1, 2, 3), cells)]


@pytest.mark.parametrize("psi, dp, stage, printed", CASES)
def test_zero_table1(psi: float, dp: int, stage: int, printed: str) -> None:
    est = estimate_training(params=int(psi), zero_stage=stage, num_gpus=dp, precision="fp16-mixed",
                            framework="deepspeed", grad_accum=2 if stage == 1 else 1)  # P_os: gradients kept whole
    value = Decimal(est.total_bytes) / Decimal(GB)
    exponent = Decimal(printed).as_tuple().exponent
    rounding = ROUND_HALF_UP if psi == 7.5e9 else ROUND_DOWN
    assert value.quantize(Decimal(1).scaleb(exponent), rounding=rounding) == Decimal(printed)
    assert est.activations_bytes is None


def test_zero_figure1_and_formulas() -> None:
    psi = 7_500_000_000
    totals = [estimate_training(params=psi, zero_stage=z, num_gpus=64, framework="deepspeed",
                                grad_accum=2 if z == 1 else 1).total_bytes / GB  # P_os: all gradients kept
              for z in range(4)]
    assert [round(t, 1) for t in totals] == [120.0, 31.4, 16.6, 1.9]
    n = 8
    assert estimate_training(params=psi, zero_stage=2, num_gpus=n, framework="deepspeed").total_bytes == (
        2 * psi + 14 * psi // n)


def test_sixteen_bytes_per_param_and_adam_vs_sgd() -> None:
    assert sum(state_bytes_per_param("bf16-mixed", "adamw")) == 16
    assert sum(state_bytes_per_param("fp32", "adamw")) == 16
    assert state_bytes_per_param("bf16-mixed", "sgd") == (2, 2, 4)
    assert state_bytes_per_param("bf16", "adamw") == (2, 2, 4)
    # the Tips notes §八: Adam's optimizer states (master + m + v) are 12Ψ, three times... the 4Ψ of fp32 weights
    assert state_bytes_per_param("bf16-mixed", "adamw")[2] == 3 * 4


def test_tips_notes_llama7b_model_states() -> None:
    est = estimate_training(params=7_000_000_000)
    assert est.total_bytes == 112 * GB  # the Tips notes §一: 16 × 7e9 ≈ 112 GB


def test_tips_notes_llama7b_kv_cache() -> None:
    est = estimate_inference("llama-7b", batch_size=8, seq_len=2048, weights="fp16")
    assert est.kv_cache_bytes == 2 * 32 * 32 * 128 * 2048 * 8 * 2 == 8_589_934_592  # "≈ 8.6 GB"
    assert round(est.weights_bytes / GB, 1) == 13.5  # the Tips notes' "14 GB"
    gqa = estimate_inference("llama-3-8b", batch_size=8, seq_len=2048)
    assert gqa.kv_cache_bytes * 4 == est.kv_cache_bytes  # 8 KV heads instead of 32


def test_rules_of_thumb() -> None:
    # the Strategies notes: fp16 inference of an nB model ≈ 2n GB; mixed-precision Adam training ≈ 16n GB of states.
    for n in (1, 7, 70):
        assert estimate_training(params=n * 10**9).total_bytes == 16 * n * GB
    assert abs(estimate_inference("llama-2-7b", batch_size=1, seq_len=1).weights_bytes / GB - 2 * 6.74) < 0.01


def test_adamw_8bit_states() -> None:
    from memlib.core.params import count_params

    pc = count_params("llama-2-7b")
    est = estimate_training("llama-2-7b", precision="bf16", optimizer="adamw-8bit")
    big = pc.params - pc.small_tensor_params
    assert est.optimizer_bytes == int(2 * big * (1 + 4 / 256) + 2 * pc.small_tensor_params * 2)
    assert est.optimizer_bytes < estimate_training("llama-2-7b", precision="bf16", optimizer="adamw").optimizer_bytes


def test_activation_terms_gpt_vs_korthikanti() -> None:
    # With eager attention and 1-byte dropout masks GPT-2's per-layer activations are close to, but not
    # exactly, sbh(34 + 5as/h): the fused qkv, gelu_new's five saved tensors and the LayerNorm statistics differ.
    terms = activation_terms("gpt2-xl", batch_size=1, seq_len=1024, precision="bf16", attention="eager")
    per_layer = sum(t.bytes for t in terms if t.per_layer)
    classic = korthikanti_activation_bytes("gpt2-xl", 1, 1024)
    assert 1.0 < per_layer / classic < 1.5


def test_recompute_ordering() -> None:
    kw = dict(batch_size=4, seq_len=2048, precision="bf16", optimizer="sgd", attention="eager")
    act = {r: estimate_training("llama-2-7b", recompute=r, **kw).activations_bytes for r in ("none", "selective", "full")}
    assert act["full"] < act["selective"] < act["none"]


def test_temp_and_phase_reported() -> None:
    small = estimate_training("llama-2-7b", batch_size=1, seq_len=512, precision="bf16")
    assert small.peak_phase == "optimizer" and small.temp_bytes == small.params_bytes  # foreach sqrt(v) buffer
    big = estimate_training("llama-2-7b", batch_size=4, seq_len=4096, precision="bf16")
    assert big.peak_phase == "backward"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(model="llama-2-7b", precision="fp12"), "unknown precision 'fp12'; expected one of: fp32, fp16-mixed"),
        (dict(model="llama-2-7b", optimizer="lion"), "unknown optimizer 'lion'; expected one of: sgd"),
        (dict(model="llama-2-7b", zero_stage=4), "unknown zero stage 4; expected one of: 0, 1, 2, 3"),
        (dict(model="llama-2-7b", batch_size=0), "batch_size must be an integer ≥ 1, got 0"),
        (dict(model="llama-2-7b", seq_len=-5), "seq_len must be an integer ≥ 1, got -5"),
        (dict(model=None), "give a model"),
        (dict(model="gpt2", params=10), "not both"),
        (dict(model="llama-2-7b", attention="flash"), "unknown attention 'flash'; expected one of: eager, sdpa"),
    ],
)
def test_bad_training_input(kwargs: dict, message: str) -> None:
    model = kwargs.pop("model")
    with pytest.raises(MemlibError, match=message):
        estimate_training(model, **kwargs)


def test_bad_inference_input() -> None:
    with pytest.raises(MemlibError, match="unknown weight format 'int3'; expected one of: fp32, fp16, bf16, int8, int4, nf4"):
        estimate_inference("gpt2", seq_len=1024, weights="int3")
    with pytest.raises(MemlibError, match="unknown kv dtype 'int2'"):
        estimate_inference("gpt2", seq_len=1024, kv_dtype="int2")


@pytest.mark.parametrize("model, seq, limit", [("gpt2", 1025, "1,024"), ("gpt2-xl", 2048, "1,024"),
                                               ("llama-7b", 4096, "2,048"), ("llama-2-7b", 4097, "4,096")])
def test_sequences_longer_than_the_model_are_refused(model: str, seq: int, limit: str) -> None:
    # transformers fails on such inputs (GPT-2's position table: IndexError); memlib names the limit
    for call in (lambda: estimate_training(model, seq_len=seq), lambda: estimate_inference(model, seq_len=seq),
                 lambda: activation_terms(model, seq_len=seq)):
        with pytest.raises(MemlibError, match=f"exceeds {model}'s maximum of {limit} positions"):
            call()
    estimate_training(model, seq_len=seq - 1 if seq % 2 else seq // 2)  # at or under the limit: fine


def test_rope_scaling_states_a_longer_limit() -> None:
    raw = dict(load_config("llama-2-7b").raw)
    assert load_config(raw).max_positions == 4096
    assert load_config({**raw, "rope_scaling": {"type": "linear", "factor": 2.0}}).max_positions == 8192
    assert load_config({**raw, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}).max_positions == 16384
    llama31 = {**raw, "max_position_embeddings": 131072,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}}
    assert load_config(llama31).max_positions == 131072
    yarn = {**raw, "max_position_embeddings": 32768,
            "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    assert load_config(yarn).max_positions == 131072
    assert load_config({**raw, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}).max_positions == 4096
    estimate_inference({**raw, "rope_scaling": {"type": "linear", "factor": 2.0}}, seq_len=8192)
    with pytest.raises(MemlibError, match=r"maximum of 8,192 positions \(max_position_embeddings 4,096 with rope"):
        estimate_inference({**raw, "rope_scaling": {"type": "linear", "factor": 2.0}}, seq_len=8193)
    with pytest.raises(MemlibError, match="rope scaling factor must be a number ≥ 1"):
        load_config({**raw, "rope_scaling": {"type": "linear", "factor": "2"}})


models = st.sampled_from(["gpt2", "gpt2-medium", "llama-2-7b", "llama-3-8b", "mistral-7b", "qwen2-0.5b", "gemma-2b",
                         # dense families with both attentions (gemma2 is eager only: tests/test_families.py)
                         "gemma-3-27b", "phi-3-mini", "pythia-1.4b", "falcon-7b"])


@settings(max_examples=60, deadline=None)
@given(model=models, precision=st.sampled_from(PRECISIONS), optimizer=st.sampled_from(OPTIMIZERS),
       stage=st.integers(0, 3), gpus=st.integers(1, 512), batch=st.integers(1, 16), seq=st.integers(1, 8192),
       attention=st.sampled_from(["eager", "sdpa"]), framework=st.sampled_from(FRAMEWORKS))
def test_more_gpus_never_raise_memory(model, precision, optimizer, stage, gpus, batch, seq, attention, framework) -> None:  # type: ignore[no-untyped-def]
    seq = min(seq, load_config(model).max_positions)
    stages = FRAMEWORK_SUPPORT[framework][0]
    stage = stages[stage % len(stages)]  # a stage the framework has
    kw = dict(precision=precision, optimizer=optimizer, zero_stage=stage, batch_size=batch, seq_len=seq, attention=attention,
              framework=framework)
    try:
        fewer = estimate_training(model, num_gpus=gpus, **kw)
    except MemlibError:  # a precision the framework lacks, bitsandbytes on a DeepSpeed partition above int32
        return
    more = estimate_training(model, num_gpus=gpus + 1, **kw)
    # PyTorch on one GPU is no DDP; on two, DDP's Reducer buckets add at most one copy of the gradients.
    ddp = fewer.grads_bytes if framework == "pytorch" and gpus == 1 else 0
    assert more.total_bytes <= fewer.total_bytes + ddp
    assert more.model_states_bytes <= fewer.model_states_bytes + ddp


@settings(max_examples=60, deadline=None)
@given(model=models, precision=st.sampled_from(PRECISIONS), batch=st.integers(1, 16), seq=st.integers(1, 8192),
       attention=st.sampled_from(["eager", "sdpa"]))
def test_recomputation_never_raises_activations(model, precision, batch, seq, attention) -> None:  # type: ignore[no-untyped-def]
    seq = min(seq, load_config(model).max_positions)
    acts = [estimate_training(model, recompute=r, precision=precision, batch_size=batch, seq_len=seq,
                              attention=attention).activations_bytes for r in ("none", "selective", "full")]
    assert acts[0] >= acts[1] >= acts[2]


@settings(max_examples=60, deadline=None)
@given(model=models, batch=st.integers(1, 64), seq=st.integers(1, 32768),
       kv=st.sampled_from(["fp32", "fp16", "bf16", "fp8"]))
def test_quantized_weights_never_exceed_unquantized(model, batch, seq, kv) -> None:  # type: ignore[no-untyped-def]
    seq = min(seq, load_config(model).max_positions)
    sizes = {w: estimate_inference(model, batch_size=batch, seq_len=seq, weights=w, kv_dtype=kv).weights_bytes
             for w in ("fp32", "fp16", "bf16", "int8", "int4", "nf4")}
    assert sizes["fp32"] > sizes["fp16"] == sizes["bf16"] > sizes["int8"] > sizes["int4"] > sizes["nf4"]


@settings(max_examples=40, deadline=None)
@given(model=models, batch=st.integers(1, 8), seq=st.integers(1, 4096))
def test_memory_grows_with_batch_and_seq(model, batch, seq) -> None:  # type: ignore[no-untyped-def]
    seq = min(seq, load_config(model).max_positions - 1)
    base = estimate_training(model, batch_size=batch, seq_len=seq)
    assert estimate_training(model, batch_size=batch + 1, seq_len=seq).total_bytes >= base.total_bytes
    assert estimate_training(model, batch_size=batch, seq_len=seq + 1).total_bytes >= base.total_bytes
