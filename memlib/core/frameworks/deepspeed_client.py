"""DeepSpeed stepping the client's optimizer: a torch.optim AdamW or bitsandbytes' 8-bit AdamW (pure Python, Ch. 3, 8).

:class:`~memlib.core.frameworks.deepspeed.DeepSpeed` models the optimizer DeepSpeed builds from its config
(``{"type": "AdamW"}``: FusedAdam, no temporary of its own, so ``optimizer_impl`` changes nothing). A script that
passes its own optimizer to ``deepspeed.initialize(optimizer=...)`` (the Hugging Face Trainer without an
``optimizer`` block in the DeepSpeed config) keeps that optimizer's step temporaries, and DeepSpeed wraps it
(DeepSpeed 0.19.8):

- ZeRO-1/2 (``stage_1_and_2.py``, ``_optimizer_step``) step it one parameter group at a time over one flat fp32
  partition (``single_partition_of_fp32_groups[i]``, ⌈Ψ/N⌉ elements with one group); ZeRO-3 (``stage3.py``) one
  sub-group (≤ ``sub_group_size`` = 10⁹ elements) at a time. foreach AdamW's ``torch._foreach_sqrt`` buffer is
  then v's size over that flat tensor: 4·Ψ/N bytes on top of the step's fp32 gradient partition.
- ZeRO-0 under mixed precision wraps it in ``FP16_UnfusedOptimizer`` (``runtime/fp16/unfused_optimizer.py``,
  ``step``: ``fp32_param.grad = fp16_param.grad.to(fp32_param.dtype)`` per parameter, then
  ``self.optimizer.step()``): the per-parameter fp32 gradients (4Ψ) beside the optimizer's own temporaries.
- bitsandbytes' ``AdamW8bit`` sees the same flat partition: no tensor is under its 4096-element threshold, so
  every element has 8-bit states, and ZeRO refuses it unless ``zero_allow_untested_optimizer`` is set. Its CUDA
  kernel takes the element count as a 32-bit int (``bitsandbytes/backends/cuda/ops.py``,
  ``_optimizer_update_8bit_blockwise_impl``: ``ct.c_int32(g.numel())``): a ZeRO-1/2 partition of more than
  2³¹ − 1 elements (Llama-2-7B on fewer than 4 ranks) does not run; :meth:`DeepSpeedClient.model_state_bytes`
  refuses it.
"""
from __future__ import annotations

from typing import ClassVar

from ..configs import ModelConfig
from ..errors import MemlibError
from ..setup import TrainingSetup
from .base import torch_adamw_step_bytes
from .deepspeed import DS_SUB_GROUP_SIZE, DeepSpeed

__all__ = ["DeepSpeedClient", "DEEPSPEED_CLIENT", "INT32_MAX", "uses_client_optimizer", "flat_partition_too_big",
           "check_flat_partition"]

#: The largest element count bitsandbytes' 8-bit kernels take (``ct.c_int32(g.numel())``).
INT32_MAX = 2**31 - 1


def uses_client_optimizer(setup: TrainingSetup) -> bool:
    """Whether DeepSpeed steps the script's optimizer: ``optimizer_source="client"``, or bitsandbytes' 8-bit AdamW
    (DeepSpeed's config builds no 8-bit optimizer, so it is always the client's)."""
    return setup.framework == "deepspeed" and (setup.optimizer_source == "client" or setup.optimizer == "adamw-8bit")


def flat_partition_too_big(n_train: int, num_gpus: int, zero_stage: int, optimizer: str) -> bool:
    """Whether bitsandbytes' 8-bit AdamW would get a flat ZeRO-1/2 partition above 2³¹ − 1 elements (on the GPU)."""
    return optimizer == "adamw-8bit" and zero_stage in (1, 2) and -(-n_train // num_gpus) > INT32_MAX


def check_flat_partition(n_train: int, setup: TrainingSetup) -> None:
    """Raise one line when bitsandbytes' 8-bit AdamW would get a flat ZeRO-1/2 partition above 2³¹ − 1 elements."""
    if setup.offload == "none" and flat_partition_too_big(n_train, setup.num_gpus, setup.zero_stage, setup.optimizer):
        part = -(-n_train // setup.num_gpus)
        need = -(-n_train // INT32_MAX)
        raise MemlibError(
            f"DeepSpeed ZeRO-{setup.zero_stage} hands bitsandbytes' 8-bit AdamW one flat partition of {part:,} elements "
            f"on {setup.num_gpus} GPU(s), above the 2,147,483,647 its kernels take (ct.c_int32(g.numel())); "
            f"expected num_gpus >= {need}, zero_stage 3 (sub-groups of 10⁹) or optimizer adamw")


def _flat_step_bytes(setup: TrainingSetup, elements: int) -> int:
    """The client optimizer's own temporaries stepping one flat tensor of ``elements``: foreach AdamW's √v buffer
    (v's bytes), for-loop AdamW's √v and quotient (twice that), 0 for fused AdamW, SGD and 8-bit AdamW."""
    if setup.optimizer != "adamw" or setup.optimizer_impl == "fused":
        return 0
    v_bytes = 2 if setup.precision == "bf16" else 4
    return (2 if setup.optimizer_impl == "for-loop" else 1) * v_bytes * elements


class DeepSpeedClient(DeepSpeed):
    """DeepSpeed wrapping the script's optimizer (:func:`uses_client_optimizer`): the layout of :class:`DeepSpeed`,
    with the client optimizer's step temporaries and bitsandbytes' flat partitions."""

    name: ClassVar[str] = "deepspeed"

    def model_state_bytes(self, cfg: ModelConfig | None, n: int, small: int,
                          setup: TrainingSetup) -> tuple[int, int, int, int]:
        """:meth:`DeepSpeed.model_state_bytes`; at ZeRO ≥ 1 bitsandbytes sees flat partitions, so no parameter
        keeps the small-tensor fp32 states. Raises (:func:`check_flat_partition`) where its kernel cannot run."""
        flat = setup.zero_stage >= 1 and setup.method == "full"
        p, g, o, n_train = super().model_state_bytes(cfg, n, 0 if flat else small, setup)
        check_flat_partition(n_train, setup)
        return p, g, o, n_train

    def optimizer_step_bytes(self, cfg: ModelConfig, setup: TrainingSetup, n: int, n_train: int) -> int:
        """The step's temporaries with the client's optimizer.

        ZeRO-0 in mixed precision (``FP16_UnfusedOptimizer``): the per-parameter fp32 gradients (4Ψ) + the client
        optimizer's temporaries over the per-parameter fp32 copies (:func:`torch_adamw_step_bytes`); in fp32 or
        pure bf16 the client optimizer steps the model's own parameters. ZeRO-1/2/3: the flat fp32 gradient
        partition (4 bytes per element) beside the client's temporaries over that one flat tensor, or
        :meth:`DeepSpeed.optimizer_step_bytes`' flattening moment where that is larger. ZeRO-1/2 free the rank's
        16-bit gradients before stepping (``stage_1_and_2.py``, ``step``: ``del flat_grad_partition``,
        ``free_grad_in_param_list(self.params_in_partition[i])``), so foreach AdamW's 4Ψ/N √v buffer takes the
        place of the flattening moment's 16-bit copies (the same peak: 8Ψ/N over the weights and states); ZeRO-3
        keeps them in its flat gradient buffer, so foreach adds 2·min(``sub_group_size``, Ψ/N) bytes. With offload
        the step runs on the CPU (:meth:`DeepSpeed.optimizer_step_bytes`).
        """
        own = super().optimizer_step_bytes(cfg, setup, n, n_train)
        if setup.offload != "none":
            return own
        n_step = n if setup.method == "full" else n_train
        mixed = setup.precision.endswith("-mixed")
        if setup.zero_stage == 0:
            fp32_grads = 4 * n_step if mixed else 0
            return fp32_grads + torch_adamw_step_bytes(cfg, setup, n, n_train, 1, 1)
        part = -(-n_step // setup.shards)
        grad = 4 if mixed or setup.precision == "fp32" else 2  # the flat gradient partition the client steps
        if setup.zero_stage == 3:
            part = min(DS_SUB_GROUP_SIZE, part)
            return max(own, grad * part + _flat_step_bytes(setup, part))
        # stages 1-2 free the flat 16-bit copy (``del flat_grad_partition``) and the partition's 16-bit gradients
        # (``free_grad_in_param_list(self.params_in_partition[i])``) before ``_optimizer_step(i)``
        g16 = int(self.state_bytes(setup.precision, setup.optimizer)[1] * part) if setup.method == "full" else 0
        return max(own, grad * part + _flat_step_bytes(setup, part) - g16)


#: The DeepSpeed framework object stepping a client optimizer.
DEEPSPEED_CLIENT = DeepSpeedClient()
