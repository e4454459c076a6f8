"""Chapter 17's helpers: a compiled training step's saved activations and backward FLOPs, one setting per call.

Used by ``chapters/17_kernels_and_compilers.ipynb`` (one tiny compiled case) and ``bench/compile_memory.py`` (the
sweep of ``torch._functorch.config.activation_memory_budget``, each setting in a fresh process: the budget is read
when AOTAutograd partitions the graph, before code generation).
"""
from __future__ import annotations

from typing import Any

__all__ = ["TINY", "compiled_step"]

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

    from ..measure.fp8 import saved_tensor_bytes
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
