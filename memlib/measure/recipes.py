"""The framework recipes of a traced training step beyond plain PyTorch (Chapters 1 and 3).

:func:`memlib.measure.trace.trace_training` runs ``torch.amp.GradScaler`` for ``fp16-mixed`` under
``framework="pytorch"`` (:func:`_grad_scaler`), DeepSpeed's ZeRO stage 1/2 optimizer of one rank for
``framework="deepspeed"`` (:func:`_deepspeed_setup`, :func:`_deepspeed_step`; ``zero_stage=0``:
``FP16_Optimizer``, :func:`_fp16_optimizer_step`), Megatron-LM's mixed-precision
optimizer of one data-parallel rank for ``framework="megatron"`` (:func:`_megatron_setup`,
:func:`_megatron_step`), and PyTorch's FSDP2 (``fully_shard``) for ``framework="fsdp2"`` (:func:`_fsdp2_group`,
:func:`_fsdp2_shard`, :func:`_fsdp2_storage_hooks`). With ``data_parallel="ddp"`` the model is wrapped in
PyTorch's ``DistributedDataParallel`` of a one-rank group (:func:`_ddp_group`, :func:`_ddp_wrap`). torch is
imported lazily.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import Any

from ..core.categories import MemCategory
from ..core.errors import MemlibError
from .deps import require_torch
from .tracker import MemoryTracker

__all__: list[str] = []


def _torch() -> Any:
    return require_torch("memlib.measure.recipes")


def _grad_scaler(device: str, tracker: MemoryTracker) -> Any:
    """``torch.amp.GradScaler`` of ``device`` with its scale and growth tracker made (counted as OPTIMIZER).

    On meta, ``GradScaler._maybe_opt_step`` (which reads ``found_inf.item()``) is replaced by a plain step:
    meta tensors hold no values, so the gradients count as finite.
    """
    torch = _torch()

    base: Any = torch.amp.GradScaler

    class _MetaGradScaler(base):
        def _maybe_opt_step(self, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any) -> Any:
            return optimizer.step(*args, **kwargs)

    scaler = (_MetaGradScaler if device == "meta" else torch.amp.GradScaler)(device)
    scaler._lazy_init_scale_growth_tracker(torch.device(device))
    tracker.reclassify(scaler._scale, MemCategory.OPTIMIZER)
    tracker.reclassify(scaler._growth_tracker, MemCategory.OPTIMIZER)
    return scaler


def _deepspeed_setup(params: list[Any]) -> Any:
    """Make the 16-bit parameters views of one flat buffer, as DeepSpeed's ZeRO optimizer does.

    ``DeepSpeedZeroOptimizer.__init__`` (``deepspeed/runtime/zero/stage_1_and_2.py``) flattens each parameter
    group into ``bit16_groups_flat[i]`` and points every parameter's data into it
    (``_update_model_bit16_weights``); its fp32 master ``single_partition_of_fp32_groups[i]`` is this rank's
    partition of the flat buffer cloned to fp32 (here, one rank: all of it). The alignment padding
    (``nccl_start_alignment_factor``, a few elements) is left out.

    Returns:
        The flat 16-bit buffer.
    """
    torch = _torch()
    with torch.no_grad():
        flat = torch._utils._flatten_dense_tensors([p.detach() for p in params])
        offset = 0
        for p in params:
            n = p.numel()
            p.data = flat.narrow(0, offset, n).view_as(p)
            offset += n
    return flat


def _deepspeed_step(params: list[Any], master: Any, flat16: Any, opt: Any, loss_scale: float | None) -> None:
    """``DeepSpeedZeroOptimizer.step`` of one rank (``deepspeed/runtime/zero/stage_1_and_2.py``).

    The rank's 16-bit gradients are flattened (``flatten_dense_tensors_aligned``, a 2 B/param temporary) and
    converted to one fp32 partition (``single_grad_partition = flat_grad_partition.to(fp32)``, 4 B/param), which
    becomes the master's ``.grad``; the 16-bit gradients are freed (``free_grad_in_param_list``), the gradient is
    unscaled in place (``unscale_and_clip_grads``, fp16), the optimizer steps the flat master (DeepSpeed's
    ``FusedAdam``, ``deepspeed/ops/adam/fused_adam.py``: one ``multi_tensor_applier`` kernel, no temporaries;
    traced as ``torch.optim.AdamW(fused=True)``), the fp32 gradient is dropped and the updated master is copied
    into the flat 16-bit buffer (``bit16_partitions[partition_id].data.copy_(fp32_partition.data)``, then the
    all-gather of ``all_gather_dp_groups``, a no-op on one rank). The global-norm computation
    (``scaled_global_norm``, per-tensor scalars) is left out.
    """
    torch = _torch()
    with torch.no_grad():
        flat_grad = torch._utils._flatten_dense_tensors([p.grad for p in params])
        held = [flat_grad.to(master.dtype)]  # single_grad_partition
        del flat_grad
        _step_flat_master(params, master, flat16, opt, loss_scale, held)


def _step_flat_master(params: list[Any], master: Any, flat16: Any, opt: Any, loss_scale: float | None,
                      held: list[Any]) -> None:
    """The tail both DeepSpeed steps share: the flat fp32 gradient becomes the master's ``.grad``, the 16-bit
    gradients are dropped, the gradient is unscaled in place, the optimizer steps, the gradient is dropped and
    the master is copied into the flat 16-bit weights. ``held`` is a one-element list holding the caller's only
    reference to the flat fp32 gradient, popped here, so that it dies with ``master.grad = None``."""
    flat_grad = held.pop()
    master.grad = flat_grad
    for p in params:
        p.grad = None
    if loss_scale is not None:
        flat_grad.mul_(1.0 / loss_scale)
    del flat_grad
    opt.step()
    master.grad = None
    flat16.copy_(master)


def _fp16_optimizer_step(params: list[Any], master: Any, flat16: Any, opt: Any, loss_scale: float | None) -> None:
    """``FP16_Optimizer.step`` (``deepspeed/runtime/fp16/fused_optimizer.py``): DeepSpeed without ZeRO in mixed
    precision, bf16 included (``engine.py``, ``_do_optimizer_sanity_check`` returns ``DDP_BFLOAT16`` while
    ``grad_accum_dtype`` is the model's). Its ``__init__`` flattens the 16-bit weights and clones an fp32 master
    as :func:`_deepspeed_setup` does. The step converts every 16-bit gradient to fp32 one by one
    (``p.grad.to(data_type) for p in group``, 4 B/param) and flattens the list (``_flatten_dense_tensors``, 4
    B/param more) while the 16-bit gradients are still set: 2 + 4 + 4 bytes/param of gradients at once; the flat
    fp32 gradient becomes the master's ``.grad``, the 16-bit gradients are dropped (``p.grad = None``), it is
    unscaled in place (``unscale_and_clip_grads``), ``FusedAdam`` steps, the fp32 gradient is dropped and the
    master is copied into the 16-bit weights (``_unflatten_dense_tensors`` views, ``p.data.copy_``). The norm
    (``get_flattened_grad_norm``, scalars) is left out."""
    torch = _torch()
    with torch.no_grad():
        fp32_grads = [p.grad.to(master.dtype) for p in params]
        held = [torch._utils._flatten_dense_tensors(fp32_grads)]
        del fp32_grads
        _step_flat_master(params, master, flat16, opt, loss_scale, held)


def _megatron_setup(params: list[Any], tracker: MemoryTracker) -> tuple[Any, list[Any]]:
    """Megatron-LM's ``main_grad`` buffer and fp32 main parameters for one data-parallel rank.

    ``megatron/core/distributed/param_and_grad_buffer.py`` (``_ParamAndGradBuffer.__init__``) allocates one
    contiguous fp32 gradient buffer with the model (``grad_data = torch.zeros(...)``) and makes every parameter's
    ``main_grad`` a view into it; ``DistributedDataParallel._make_backward_post_hook``
    (``megatron/core/distributed/distributed_data_parallel.py``) adds each gradient autograd makes into it and
    frees it (``param.main_grad.add_(param.grad.data)``, ``param.grad = None``; registered here as a
    ``register_post_accumulate_grad_hook``). The optimizer (``Float16OptimizerWithFloat16Params`` or, sharded, the
    distributed optimizer, ``megatron/core/optimizer/``) keeps an fp32 main copy of each parameter
    (``param.detach().clone().float()``; one rank holds all of it). Bucket padding is left out.

    Returns:
        The flat fp32 gradient buffer (counted as GRAD) and the fp32 main parameters (counted as OPTIMIZER).
    """
    torch = _torch()
    with tracker.mode():
        grad_data = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32, device=params[0].device)
        mains = [p.detach().clone().float().requires_grad_(True) for p in params]
    tracker.reclassify(grad_data, MemCategory.GRAD)
    for m in mains:
        tracker.reclassify(m, MemCategory.OPTIMIZER)
    offset = 0
    for p in params:
        p.main_grad = grad_data.narrow(0, offset, p.numel()).view_as(p)
        offset += p.numel()

        def hook(param: Any) -> None:
            with torch.no_grad():
                param.main_grad.add_(param.grad)
            param.grad = None

        p.register_post_accumulate_grad_hook(hook)
    return grad_data, mains


def _megatron_step(params: list[Any], mains: list[Any], grad_data: Any, opt: Any, loss_scale: float | None) -> None:
    """``MixedPrecisionOptimizer.step`` of one rank (``megatron/core/optimizer/optimizer.py``).

    ``_copy_model_grads_to_main_grads`` makes each main parameter's gradient its ``main_grad`` (``.float()`` of an
    fp32 tensor is the tensor itself: no copy); with fp16 the gradients are unscaled in place
    (``_unscale_main_grads_and_check_for_nan``); the fused Adam (Apex/Transformer Engine ``FusedAdam``, traced as
    ``torch.optim.AdamW(fused=True)``) steps the main parameters; ``_copy_main_params_to_model_params`` copies
    them into the 16-bit weights; the next iteration's ``zero_grad_buffer`` zeroes ``main_grad`` in place. The
    gradient-norm clipping (per-tensor scalars) is left out.
    """
    torch = _torch()
    with torch.no_grad():
        for p, m in zip(params, mains):
            m.grad = p.main_grad.float()
            if loss_scale is not None:
                m.grad.mul_(1.0 / loss_scale)
        opt.step()
        for p, m in zip(params, mains):
            p.copy_(m)
            m.grad = None
        grad_data.zero_()


@contextlib.contextmanager
def _fsdp2_group(device: str) -> Iterator[Any]:
    """The device mesh FSDP2 shards over: the caller's process group if one exists, else a one-rank gloo group.

    The one-rank group lives in a ``torch.distributed.HashStore`` (no port, no file: two traces never collide)
    and is destroyed on exit; a group the caller made (e.g. ``torchrun``, or the two-rank test) is used as it
    is and left alone.
    """
    _torch()
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh(device, (dist.get_world_size(),))
    finally:
        if own:
            dist.destroy_process_group()


def _fsdp2_shard(net: Any, layers: Any, mesh: Any, precision: str, zero_stage: int) -> None:
    """Apply FSDP2 as users do: ``fully_shard`` on every decoder layer, then on the root model.

    ``torch/distributed/fsdp/_fully_shard/_fully_shard.py``: ``fully_shard(module, mesh=..., mp_policy=...,
    reshard_after_forward=...)``, the layers first so that each is its own parameter group
    (``FSDPParamGroup``) and the root group holds the rest (embedding, final norm, LM head). Mixed precision is
    ``MixedPrecisionPolicy(param_dtype=bf16 or fp16, reduce_dtype=fp32)`` on the fp32 model; ``fp32`` and pure
    ``bf16`` shard the model in its own dtype with the default policy. ``zero_stage`` 3 is
    ``reshard_after_forward=True``, 2 is ``False``, for every group alike (as Hugging Face Accelerate passes its
    one setting to the layers and the root).
    """
    torch = _torch()
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    low = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(precision)
    mp = (MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32) if low is not None
          else MixedPrecisionPolicy())
    kw = dict(mesh=mesh, mp_policy=mp, reshard_after_forward=zero_stage == 3)
    for layer in layers:
        fully_shard(layer, **kw)
    fully_shard(net, **kw)


@contextlib.contextmanager
def _fsdp2_storage_hooks(tracker: MemoryTracker) -> Iterator[None]:
    """Tell ``tracker`` when FSDP2 gives an unsharded parameter's storage memory or takes it back.

    FSDP2 allocates each parameter's all-gather output once (``FSDPParam.init_all_gather_outputs``,
    ``torch.empty``) and afterwards only resizes its storage: ``alloc_storage`` before the parameter is used
    (``FSDPParamGroup.wait_for_unshard``, ``FSDPParam.init_unsharded_param``, ``to_unsharded``) and
    ``free_storage`` when it is resharded (``FSDPParam.free_unsharded_param``), both
    ``UntypedStorage.resize_`` (``_fsdp_param.py``), which no dispatch mode sees. Wrapped here, both report to
    :meth:`MemoryTracker.resized`; every other FSDP2 buffer (the copy-in and all-gather outputs of
    ``foreach_all_gather``, the reduce-scatter input and output of ``foreach_reduce``, ``_fsdp_collectives.py``)
    is a ``torch.empty`` and ops on it, which the tracker's dispatch mode sees.
    """
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    alloc, free = _fsdp_param.alloc_storage, _fsdp_param.free_storage

    def alloc_storage(tensor: Any) -> None:
        alloc(tensor)
        tracker.resized(tensor, MemCategory.PARAM)  # the unsharded (gathered) parameter

    def free_storage(tensor: Any) -> None:
        free(tensor)
        tracker.resized(tensor)

    _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = alloc_storage
    _fsdp_param.free_storage = free_storage
    try:
        yield
    finally:
        _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = alloc
        _fsdp_param.free_storage = free


@contextlib.contextmanager
def _ddp_group(device: str) -> Iterator[None]:
    """A one-rank default process group for the trace's ``DistributedDataParallel``, destroyed on exit.

    ``cpu``: gloo over a ``FileStore`` in a temporary file (no port). ``meta``: PyTorch's fake backend
    (``torch.testing._internal.distributed.fake_pg``: collectives that touch no data), with DDP's construction-time
    check that all ranks' parameter shapes agree (``_verify_param_shape_across_processes``, which reads a value
    with ``.item()``) skipped: one rank agrees with itself.

    Raises:
        MemlibError: a default process group already exists (the trace needs a one-rank group of its own).
    """
    torch = _torch()
    dist = torch.distributed
    if dist.is_initialized():
        raise MemlibError("data_parallel 'ddp' traces in a one-rank process group of its own, but one is already "
                          "initialized; expected none (call torch.distributed.destroy_process_group() first)")
    ddp_module: Any = torch.nn.parallel.distributed
    verify = ddp_module._verify_param_shape_across_processes
    path = None
    if device == "meta":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
        ddp_module._verify_param_shape_across_processes = lambda *args, **kwargs: None
    else:
        fd, path = tempfile.mkstemp(prefix="memlib-ddp-")
        os.close(fd)
        dist.init_process_group("gloo", store=dist.FileStore(path, 1), rank=0, world_size=1)
    try:
        yield
    finally:
        ddp_module._verify_param_shape_across_processes = verify
        dist.destroy_process_group()
        if path is not None and os.path.exists(path):
            os.remove(path)


def _ddp_wrap(net: Any, tracker: MemoryTracker, gradient_as_bucket_view: bool) -> Any:
    """``DistributedDataParallel(net)`` made under the tracker, its Reducer's buckets counted as GRAD.

    The constructor (``torch/nn/parallel/distributed.py``, ``_ddp_init_helper``) builds the C++ Reducer, whose
    ``Reducer::initialize_buckets`` (``torch/csrc/distributed/c10d/reducer.cpp``) allocates one flat
    ``bucket.gradients`` per bucket with ``at::empty``: a dispatcher op, which the tracker's dispatch mode sees
    like any other. It is made with the tracker's category set to GRAD, so those storages count as gradients
    (anything else the constructor makes, the broadcast of the module states, is freed before the step).
    """
    torch = _torch()
    before = tracker.category
    with tracker.mode():
        tracker.category = MemCategory.GRAD
        try:
            ddp = torch.nn.parallel.DistributedDataParallel(net, gradient_as_bucket_view=gradient_as_bucket_view)
        finally:
            tracker.category = before
    if tracker.device_type == "meta":
        # The fake backend's all-reduce completes with no tensor, which the Reducer refuses; a one-rank
        # all-reduce is the bucket itself, in place: this comm hook returns it (no memory of its own).
        def one_rank_allreduce(state: Any, bucket: Any) -> Any:
            fut: Any = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        # DDP checks the hook's annotations as objects (this module's are strings).
        one_rank_allreduce.__annotations__ = {"state": object, "bucket": torch.distributed.GradBucket,
                                              "return": torch.futures.Future[torch.Tensor]}

        ddp.register_comm_hook(None, one_rank_allreduce)
    return ddp


def _make_optimizer(name: str, params: list[Any], impl: str = "foreach") -> Any:
    """The torch optimizer of a trace; ``impl`` picks torch.optim.AdamW's path (SGD and adamw-8bit ignore it)."""
    torch = _torch()
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=True)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    if name == "adamw":
        # Set explicitly (foreach=True is PyTorch's default on CUDA, foreach=False on CPU) so that meta, CPU and
        # GPU traces run the same path.
        flags = {"foreach": dict(foreach=True, fused=False), "fused": dict(foreach=False, fused=True),
                 "for-loop": dict(foreach=False, fused=False)}[impl]
        return torch.optim.AdamW(params, lr=1e-4, **flags)
    try:
        import bitsandbytes as bnb
    except ImportError:  # pragma: no cover
        raise ImportError("adamw-8bit needs bitsandbytes: pip install bitsandbytes") from None
    return bnb.optim.AdamW8bit(params, lr=1e-4)


def _init_fused_state(opt: Any) -> None:
    """Create a fused AdamW's states as ``Adam._init_group`` does, skipping its device check (meta device).

    ``_device_dtype_check_for_fused`` refuses meta tensors, although ``aten._fused_adamw_`` has a meta kernel
    (``torch/_meta_registrations.py``, ``meta__fused_adam_``). With the states made here (a float32 ``step`` on the
    parameter's device, m and v ``zeros_like`` the parameter) the check never runs and the step runs torch's own
    ``_fused_adam``, so the meta trace holds what a CUDA or CPU fused step holds.
    """
    torch = _torch()
    for group in opt.param_groups:
        if not group.get("fused"):
            continue
        for p in group["params"]:
            state = opt.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
