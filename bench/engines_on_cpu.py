"""Run Megatron-Core and TorchTitan on CPU and record what their forward saves (Chapter 15).

The record is ``tests/data/engines_on_cpu.json``, which ``tests/test_engines_parallel.py`` checks memlib against.

Megatron-Core 0.16.1 (``GPTModel`` with ``get_gpt_layer_local_spec(normalization="RMSNorm")``, bf16 through
``.to(torch.bfloat16)``, one gloo rank) and TorchTitan 0.3.0 (``Llama3Model``, its ``ScaledDotProductAttention``,
bf16 parameters as FSDP2's ``MixedPrecisionPolicy`` computes them) on one tiny Llama-like config. Saved bytes are
counted with :class:`memlib.measure.parallel_counters.SavedBytes` (``saved_tensors_hooks``, distinct storages,
parameters and buffers excluded) from the forward through the loss.

The engines are not in requirements.txt (their dependencies would move the book's pins); install them beside it::

    python -m venv /tmp/enginesenv && /tmp/enginesenv/bin/pip install --no-deps megatron-core==0.16.1 \\
        torchtitan==0.3.0 spmd_types==0.2.3 tyro docstring_parser
    PYTHONPATH=$PWD:/tmp/enginesenv/lib/python3.11/site-packages python bench/engines_on_cpu.py --write

CPU patches (``/work/shared/ENGINES_ON_CPU.md``): ``torch.cuda.current_device`` returns ``"cpu"`` (RoPE's
``inv_freq``), the default causal mask is built on CPU, the CUDA RNG tracker's ``fork`` is a null context
(dropout 0), and TorchTitan's triton-only MoE kernels module is a stand-in (a dense model never calls it).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import torch

from memlib.measure.parallel_counters import SavedBytes

#: The tiny config both engines build (Llama-like: GQA, SwiGLU, RMSNorm, RoPE, untied head).
TINY = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 176, "num_hidden_layers": 2, "vocab_size": 128, "max_position_embeddings": 64,
        "tie_word_embeddings": False}
BATCH, SEQ = 2, 32
OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "engines_on_cpu.json"


def _saved(model: torch.nn.Module, run: Any) -> int:
    """Bytes autograd holds for backward after ``run()`` (the forward and the loss)."""
    sb = SavedBytes(exclude=list(model.parameters()) + list(model.buffers()))
    with sb.hooks():
        loss = run()
    n = sb.live
    loss.backward()
    return n


def megatron_core() -> dict[str, Any]:
    """Megatron-Core's GPTModel, local spec, bf16, one gloo rank: the bytes saved by forward + loss."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1)
    torch.cuda.current_device = lambda: "cpu"  # RotaryEmbedding places inv_freq there
    import megatron.core
    import megatron.core.fusions.fused_softmax as fused_softmax
    import megatron.core.transformer.dot_product_attention as dpa
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(1, 1)

    class _NoFork:
        def fork(self, *args: Any, **kwargs: Any) -> Any:
            return contextlib.nullcontext()

    dpa.tensor_parallel.get_cuda_rng_tracker = lambda *a, **k: _NoFork()
    fused_softmax.get_default_causal_mask = functools.lru_cache(None)(
        lambda sq: torch.triu(torch.ones((sq, sq), dtype=torch.bool), diagonal=1))
    c = TINY
    cfg = TransformerConfig(
        num_layers=c["num_hidden_layers"], hidden_size=c["hidden_size"], num_attention_heads=c["num_attention_heads"],
        num_query_groups=c["num_key_value_heads"], ffn_hidden_size=c["intermediate_size"], normalization="RMSNorm",
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, bf16=True, params_dtype=torch.bfloat16,
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False, apply_rope_fusion=False)
    torch.manual_seed(0)
    model = GPTModel(cfg, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=c["vocab_size"],
                     max_sequence_length=SEQ, position_embedding_type="rope").to(torch.bfloat16)
    ids = torch.randint(0, c["vocab_size"], (BATCH, SEQ))
    pos = torch.arange(SEQ).expand(BATCH, SEQ)
    saved = _saved(model, lambda: model(ids, pos, None, labels=ids).float().sum())
    return {"engine": "megatron-core", "version": megatron.core.__version__,
            "spec": "get_gpt_layer_local_spec(normalization='RMSNorm'), bf16, attention unfused (CPU)",
            "saved_bytes": saved}


def torchtitan() -> dict[str, Any]:
    """TorchTitan's Llama 3 with SDPA and bf16 parameters: the bytes saved by forward + cross-entropy."""
    stub = types.ModuleType("torchtitan.distributed.minimal_async_ep.kernels")
    stub.__getattr__ = lambda name: None  # type: ignore[attr-defined]  # triton kernels of MoE EP only
    sys.modules.setdefault(stub.__name__, stub)
    from importlib.metadata import version

    import torchtitan.models.llama3 as llama3
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention

    llama3.get_attention_config = lambda backend: ScaledDotProductAttention.Config()  # type: ignore[attr-defined]
    c = TINY
    h, a, V = c["hidden_size"], c["num_attention_heads"], c["vocab_size"]
    cfg = llama3.Llama3Model.Config(
        dim=h, vocab_size=V, tok_embeddings=Embedding.Config(num_embeddings=V, embedding_dim=h),
        norm=RMSNorm.Config(normalized_shape=h), lm_head=Linear.Config(in_features=h, out_features=V),
        layers=llama3._build_llama3_layers(
            n_layers=c["num_hidden_layers"], dim=h, n_heads=a, n_kv_heads=c["num_key_value_heads"],
            hidden_dim=c["intermediate_size"], rope=ComplexRoPE.Config(dim=h // a, max_seq_len=SEQ, theta=500000),
            attn_backend="sdpa"))
    torch.manual_seed(0)
    model = cfg.build()
    for p in model.parameters():  # FSDP2's MixedPrecisionPolicy(param_dtype=bf16): bf16 weights in compute
        p.data = p.data.to(torch.bfloat16)
    ids = torch.randint(0, V, (BATCH, SEQ))

    def run() -> torch.Tensor:
        logits = model(ids)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids.flatten())

    return {"engine": "torchtitan", "version": version("torchtitan"),
            "spec": "Llama3Model, ScaledDotProductAttention, bf16 parameters (CPU)", "saved_bytes": _saved(model, run)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {OUT.name}")
    args = ap.parse_args()
    runs = [megatron_core(), torchtitan()]
    data = {"command": "python bench/engines_on_cpu.py --write", "torch": torch.__version__, "config": TINY,
            "batch_size": BATCH, "seq_len": SEQ, "runs": runs}
    print(json.dumps(data, indent=1))
    if args.write:
        OUT.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
