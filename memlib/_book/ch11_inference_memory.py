"""Chapter 11's book helpers: a real DynamicCache's bytes vs the KV formula, int8 weights, a real serving peak.

Book helpers (moved from ``memlib.measure.inference`` and ``memlib.core.inference``): only Chapter 11 (and the
GPU suite's inference part, ``labs/gpu_suite.py``) uses them. Imports torch, transformers and bitsandbytes lazily,
inside the functions. Models are tiny random-weight configs built locally (no downloads).
"""
from __future__ import annotations

import logging
from typing import Any

from ..core.dtypes import WEIGHT_FORMATS
from ..core.errors import check_positive
from ..core.estimate import estimate_inference
from ..core.inference import kv_bytes_per_token
from ..measure.deps import require_torch


def group_quant_bits(bits: int, group_size: int, scale_bits: int = 16, zero_bits: int = 0) -> float:
    """Bits per weight of group-wise quantization: the codes plus one scale (and zero-point) per group.

    Introduced in Chapter 11. GPTQ/AWQ 4-bit with groups of 128, fp16 scales and 4-bit zero-points:
    4 + (16 + 4)/128 = 4.156 bits; bitsandbytes' 4-bit with fp32 absmax per 64: 4 + 32/64 = 4.5 bits
    (memlib's ``int4``); NF4 with double quantization: 4 + 8/64 + 32/(64·256) = 4.127 bits (``nf4``).

    Args:
        bits: bits per code (4, 8).
        group_size: weights sharing one scale.
        scale_bits: bits per scale.
        zero_bits: bits per zero-point (0 for symmetric quantization).

    Returns:
        Bits per weight.
    """
    b = check_positive("bits", bits)
    g = check_positive("group_size", group_size)
    check_positive("scale_bits", scale_bits, allow_zero=True)
    check_positive("zero_bits", zero_bits, allow_zero=True)
    return b + (scale_bits + zero_bits) / g


def _torch() -> Any:
    return require_torch("memlib._book.ch11_inference_memory")


def tiny_llama_config(*, hidden_size: int = 256, num_layers: int = 2, num_heads: int = 8, num_kv_heads: int = 8,
                      intermediate_size: int = 688, vocab_size: int = 1024) -> dict[str, Any]:
    """A small LLaMA-architecture config dict (random weights; memlib and transformers both read it). Chapter 11."""
    return {
        "model_type": "llama",
        "hidden_size": hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "intermediate_size": intermediate_size,
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "rope_theta": 10000.0,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }


def storage_bytes(tensors: Any) -> int:
    """Bytes of the distinct storages behind ``tensors`` (shared storage counted once). Chapter 11."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def rowwise_int8(weight: Any) -> tuple[Any, Any]:
    """From scratch: symmetric per-output-row absmax int8 quantization, as LLM.int8 stores weights. Chapter 11.

    Args:
        weight: a (out_features, in_features) float tensor.

    Returns:
        ``(codes, absmax)``: int8 codes round(127 · W / absmax_row) and the fp32 absmax of each row.
    """
    torch = _torch()
    w = weight.detach().float()
    absmax = w.abs().amax(dim=1)  # (out,)
    codes = torch.round(w * (127.0 / absmax.clamp_min(1e-12))[:, None]).to(torch.int8)  # (out, in)
    return codes, absmax


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:  # pragma: no cover
        raise ImportError("memlib._book.ch11_inference_memory needs transformers: pip install transformers") from None
    transformers.logging.set_verbosity_error()
    return transformers


def _bnb() -> Any:
    # bitsandbytes logs a warning at import on CPUs with AVX512-BF16 when the optional `kernels` package is
    # missing (it only affects 4-bit CPU matmuls); keep it out of notebook outputs.
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    try:
        import bitsandbytes
    except ImportError:  # pragma: no cover
        raise ImportError("the int8 measurement needs bitsandbytes: pip install bitsandbytes") from None
    return bitsandbytes


def _build(cfg: dict[str, Any], dtype: str, seed: int) -> Any:
    torch, transformers = _torch(), _transformers()
    torch.manual_seed(seed)
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    net = transformers.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="sdpa")
    net = net.to({"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype])
    return net.eval()


def measure_kv_cache(*, kv_heads: tuple[int, ...] = (8, 2, 1), batch_size: int = 2, prompt_len: int = 24,
                     new_tokens: int = 8, dtype: str = "bf16", seed: int = 0) -> list[dict[str, Any]]:
    """Prefill and greedily decode with a real transformers ``DynamicCache``; compare its bytes with the formula.

    Introduced in Chapter 11. For each KV-head count (8 of 8 query heads = MHA, 2 = GQA, 1 = MQA) a tiny
    LLaMA model prefills ``batch_size`` prompts of ``prompt_len`` tokens, then decodes ``new_tokens`` tokens
    one at a time, feeding each back. The cache then holds prompt_len + new_tokens tokens per sequence.

    Returns:
        One dict per layout: kv_heads, tokens held (the cache's own count), measured bytes (storages of every
        layer's keys and values), formula bytes (:func:`memlib.core.inference.kv_bytes_per_token` × tokens × batch),
        the key tensor's shape and dtype.
    """
    torch, transformers = _torch(), _transformers()
    rows = []
    for n_kv in kv_heads:
        cfg = tiny_llama_config(num_kv_heads=n_kv)
        net = _build(cfg, dtype, seed)
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, cfg["vocab_size"], (batch_size, prompt_len), generator=gen)  # (B, T)
        cache = transformers.DynamicCache(config=net.config)
        with torch.no_grad():
            out = net(input_ids=ids, cache=cache, use_cache=True)
            for _ in range(new_tokens):
                nxt = out.logits[:, -1:].argmax(-1)  # (B, 1)
                out = net(input_ids=nxt, cache=out.cache, use_cache=True)
        cache = out.cache
        tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        tokens = int(cache.get_seq_length())
        rows.append({
            "kv_heads": n_kv,
            "tokens": tokens,
            "measured_bytes": storage_bytes(tensors),
            "formula_bytes": kv_bytes_per_token(cfg, dtype) * tokens * batch_size,
            "key_shape": tuple(tensors[0].shape),
            "dtype": str(tensors[0].dtype).replace("torch.", ""),
        })
    return rows


def measure_int8_weights(cfg: dict[str, Any] | None = None, *, batch_size: int = 2, seq_len: int = 32,
                         threshold: float = 6.0, seed: int = 0) -> dict[str, Any]:
    """Weight-only int8 with bitsandbytes ``Linear8bitLt`` on CPU: memory measured and output error.

    Introduced in Chapter 11. Every ``nn.Linear`` inside the decoder layers is replaced by
    ``bitsandbytes.nn.Linear8bitLt(has_fp16_weights=False, threshold=threshold)`` holding the same weights;
    embeddings, norms and the LM head stay in 16 bits (as transformers' bitsandbytes integration does).
    Bytes are measured from the tensors' storages; the reference model is the same one in fp16 for memory
    and in fp32 for outputs.

    Args:
        cfg: a config dict (default: a small LLaMA, hidden 512, 4 layers, vocabulary 4096).
        batch_size: sequences in the test batch.
        seq_len: tokens per sequence.
        threshold: LLM.int8's outlier threshold (activation magnitude above which a feature goes through the
            16-bit path).
        seed: torch seed for weights and inputs.

    Returns:
        A dict: parameter counts, measured bytes (fp16 model, int8 model, the quantized layers before/after and
        their row scales), memlib's estimates for fp16 and int8, the from-scratch codes' agreement with
        bitsandbytes', and the output error against fp32 (max |Δlogit|, relative error, top-1 agreement), with
        the plain fp16 model's relative error beside it.
    """
    torch = _torch()
    bnb = _bnb()
    cfg = cfg or tiny_llama_config(hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=8,
                                   intermediate_size=1376, vocab_size=4096)
    ref = _build(cfg, "fp32", seed)
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, cfg["vocab_size"], (batch_size, seq_len), generator=gen)  # (B, T)
    with torch.no_grad():
        ref_logits = ref(input_ids=ids).logits.float()  # (B, T, V)

    q = _build(cfg, "fp32", seed)
    linear_names = [n for n, m in q.model.layers.named_modules() if isinstance(m, torch.nn.Linear)]
    dense_params = 0
    codes_equal = codes_total = max_code_diff = 0
    for name in linear_names:
        parent = q.model.layers.get_submodule(name.rsplit(".", 1)[0])
        child = name.rsplit(".", 1)[1]
        lin = getattr(parent, child)
        dense_params += lin.weight.numel() + (lin.bias.numel() if lin.bias is not None else 0)
        new = bnb.nn.Linear8bitLt(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                  has_fp16_weights=False, threshold=threshold)
        new.load_state_dict(lin.state_dict())
        new = new.to("cpu")  # Int8Params quantize when moved to a device
        ours, _ = rowwise_int8(lin.weight)
        diff = (ours.int() - new.weight.data.int()).abs()
        codes_equal += int((diff == 0).sum())
        codes_total += diff.numel()
        max_code_diff = max(max_code_diff, int(diff.max()))
        setattr(parent, child, new)
    q = q.half()  # embeddings, norms, LM head to fp16; int8 codes and their fp32 row scales (SCB) stay as they are
    int8_layers = [m for m in q.modules() if isinstance(m, bnb.nn.Linear8bitLt)]
    layer_weights = storage_bytes(m.weight for m in int8_layers)
    layer_scales = storage_bytes(m.weight.SCB for m in int8_layers)
    layer_bias = storage_bytes(m.bias for m in int8_layers)
    int8_total = storage_bytes(list(q.parameters()) + list(q.buffers()) + [m.weight.SCB for m in int8_layers])

    fp16 = _build(cfg, "fp16", seed)
    fp16_total = storage_bytes(list(fp16.parameters()) + list(fp16.buffers()))
    fp16_layers = storage_bytes(p for n, p in fp16.model.layers.named_parameters()
                                if "norm" not in n)
    buffers = storage_bytes(fp16.buffers())

    with torch.no_grad():
        q_logits = q(input_ids=ids).logits.float()  # (B, T, V)
        fp16_logits = fp16(input_ids=ids).logits.float()  # (B, T, V)
    err = (q_logits - ref_logits)
    rel = float(err.norm() / ref_logits.norm())
    rel16 = float((fp16_logits - ref_logits).norm() / ref_logits.norm())
    top1 = float((q_logits.argmax(-1) == ref_logits.argmax(-1)).float().mean())
    est16 = estimate_inference(cfg, weights="fp16", batch_size=1, seq_len=1).weights_bytes
    est8 = estimate_inference(cfg, weights="int8", batch_size=1, seq_len=1).weights_bytes
    return {
        "params": sum(p.numel() for p in fp16.parameters()),
        "quantized_params": dense_params,
        "quantized_layers": len(int8_layers),
        "fp16_model_bytes": fp16_total - buffers,
        "int8_model_bytes": int8_total - buffers,
        "fp16_layer_bytes": fp16_layers,
        "int8_layer_weight_bytes": layer_weights,
        "int8_layer_scale_bytes": layer_scales,
        "int8_layer_bias_bytes": layer_bias,
        "estimate_fp16_bytes": est16,
        "estimate_int8_bytes": est8,
        "int8_bytes_per_param": WEIGHT_FORMATS["int8"],
        "codes_equal_fraction": codes_equal / codes_total,
        "max_code_diff": max_code_diff,
        "max_abs_logit_error": float(err.abs().max()),
        "max_abs_logit": float(ref_logits.abs().max()),
        "relative_error": rel,
        "fp16_relative_error": rel16,
        "top1_agreement": top1,
        "threshold": threshold,
    }


def measure_forward_peak(model: Any, *, batch_size: int = 1, seq_len: int = 2048, dtype: str = "fp16",
                         num_layers: int = 2) -> int:
    """Measured peak of the transient tensors of one inference forward pass (prefill), in bytes.

    Introduced in Chapter 11. Builds the transformers model on the ``meta`` device (no memory), counts the
    weights as already there, and traces a ``no_grad`` forward over ``batch_size × seq_len`` tokens with
    :class:`memlib.measure.trace.MemoryTracker`, attention emulating the CUDA flash SDPA kernel as memlib's training
    tracer does, logits for the last position only (``logits_to_keep=1``) and upcast to fp32 as generation
    does. Only one layer's intermediates are alive at a time, so ``num_layers`` layers give the same peak as
    the full depth, much faster.

    Returns:
        Peak bytes above the weights.
    """
    torch = _torch()
    from ..measure.trace import MemoryTracker, _patched, build_model

    net = build_model(model, device="meta", dtype=dtype, attention="sdpa",
                      overrides={"num_hidden_layers": num_layers, "n_layer": num_layers}).eval()
    tracker = MemoryTracker("meta")
    tracker.track_model(net, grad_hooks=False)
    base = tracker.total
    tracker.reset_peak()
    ids = torch.zeros(batch_size, seq_len, dtype=torch.long, device="meta")  # (B, T)
    with torch.no_grad(), _patched(True), tracker.mode():
        out = net(input_ids=ids, use_cache=False, logits_to_keep=1)
        out.logits[:, -1, :].float()  # (B, V) in fp32, as generation upcasts it
    return tracker.peak - base


def measure_serving(model: Any = "qwen2-0.5b", *, device: str = "cuda", batch_size: int = 8,
                    prompt_len: int = 512, new_tokens: int = 64, dtype: str = "bf16", seed: int = 0) -> dict[str, Any]:
    """Weights, KV cache and (on CUDA) peak and device memory of a real prefill + greedy decode.

    Introduced in Chapter 11, for the GPU suite (the chapter shows the recorded JSON); on ``device="cpu"`` it
    runs the same steps with a tiny config (tests). Random weights from a config (no download). Reads the
    weights' bytes (``torch.cuda.memory_allocated`` after loading, on CUDA), the cache's storages after
    decoding, ``max_memory_allocated`` / ``max_memory_reserved`` over prefill and decode, and the device's used
    memory from ``torch.cuda.mem_get_info`` (which includes the CUDA context the allocator does not see).

    Args:
        model: shipped name, config.json path, dict or ModelConfig.
        device: ``"cuda"`` or ``"cpu"``.
        batch_size: sequences.
        prompt_len: prompt tokens per sequence (prefilled in one pass).
        new_tokens: tokens decoded one at a time after the prefill.
        dtype: ``"fp32"``, ``"fp16"`` or ``"bf16"`` (weights, activations and KV cache).
        seed: torch seed.

    Returns:
        A dict of the readings in bytes (CUDA-only readings are None on the CPU), with device and torch version.

    Raises:
        RuntimeError: ``device="cuda"`` without a CUDA device.
    """
    torch, transformers = _torch(), _transformers()
    from ..core.configs import load_config
    from ..core.errors import check_choice

    check_choice("device", device, ("cuda", "cpu"))
    check_choice("dtype", dtype, ("fp32", "fp16", "bf16"))
    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("measure_serving(device='cuda') needs a CUDA device")
    mc = load_config(model)
    free0, total = torch.cuda.mem_get_info() if cuda else (None, None)
    torch.manual_seed(seed)
    hf_cfg = transformers.AutoConfig.for_model(**mc.raw)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    with torch.device(device):
        net = transformers.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="sdpa")
    net = net.to(torch_dtype).eval()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    weights = torch.cuda.memory_allocated() if cuda else storage_bytes(net.parameters())
    ids = torch.randint(0, mc.vocab_size, (batch_size, prompt_len), device=device)  # (B, T)
    cache = transformers.DynamicCache(config=net.config)
    with torch.no_grad():
        out = net(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        for _ in range(new_tokens):
            nxt = out.logits[:, -1:].argmax(-1)  # (B, 1)
            out = net(input_ids=nxt, cache=out.cache, use_cache=True, logits_to_keep=1)
    if cuda:
        torch.cuda.synchronize()
    cache = out.cache
    kv = storage_bytes(t for layer in cache.layers for t in (layer.keys, layer.values))
    tokens = int(cache.get_seq_length())
    free1 = torch.cuda.mem_get_info()[0] if cuda else None
    used = used_before_model = None
    if cuda:
        assert free0 is not None and total is not None and free1 is not None  # mem_get_info() read them
        used, used_before_model = total - free1, total - free0
    return {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "model": mc.name,
        "batch_size": batch_size,
        "tokens": tokens,
        "dtype": dtype,
        "weights_allocated_bytes": weights,
        "estimate_weights_bytes": estimate_inference(mc, weights=dtype, batch_size=1, seq_len=1).weights_bytes,
        "kv_cache_bytes": kv,
        "formula_kv_bytes": kv_bytes_per_token(mc, dtype) * tokens * batch_size,
        "max_memory_allocated": torch.cuda.max_memory_allocated() if cuda else None,
        "max_memory_reserved": torch.cuda.max_memory_reserved() if cuda else None,
        "device_used_bytes": used,
        "device_used_before_model_bytes": used_before_model,
        "device_total_bytes": total,
    }
