"""How each training framework lays out memory on a GPU: one module and one object per framework (Chapter 1).

Dependency direction: ``base`` (the :class:`~memlib.core.frameworks.base.Framework` interface and the accounting
frameworks share) ← one module per framework (``pytorch``, ``deepspeed``, ``fsdp2``, ``megatron``) ← this
registry; the package imports only the facts below it in :mod:`memlib.core` (choices, configs, lora, setup,
terms) and is imported by :mod:`memlib.core.states` and :mod:`memlib.core.estimate`, never the reverse.

:func:`memlib.core.estimate.estimate_training` takes :func:`framework_for` ``(setup)`` and composes its methods
without naming any framework. A new framework (TorchTitan, Megatron-FSDP) is one new module here with a
:class:`~memlib.core.frameworks.base.Framework` subclass, its entry in :data:`FRAMEWORK_OBJECTS` and its row in
:data:`memlib.core.choices.FRAMEWORK_SUPPORT`, plus its tests.

* **pytorch** (:mod:`.pytorch`): ``torch.autocast`` AMP, DDP, ``ZeroRedundancyOptimizer``; 4 + 4 + K.
* **deepspeed** (:mod:`.deepspeed`): the ZeRO paper's 2 + 2 + 12, by stage; offload; stepping the script's own
  optimizer (a torch.optim AdamW, bitsandbytes' 8-bit AdamW): :mod:`.deepspeed_client`.
* **fsdp2** (:mod:`.fsdp2`): ``fully_shard``, (4 + 4 + 8)/N plus the working set.
* **megatron** (:mod:`.megatron`): 2 + 4 + 12 (fp32 ``main_grad``), the distributed optimizer as ZeRO-1.

The functions below are the per-term functions of the first version of this module, kept under their names
(notebooks and tests call them); each dispatches to the setup's framework object.
"""
from __future__ import annotations

from ..choices import FRAMEWORKS
from ..configs import ModelConfig
from ..errors import check_choice
from ..setup import TrainingSetup
from .base import Framework, Saved, Support
from .base import parameter_order as _parameter_order  # the old private name (tests/test_optimizer_impl.py)
from .deepspeed import DEEPSPEED, DS_REDUCE_BUCKET, DS_SUB_GROUP_SIZE, DeepSpeed
from .deepspeed_client import DEEPSPEED_CLIENT, uses_client_optimizer
from .fsdp2 import FSDP_2, FSDP2, fsdp2_backward_bytes
from .fsdp2 import traced_layout as _fsdp2_traced
from .megatron import MEGATRON, Megatron
from .pytorch import GRAD_SCALER_BYTES, PYTORCH, PyTorch

__all__ = ["Framework", "Support", "Saved", "PyTorch", "DeepSpeed", "FSDP2", "Megatron", "FRAMEWORK_OBJECTS",
           "framework_for", "get_framework",
           "layout_bytes", "state_bytes", "optimizer_state_bytes", "model_state_bytes", "shard_states",
           "gathered_bytes", "fsdp2_backward_bytes", "fsdp2_traced_layout", "zero3_gathered_bytes", "offload_split",
           "bucket_bytes", "ddp_bucket_bytes", "optimizer_step_bytes",
           "GRAD_SCALER_BYTES", "DS_REDUCE_BUCKET", "DS_SUB_GROUP_SIZE"]

#: The framework objects, by name (the keys are :data:`memlib.core.choices.FRAMEWORKS`).
FRAMEWORK_OBJECTS: dict[str, Framework] = {fw.name: fw for fw in (PYTORCH, DEEPSPEED, FSDP_2, MEGATRON)}
assert tuple(FRAMEWORK_OBJECTS) == FRAMEWORKS, "every framework choice has its object"



def get_framework(name: str) -> Framework:
    """The framework object of that name; one line naming the valid choices otherwise."""
    check_choice("framework", name, FRAMEWORKS)
    return FRAMEWORK_OBJECTS[name]


def framework_for(setup: TrainingSetup) -> Framework:
    """The framework object whose layout ``setup`` follows (DeepSpeed stepping the script's optimizer:
    :class:`~memlib.core.frameworks.deepspeed_client.DeepSpeedClient`)."""
    if uses_client_optimizer(setup):
        return DEEPSPEED_CLIENT
    return FRAMEWORK_OBJECTS[setup.framework]


def layout_bytes(framework: str, precision: str) -> tuple[float, float, float, float]:
    """(working weights, gradients, master weights, one optimizer moment) bytes per parameter, before sharding.

    pytorch and fsdp2 keep fp32 parameters under mixed precision (the optimizer steps them: no master copy);
    deepspeed keeps 16-bit parameters and gradients with an fp32 master (ZeRO paper §3); megatron keeps bf16
    parameters, an fp32 ``main_grad`` and an fp32 main copy. ``fp32`` is 4/4/0/4 and pure ``bf16``
    (``model.to(torch.bfloat16)``) 2/2/0/2 everywhere.
    """
    return FRAMEWORK_OBJECTS[framework].layout(precision)


def state_bytes(framework: str, precision: str, optimizer: str) -> tuple[float, float, float]:
    """(weight, gradient, optimizer-state) bytes per parameter before sharding (:meth:`Framework.state_bytes`)."""
    return FRAMEWORK_OBJECTS[framework].state_bytes(precision, optimizer)


def optimizer_state_bytes(n_params: int, small_params: int, precision: str, optimizer: str,
                          framework: str = "deepspeed") -> int:
    """Optimizer-state bytes for ``n_params`` parameters (:meth:`Framework.optimizer_state_bytes`)."""
    return FRAMEWORK_OBJECTS[framework].optimizer_state_bytes(n_params, small_params, precision, optimizer)


def model_state_bytes(cfg: ModelConfig | None, n: int, small: int, setup: TrainingSetup) -> tuple[int, int, int, int]:
    """Weights, gradients, optimizer states and trainable parameters before sharding
    (:meth:`Framework.model_state_bytes`: PyTorch AMP 4 + 4 + 8, DeepSpeed 2 + 2 + 12, Megatron 2 + 4 + 12,
    FSDP2 4 + 4 + 8; GradScaler's 12 bytes for PyTorch fp16 AMP; LoRA/QLoRA's frozen base and fp32 adapters)."""
    return framework_for(setup).model_state_bytes(cfg, n, small, setup)


def shard_states(p_bytes: int, g_bytes: int, o_bytes: int, setup: TrainingSetup) -> tuple[int, int, int]:
    """Each framework's partitioning over N data-parallel GPUs (:meth:`Framework.shard`)."""
    return framework_for(setup).shard(p_bytes, g_bytes, o_bytes, setup)


def gathered_bytes(cfg: ModelConfig | None, layer_params: int, p_sharded: int, n: int, n_train: int,
                   setup: TrainingSetup) -> tuple[int, int]:
    """The unsharded weights and gradients a sharded framework materializes while computing
    (:meth:`Framework.working_set`; DeepSpeed ZeRO-3's and FSDP2's)."""
    return framework_for(setup).working_set(cfg, layer_params, p_sharded, n, n_train, setup)


#: Kept under its old name: :func:`gathered_bytes` (ZeRO-3's gathered layers were the first working set).
zero3_gathered_bytes = gathered_bytes


def offload_split(p_bytes: int, g_bytes: int, o_bytes: int, n_train: int,
                  setup: TrainingSetup) -> tuple[int, int, int, int]:
    """What moves to host memory with CPU offload, and what the GPU keeps (:meth:`Framework.offload`)."""
    return framework_for(setup).offload(p_bytes, g_bytes, o_bytes, n_train, setup)


def bucket_bytes(setup: TrainingSetup) -> tuple[int, int]:
    """DeepSpeed's gradient reduce bucket: (backward, step) bytes (:meth:`DeepSpeed.comm_buffers`); (0, 0) elsewhere."""
    return framework_for(setup).comm_buffers(setup)


def ddp_bucket_bytes(setup: TrainingSetup, g_bytes: int) -> tuple[int, int]:
    """PyTorch DDP's gradient buckets: (backward, step) bytes (:meth:`PyTorch.gradient_buffers`); (0, 0) elsewhere."""
    return framework_for(setup).gradient_buffers(setup, g_bytes)


def optimizer_step_bytes(cfg: ModelConfig, setup: TrainingSetup, g_bytes: int, n: int, n_train: int) -> int:
    """Temporaries of the optimizer step on the GPU, on top of the states and all gradients
    (:meth:`Framework.optimizer_step_bytes`; ``g_bytes`` is not used and kept for the old signature)."""
    return framework_for(setup).optimizer_step_bytes(cfg, setup, n, n_train)


def fsdp2_traced_layout(setup: TrainingSetup) -> bool:
    """Whether the setup is FSDP2 with its working set modelled moment by moment (:func:`.fsdp2.traced_layout`)."""
    return setup.framework == FSDP_2.name and _fsdp2_traced(setup)
