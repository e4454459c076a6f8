"""DeepSpeed ZeRO stages 0-3, ZeRO-Offload and ZeRO-Infinity's parameter offload (pure Python, Chapters 1, 6, 7).

``deepspeed/runtime/zero/stage_1_and_2.py``, ``stage3.py``: the ZeRO paper's accounting (Rajbhandari et al.
2020, §5, ``rajbhandari2020zero``): 16-bit params 2 + 16-bit grads 2 + fp32 master, m, v 12, partitioned by stage
(Table 1 stays exact), plus the step's fp32 gradient partition (:meth:`DeepSpeed.optimizer_step_bytes`) and the
reduce bucket (:meth:`DeepSpeed.comm_buffers`).
"""
from __future__ import annotations

from typing import ClassVar

from ..configs import ModelConfig
from ..setup import TrainingSetup
from .base import Framework

__all__ = ["DeepSpeed", "DEEPSPEED", "DS_REDUCE_BUCKET", "DS_SUB_GROUP_SIZE"]

#: DeepSpeed's ``reduce_bucket_size`` default, elements (``deepspeed/runtime/zero/config.py``: ``pp_int(5e8)``).
DS_REDUCE_BUCKET = 500_000_000
#: DeepSpeed ZeRO-3's ``sub_group_size`` default, elements (``deepspeed/runtime/zero/config.py``: ``pp_int(1e9)``).
DS_SUB_GROUP_SIZE = 1_000_000_000


class DeepSpeed(Framework):
    """DeepSpeed: 16-bit params and grads with an fp32 master (ZeRO paper §3), sharded by ZeRO stage."""

    name: ClassVar[str] = "deepspeed"
    mixed_layout: ClassVar[tuple[float, float, float, float]] = (2.0, 2.0, 4.0, 4.0)
    sharded_optimizer: ClassVar[str] = "DeepSpeed ZeRO-1"

    def working_set(self, cfg: ModelConfig | None, layer_params: int, p_sharded: int, n: int, n_train: int,
                    setup: TrainingSetup) -> tuple[int, int]:
        """ZeRO-3's gathered layers (``deepspeed/runtime/zero/partitioned_param_coordinator.py``).

        U is the largest unit (a decoder layer or the V·h embedding; DeepSpeed's
        ``estimate_zero3_model_states_mem_needs`` takes the largest layer too): the module being computed and the
        prefetched next, gathered in the base weight dtype w: 2·w·U; one module's 16-bit gradients g·U until
        reduce-scattered (full fine-tuning only: LoRA's frozen base has none). (0, 0) below stage 3.
        """
        if cfg is None or setup.zero_stage != 3:
            return 0, 0
        full = setup.method == "full"
        biggest = max(layer_params, cfg.vocab_size * cfg.hidden_size)
        base_per_param = (p_sharded * setup.num_gpus - 4 * (0 if full else n_train)) / n
        g = self.state_bytes(setup.precision, setup.optimizer)[1]
        return int(2 * base_per_param * biggest), int(g * biggest) if full else 0

    def offload(self, p_bytes: int, g_bytes: int, o_bytes: int, n_train: int,
                setup: TrainingSetup) -> tuple[int, int, int, int]:
        """``offload_optimizer`` (ZeRO-Offload, Ren et al. 2021, §4, ``ren2021zerooffload``): the optimizer states
        (fp32 master included) and the fp32 gradient partition, 4·Ψ_train/N, live in CPU memory and the step
        runs there; the GPU keeps the 16-bit weights and gradients. With ZeRO-2 each gradient goes to the host
        through the reduce bucket (``reduce_bucket_size`` = 5·10⁸ elements): the GPU holds at most g·5·10⁸ bytes
        of them. ``offload_param`` (ZeRO-Infinity, ``rajbhandari2021zeroinfinity``) moves the 16-bit weight
        shards too; the GPU holds only gathered layers."""
        if setup.offload == "none":
            return p_bytes, g_bytes, o_bytes, 0
        cpu_bytes = o_bytes + -(-4 * n_train // setup.shards)
        if setup.offload == "optimizer" and setup.zero_stage == 2 and setup.method == "full":
            g_bytes = min(g_bytes, int(self.state_bytes(setup.precision, setup.optimizer)[1] * DS_REDUCE_BUCKET))
        if setup.offload == "params+optimizer":
            cpu_bytes += p_bytes
            p_bytes = 0
            g_bytes = 0 if setup.method == "full" else g_bytes
        return p_bytes, g_bytes, 0, cpu_bytes

    def comm_buffers(self, setup: TrainingSetup) -> tuple[int, int]:
        """The gradient reduce bucket: (bytes live in the backward pass, bytes live at the optimizer step).

        ``deepspeed/runtime/zero/config.py``: ``contiguous_gradients`` True, ``reduce_bucket_size`` 5·10⁸
        elements, ``overlap_comm`` False below stage 3. Stages 1–2 (``stage_1_and_2.py``, ``setup_buckets``)
        allocate one bucket of 5·10⁸ gradient elements (two with ``overlap_comm``) before the backward pass and
        free it at the step (``_release_ipg_buffers``); ZeRO-3 (``stage3.py``, ``_create_fp16_sub_groups``'
        caller) allocates its bucket once, at initialization, so it is live at the step too. The all-gather of
        the updated weights (``allgather_bucket_size``) needs no buffer: ``all_gather_dp_groups`` gathers into
        the flat 16-bit groups with ``all_gather_into_tensor``. With offload the bucket is the gradients'
        staging area, already counted by :meth:`offload`; stage 0 has none.
        """
        if setup.zero_stage == 0 or setup.offload != "none":
            return 0, 0
        bucket = int(self.state_bytes(setup.precision, setup.optimizer)[1] * DS_REDUCE_BUCKET)
        return bucket, bucket if setup.zero_stage == 3 else 0

    def optimizer_step_bytes(self, cfg: ModelConfig, setup: TrainingSetup, n: int, n_train: int) -> int:
        """The step's fp32 gradient partition (the default optimizer is ``FusedAdam``,
        ``deepspeed/ops/adam/fused_adam.py``: no temporary of its own; ``optimizer_impl`` is ignored).

        Stages 0–2: ``DeepSpeedZeroOptimizer.step`` flattens the rank's gradient partition and converts it to
        fp32 (``single_grad_partition = self.flatten_dense_tensors_aligned(self.averaged_gradients[i], ...)
        .to(fp32)``, assigned to ``single_partition_of_fp32_groups[i].grad``, freed after the step): the flat
        16-bit copy ``torch.cat`` makes and its fp32 conversion coexist, 2·Ψ/N + 4·Ψ/N in mixed precision (the
        flat copy alone when the dtype already matches); the trace's DeepSpeed recipe
        (:mod:`memlib.measure.recipes`) holds the same. Stage 3 (``stage3.py``,
        ``_prepare_fp32_grad_for_sub_group``) does it one sub-group at a time: 4·min(``sub_group_size`` = 10⁹,
        ⌈Ψ/N⌉). Stage 0 is ``BF16_Optimizer``/``FP16_Optimizer`` in mixed precision (the same fp32 flatten,
        N = 1) and the bare optimizer in fp32 or pure bf16 (0). With offload the step runs on the CPU: 0.
        """
        if setup.offload != "none":
            return 0
        n_step = n if setup.method == "full" else n_train
        if setup.zero_stage == 0 and setup.precision in ("fp32", "bf16"):
            return 0  # no ZeRO optimizer wrapper: the client's optimizer steps the parameters
        part = -(-n_step // setup.shards)
        if setup.zero_stage == 3:
            v_bytes = 2 if setup.precision == "bf16" and setup.method == "full" else 4
            return v_bytes * min(DS_SUB_GROUP_SIZE, part)
        flat = 4 if setup.precision == "fp32" or setup.method != "full" else 2  # torch.cat's flat copy
        return (flat + (4 if setup.precision.endswith("-mixed") else 0)) * part  # + its fp32 conversion


#: The DeepSpeed framework object.
DEEPSPEED = DeepSpeed()
