"""Real sharded training on torch.distributed: DDP, ZeRO-1, FSDP2 (ZeRO-2-like and ZeRO-3), measured (Chapter 6).

One tiny transformers Llama, built from a dict config with the same seed on every rank, is trained for a few
steps four ways — ``DistributedDataParallel`` (the baseline), ``ZeroRedundancyOptimizer`` (ZeRO-1),
``fully_shard`` with ``reshard_after_forward=False`` (ZeRO-2-like) and ``True`` (ZeRO-3) — and each rank
reports what it holds (parameters, gradients and optimizer states, counted as the bytes of the distinct
storages it owns, local shards only), its peak over a step, its losses and the bytes its collectives moved.

On CPU the processes use gloo and are started with ``torch.multiprocessing`` (:func:`run_sharded`); the same
module runs unchanged under ``torchrun`` with NCCL on GPUs (``torchrun --nproc-per-node 4 -m memlib.measure.distributed
--out result.json``), where it also records ``torch.cuda.max_memory_allocated``. torch and transformers are
imported lazily: importing this module is cheap. Chapter 6's one-process reference losses and its call of
DeepSpeed's own estimators are book helpers (:mod:`memlib._book.ch06_zero_fsdp`).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..core.choices import ZERO_STAGES, OneLineParser, positive_int
from ..core.errors import MemlibError, check_choice, check_positive
from .deps import require_torch
from .procs import join_gloo_group, join_with_deadline
from .results import DATE_FORMAT

__all__ = [
    "STRATEGIES",
    "STRATEGY_STAGE",
    "TINY_LLAMA",
    "RankResult",
    "ShardedRun",
    "CommCounter",
    "bus_bytes",
    "state_bytes",
    "train_rank",
    "run_sharded",
    "build_parser",
    "main",
]

STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
"""The four ways of training: DDP, ZeroRedundancyOptimizer, fully_shard(reshard_after_forward=False / True)."""

STRATEGY_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}
"""The ZeRO stage each strategy implements (``zero2`` is FSDP2 without resharding after forward)."""

TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
"""The chapter's tiny Llama: 106,816 parameters, 21 tensors; fast on two CPU cores."""

_LR = 1e-2


def _torch() -> Any:
    return require_torch("memlib.measure.distributed")


@dataclass(frozen=True)
class RankResult:
    """What one rank measured for one strategy. Introduced in Chapter 6.

    Attributes:
        strategy: ``ddp``, ``zero1``, ``zero2`` or ``zero3``.
        rank: this process's rank.
        world_size: number of processes.
        num_params: parameters of the full (unsharded) model, Ψ.
        params_bytes: bytes of parameter storage this rank holds after the last step (its shards only).
        grads_bytes: bytes of gradient storage after the last backward (before ``zero_grad``).
        optimizer_bytes: bytes of optimizer-state storage after the last step (the step counters excluded).
        peak_bytes: peak over the last step of params + grads + optimizer-state bytes, gathered
            parameters and unsharded gradients included (sampled at module boundaries).
        peak_by_category: ``{"params", "grads", "optimizer"}`` bytes at that peak.
        losses: this rank's loss at each step (its own data shard).
        comm: per collective name, ``[calls, payload bytes, bus bytes]`` in the last step.
        comm_bus_bytes: bytes this rank sent in the last step (ring algorithms: all-reduce 2(n−1)/n·S,
            all-gather and reduce-scatter (n−1)/n·S of the full tensor, broadcast (n−1)/n·S).
        backend: ``gloo`` or ``nccl``.
        device: ``cpu`` or ``cuda``.
        cuda_peak_bytes: ``torch.cuda.max_memory_allocated`` over the last step (None on CPU).
    """

    strategy: str
    rank: int
    world_size: int
    num_params: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    peak_bytes: int
    peak_by_category: dict[str, int]
    losses: list[float]
    comm: dict[str, list[int]]
    comm_bus_bytes: int
    backend: str
    device: str
    cuda_peak_bytes: int | None = None

    @property
    def states_bytes(self) -> int:
        """Params + grads + optimizer states held by this rank at the end of a step."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class ShardedRun:
    """All ranks of one strategy. Introduced in Chapter 6.

    Attributes:
        strategy: the strategy.
        world_size: number of processes.
        ranks: one :class:`RankResult` per rank, by rank.
        settings: model config, batch, sequence length, steps, backend.
    """

    strategy: str
    world_size: int
    ranks: list[RankResult]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def mean_losses(self) -> list[float]:
        """Loss per step averaged over ranks: the loss of the global batch."""
        steps = len(self.ranks[0].losses)
        return [sum(r.losses[i] for r in self.ranks) / len(self.ranks) for i in range(steps)]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"strategy": self.strategy, "world_size": self.world_size,
                "ranks": [r.as_dict() for r in self.ranks], "settings": self.settings}


def bus_bytes(op: str, nbytes: int, world_size: int) -> int:
    """Bytes one rank sends in a ring implementation of collective ``op`` on a tensor of ``nbytes``.

    Introduced in Chapter 6. ``nbytes`` is the full tensor: the all-reduce input, the all-gather output, the
    reduce-scatter input, the broadcast tensor. All-reduce = reduce-scatter + all-gather: 2(n−1)/n·S; the
    others (n−1)/n·S. The ZeRO paper's volumes (2Ψ, 3Ψ) drop the (n−1)/n.
    """
    check_choice("collective", op, ("all_reduce", "all_gather", "reduce_scatter", "broadcast"))
    n = check_positive("world_size", world_size)
    factor = 2 if op == "all_reduce" else 1
    return factor * nbytes * (n - 1) // n


class CommCounter:
    """Counts the bytes of ``torch.distributed`` collectives while :meth:`patched` is active.

    Introduced in Chapter 6. Wraps ``all_reduce``, ``broadcast``, ``all_gather``, ``all_gather_into_tensor``,
    ``all_gather_single``, ``reduce_scatter_tensor``, ``reduce_scatter_single`` in the ``torch.distributed``
    namespace (what FSDP2 and ``ZeroRedundancyOptimizer`` call); DDP's reducer runs in C++ and is counted
    by the hook from :meth:`ddp_hook_fn`, registered with ``register_comm_hook``.
    """

    _WRAPPED = {
        "all_reduce": ("all_reduce", lambda a, k: _arg(a, k, 0, "tensor")),
        "broadcast": ("broadcast", lambda a, k: _arg(a, k, 0, "tensor")),
        "all_gather": ("all_gather", lambda a, k: _list_bytes(_arg(a, k, 0, "tensor_list"))),
        "all_gather_into_tensor": ("all_gather", lambda a, k: _arg(a, k, 0, "output_tensor")),
        "all_gather_single": ("all_gather", lambda a, k: _arg(a, k, 0, "output_tensor")),
        "reduce_scatter_tensor": ("reduce_scatter", lambda a, k: _arg(a, k, 1, "input")),
        "reduce_scatter_single": ("reduce_scatter", lambda a, k: _arg(a, k, 1, "input")),
    }

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.records: dict[str, list[int]] = {}
        self.active = False

    def reset(self) -> None:
        """Forget what was counted."""
        self.records = {}

    def add(self, name: str, op: str, nbytes: int) -> None:
        """Record one call of collective ``name`` (kind ``op``) on a full tensor of ``nbytes``."""
        if not self.active:
            return
        rec = self.records.setdefault(name, [0, 0, 0])
        rec[0] += 1
        rec[1] += nbytes
        rec[2] += bus_bytes(op, nbytes, self.world_size)

    @property
    def bus_bytes(self) -> int:
        """Bytes sent by this rank, all collectives together."""
        return sum(r[2] for r in self.records.values())

    @contextlib.contextmanager
    def patched(self) -> Iterator[CommCounter]:
        """Within the block, the wrapped ``torch.distributed`` functions are counted."""
        dist = _torch().distributed
        originals = {}
        for name, (op, size_of) in self._WRAPPED.items():
            if not hasattr(dist, name):
                continue
            original = getattr(dist, name)
            originals[name] = original

            def wrapper(*args: Any, _orig: Any = original, _name: str = name, _op: str = op,
                        _size: Any = size_of, **kwargs: Any) -> Any:
                size = _size(args, kwargs)
                self.add(_name, _op, size if isinstance(size, int) else _nbytes(size))
                return _orig(*args, **kwargs)

            setattr(dist, name, wrapper)
        try:
            yield self
        finally:
            for name, original in originals.items():
                setattr(dist, name, original)

    def ddp_hook_fn(self) -> Any:
        """A DDP communication hook that counts each bucket, then all-reduces it (mean) as DDP's default does."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks these annotations: leave them out
            self.add("all_reduce (DDP bucket)", "all_reduce", _nbytes(bucket.buffer()))
            was, self.active = self.active, False  # the default hook calls dist.all_reduce: count it once
            try:
                return default_hooks.allreduce_hook(state, bucket)
            finally:
                self.active = was

        return hook


def _arg(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs[name]


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size())


def _list_bytes(ts: Sequence[Any]) -> int:
    return sum(_nbytes(t) for t in ts)


def _local(t: Any) -> Any:
    """The local tensor of a DTensor (FSDP2's sharded parameters, gradients and states), else ``t``."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def _add_storage(seen: dict[int, int], t: Any) -> None:
    torch = _torch()
    if t is None or not isinstance(t, torch.Tensor):
        return
    st = _local(t).untyped_storage()
    if st.nbytes() == 0:  # FSDP2 frees unsharded parameters by resizing their storage to 0
        return
    seen[st.data_ptr()] = st.nbytes()


def _fsdp_params(model: Any) -> list[Any]:
    out = []
    for m in model.modules():
        state = getattr(m, "_get_fsdp_state", None)
        if state is None:
            continue
        group = state()._fsdp_param_group
        if group is not None:
            out.extend(group.fsdp_params)
    return out


def state_bytes(model: Any, optimizer: Any) -> dict[str, int]:
    """Bytes of the distinct storages this rank holds for parameters, gradients and optimizer states.

    Introduced in Chapter 6. Local shards only (the local tensor of a DTensor); a storage shared by several
    tensors (DDP's gradient buckets, FSDP2's padded shards) counts once. With FSDP2 the unsharded
    (all-gathered) parameters and gradients count too while they exist. The optimizer's ``step`` counters
    (scalars) are excluded, as in :mod:`memlib.measure.trace`.

    Limitation: FSDP2's shards and gathered buffers are read from its internals (``FSDPParam`` attributes
    ``_sharded_param_data``, ``_unsharded_param``, ``all_gather_outputs``, ``unsharded_accumulated_grad``
    in torch 2.13); tests/test_distributed.py checks the counts against the ZeRO formulas.

    Returns:
        ``{"params": ..., "grads": ..., "optimizer": ...}`` in bytes.
    """
    params: dict[int, int] = {}
    grads: dict[int, int] = {}
    opt: dict[int, int] = {}
    for p in model.parameters():
        _add_storage(params, p)
        _add_storage(grads, p.grad)
    for fp in _fsdp_params(model):
        _add_storage(params, fp._sharded_param_data)
        _add_storage(grads, fp.sharded_param.grad)
        unsharded = getattr(fp, "_unsharded_param", None)
        if unsharded is not None:
            _add_storage(params, unsharded)
            _add_storage(grads, unsharded.grad)
        for t in getattr(fp, "all_gather_outputs", []) or []:
            _add_storage(params, t)
        _add_storage(grads, getattr(fp, "unsharded_accumulated_grad", None))
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer wraps the local optimizer
    for st in inner.state.values():
        for key, t in st.items():
            if key != "step":
                _add_storage(opt, t)
    return {"params": sum(params.values()), "grads": sum(grads.values()), "optimizer": sum(opt.values())}


class _PeakMeter:
    """Samples :func:`state_bytes` at every module boundary (forward and backward) and keeps the peak."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        self.model, self.optimizer = model, optimizer
        self.active = False
        self.peak = 0
        self.peak_by: dict[str, int] = {"params": 0, "grads": 0, "optimizer": 0}
        self.handles: list[Any] = []
        for m in model.modules():
            self.handles.append(m.register_forward_pre_hook(lambda mod, args: self.sample()))
            self.handles.append(m.register_forward_hook(self._after_forward))

    def _after_forward(self, mod: Any, args: Any, out: Any) -> None:
        torch = _torch()
        self.sample()
        if not self.active:
            return
        from torch.utils._pytree import tree_leaves

        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(self._grad_hook)

    def _grad_hook(self, grad: Any) -> None:
        self.sample()

    def sample(self) -> None:
        if not self.active:
            return
        b = state_bytes(self.model, self.optimizer)
        total = sum(b.values())
        if total > self.peak:
            self.peak, self.peak_by = total, b

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _batch(step: int, rank: int, batch_size: int, seq_len: int, vocab: int, seed: int) -> Any:
    torch = _torch()
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    return torch.randint(0, vocab, (batch_size, seq_len), generator=g)  # (B, T)


def _build(config: dict[str, Any], seed: int, device: Any) -> Any:
    torch = _torch()
    from .trace import build_model

    torch.manual_seed(seed)
    model = build_model(config, device="cpu", dtype="fp32", attention="sdpa")
    return model.to(device)


def train_rank(strategy: str, *, config: dict[str, Any] | None = None, steps: int = 3, batch_size: int = 2,
               seq_len: int = 32, seed: int = 0) -> RankResult:
    """Train the model a few steps with ``strategy`` in an initialized process group; measure this rank.

    Introduced in Chapter 6. Every rank builds the same model from the same seed and trains on its own
    batch (seeded by step and rank); AdamW (lr 1e-2, fp32). The last step is measured: collectives, the
    peak of model-state bytes; the states themselves after its backward (gradients) and step (the rest).

    Args:
        strategy: ``ddp``, ``zero1``, ``zero2`` (fully_shard, reshard_after_forward=False) or ``zero3``.
        config: transformers config dict (default :data:`TINY_LLAMA`).
        steps: optimizer steps (≥ 2: the first one initializes lazily-created states and buffers).
        batch_size: sequences per rank.
        seq_len: tokens per sequence.
        seed: model and data seed.

    Returns:
        This rank's :class:`RankResult`.
    """
    check_choice("strategy", strategy, STRATEGIES)
    if check_positive("steps", steps) < 2:
        raise MemlibError(f"steps must be ≥ 2 (the last step is measured after a warm-up step), got {steps}")
    torch = _torch()
    dist = torch.distributed
    if not dist.is_initialized():
        raise MemlibError("train_rank needs an initialized process group (use run_sharded or torchrun)")
    config = dict(config or TINY_LLAMA)
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.get_backend()
    cuda = backend == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    model = _build(config, seed, device)
    num_params = sum(p.numel() for p in model.parameters())
    counter = CommCounter(world)
    if strategy in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, device_ids=[device.index] if cuda else None, gradient_as_bucket_view=True)
        ddp.register_comm_hook(None, counter.ddp_hook_fn())
        net = ddp
        if strategy == "ddp":
            opt = torch.optim.AdamW(model.parameters(), lr=_LR, foreach=False)
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=_LR,
                                          foreach=False)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))
        reshard = strategy == "zero3"
        inner = model.model
        fully_shard(inner.embed_tokens, mesh=mesh, reshard_after_forward=reshard)
        for layer in inner.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model.lm_head, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)  # root: the final norm
        net = model
        opt = torch.optim.AdamW(model.parameters(), lr=_LR, foreach=False)
    meter = _PeakMeter(model, opt)
    losses: list[float] = []
    grads_after_backward: dict[str, int] = {}
    cuda_peak = None
    try:
        for step in range(steps):
            last = step == steps - 1
            x = _batch(step, rank, batch_size, seq_len, config["vocab_size"], seed).to(device)
            if last:
                counter.reset()
                counter.active = meter.active = True
                meter.peak = 0
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
            with counter.patched():
                loss = net(input_ids=x, labels=x).loss
                loss.backward()
                meter.sample()
                if last:
                    grads_after_backward = state_bytes(model, opt)
                opt.step()
                meter.sample()
            if last:
                counter.active = meter.active = False
                if cuda:
                    torch.cuda.synchronize()
                    cuda_peak = int(torch.cuda.max_memory_allocated())
                after_step = state_bytes(model, opt)
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
    finally:
        meter.remove()
    return RankResult(
        strategy=strategy, rank=rank, world_size=world, num_params=num_params,
        params_bytes=after_step["params"], grads_bytes=grads_after_backward["grads"],
        optimizer_bytes=after_step["optimizer"], peak_bytes=meter.peak, peak_by_category=dict(meter.peak_by),
        losses=losses, comm={k: list(v) for k, v in counter.records.items()}, comm_bus_bytes=counter.bus_bytes,
        backend=backend, device=device.type, cuda_peak_bytes=cuda_peak,
    )


_PRELOAD = ["torch", "torch.distributed.fsdp", "transformers.models.llama.modeling_llama", "memlib.measure.distributed"]


def _start_method() -> str:
    """``forkserver`` with torch and transformers preloaded (each worker then starts in a fraction of a second
    instead of importing them anew), else ``spawn``. Never plain ``fork``: the parent may hold threads."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():  # pragma: no cover - Windows
        return "spawn"
    multiprocessing.get_context("forkserver").set_forkserver_preload(_PRELOAD)
    return "forkserver"


def _worker(rank: int, world_size: int, init_file: str, out_dir: str, strategies: list[str],
            kwargs: dict[str, Any], timeout_s: float) -> None:
    """Body of one spawned process: join the gloo group, run every strategy, write the results as JSON."""
    dist = join_gloo_group(_torch(), rank, world_size, init_file, out_dir, timeout_s)  # output to rank<r>.log
    try:
        results = [train_rank(s, **kwargs).as_dict() for s in strategies]
        dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))


def run_sharded(world_size: int = 2, strategies: Sequence[str] = STRATEGIES, *,
                config: dict[str, Any] | None = None, steps: int = 3, batch_size: int = 2, seq_len: int = 32,
                seed: int = 0, timeout_s: float = 120.0) -> dict[str, ShardedRun]:
    """Spawn ``world_size`` gloo processes on this machine and train with each strategy; collect the results.

    Introduced in Chapter 6. The processes start from a fork server that has imported torch and transformers
    once, rendezvous through a temporary file (a ``file://`` store: no port to pick, so no port clash between
    concurrent runs), each runs every strategy in turn, and writes its results to a temporary
    directory. If they have not finished within ``timeout_s`` they are killed and :class:`MemlibError` is
    raised; an exception in a worker is re-raised here with its traceback.

    Args:
        world_size: number of processes (ranks).
        strategies: subset of :data:`STRATEGIES`.
        config: transformers config dict (default :data:`TINY_LLAMA`).
        steps, batch_size, seq_len, seed: passed to :func:`train_rank`.
        timeout_s: wall-clock limit for the whole run (also the collectives' timeout).

    Returns:
        ``{strategy: ShardedRun}``.
    """
    torch = _torch()
    import torch.multiprocessing as mp

    n = check_positive("world_size", world_size)
    for s in strategies:
        check_choice("strategy", s, STRATEGIES)
    kwargs = {"config": dict(config or TINY_LLAMA), "steps": steps, "batch_size": batch_size,
              "seq_len": seq_len, "seed": seed}
    with tempfile.TemporaryDirectory(prefix="memlib_dist_") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        ctx = mp.start_processes(_worker, args=(n, init_file, tmp, list(strategies), kwargs, timeout_s),
                                 nprocs=n, join=False, start_method=_start_method())
        try:
            join_with_deadline(ctx, timeout_s, f"distributed run with {n} processes")
        except TimeoutError as err:
            raise MemlibError(str(err)) from None
        per_rank = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(n)]
    settings = {**kwargs, "world_size": n, "backend": "gloo"}
    return {s: ShardedRun(s, n, [RankResult(**per_rank[r][i]) for r in range(n)], settings)
            for i, s in enumerate(strategies)}


def build_parser() -> argparse.ArgumentParser:
    """The arguments of ``python -m memlib.measure.distributed``: the flag names of ``memlib train``."""
    ap = OneLineParser(prog="python -m memlib.measure.distributed", description=main.__doc__)
    ap.add_argument("--zero", type=int, nargs="+", choices=ZERO_STAGES, default=None,
                    help="ZeRO stages to run: 0 DDP, 1 ZeroRedundancyOptimizer, 2 and 3 FSDP2 (default: all)")
    ap.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=None, help=argparse.SUPPRESS)  # old name
    ap.add_argument("--steps", type=positive_int, default=3, help="training steps, ≥ 2 (default 3)")
    ap.add_argument("--batch", "--batch-size", dest="batch", type=positive_int, default=2, help="default 2")
    ap.add_argument("--seq", "--seq-len", dest="seq", type=positive_int, default=32,
                    help=f"sequence length, at most {TINY_LLAMA['max_position_embeddings']} (default 32)")
    ap.add_argument("--gpus", type=positive_int, default=2, help="processes to spawn without torchrun (default 2)")
    ap.add_argument("--world-size", dest="gpus", type=positive_int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here (default: print it)")
    return ap


def _strategies(args: argparse.Namespace) -> list[str]:
    """The strategies asked for, validated as ``memlib train`` validates its settings (a TrainingSetup each)."""
    from ..core.configs import check_seq_len, load_config
    from ..core.setup import TrainingSetup
    if args.zero is not None and args.strategies is not None:
        raise MemlibError("give --zero or --strategies, not both")
    strategies = args.strategies or [STRATEGIES[z] for z in (args.zero if args.zero is not None else ZERO_STAGES)]
    for s in strategies:
        TrainingSetup(batch_size=args.batch, seq_len=args.seq, zero_stage=STRATEGY_STAGE[s], num_gpus=args.gpus,
                      framework="fsdp2" if STRATEGY_STAGE[s] >= 2 else "pytorch")  # ddp, zero1: plain PyTorch
    check_seq_len(load_config(TINY_LLAMA), args.seq)
    if args.steps < 2:
        raise MemlibError(f"steps must be ≥ 2 (the last step is measured after a warm-up step), got {args.steps}")
    return list(strategies)


def main(argv: Sequence[str] | None = None) -> int:
    """``torchrun --nproc-per-node N -m memlib.measure.distributed [--out F]``: every strategy, NCCL on GPUs.

    Without ``torchrun`` (no ``RANK`` in the environment) it spawns ``--gpus`` gloo processes on CPU instead.
    Rank 0 writes the results (JSON, with device name, torch version and date) to ``--out``. Flags and checks
    are ``memlib train``'s; bad input exits with status 2 and one line on stderr.
    """
    args = build_parser().parse_args(argv)
    try:
        return _main(args, _strategies(args))
    except MemlibError as e:
        print(f"memlib.measure.distributed: error: {e}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace, strategies: list[str]) -> int:
    torch = _torch()
    kwargs = {"steps": args.steps, "batch_size": args.batch, "seq_len": args.seq}
    meta: dict[str, Any] = {"torch": torch.__version__, "date": time.strftime(DATE_FORMAT, time.gmtime())}
    if "RANK" not in os.environ:
        runs = run_sharded(args.gpus, strategies, **kwargs)
        payload = {**meta, "device": "cpu", "runs": {s: r.as_dict() for s, r in runs.items()}}
    else:
        dist = torch.distributed
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=300))
        try:
            results = [train_rank(s, **kwargs).as_dict() for s in strategies]
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, results)
        finally:
            dist.destroy_process_group()
        if int(os.environ["RANK"]) != 0:
            return 0
        world = len(gathered)
        meta["device"] = torch.cuda.get_device_name() if cuda else "cpu"
        payload = {**meta, "runs": {s: {"strategy": s, "world_size": world,
                                        "ranks": [gathered[r][i] for r in range(world)],
                                        "settings": {**kwargs, "world_size": world}}
                                    for i, s in enumerate(strategies)}}
    text = json.dumps(payload, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
