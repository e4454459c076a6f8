"""Chapter 17's code: FP8 Linears traced on CPU, chunked cross-entropy, a compiled step's saved activations.

Used by ``chapters/17_kernels_and_compilers.ipynb``, ``tests/test_fp8_losses.py`` and ``bench/compile_memory.py``.

* :func:`saved_tensor_bytes` runs one forward pass (with the loss) and adds up the distinct storages autograd saves
  for backward, parameters left out: the activations :func:`memlib.core.estimate.saved_activations` estimates.
* :func:`to_float8` converts a model's decoder-layer Linears (the LM head stays bf16, as TorchTitan's
  ``filter_fqns=["output"]``): ``tensorwise`` / ``rowwise`` with torchao 0.18.0's ``convert_to_float8_training``
  (``Float8LinearConfig.from_recipe_name``; ``torch._scaled_mm`` runs on CPU); ``blockwise`` with
  :func:`BlockwiseFP8Linear`, the DeepSeek-V3 recipe (§3.3) in plain PyTorch: the input quantized to
  ``float8_e4m3fn`` in 1×128 tiles with fp32 scales and cached for backward, the weight rounded through FP8 and not
  cached; the GEMM emulated in bf16 from the dequantized operands (a CPU has no blockwise FP8 GEMM). What is
  *saved* is the recipe's (:mod:`memlib.core.fp8` models it).
* :func:`chunked_cross_entropy`: the LM head and the loss over checkpointed chunks of tokens: the forward keeps no
  logits, the backward re-makes one chunk's at a time (:mod:`memlib.core.losses`, ``loss="chunked"``).
* :func:`compiled_step`: a compiled training step's saved bytes and backward FLOPs, one setting per call (the
  budget is read when AOTAutograd partitions, before code generation: ``bench/compile_memory.py`` runs each
  setting in a fresh process).
"""
from __future__ import annotations

from typing import Any

from ..core.choices import FP8_RECIPES
from ..core.errors import check_choice

__all__ = ["TINY", "compiled_step", "saved_tensor_bytes", "to_float8", "BlockwiseFP8Linear", "quantize_tiles",
           "chunked_cross_entropy"]

TILE = 128


def saved_tensor_bytes(run: Any, params: Any = ()) -> int:
    """Bytes of the distinct storages autograd saves while ``run()`` executes, the ``params`` left out.

    Args:
        run: a callable doing one forward pass (and the loss), returning the loss.
        params: tensors not to count (the model's parameters).
    """
    import torch

    seen: dict[Any, int] = {}
    skip = {p.untyped_storage().data_ptr() for p in params}

    def pack(t: Any) -> Any:
        if t.device.type != "meta":
            st = t.untyped_storage()
            if st.data_ptr() not in skip:
                seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = run()
    del loss
    return sum(seen.values())


def quantize_tiles(x: Any, tile: int = TILE) -> tuple[Any, Any]:
    """``x`` (…, K) as float8_e4m3fn in 1×``tile`` tiles along K, with one fp32 scale per tile (amax / 448)."""
    import torch

    k = x.shape[-1]
    pad = (-k) % tile
    xp = torch.nn.functional.pad(x.float(), (0, pad)).reshape(*x.shape[:-1], -1, tile)
    scale = (xp.abs().amax(-1, keepdim=True) / 448.0).clamp(min=1e-12)
    q = (xp / scale).to(torch.float8_e4m3fn).reshape(*x.shape[:-1], k + pad)[..., :k].contiguous()
    return q, scale.squeeze(-1)


def _dequantize(q: Any, scale: Any, dtype: Any, tile: int = TILE) -> Any:
    import torch

    k = q.shape[-1]
    pad = (-k) % tile
    qp = torch.nn.functional.pad(q.float(), (0, pad)).reshape(*q.shape[:-1], -1, tile)
    return (qp * scale.unsqueeze(-1)).reshape(*q.shape[:-1], k + pad)[..., :k].to(dtype)


def _block_weight(w: Any) -> Any:
    """The weight rounded through float8_e4m3fn in 128×128 blocks (one fp32 scale each), back in its dtype."""
    n, k = w.shape
    q, s = quantize_tiles(w.reshape(n, k).t().reshape(k, n), TILE)  # tiles along n; blocks approximated by tiles
    return _dequantize(q, s, w.dtype).reshape(k, n).t()


def _function() -> Any:
    import torch

    class _BlockwiseFP8(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, weight: Any) -> Any:
            q, scale = quantize_tiles(x)  # (…, K) fp8 and (…, K/128) fp32: what backward keeps
            ctx.save_for_backward(q, scale, weight)
            ctx.x_dtype = x.dtype
            return _dequantize(q, scale, x.dtype) @ _block_weight(weight).t()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            q, scale, weight = ctx.saved_tensors
            x = _dequantize(q, scale, ctx.x_dtype)
            grad_x = grad @ weight
            grad_w = grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
            return grad_x, grad_w

    return _BlockwiseFP8


class _Lazy:
    fn: Any = None


def BlockwiseFP8Linear(linear: Any) -> Any:  # noqa: N802 (a factory named as the module it makes)
    """A bias-free ``nn.Linear`` whose forward runs DeepSeek-V3's blockwise FP8 recipe (see the module docstring)."""
    import torch

    if _Lazy.fn is None:
        _Lazy.fn = _function()

    class _Linear(torch.nn.Linear):
        def forward(self, x: Any) -> Any:
            out = _Lazy.fn.apply(x, self.weight)
            return out if self.bias is None else out + self.bias

    new = _Linear.__new__(_Linear)
    new.__dict__ = linear.__dict__
    return new


def to_float8(model: Any, recipe: str) -> Any:
    """Convert the decoder-layer Linears of ``model`` (not ``lm_head``) to an FP8 recipe of :data:`FP8_RECIPES`."""
    import torch

    check_choice("fp8 recipe", recipe, FP8_RECIPES)
    if recipe != "blockwise":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = Float8LinearConfig.from_recipe_name(recipe)
        return convert_to_float8_training(model, config=config,
                                          module_filter_fn=lambda mod, fqn: "lm_head" not in fqn)
    for name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            if isinstance(child, torch.nn.Linear) and "lm_head" not in f"{name}.{child_name}":
                setattr(mod, child_name, BlockwiseFP8Linear(child))
    return model


def _chunk_loss(x: Any, weight: Any, target: Any) -> Any:
    import torch

    logits = (x @ weight.t()).float()  # (c, V): the only logits alive
    return torch.nn.functional.cross_entropy(logits, target, reduction="sum")


def chunked_cross_entropy(hidden: Any, weight: Any, target: Any, chunk: int = 1024) -> Any:
    """Mean cross-entropy of ``hidden @ weight.T`` against ``target``, ``chunk`` tokens at a time.

    Args:
        hidden: (T, h) final hidden states; weight: (V, h) the LM head; target: (T,) token ids.
        chunk: tokens per chunk.

    Returns:
        The mean loss (a 0-d tensor), equal to ``cross_entropy(hidden @ weight.T, target)``.
    """
    from torch.utils.checkpoint import checkpoint

    total = hidden.new_zeros((), dtype=hidden.dtype).float()
    for start in range(0, hidden.shape[0], chunk):
        sl = slice(start, start + chunk)
        total = total + checkpoint(_chunk_loss, hidden[sl], weight, target[sl], use_reentrant=False)
    return total / hidden.shape[0]

#: The tiny Llama-3-shaped model of the chapter (bf16 weights, SDPA attention).
TINY: dict[str, Any] = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=1024)


def compiled_step(backend: str, budget: float = 1.0, batch_size: int = 2, seq_len: int = 128) -> dict[str, Any]:
    """Saved-for-backward bytes and backward FLOPs of one training step of :data:`TINY`, traced on CPU.

    Args:
        backend: ``eager`` (no compile) or a ``torch.compile`` backend: ``aot_eager`` (AOTAutograd's default
            partition: saves what eager would, minus views), ``aot_eager_decomp_partition`` (the min-cut
            partitioner Inductor uses, without code generation), ``inductor`` (C++ on CPU; slow to compile).
        budget: ``torch._functorch.config.activation_memory_budget`` (1.0: the min-cut partitioner's own choice,
            0.0: recompute everything it can). Read by the min-cut partitioner only.

    Returns:
        ``saved_bytes`` (distinct storages autograd saves, parameters excluded), ``backward_flops``
        (``torch.utils.flop_counter.FlopCounterMode`` over the backward pass), the settings.
    """
    import torch
    import torch._functorch.config as functorch_config
    from torch.utils.flop_counter import FlopCounterMode

    from ..measure.hf_config import build_model

    torch._dynamo.reset()
    functorch_config.activation_memory_budget = budget
    torch.manual_seed(0)
    model = build_model("llama-3.1-8b", device="cpu", dtype="bf16", attention="sdpa", overrides=TINY)
    ids = torch.randint(0, TINY["vocab_size"], (batch_size, seq_len))
    fwd = model if backend == "eager" else torch.compile(model, backend=backend)

    def run() -> Any:
        return fwd(input_ids=ids, labels=ids, use_cache=False).loss

    run().backward()  # compile (and warm up) once
    model.zero_grad(set_to_none=True)
    saved = saved_tensor_bytes(run, list(model.parameters()))
    loss = run()
    with FlopCounterMode(display=False) as counter:
        loss.backward()
    return {"backend": backend, "budget": budget, "saved_bytes": saved, "backward_flops": counter.get_total_flops()}
