"""Tensor, sequence, pipeline, context and expert parallelism, run for real on CPU gloo processes (Chapter 15).

One spawn of ``world_size`` processes (a fork server with torch and transformers preloaded, rendezvous through a
``file://`` store, as :mod:`memlib.measure.distributed`) runs each technique in turn on a tiny model and reports per rank:

* ``tp`` / ``sp``: DTensor tensor parallelism (``parallelize_module`` with ``ColwiseParallel`` /
  ``RowwiseParallel``, plus ``SequenceParallel`` norms) on the tiny transformers Llama: the local parameter bytes,
  the bytes the decoder layers save for backward, and the collectives' bytes;
* ``pp``: ``torch.distributed.pipelining`` (``PipelineStage`` with ``ScheduleGPipe`` and ``Schedule1F1B``): each
  stage's peak of saved activation bytes over a step, and the bubble (each stage's forward and backward take a
  fixed time, slept rather than computed, so the idle fraction does not depend on the CPU);
* ``cp``: context parallelism as Llama 3 trains it: each rank keeps s/cp tokens and all-gathers K and V (autograd
  through ``all_gather_tensor_autograd``); PyTorch's experimental ring ``context_parallel`` is not used here;
* ``ep``: a tiny MoE layer whose experts are split over the ranks, tokens sent to them and back with
  ``all_to_all_single``; the output is checked against the same layer on one process.

Saved activations and collectives are counted by :mod:`memlib.measure.parallel_counters` (``SavedBytes``,
``CommCounter``). torch is imported lazily.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import MemlibError, check_choice, check_positive
from .deps import require_torch
from .parallel_counters import CommCounter, SavedBytes, local_tensor, nbytes
from .procs import join_gloo_group, join_with_deadline

__all__ = ["TECHNIQUES", "TINY_PP_LLAMA", "ParallelResult", "ParallelRuns", "Comparison", "SavedBytes",
           "run_parallel", "moe_expert_params", "BUBBLE_TOLERANCE"]

#: Absolute tolerance of the measured pipeline bubble against (p−1)/(m+p−1): gloo's point-to-point latency and
#: Python overhead on a loaded CPU lengthen the step beyond the slept compute.
BUBBLE_TOLERANCE = 0.15

TECHNIQUES = ("tp", "sp", "pp", "cp", "ep")
"""What :func:`run_parallel` can run: tensor, sequence, pipeline, context and expert parallelism."""

TINY_PP_LLAMA: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
"""Chapter 6's tiny Llama with 4 layers (2 per stage with 2 pipeline stages, 1 with 4)."""

_PRELOAD = ["torch", "torch.distributed.tensor.parallel", "torch.distributed.pipelining",
            "transformers.models.llama.modeling_llama", "memlib.measure.parallel"]


def _torch() -> Any:
    return require_torch("memlib.measure.parallel")


@dataclass(frozen=True)
class ParallelResult:
    """What one rank measured for one technique. Introduced in Chapter 15.

    Attributes:
        technique: ``tp``, ``sp``, ``pp-gpipe``, ``pp-1f1b``, ``cp`` or ``ep``.
        rank: this process's rank (the pipeline stage for ``pp``).
        world_size: processes.
        params_bytes: local parameter bytes (the rank's shards or stage; the expert weights for ``ep``).
        saved_bytes: bytes saved for backward, at the peak (``pp``: over the step; others: after the forward),
            in the part measured (decoder layers for ``tp``/``sp``, the attention for ``cp``, the MoE layer
            for ``ep``).
        comm: ``{collective: [calls, bytes of the full tensors, bytes sent by this rank]}``.
        extra: technique-specific numbers (``busy_s``/``step_s`` for the bubble, ``max_abs_diff`` checks).
    """

    technique: str
    rank: int
    world_size: int
    params_bytes: int
    saved_bytes: int
    comm: dict[str, list[int]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def _build(config: dict[str, Any], seed: int) -> Any:
    torch = _torch()
    from .trace import build_model

    torch.manual_seed(seed)
    return build_model(config, device="cpu", dtype="fp32", attention="sdpa")


def _batch(batch_size: int, seq_len: int, vocab: int, seed: int) -> Any:
    torch = _torch()
    g = torch.Generator().manual_seed(seed + 17)
    return torch.randint(0, vocab, (batch_size, seq_len), generator=g)  # (B, T)


def _param_bytes(model: Any) -> int:
    seen: dict[int, int] = {}
    for p in model.parameters():
        st = local_tensor(p).untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _tp_rank(sp: bool, config: dict[str, Any], batch_size: int, seq_len: int, seed: int) -> ParallelResult:
    """Tensor (and sequence) parallelism with DTensor on the tiny Llama; the decoder layers are measured."""
    torch = _torch()
    dist = torch.distributed
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    rank, world = dist.get_rank(), dist.get_world_size()
    ids = _batch(batch_size, seq_len, config["vocab_size"], seed)
    reference = _build(config, seed)
    ref_loss = reference(input_ids=ids, labels=ids).loss.detach()
    model = _build(config, seed)
    mesh = init_device_mesh("cpu", (world,))
    seq = Shard(1)
    if sp:  # torchtitan's plan: the residual stream stays sharded along the sequence between the layers
        top = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq,
                                                     use_local_output=False),
               "model.norm": SequenceParallel(),
               "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Replicate())}
    else:
        top = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
               "lm_head": ColwiseParallel(output_layouts=Replicate())}
    parallelize_module(model, mesh, top)
    inp = seq if sp else Replicate()
    for layer in model.model.layers:
        plan: dict[str, Any] = {
            "self_attn.q_proj": ColwiseParallel(input_layouts=inp), "self_attn.k_proj": ColwiseParallel(input_layouts=inp),
            "self_attn.v_proj": ColwiseParallel(input_layouts=inp),
            "self_attn.o_proj": RowwiseParallel(output_layouts=inp, use_local_output=not sp),
            "mlp.gate_proj": ColwiseParallel(input_layouts=inp), "mlp.up_proj": ColwiseParallel(input_layouts=inp),
            "mlp.down_proj": RowwiseParallel(output_layouts=inp, use_local_output=not sp)}
        if sp:
            plan["input_layernorm"] = SequenceParallel()
            plan["post_attention_layernorm"] = SequenceParallel()
        parallelize_module(layer, mesh, plan)
    saved = SavedBytes(exclude=list(model.parameters()))
    saved.enabled = False

    def on(mod: Any, args: Any, kwargs: Any) -> None:
        saved.enabled = True

    def off(mod: Any, args: Any, kwargs: Any, out: Any) -> None:
        saved.enabled = False

    handles = []
    for layer in model.model.layers:
        handles.append(layer.register_forward_pre_hook(on, with_kwargs=True))
        handles.append(layer.register_forward_hook(off, with_kwargs=True))
    comm = CommCounter(world)
    with saved.hooks():
        loss = model(input_ids=ids, labels=ids).loss
        layers_saved = saved.peak
        with comm.counting():
            loss2 = loss * 1.0
            loss2.backward()
    for h in handles:
        h.remove()
    # the forward's collectives, counted on a second forward pass (nothing saved)
    fwd = CommCounter(world)
    with torch.no_grad(), fwd.counting():
        model(input_ids=ids, labels=ids)
    comm_all = {k: list(v) for k, v in fwd.records.items()}
    for k, v in comm.records.items():
        rec = comm_all.setdefault(k, [0, 0, 0])
        for i in range(3):
            rec[i] += v[i]
    diff = float((loss.detach() - ref_loss).abs())
    return ParallelResult("sp" if sp else "tp", rank, world, _param_bytes(model), layers_saved, comm_all,
                          {"loss_matches_one_process": diff < 1e-4, "skipped": sorted(set(saved.skipped))})


def _timing_fns() -> tuple[Any, Any]:
    """Two autograd identities that time a stage's backward and pad it to a fixed duration: ``Start`` (at the
    stage's output, the first thing its backward runs) notes the time; ``End`` (at its input, the last) sleeps
    until the backward has lasted ``seconds`` and adds the time to the stage's busy clock."""
    torch: Any = _torch()

    class Start(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, clock: list[float]) -> Any:
            ctx.clock = clock
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            ctx.clock[1] = time.perf_counter()
            return grad, None

    class End(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, seconds: float, clock: list[float]) -> Any:
            ctx.seconds, ctx.clock = seconds, clock
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            time.sleep(max(0.0, ctx.seconds - (time.perf_counter() - ctx.clock[1])))
            ctx.clock[0] += time.perf_counter() - ctx.clock[1]
            return grad, None, None

    return Start, End


def _stage_module(model: Any, layers: range, first: bool, last: bool, t_fwd: float, clock: list[float]) -> Any:
    torch: Any = _torch()
    start, end = _timing_fns()

    class Stage(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed: Any = model.model.embed_tokens if first else None
            self.layers = torch.nn.ModuleList([model.model.layers[i] for i in layers])
            self.rotary = model.model.rotary_emb
            self.norm: Any = model.model.norm if last else None
            self.head: Any = model.lm_head if last else None

        def forward(self, x: Any) -> Any:
            t0 = time.perf_counter()
            h = self.embed(x) if self.embed is not None else x  # (B, T, C)
            h = end.apply(h, 2 * t_fwd, clock)  # the backward ends here
            pos = torch.arange(h.shape[1]).unsqueeze(0)
            cos_sin = self.rotary(h, pos)
            for layer in self.layers:
                out = layer(h, attention_mask=None, position_ids=pos, position_embeddings=cos_sin)
                h = out[0] if isinstance(out, tuple) else out
            if self.head is not None:
                h = self.head(self.norm(h))  # (B, T, V)
            time.sleep(max(0.0, t_fwd - (time.perf_counter() - t0)))
            clock[0] += time.perf_counter() - t0
            return start.apply(h, clock)  # the backward starts here

    return Stage()


def _pp_rank(schedule: str, config: dict[str, Any], batch_size: int, seq_len: int, micro_batches: int, seed: int,
             t_fwd: float) -> ParallelResult:
    """One pipeline stage per rank; the step's peak of saved bytes and the busy time against the step's."""
    torch = _torch()
    dist = torch.distributed
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from ..core.parallel import stage_layers

    rank, world = dist.get_rank(), dist.get_world_size()
    model = _build(config, seed)
    counts = stage_layers(config["num_hidden_layers"], world)
    start = sum(counts[:rank])
    clock = [0.0, 0.0]  # busy seconds, start of the current backward
    module = _stage_module(model, range(start, start + counts[rank]), rank == 0, rank == world - 1, t_fwd, clock)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))

    def loss_fn(logits: Any, target: Any) -> Any:
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())

    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    sched = cls(stage, n_microbatches=micro_batches, loss_fn=loss_fn)
    ids = _batch(batch_size * micro_batches, seq_len, config["vocab_size"], seed)
    saved = SavedBytes(exclude=list(module.parameters()))

    def step() -> None:
        if rank == 0:
            sched.step(ids)
        elif rank == world - 1:
            sched.step(target=ids)
        else:
            sched.step()

    step()  # warm-up: shapes are exchanged on the first step
    module.zero_grad(set_to_none=True)
    comm = CommCounter(world)
    dist.barrier()
    clock[0] = 0.0
    with saved.hooks(), comm.counting():
        t0 = time.perf_counter()
        step()
        elapsed = time.perf_counter() - t0
    dist.barrier()
    return ParallelResult(f"pp-{schedule}", rank, world, _param_bytes(module), saved.peak,
                          {k: list(v) for k, v in comm.records.items()},
                          {"busy_s": clock[0], "step_s": elapsed, "layers": counts[rank],
                           "micro_batches": micro_batches})


def _cp_rank(config: dict[str, Any], batch_size: int, seq_len: int, seed: int) -> ParallelResult:
    """Context parallelism with all-gathered K/V (Llama 3's variant) on one attention block: each rank keeps
    s/cp query tokens and all-gathers K and V; checked against the whole sequence on one process."""
    torch = _torch()
    dist = torch.distributed
    from torch.distributed._functional_collectives import all_gather_tensor_autograd

    rank, world = dist.get_rank(), dist.get_world_size()
    h, a, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    d = h // a
    torch.manual_seed(seed)
    wq, wk, wv, wo = (torch.nn.Linear(h, n, bias=False) for n in (a * d, kv * d, kv * d, h))
    params = [wq.weight, wk.weight, wv.weight, wo.weight]
    x_full = torch.randn(batch_size, seq_len, h, generator=torch.Generator().manual_seed(seed + 1))  # (B, T, C)
    s_loc = seq_len // world
    F = torch.nn.functional

    def attend(x: Any, k_all: Any, v_all: Any, offset: int) -> Any:
        b, t, _ = x.shape
        q = wq(x).view(b, t, a, d).transpose(1, 2)  # (B, a, t, d)
        k = k_all.view(b, -1, kv, d).transpose(1, 2)  # (B, a_kv, s, d): whole sequence
        v = v_all.view(b, -1, kv, d).transpose(1, 2)
        rows = torch.arange(offset, offset + t).unsqueeze(1)
        mask = rows >= torch.arange(k.shape[2]).unsqueeze(0)  # causal, (t, s)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return wo(o.transpose(1, 2).reshape(b, t, a * d))

    with torch.no_grad():
        ref = attend(x_full, wk(x_full), wv(x_full), 0)
    x = x_full[:, rank * s_loc:(rank + 1) * s_loc].clone().requires_grad_(True)
    saved = SavedBytes(exclude=params)
    comm = CommCounter(world)
    with saved.hooks(), comm.counting():
        k_all = all_gather_tensor_autograd(wk(x), gather_dim=1, group=dist.group.WORLD)
        v_all = all_gather_tensor_autograd(wv(x), gather_dim=1, group=dist.group.WORLD)
        out = attend(x, k_all, v_all, rank * s_loc)
        peak = saved.peak
        out.sum().backward()
    diff = float((out.detach() - ref[:, rank * s_loc:(rank + 1) * s_loc]).abs().max())
    return ParallelResult("cp", rank, world, sum(nbytes(p) for p in params), peak,
                          {k: list(v) for k, v in comm.records.items()}, {"matches_one_process": diff < 1e-5})


def moe_expert_params(hidden_size: int, expert_size: int) -> int:
    """Parameters of one expert of the tiny MoE (a SwiGLU MLP: gate, up, down, no biases)."""
    return 3 * hidden_size * expert_size


def _ep_rank(num_experts: int, top_k: int, hidden: int, expert_size: int, tokens: int, seed: int) -> ParallelResult:
    """Expert parallelism on a tiny MoE layer: route, all-to-all to the experts' ranks, compute, all-to-all back.

    Each rank sends every destination rank a fixed capacity of k·tokens/ep slots (unused slots zero), so the
    buffers have the size :func:`memlib.core.parallel.expert_parallel_bytes` gives with capacity factor 1 when the
    routing is balanced; the router here is a fixed balanced assignment (token i to experts i mod E, ...).
    """
    torch = _torch()
    dist = torch.distributed
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    rank, world = dist.get_rank(), dist.get_world_size()
    local = num_experts // world
    torch.manual_seed(seed)
    experts = [torch.nn.ModuleDict({"gate": torch.nn.Linear(hidden, expert_size, bias=False),
                                    "up": torch.nn.Linear(hidden, expert_size, bias=False),
                                    "down": torch.nn.Linear(expert_size, hidden, bias=False)})
               for _ in range(num_experts)]
    mine = experts[rank * local:(rank + 1) * local]
    F = torch.nn.functional

    def expert(e: Any, x: Any) -> Any:
        return e["down"](F.silu(e["gate"](x)) * e["up"](x))

    g = torch.Generator().manual_seed(seed + 100)
    xs = [torch.randn(tokens, hidden, generator=g) for _ in range(world)]  # every rank's tokens (T, C)
    x = xs[rank].clone().requires_grad_(True)
    # balanced routing: token i of rank r goes to experts (i + r + j) mod E, j < k, weight 1/k
    def route(r: int) -> list[list[int]]:
        return [[(i + r + j) % num_experts for j in range(top_k)] for i in range(tokens)]

    with torch.no_grad():  # one process, every expert: the reference output of this rank's tokens
        ref = torch.stack([sum(expert(experts[e], xs[rank][i]) for e in row) / top_k
                           for i, row in enumerate(route(rank))])
    cap = top_k * tokens // world  # slots per destination rank
    dest = route(rank)
    send_idx: list[list[tuple[int, int]]] = [[] for _ in range(world)]  # (token, expert) per destination
    for i, row in enumerate(dest):
        for e in row:
            send_idx[e // local].append((i, e))
    if any(len(s) > cap for s in send_idx):
        raise MemlibError(f"routing exceeds the capacity of {cap} slots per rank")
    buf = torch.zeros(world * cap, hidden)
    send = buf.index_add(0, torch.tensor([r * cap + j for r in range(world) for j in range(len(send_idx[r]))]),
                         x[torch.tensor([i for r in range(world) for i, _ in send_idx[r]])])
    comm = CommCounter(world)
    saved = SavedBytes(exclude=[p for e in mine for p in e.parameters()])
    with saved.hooks(), comm.counting():
        recv = all_to_all_single_autograd(send, None, None, dist.group.WORLD)  # (ep·cap, C) dispatch
        # which local expert each received slot is for: every rank's routing is known (deterministic)
        outs = torch.zeros_like(recv)
        slot_expert = []
        for src in range(world):
            mine_slots = [e for row in route(src) for e in row if e // local == rank]
            slot_expert += mine_slots + [-1] * (cap - len(mine_slots))
        pieces = []
        for j, e in enumerate(slot_expert):
            pieces.append(expert(experts[e], recv[j]) if e >= 0 else outs[j])
        y = torch.stack(pieces)
        back = all_to_all_single_autograd(y, None, None, dist.group.WORLD)  # (ep·cap, C) combine
        out = torch.zeros(tokens, hidden).index_add(
            0, torch.tensor([i for r in range(world) for i, _ in send_idx[r]]),
            back[torch.tensor([r * cap + j for r in range(world) for j in range(len(send_idx[r]))])]) / top_k
        peak = saved.peak
        out.sum().backward()
    diff = float((out.detach() - ref).abs().max())
    params = sum(nbytes(p) for e in mine for p in e.parameters())
    return ParallelResult("ep", rank, world, params, peak, {k: list(v) for k, v in comm.records.items()},
                          {"matches_one_process": diff < 1e-5, "send_buffer_bytes": nbytes(send),
                           "recv_buffer_bytes": nbytes(recv), "capacity": cap})


@dataclass(frozen=True)
class Comparison:
    """One measured number beside memlib's estimate. Introduced in Chapter 15.

    Attributes:
        technique: ``tp``, ``sp``, ``pp-gpipe``, ``pp-1f1b``, ``cp`` or ``ep``.
        what: the quantity (``"params, rank 0"``, ``"saved activations, stage 1"``...).
        measured: the measured value (bytes; a fraction for the bubble).
        estimated: memlib's value.
        tolerance: the relative tolerance (absolute for the bubble).
        source: the memlib function the estimate comes from.
    """

    technique: str
    what: str
    measured: float
    estimated: float
    tolerance: float
    source: str

    @property
    def match(self) -> bool:
        """Within the tolerance (relative; absolute for fractions below 1)."""
        if self.what.startswith("bubble"):
            return abs(self.measured - self.estimated) <= self.tolerance
        return abs(self.measured - self.estimated) <= self.tolerance * max(abs(self.estimated), 1)


@dataclass(frozen=True)
class ParallelRuns:
    """Every technique's per-rank results and the settings they ran with; :meth:`comparisons` sets them beside
    memlib's estimates. Introduced in Chapter 15."""

    results: dict[str, list[ParallelResult]]
    settings: dict[str, Any]

    def comparisons(self) -> list[Comparison]:
        """Measured against estimated, per technique (see Chapter 15 for each formula)."""
        from ..core.configs import load_config
        from ..core.estimate import activation_terms
        from ..core.parallel import (Layout, bubble_fraction, comm_bytes_per_layer, column_linears,
                               cp_allgather_attention_bytes, expert_parallel_bytes, in_flight, split_terms,
                               sp_gathered_extra_bytes, stage_layers, stage_params)

        st = self.settings
        n, b, s, e = st["world_size"], st["batch_size"], st["seq_len"], 4  # fp32 on CPU
        rows: list[Comparison] = []
        for tech in ("tp", "sp"):
            if tech not in self.results:
                continue
            cfg = load_config(dict(st["config"]))
            sp = tech == "sp"
            r0 = self.results[tech][0]
            terms = activation_terms(cfg, batch_size=b, seq_len=s, precision="fp32", attention="sdpa")
            per_layer = split_terms(terms, n, sp)[0] + (sp_gathered_extra_bytes(cfg, b, s, n, e) if sp else 0)
            act = e * b * s * cfg.hidden_size
            ncol = column_linears(cfg)
            layers = cfg.num_layers * comm_bytes_per_layer(cfg, b, s, Layout(tp=n, sequence_parallel=sp), e,
                                                           ncol)["tp"]
            # outside the layers: the embedding's output and the LM head's input gradient (all-reduce, or
            # reduce-scatter + all-gather each way with SP) and the all-gathered logits
            outside = ((4 * act if sp else 2 * 2 * act) + e * b * s * cfg.vocab_size) * (n - 1) // n
            sent = sum(v[2] for v in r0.comm.values())
            rows += [Comparison(tech, "params per rank", r0.params_bytes, e * stage_params(cfg, n, 1)[0], 0.0,
                                "parallel.stage_params"),
                     Comparison(tech, "saved activations, decoder layers", r0.saved_bytes,
                                cfg.num_layers * per_layer, 0.05,
                                "parallel.split_terms" + (" + sp_gathered_extra_bytes" if sp else "")),
                     Comparison(tech, "bytes sent by collectives", sent, layers + outside, 0.0,
                                "parallel.comm_bytes_per_layer")]
        for sched in ("gpipe", "1f1b"):
            key = f"pp-{sched}"
            if key not in self.results:
                continue
            cfg = load_config(dict(st["pp_config"]))
            m = st["micro_batches"]
            terms = activation_terms(cfg, batch_size=b, seq_len=s, precision="fp32", attention="sdpa")
            per_layer, first, last = split_terms(terms, 1, False)
            counts = stage_layers(cfg.num_layers, n)
            runs = self.results[key]
            span = max(r.extra["step_s"] for r in runs)
            for r in runs:
                i = r.rank
                outside = (first if i == 0 else 0) + (last if i == n - 1 else 0)
                est = in_flight(n, m, sched, i) * (counts[i] * per_layer + outside)
                rows.append(Comparison(key, f"peak saved activations, stage {i}", r.saved_bytes, est, 0.02,
                                       "parallel.in_flight × split_terms"))
            busy = sum(r.extra["busy_s"] for r in runs) / len(runs)
            rows.append(Comparison(key, "bubble (idle fraction of the step)", 1 - busy / span,
                                   bubble_fraction(n, m, sched), BUBBLE_TOLERANCE, "parallel.bubble_fraction"))
            rows.append(Comparison(key, "bytes sent point-to-point, stage 0", runs[0].comm.get("send (p2p)", [0, 0, 0])[2],
                                   m * e * b * s * cfg.hidden_size, 0.0, "m·e·bsh"))
        if "cp" in self.results:
            cfg = load_config(dict(st["config"]))
            r0 = self.results["cp"][0]
            kv = 2 * e * b * s * cfg.kv_dim
            rows += [Comparison("cp", "saved activations, attention", r0.saved_bytes,
                                cp_allgather_attention_bytes(cfg, b, s, n, e), 0.0,
                                "parallel.cp_allgather_attention_bytes"),
                     Comparison("cp", "bytes sent by collectives", sum(v[2] for v in r0.comm.values()),
                                2 * kv * (n - 1) // n, 0.0, "K, V all-gathered, their gradients reduce-scattered")]
        if "ep" in self.results:
            r0 = self.results["ep"][0]
            h, f = st["config"]["hidden_size"], st["config"]["intermediate_size"]
            ep = expert_parallel_bytes(num_experts=st["num_experts"], expert_params=moe_expert_params(h, f), ep=n,
                                       tokens=st["tokens"], hidden_size=h, top_k=st["top_k"], param_bytes=e,
                                       act_bytes=e)
            rows += [Comparison("ep", "expert weights per rank", r0.params_bytes, ep["expert_weights_bytes"], 0.0,
                                "parallel.expert_parallel_bytes"),
                     Comparison("ep", "all-to-all buffers (send + receive)",
                                r0.extra["send_buffer_bytes"] + r0.extra["recv_buffer_bytes"], ep["a2a_buffer_bytes"],
                                0.0, "parallel.expert_parallel_bytes"),
                     Comparison("ep", "bytes sent by all-to-all (dispatch, combine; fwd + bwd)",
                                r0.comm.get("all_to_all", [0, 0, 0])[2], 4 * ep["a2a_bytes_sent"], 0.0,
                                "parallel.expert_parallel_bytes")]
        return rows


def _worker(rank: int, world: int, init_file: str, out_dir: str, techniques: list[str], kw: dict[str, Any],
            timeout_s: float) -> None:
    torch = _torch()
    dist = join_gloo_group(torch, rank, world, init_file, out_dir, timeout_s)  # output to rank<r>.log
    results = []
    try:
        for t in techniques:
            if t in ("tp", "sp"):
                results.append(_tp_rank(t == "sp", kw["config"], kw["batch_size"], kw["seq_len"], kw["seed"]))
            elif t == "pp":
                for sch in ("gpipe", "1f1b"):
                    results.append(_pp_rank(sch, kw["pp_config"], kw["batch_size"], kw["seq_len"],
                                            kw["micro_batches"], kw["seed"], kw["t_fwd"]))
            elif t == "cp":
                results.append(_cp_rank(kw["config"], kw["batch_size"], kw["seq_len"], kw["seed"]))
            else:
                results.append(_ep_rank(kw["num_experts"], kw["top_k"], kw["config"]["hidden_size"],
                                        kw["config"]["intermediate_size"], kw["tokens"], kw["seed"]))
            dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps([r.as_dict() for r in results]))


def _start_method() -> str:
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():  # pragma: no cover - Windows
        return "spawn"
    multiprocessing.get_context("forkserver").set_forkserver_preload(_PRELOAD)
    return "forkserver"


def run_parallel(world_size: int = 2, techniques: Sequence[str] = TECHNIQUES, *,
                 config: dict[str, Any] | None = None, pp_config: dict[str, Any] | None = None, batch_size: int = 2,
                 seq_len: int = 32, micro_batches: int = 4, t_fwd: float = 0.1, num_experts: int = 4,
                 top_k: int = 2, tokens: int = 16, seed: int = 0,
                 timeout_s: float = 300.0) -> ParallelRuns:
    """Spawn ``world_size`` gloo processes and run each technique; return the results per rank.

    Introduced in Chapter 15. ``pp`` gives two entries, ``pp-gpipe`` and ``pp-1f1b``.

    Args:
        world_size: processes (2 to 4 on CPU): the tp, pp, cp and ep degree alike.
        techniques: subset of :data:`TECHNIQUES`.
        config: the tiny Llama for tp/sp/cp and the MoE's sizes (default :data:`memlib.measure.distributed.TINY_LLAMA`).
        pp_config: the Llama cut into stages (default :data:`TINY_PP_LLAMA`).
        batch_size: sequences per step (per micro-batch for pp).
        seq_len: tokens per sequence (divisible by world_size for cp).
        micro_batches: pipeline micro-batches m.
        t_fwd: seconds each stage's forward takes (slept; the backward sleeps twice as long).
        num_experts, top_k, tokens: the MoE layer and the tokens per rank.
        seed: model and data seed.
        timeout_s: wall-clock limit for the whole run.

    Raises:
        MemlibError: bad input or a run past ``timeout_s``.
    """
    from .distributed import TINY_LLAMA

    _torch()
    import torch.multiprocessing as mp

    n = check_positive("world_size", world_size)
    for t in techniques:
        check_choice("technique", t, TECHNIQUES)
    cfg = dict(config or TINY_LLAMA)
    if "cp" in techniques and check_positive("seq_len", seq_len) % n:
        raise MemlibError(f"seq_len {seq_len} does not split over {n} ranks; expected a multiple of {n}")
    if "ep" in techniques and check_positive("num_experts", num_experts) % n:
        raise MemlibError(f"ep {n} does not divide {num_experts} experts; expected a divisor of {num_experts}")
    kw = {"config": cfg, "pp_config": dict(pp_config or TINY_PP_LLAMA), "batch_size": batch_size,
          "seq_len": seq_len, "micro_batches": check_positive("micro_batches", micro_batches), "t_fwd": t_fwd,
          "num_experts": num_experts, "top_k": top_k, "tokens": tokens, "seed": seed}
    with tempfile.TemporaryDirectory(prefix="memlib_par_") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        ctx = mp.start_processes(_worker, args=(n, init_file, tmp, list(techniques), kw, timeout_s), nprocs=n,
                                 join=False, start_method=_start_method())
        try:
            join_with_deadline(ctx, timeout_s, f"parallel run with {n} processes")
        except TimeoutError as err:
            raise MemlibError(str(err)) from None
        per_rank = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(n)]
    out: dict[str, list[ParallelResult]] = {}
    for r in range(n):
        for d in per_rank[r]:
            out.setdefault(d["technique"], []).append(ParallelResult(**d))
    return ParallelRuns(out, {**kw, "world_size": n, "backend": "gloo"})
