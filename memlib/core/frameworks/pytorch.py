"""Plain PyTorch: ``torch.autocast`` AMP, ``DistributedDataParallel``, ``ZeroRedundancyOptimizer`` (Chapter 1).

The parameters stay fp32 under mixed precision (``torch/amp/autocast_mode.py``) and are the optimizer's own (no
master copy): fp32 and ``*-mixed`` are 4 + 4 + K (Adam's m and v in fp32, K = 8; momentum 4; SGD 0);
``fp16-mixed`` adds ``torch/amp/grad_scaler.py``'s ``GradScaler`` tensors (``_scale``, ``_growth_tracker``,
``found_inf``: 12 bytes). ``bf16`` is ``model.to(torch.bfloat16)``: 2 + 2 + 2 per moment. ZeRO-1 is
``torch/distributed/optim/zero_redundancy_optimizer.py``'s ``ZeroRedundancyOptimizer``, which hands whole
parameters to ranks greedily by size (``_partition_parameters``): ⌈O/N⌉ is the estimate, exact up to that
packing. On more than one GPU the model is ``DistributedDataParallel``, whose Reducer keeps every gradient in
flat buckets too (:meth:`PyTorch.gradient_buffers`).
"""
from __future__ import annotations

from typing import ClassVar

from ..configs import ModelConfig
from ..setup import TrainingSetup
from .base import Framework, torch_adamw_step_bytes

__all__ = ["PyTorch", "PYTORCH", "GRAD_SCALER_BYTES"]

#: ``torch.amp.GradScaler``'s tensors on the device: ``_scale`` (fp32), ``_growth_tracker`` (int32) and the
#: ``found_inf`` of one device (fp32), one element each (``torch/amp/grad_scaler.py``).
GRAD_SCALER_BYTES = 12


class PyTorch(Framework):
    """PyTorch AMP / DDP / ZeroRedundancyOptimizer: fp32 params and grads, no master copy."""

    name: ClassVar[str] = "pytorch"
    mixed_layout: ClassVar[tuple[float, float, float, float]] = (4.0, 4.0, 0.0, 4.0)
    sharded_optimizer: ClassVar[str] = "torch's ZeroRedundancyOptimizer"

    def extra_state_bytes(self, setup: TrainingSetup) -> int:
        """GradScaler's 12 bytes under fp16 AMP."""
        return GRAD_SCALER_BYTES if setup.precision == "fp16-mixed" else 0

    def gradient_buffers(self, setup: TrainingSetup, g_bytes: int) -> tuple[int, int]:
        """PyTorch DDP's gradient buckets: (bytes live through the backward pass, bytes on top of the gradients at
        the step).

        ``torch/nn/parallel/distributed.py`` (``DistributedDataParallel.__init__`` → ``_ddp_init_helper``) hands
        the trainable parameters (``_build_params_for_reducer``: those with ``requires_grad``) to the C++ Reducer
        (``torch/csrc/distributed/c10d/reducer.cpp``). ``Reducer::initialize_buckets``, run by its constructor,
        allocates one flat ``bucket.gradients = at::empty({offset}, options)`` per bucket in the parameters'
        dtype; the buckets together cover every trainable parameter once, so they hold g_bytes (the gradients'
        bytes: 4·Ψ under AMP, whose parameters and gradients are fp32; ZeroRedundancyOptimizer shards only the
        optimizer states, not them). The sizes (``bucket_cap_mb`` 25 MiB, a first bucket of
        ``_DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB, one bucket for the first iteration without
        ``find_unused_parameters``; ``_rebuild_buckets`` re-splits them once, before the second forward) change
        how they are split, not the sum. They live as long as the Reducer, through every backward pass and step.

        * ``gradient_as_bucket_view=False`` (DDP's default): ``mark_variable_ready_dense`` copies each
          accumulated ``param.grad`` into its bucket view (``at::mul_out`` by 1/world size) and, after the
          all-reduce, ``copy_bucket_to_grad`` copies it back: the gradients and the buckets coexist, (g, g).
        * ``gradient_as_bucket_view=True``: ``mark_variable_ready_dense`` points ``grad`` at its bucket view (the
          tensor autograd accumulated is freed), so the gradients live in the buckets: the whole bucket memory
          is there from the start of the backward pass, nothing more at the step, (g, 0). The accumulated
          tensor of one parameter lives until its hook copies it (a transient this estimate leaves out).

        Returns:
            (0, 0) unless ``setup.ddp`` (more than one GPU); for one GPU no DDP is built.
        """
        if not setup.ddp or setup.model_parallel:
            return 0, 0
        return g_bytes, 0 if setup.gradient_as_bucket_view else g_bytes

    def optimizer_step_bytes(self, cfg: ModelConfig, setup: TrainingSetup, n: int, n_train: int) -> int:
        """``torch.optim.AdamW`` steps the fp32 (AMP) or bf16 parameters directly
        (:func:`memlib.core.frameworks.base.torch_adamw_step_bytes`): ÷N with ZeroRedundancyOptimizer, which keeps
        whole tensors (the for-loop path does not shrink)."""
        return torch_adamw_step_bytes(cfg, setup, n, n_train, setup.shards, 1)


#: The PyTorch framework object.
PYTORCH = PyTorch()
