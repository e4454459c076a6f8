"""The framework recipes of a traced training step beyond plain PyTorch (Chapters 1 and 3).

:func:`memlib.measure.trace.trace_training` runs ``torch.amp.GradScaler`` for ``fp16-mixed`` under
``framework="pytorch"`` (:func:`_grad_scaler`), and DeepSpeed's ZeRO stage 1/2 optimizer of one rank for
``framework="deepspeed"`` (:func:`_deepspeed_setup`, :func:`_deepspeed_step`), and wraps the model in PyTorch's
``DistributedDataParallel`` of a one-rank group for ``data_parallel="ddp"`` (:func:`_ddp_group`,
:func:`_ddp_wrap`). torch is imported lazily.
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
        single_grad_partition = flat_grad.to(master.dtype)
        del flat_grad
        master.grad = single_grad_partition
        for p in params:
            p.grad = None
        if loss_scale is not None:
            single_grad_partition.mul_(1.0 / loss_scale)
        del single_grad_partition
        opt.step()
        master.grad = None
        flat16.copy_(master)


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
