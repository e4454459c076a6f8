"""Run Megatron-Core and TorchTitan on CPU and record what their forward saves (Chapter 15).

The record is ``tests/data/engines_on_cpu.json``, which ``tests/test_engines_parallel.py`` checks memlib against.

Megatron-Core 0.16.1 (``GPTModel`` with ``get_gpt_layer_local_spec(normalization="RMSNorm")``, bf16 through
``.to(torch.bfloat16)``, one gloo rank) and TorchTitan 0.3.0 (``Llama3Model``, its ``ScaledDotProductAttention``,
bf16 parameters as FSDP2's ``MixedPrecisionPolicy`` computes them) on one tiny Llama-like config. Saved bytes are
counted with :class:`memlib.measure.parallel_counters.SavedBytes` (``saved_tensors_hooks``, distinct storages,
parameters and buffers excluded) from the forward through the loss.

The training steps (``steps`` in the record, ``tests/test_engine_steps.py``): each engine's model states and the peak
of live tensor bytes over two whole steps (forward, backward, optimizer step; the second is the steady state),
counted by :class:`memlib.measure.tracker.MemoryTracker` (its dispatch mode entered before the model is built, as
``bench/deepspeed_cpu_memory.py`` does; FSDP2's storage resizes reported by ``memlib.measure.recipes``). Megatron-Core:
``DistributedDataParallel(grad_reduce_in_fp32=True, use_distributed_optimizer=True)`` and
``get_megatron_optimizer(use_distributed_optimizer=True)``; what needed CUDA: its Adam is TransformerEngine's or
apex's ``FusedAdam`` on a GPU and ``torch.optim.AdamW`` here (``megatron/core/optimizer/__init__.py``'s fallback),
and a few ``device='cuda'`` literals and ``Tensor.type()`` checks are redirected (:func:`_cuda_literals_on_cpu`).
TorchTitan: ``apply_fsdp_to_decoder`` on a one-rank ``fsdp`` mesh, ``torch.optim.AdamW(fused=True)``.

TorchTitan's TP plan (``tensor_parallel`` in the record, ``tests/test_engines_parallel.py``): two gloo ranks
(``torch.multiprocessing`` spawn), ``set_llama3_sharding_config`` + ``Module.parallelize`` with and without
sequence parallelism, on one and two layers (their difference is one layer); rank 0's saved bytes and the
collectives of a forward and a backward (:class:`memlib.measure.parallel_counters.CommCounter`). TorchTitan's default
``spmd_backend`` is ``spmd_types``; this runs its DTensor backend ``partial_dtensor`` (the same sharding configs).

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
from memlib.measure.tracker import MemoryTracker

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


def _megatron_model() -> tuple[Any, Any, Any]:
    """Megatron-Core's GPTModel with the local spec in bf16 on one gloo rank (the CPU patches of the docstring)."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1)
    torch.cuda.current_device = lambda: "cpu"  # RotaryEmbedding places inv_freq there, the DDP buffers too
    import megatron.core.fusions.fused_softmax as fused_softmax
    import megatron.core.transformer.dot_product_attention as dpa
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    if not parallel_state.model_parallel_is_initialized():
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
    return model, cfg, ids


def megatron_core() -> dict[str, Any]:
    """Megatron-Core's GPTModel, local spec, bf16, one gloo rank: the bytes saved by forward + loss."""
    import megatron.core

    model, _, ids = _megatron_model()
    pos = torch.arange(SEQ).expand(BATCH, SEQ)
    saved = _saved(model, lambda: model(ids, pos, None, labels=ids).float().sum())
    return {"engine": "megatron-core", "version": megatron.core.__version__,
            "spec": "get_gpt_layer_local_spec(normalization='RMSNorm'), bf16, attention unfused (CPU)",
            "saved_bytes": saved}


@contextlib.contextmanager
def _cuda_literals_on_cpu() -> Any:
    """What Megatron-Core's optimizer needs on a CPU: ``device='cuda'`` literals made on the CPU
    (``optimizer.py``, ``MixedPrecisionOptimizer.__init__``: ``_scale_one``; ``clip_grads.py``,
    ``get_grad_norm_fp32``: the overflow buffer) and ``Tensor.type()`` answering ``torch.cuda.BFloat16Tensor``
    for a CPU bf16 tensor (``distrib_optimizer.py``, ``_build_model_and_main_param_groups``, accepts only
    ``torch.cuda.*`` types). Both restored on exit."""
    makers = {name: getattr(torch, name) for name in ("tensor", "zeros", "empty", "ones")}
    type_of = torch.Tensor.type

    def on_cpu(make: Any) -> Any:
        return lambda *a, device=None, **k: make(*a, device="cpu" if device == "cuda" else device, **k)

    def cuda_type(self: torch.Tensor, *a: Any, **k: Any) -> Any:
        name = type_of(self, *a, **k)
        return name.replace("torch.", "torch.cuda.", 1) if not (a or k) and self.device.type == "cpu" else name

    for name, make in makers.items():
        setattr(torch, name, on_cpu(make))
    torch.Tensor.type = cuda_type  # type: ignore[method-assign]
    try:
        yield
    finally:
        for name, make in makers.items():
            setattr(torch, name, make)
        torch.Tensor.type = type_of  # type: ignore[method-assign]


def _steps(tracker: MemoryTracker, one_step: Any) -> list[dict[str, Any]]:
    """Two training steps under ``tracker``: each one's peak of live bytes and the phase it fell in (the second is
    the steady state: Adam's m and v are made at the first step)."""
    out = []
    for _ in range(2):
        tracker.reset_peak()
        one_step()
        out.append({"peak_bytes": tracker.peak, "peak_phase": tracker.peak_phase, "live_after_bytes": tracker.total})
    return out


def megatron_core_step() -> dict[str, Any]:
    """Megatron-Core's training step on one gloo rank: ``DistributedDataParallel`` (fp32 ``main_grad`` buffer,
    ``grad_reduce_in_fp32``) and ``DistributedOptimizer`` (``get_megatron_optimizer``, ``use_distributed_optimizer``;
    without TransformerEngine or apex its Adam is ``torch.optim.AdamW``, ``optimizer/__init__.py``'s fallback)."""
    import megatron.core
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    tracker = MemoryTracker("cpu")
    with _cuda_literals_on_cpu(), tracker.mode():
        model, cfg, ids = _megatron_model()
        pos = torch.arange(SEQ).expand(BATCH, SEQ)
        ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, use_distributed_optimizer=True), model)
        opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, bf16=True,
                                                     use_distributed_optimizer=True), [ddp])

        def one_step() -> None:
            ddp.zero_grad_buffer()
            opt.zero_grad()
            with tracker.forward():
                loss = ddp(ids, pos, None, labels=ids).float().sum()
            with tracker.backward():
                loss.backward()
            del loss
            ddp.finish_grad_sync()
            with tracker.optimizer_step():
                opt.step()

        steps = _steps(tracker, one_step)
        inner = opt.chained_optimizers[0]
        states = {"params_bytes": sum(b.param_data.nbytes for b in ddp.buffers),
                  "grads_bytes": sum(b.grad_data.nbytes for b in ddp.buffers),
                  "optimizer_bytes": sum(p.nbytes for g in inner.optimizer.param_groups for p in g["params"])
                  + sum(v.nbytes for st in inner.optimizer.state.values() for k, v in st.items() if k != "step")}
    return {"engine": "megatron-core", "version": megatron.core.__version__,
            "spec": "DistributedDataParallel(grad_reduce_in_fp32) + DistributedOptimizer, bf16, one gloo rank; "
                    "Adam is torch.optim.AdamW (no TransformerEngine/apex on CPU)",
            "optimizer": type(inner.optimizer).__name__, "params": sum(p.numel() for p in model.parameters()),
            "states": states, "steps": steps}


def _torchtitan_model(layers: int = TINY["num_hidden_layers"], sequence_parallel: bool | None = None
                      ) -> tuple[Any, Any]:
    """TorchTitan's Llama3Model on the tiny config (fp32 parameters, as TorchTitan builds it) and the token ids;
    ``sequence_parallel`` not None: its TP sharding config (``set_llama3_sharding_config(enable_sp=...)``)."""
    stub = types.ModuleType("torchtitan.distributed.minimal_async_ep.kernels")
    stub.__getattr__ = lambda name: None  # type: ignore[attr-defined]  # triton kernels of MoE EP only
    sys.modules.setdefault(stub.__name__, stub)
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
            n_layers=layers, dim=h, n_heads=a, n_kv_heads=c["num_key_value_heads"],
            hidden_dim=c["intermediate_size"], rope=ComplexRoPE.Config(dim=h // a, max_seq_len=SEQ, theta=500000),
            attn_backend="sdpa"))
    if sequence_parallel is not None:
        from torchtitan.models.llama3.sharding import set_llama3_sharding_config

        set_llama3_sharding_config(cfg, enable_sp=sequence_parallel)
    torch.manual_seed(0)
    return cfg.build(), torch.randint(0, V, (BATCH, SEQ))


def _tt_loss(model: Any, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids.flatten())


def torchtitan() -> dict[str, Any]:
    """TorchTitan's Llama 3 with SDPA and bf16 parameters: the bytes saved by forward + cross-entropy."""
    from importlib.metadata import version

    model, ids = _torchtitan_model()
    for p in model.parameters():  # FSDP2's MixedPrecisionPolicy(param_dtype=bf16): bf16 weights in compute
        p.data = p.data.to(torch.bfloat16)
    return {"engine": "torchtitan", "version": version("torchtitan"),
            "spec": "Llama3Model, ScaledDotProductAttention, bf16 parameters (CPU)",
            "saved_bytes": _saved(model, lambda: _tt_loss(model, ids))}


def torchtitan_step() -> dict[str, Any]:
    """TorchTitan's training step on one gloo rank: ``apply_fsdp_to_decoder`` (``torchtitan/distributed/fsdp.py``:
    ``fully_shard`` on the embedding, on [norm, lm_head], on each block and on the root, ``MixedPrecisionPolicy``
    bf16/fp32) and ``torch.optim.AdamW(fused=True)`` (TorchTitan's default implementation), ``zero_grad`` with
    ``set_to_none`` as its trainer calls it."""
    from importlib.metadata import version

    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    from memlib.measure.recipes import _fsdp2_storage_hooks

    tracker = MemoryTracker("cpu")
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
    with _fsdp2_storage_hooks(tracker), tracker.mode():
        model, ids = _torchtitan_model()
        apply_fsdp_to_decoder(model, mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32, pp_enabled=False)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

        def one_step() -> None:
            opt.zero_grad()
            with tracker.forward():
                loss = _tt_loss(model, ids)
            with tracker.backward():
                loss.backward()
            del loss
            with tracker.optimizer_step():
                opt.step()

        steps = _steps(tracker, one_step)
        local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
        states = {"params_bytes": sum(p.nbytes for p in local),
                  "grads_bytes": sum(p.grad.to_local().nbytes for p in model.parameters() if p.grad is not None),
                  "optimizer_bytes": sum(v.to_local().nbytes if hasattr(v, "to_local") else v.nbytes
                                         for st in opt.state.values() for k, v in st.items() if k != "step")}
    return {"engine": "torchtitan", "version": version("torchtitan"),
            "spec": "apply_fsdp_to_decoder (FSDP2, MixedPrecisionPolicy bf16/fp32, reshard_after_forward default), "
                    "AdamW(fused=True), one gloo rank", "optimizer": "AdamW(fused=True)",
            "params": sum(p.numel() for p in model.parameters()), "states": states, "steps": steps}


TP_WORLD = 2


def _tp_worker(rank: int, port: int, sequence_parallel: bool, layers: int, queue: Any) -> None:
    """One of two gloo ranks: TorchTitan's Llama 3 under its TP plan, forward + TorchTitan's loss + backward."""
    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=TP_WORLD)
    from memlib.measure.parallel_counters import CommCounter

    model, ids = _torchtitan_model(layers, sequence_parallel)
    import torchtitan.distributed.parallel_dims as parallel_dims
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.distributed.utils import set_spmd_backend

    parallel_dims.device_type = "cpu"  # torchtitan.tools.utils.device_type falls back to "cuda"
    set_spmd_backend("partial_dtensor")  # the DTensor path: _LossParallelCrossEntropy on the vocab shards
    dims = parallel_dims.ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=TP_WORLD, pp=1, ep=1,
                                      world_size=TP_WORLD, spmd_backend="partial_dtensor")
    dims.build_mesh()
    for p in model.parameters():  # bf16 weights in compute, as FSDP2's MixedPrecisionPolicy gives them
        p.data = p.data.to(torch.bfloat16)
    model.parallelize(dims)
    sb = SavedBytes(exclude=list(model.parameters()) + list(model.buffers()))
    comm = CommCounter(TP_WORLD)
    with comm.counting():
        with sb.hooks():
            loss = cross_entropy_loss(model(ids), ids, global_vocab_size=TINY["vocab_size"])
        forward = {k: v[0] for k, v in comm.records.items()}
        saved = sb.live
        loss.backward()
    if rank == 0:
        queue.put({"sequence_parallel": sequence_parallel, "layers": layers, "saved_bytes": saved,
                   "forward_collectives": forward, "step_collectives": {k: v[0] for k, v in comm.records.items()}})
    dist.destroy_process_group()


def torchtitan_tp() -> dict[str, Any]:
    """TorchTitan's TP plan (``set_llama3_sharding_config`` + ``Module.parallelize``: fused wqkv and w1/w3
    column-parallel, wo and w2 row-parallel; with SP the attention and feed-forward inputs go Shard(1) →
    Replicate once each) on two gloo ranks, with and without sequence parallelism, 1 and 2 layers (their
    difference is one layer's collectives): rank 0's saved bytes and the collectives of a forward + backward."""
    from importlib.metadata import version

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    runs = []
    for i, (sp, layers) in enumerate([(sp, n) for sp in (True, False) for n in (1, 2)]):
        queue = ctx.Queue()
        mp.start_processes(_tp_worker, args=(29641 + i, sp, layers, queue), nprocs=TP_WORLD, join=True,
                           start_method="spawn")
        runs.append(queue.get())
    return {"engine": "torchtitan", "version": version("torchtitan"), "tp": TP_WORLD,
            "spec": "Llama3Model, set_llama3_sharding_config + parallelize (spmd_backend partial_dtensor), bf16 "
                    "parameters, cross_entropy_loss (vocab-parallel), gloo", "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {OUT.name}")
    args = ap.parse_args()
    runs = [megatron_core(), torchtitan()]
    steps = [megatron_core_step(), torchtitan_step()]
    data = {"command": "python bench/engines_on_cpu.py --write", "torch": torch.__version__, "config": TINY,
            "batch_size": BATCH, "seq_len": SEQ, "runs": runs, "steps": steps, "tensor_parallel": torchtitan_tp()}
    print(json.dumps(data, indent=1))
    if args.write:
        OUT.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
