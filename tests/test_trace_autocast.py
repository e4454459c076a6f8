"""Framework recipes of the trace: PyTorch AMP (torch.autocast, emulated on meta) and DeepSpeed's ZeRO-1/2 step.

The meta emulation of CPU autocast's op lists must hold exactly what real ``torch.autocast("cpu")`` holds on CPU
tensors, for each family, attention, recomputation and AdamW implementation.
"""
import pytest

torch = pytest.importorskip("torch")

from memlib import MemlibError  # noqa: E402
from memlib.measure.autocast import POLICIES, emulated  # noqa: E402
from memlib.measure.trace import build_model, trace_training  # noqa: E402

LLAMA_LIKE = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 256, "head_dim": 16}
TINY = {"llama-2-7b": LLAMA_LIKE, "qwen2-0.5b": LLAMA_LIKE, "gemma-2b": LLAMA_LIKE,
        "gpt2": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "n_positions": 64}}
IMPLS = ("foreach", "fused", "for-loop")
# Every family × attention × recompute once; the AdamW path and the precision rotate over the grid.
GRID = [(model, attention, recompute, IMPLS[k % 3], ("bf16-mixed", "fp16-mixed")[k % 2 if model != "gpt2" else 0])
        for k, (model, attention, recompute) in enumerate(
            (m, a, r) for m in TINY for a in ("eager", "sdpa") for r in ("none", "full"))]


def _kw(model: str, **kw: object) -> dict:
    return dict(batch_size=2, seq_len=16, overrides=TINY[model], extrapolate=False, **kw)


@pytest.mark.parametrize("model, attention, recompute, impl, precision", GRID)
def test_meta_emulation_equals_real_cpu_autocast(model: str, attention: str, recompute: str, impl: str,
                                                 precision: str) -> None:
    kw = _kw(model, precision=precision, attention=attention, recompute=recompute, optimizer_impl=impl)
    meta = trace_training(model, autocast_lists="cpu", **kw)
    cpu = trace_training(model, device="cpu", **kw)  # real torch.autocast("cpu", dtype)
    assert meta.peak_bytes == cpu.peak_bytes
    assert meta.by_category == cpu.by_category
    assert meta.peak_phase == cpu.peak_phase


@pytest.mark.parametrize("model", list(TINY))
def test_amp_trace_holds_fp32_weights_and_grads(model: str) -> None:
    n = sum(p.numel() for p in build_model(model, overrides=TINY[model]).parameters())
    res = trace_training(model, **_kw(model, precision="bf16-mixed", optimizer_impl="foreach"))
    assert res.by_category["params"] == 4 * n
    assert res.by_category["grads"] == 4 * n  # the peak is in the step: every fp32 gradient is there
    assert res.by_category["optimizer"] == 8 * n  # m and v of AdamW on the fp32 parameters, no master copy
    assert res.by_category["temp"] == 4 * n  # foreach's _foreach_sqrt(exp_avg_sq), full size
    assert res.settings["framework"] == "pytorch" and res.settings["autocast_lists"] == "cuda"


def test_fused_amp_step_has_no_temporaries_and_fp16_adds_the_scaler() -> None:
    kw = _kw("llama-2-7b", optimizer_impl="fused")
    bf16 = trace_training("llama-2-7b", precision="bf16-mixed", **kw)
    fp16 = trace_training("llama-2-7b", precision="fp16-mixed", **kw)
    # GradScaler's scale (fp32) and growth tracker (int32) live across steps; the rest of fp16's extra bytes are
    # the scaled loss, found-inf flag and inverse scale (one element each).
    assert fp16.by_category["optimizer"] - bf16.by_category["optimizer"] == 8
    assert 0 < fp16.peak_bytes - bf16.peak_bytes <= 8 + 4 * 4


@pytest.mark.parametrize("model", ["llama-2-7b", "qwen2-0.5b", "gemma-2b"])
def test_cuda_and_cpu_lists_hold_the_same_for_llama_like_families(model: str) -> None:
    kw = _kw(model, precision="bf16-mixed", attention="eager")
    cuda = trace_training(model, autocast_lists="cuda", **kw)
    cpu = trace_training(model, autocast_lists="cpu", **kw)
    assert (cuda.peak_bytes, cuda.by_category) == (cpu.peak_bytes, cpu.by_category)


def test_cuda_lists_keep_gpt2_gelu_and_softmax_in_fp32() -> None:
    # gelu_new's torch.pow runs in fp32 under CUDA autocast only (the MLP's elementwise activations grow).
    kw = _kw("gpt2", precision="bf16-mixed", attention="eager", optimizer="sgd")
    kw.update(batch_size=4, seq_len=64)
    cuda = trace_training("gpt2", autocast_lists="cuda", **kw)
    cpu = trace_training("gpt2", autocast_lists="cpu", **kw)
    assert cuda.activations_bytes > cpu.activations_bytes


def test_emulation_casts_like_autocast_and_caches_weights() -> None:
    w = torch.nn.Parameter(torch.empty(8, 8, device="meta"))
    x = torch.empty(4, 8, device="meta")
    with emulated("cuda") as mode:
        y = torch.nn.functional.linear(x, w)
        assert y.dtype == torch.float32  # autocast off: nothing happens
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y1 = torch.nn.functional.linear(x, w)
            y2 = x @ w
            assert list(mode.cache) == [id(w)]  # one cached bf16 copy of the weight, used twice
            s = torch.softmax(y1, dim=-1)
            ls = torch.nn.functional.log_softmax(y1, dim=-1, dtype=torch.float64)
            p = y1.pow(2)
        assert not mode.cache  # emptied when the outermost autocast region exits
        assert (y1.dtype, y2.dtype, s.dtype, ls.dtype, p.dtype) == (torch.bfloat16, torch.bfloat16, torch.float32,
                                                                    torch.float64, torch.float32)
    with emulated("cpu"), torch.autocast("cpu", dtype=torch.bfloat16):
        y1 = torch.nn.functional.linear(x, w)
        assert (torch.softmax(y1, dim=-1).dtype, y1.pow(2).dtype) == (torch.bfloat16, torch.bfloat16)
    assert POLICIES["cpu"]["linear"] == "lower" and "softmax" not in POLICIES["cpu"]


def test_deepspeed_recipe_layout_and_meta_equals_cpu() -> None:
    model = "llama-2-7b"
    n = sum(p.numel() for p in build_model(model, overrides=TINY[model]).parameters())
    for precision in ("bf16-mixed", "fp16-mixed"):
        kw = _kw(model, precision=precision, framework="deepspeed")
        meta = trace_training(model, **kw)
        cpu = trace_training(model, device="cpu", **kw)
        assert (meta.peak_bytes, meta.by_category) == (cpu.peak_bytes, cpu.by_category)
        cats = meta.by_category
        # 16-bit weights (views of one flat buffer) and gradients, fp32 master + m + v held by the optimizer
        assert (cats["params"], cats["grads"], cats["optimizer"]) == (2 * n, 2 * n, 12 * n)
        # the step's peak: the flattened 16-bit gradients and their fp32 copy, single_grad_partition
        assert meta.peak_phase == "optimizer" and cats["temp"] == 6 * n
        assert meta.settings["framework"] == "deepspeed" and meta.settings["optimizer_impl"] == "fused"


def test_framework_errors_are_one_line() -> None:
    with pytest.raises(MemlibError, match="unknown framework 'jax'; expected one of: pytorch, deepspeed, fsdp2"):
        trace_training("gpt2", framework="jax")
    with pytest.raises(MemlibError, match="framework 'megatron' traces mixed precision"):
        trace_training("gpt2", framework="megatron", precision="fp32")
    with pytest.raises(MemlibError, match="framework 'fsdp2' is not traced with device 'meta'; expected one of: cpu, cuda"):
        trace_training("gpt2", framework="fsdp2")
    with pytest.raises(MemlibError, match="framework 'deepspeed' traces mixed precision"):
        trace_training("gpt2", framework="deepspeed", precision="bf16")
    with pytest.raises(MemlibError, match="unknown autocast lists 'xpu'"):
        trace_training("gpt2", precision="bf16-mixed", autocast_lists="xpu")


def test_cli_trace_framework(capsys: pytest.CaptureFixture) -> None:
    import json

    from memlib.cli import main

    bytes_ = {}
    for framework in ("pytorch", "deepspeed"):
        assert main(["trace", "gpt2", "--batch", "1", "--seq", "32", "--framework", framework, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["framework"] == framework and data["precision"] == "bf16-mixed"
        bytes_[framework] = data["params_bytes"]
    assert bytes_["pytorch"] == 2 * bytes_["deepspeed"]  # fp32 weights under autocast, 16-bit under DeepSpeed
    with pytest.raises(SystemExit) as e:
        main(["trace", "gpt2", "--framework", "fsdp2"])
    assert e.value.code == 2 and "invalid choice: 'fsdp2'" in capsys.readouterr().err
    assert main(["trace", "gpt2", "--framework", "deepspeed", "--precision", "bf16"]) == 2
    assert "framework 'deepspeed' traces mixed precision" in capsys.readouterr().err
