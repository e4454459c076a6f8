"""DeepSpeed ZeRO stages 0-3, ZeRO-Offload and ZeRO-Infinity's parameter offload (pure Python, Chapters 1, 6, 7).

``deepspeed/runtime/zero/stage_1_and_2.py``, ``stage3.py`` (DeepSpeed 0.19.8): the ZeRO paper's accounting
(Rajbhandari et al. 2020, §5, ``rajbhandari2020zero``): 16-bit params 2 + 16-bit grads 2 + fp32 master, m, v 12,
partitioned by stage, plus the step's fp32 gradient partition (:meth:`DeepSpeed.optimizer_step_bytes`) and the
reduce bucket (:meth:`DeepSpeed.comm_buffers`). Where the code departs from the paper's Table 1:

- ZeRO-1 frees the gradients outside its partition bucket by bucket as ZeRO-2 does, at the micro-batch that ends
  the accumulation (``reduce_ready_partitions_and_remove_grads``: ``if self.partition_gradients or
  self.is_gradient_accumulation_boundary()``): with one micro-batch per step it is ZeRO-2 byte for byte; with
  ``grad_accum`` > 1 it keeps all 16-bit gradients between micro-batches (:meth:`DeepSpeed.backward_extra`).
- ``DeepSpeedZeroOptimizer`` always clones its partition into a master copy, also in fp32 and pure bf16
  (:meth:`DeepSpeed.model_state_bytes`); stage 0 in mixed precision is ``FP16_Optimizer``.
- ZeRO-2 with ``grad_accum`` > 1 holds two gradient partitions from the first bucket reduced to the backward
  epilogue (``copy_grads_in_partition``, :meth:`DeepSpeed.backward_extra`).
- ZeRO-3's gathered working set is the coordinator's (``partitioned_param_coordinator.py``), replayed by
  :mod:`memlib.core.frameworks.zero3_fetch` (:meth:`DeepSpeed.working_set`).
- ``grad_accum_dtype`` fp32 at ZeRO-1 in bf16 is ``BF16_Optimizer`` (:meth:`DeepSpeed.bf16_optimizer`).
- The model is the steady state: ZeRO optimizers create Adam's m and v at the first step, so the first step's
  peak differs.

Checked against DeepSpeed 0.19.8's engine measured on CPU (two gloo ranks, a tiny Llama; stages 0-3 with one and
two micro-batches, and ``BF16_Optimizer``): ``tests/test_deepspeed_measured.py``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from ..configs import ModelConfig
from ..setup import TrainingSetup
from .base import Framework, Saved
from .zero3_fetch import PERSISTENCE_THRESHOLD, gathered_peak, largest_module

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

    #: ``stage3_param_persistence_threshold`` (elements): parameters below it stay whole on every rank.
    param_persistence_threshold: ClassVar[int] = PERSISTENCE_THRESHOLD

    def working_set(self, cfg: ModelConfig | None, layer_params: int, p_sharded: int, n: int, n_train: int,
                    setup: TrainingSetup) -> tuple[int, int]:
        """ZeRO-3's gathered parameters and gradients (``deepspeed/runtime/zero/partitioned_param_coordinator.py``).

        Weights: the most elements gathered at once over a traced forward and backward pass, as the coordinator
        fetches, prefetches and releases them (:func:`~memlib.core.frameworks.zero3_fetch.gathered_peak`: per
        submodule, prefetching up to ``prefetch_bucket_size`` = 5·10⁷ elements, capped at
        ``max_live_parameters`` = 10⁹, keeping what is reused within ``max_reuse_distance`` = 10⁹ elements, a
        prefetched parameter held twice until its coalesced gather's flat buffer is consumed (a one-parameter
        gather once), parameters under ``stage3_param_persistence_threshold`` = 10⁵ elements whole), in the base
        weight dtype w: for Llama-2-7B about 1.13·10⁹ elements, several layers. Measured on CPU (a tiny Llama,
        two ranks): with the defaults the forward's prefetch gathers the whole model in one call and holds it
        twice, 2·w·Ψ; with the three knobs set small the all-gather's bytes equal the replay's to the byte. Gradients: one module's 16-bit
        gradients, g times the largest module's own parameters, until copied into the reduce bucket (full
        fine-tuning only: LoRA's frozen base has none). (0, 0) below stage 3. DeepSpeed's own
        ``estimate_zero3_model_states_mem_needs`` takes the largest single module (``model_to_params``:
        ``parameters(recurse=False)``), not a decoder layer, and leaves the prefetch out. Nothing is gathered at
        the step: ``stage3.py``'s ``step()`` calls ``_partition_all_parameters()`` first
        (:meth:`working_set_at_step`).
        """
        if cfg is None or setup.zero_stage != 3:
            return 0, 0
        full = setup.method == "full"
        gathered = gathered_peak(cfg, layer_params, setup.recompute == "full",
                                 persistence_threshold=self.param_persistence_threshold)
        base_per_param = (p_sharded * setup.num_gpus - 4 * (0 if full else n_train)) / n
        g = self.state_bytes(setup.precision, setup.optimizer)[1]
        return int(base_per_param * gathered), int(g * largest_module(cfg, layer_params)) if full else 0

    def working_set_at_step(self, setup: TrainingSetup) -> bool:
        """ZeRO-3 releases every gathered parameter before stepping (``stage3.py``, ``step``:
        ``self._partition_all_parameters()``): nothing of the working set is live at the step."""
        return setup.zero_stage != 3

    def model_state_bytes(self, cfg: ModelConfig | None, n: int, small: int,
                          setup: TrainingSetup) -> tuple[int, int, int, int]:
        """:meth:`Framework.model_state_bytes`, plus the master copy ``DeepSpeedZeroOptimizer`` clones at ZeRO ≥ 1
        in fp32 and pure bf16 (``stage_1_and_2.py``: ``single_partition_of_fp32_groups[i] =
        self.parallel_partitioned_bit16_groups[i][partition_id].to(self.device).clone().float().detach()``;
        pure bf16 needs ``bf16_master_weights_and_grads``, which keeps that copy in bf16): fp32 4 + 4 + 12/N,
        pure bf16 2 + 2 + (2 + 4)/N. Stage 0 without mixed precision steps the client's optimizer: no copy."""
        p, g, o, n_train = super().model_state_bytes(cfg, n, small, setup)
        if setup.method == "full" and setup.zero_stage >= 1 and setup.precision in ("fp32", "bf16"):
            o += int(self.layout(setup.precision)[0] * n)
        if self.bf16_optimizer(setup):  # the unsharded fp32 gradient buffer beside the 16-bit gradients
            g += 4 * n
        return p, g, o, n_train

    def bf16_optimizer(self, setup: TrainingSetup) -> bool:
        """Whether DeepSpeed runs ``BF16_Optimizer``: ``grad_accum_dtype`` fp32 with ZeRO-1 in bf16 and no offload
        (``engine.py``, ``_do_optimizer_sanity_check``: ``model_dtype == torch.bfloat16 and grad_accum_dtype ==
        torch.float32 and self.zero_optimization_stage() == 1 and not self.zero_cpu_offload()`` → ``BFLOAT16``).
        ``bf16_optimizer.py``, ``_setup_for_real_optimizer``: the 16-bit weights flattened (2Ψ), the fp32 master
        partition (``bf16_dp_partitions[partition_id].clone().float()``, 4Ψ/N), Adam's m and v (8Ψ/N) and an fp32
        gradient buffer the size of the whole model from initialisation (``torch.zeros_like(self.bf16_groups_flat[i],
        dtype=self.grad_acc_dtype)``, 4Ψ); the 16-bit gradients (2Ψ) are added into it in the backward epilogue
        (``update_hp_grads``) and stay until the next backward's ``clear_lp_grads``: 2 + 2 + 4 + 12/N bytes/param,
        no ZeRO reduce bucket. Measured on CPU (two ranks, a tiny Llama): exactly that plus the engine's
        ``allreduce_bucket`` flatten (``engine.py``, ``allreduce_no_retain``: a 16-bit copy of up to
        ``reduce_bucket_size`` elements) at the backward epilogue."""
        return setup.grad_accum_dtype == "fp32" and setup.framework == "deepspeed"

    def shard_stage(self, setup: TrainingSetup) -> int:
        """ZeRO-1 with one micro-batch per step shards the gradients as ZeRO-2 does (the rank's partition is what
        stays); with ``grad_accum`` > 1 it keeps all of them between micro-batches, the ZeRO paper's P_os
        (2Ψ + 2Ψ + KΨ/N, its Table 1: :meth:`keeps_all_gradients`)."""
        if self.bf16_optimizer(setup):
            return 1  # BF16_Optimizer partitions only the master and the states
        return 2 if setup.zero_stage == 1 and not self.keeps_all_gradients(setup) else setup.zero_stage

    def keeps_all_gradients(self, setup: TrainingSetup) -> bool:
        """Whether all 16-bit gradients stay between micro-batches: ZeRO-1 with ``grad_accum`` > 1 (``stage_1_and_2.py``, ``reduce_ready_partitions_and_remove_grads`` reduces before the boundary only
        when ``self.partition_gradients``; ZeRO-2 reduces every micro-batch into its partition)."""
        return (setup.zero_stage == 1 and setup.grad_accum > 1 and setup.method == "full"
                and not self.bf16_optimizer(setup))

    def backward_extra(self, cfg: ModelConfig, setup: TrainingSetup, saved: Saved, g_bytes: int, n: int,
                       layer_params: int, generic_peak: Callable[[int], int]) -> int:
        """ZeRO-1 with gradient accumulation: from the second micro-batch on every backward pass starts with all
        16-bit gradients (g·Ψ, ``g_bytes`` unsharded) and the reduce bucket (allocated at the first gradient hook, ``setup_buckets``,
        released in the backward epilogue, ``_release_ipg_buffers``); new gradients add into them in place. The
        other stages: :meth:`Framework.backward_extra` (the rank's partition accumulating, the bucket on top), with
        ZeRO-3's gathered working set (:meth:`working_set`), which the estimate leaves out of the step. ZeRO-2 with
        ``grad_accum`` > 1: the previous micro-batch's gradient partition beside the new one (below)."""
        if self.keeps_all_gradients(setup):
            return generic_peak(0) + g_bytes + self.comm_buffers(setup)[0]
        if self.bf16_optimizer(setup):  # the fp32 buffer from the start; the 16-bit gradients build up
            fp32_buffer, g16 = 4 * n, g_bytes - 4 * n
            flat = 2 * min(DS_REDUCE_BUCKET, n)  # the engine's allreduce flatten, at the epilogue
            return max(generic_peak(g16) + fp32_buffer, g_bytes + flat)
        extra = super().backward_extra(cfg, setup, saved, g_bytes, n, layer_params, generic_peak)
        if setup.zero_stage in (1, 2) and setup.offload == "none":
            # reducing a bucket flattens its gradients (average_tensor -> allreduce_and_scatter ->
            # allreduce_bucket: self.flatten(bucket)), a bucket-sized 16-bit copy beside the bucket; measured on
            # CPU it sets the backward peak of a model smaller than the bucket (its gradients are views of it,
            # reduced in the backward epilogue)
            g = self.state_bytes(setup.precision, setup.optimizer)[1]
            n_red = n if setup.method == "full" else 0
            flat = int(g * min(DS_REDUCE_BUCKET, n_red))
            # ZeRO-2 with accumulation: after the first micro-batch the rank's gradients are views of the last
            # micro-batch's partition buffer; copy_grads_in_partition allocates a new one in full at the first
            # reduction (_release_ipg_buffers set self.grads_in_partition = None; torch.empty(total_size)) and the
            # old one dies only when its last gradient has moved (grad_reduc.data = new_grad_tensor.data): two
            # partitions from the first bucket reduced to the epilogue (measured on CPU: +g·Ψ/N)
            second = int(g * -(-n_red // setup.shards)) if setup.zero_stage == 2 and setup.grad_accum > 1 else 0
            if n_red > DS_REDUCE_BUCKET:  # reductions inside the backward pass: the copy is there at its peak
                extra += second
            extra = max(extra, self.comm_buffers(setup)[0] + flat + second)  # at the epilogue: activations freed
        if setup.zero_stage == 3:  # the gathered working set, live in the backward pass but not at the step
            p, g, o, n_train = self.model_state_bytes(cfg, n, 0, setup)
            extra += sum(self.working_set(cfg, layer_params, self.shard(p, g, o, setup)[0], n, n_train, setup))
        return extra

    def offload(self, p_bytes: int, g_bytes: int, o_bytes: int, n_train: int,
                setup: TrainingSetup) -> tuple[int, int, int, int]:
        """``offload_optimizer`` (ZeRO-Offload, Ren et al. 2021, §4, ``ren2021zerooffload``): the optimizer states
        (fp32 master included) and the fp32 gradient partition, 4·Ψ_train/N, live in CPU memory and the step
        runs there; the GPU keeps the 16-bit weights and gradients. With ZeRO-2 each gradient goes to the host
        through the reduce bucket (``reduce_bucket_size`` = 5·10⁸ elements): the GPU holds at most g·5·10⁸ bytes
        of them. ``offload_param`` (ZeRO-Infinity, ``rajbhandari2021zeroinfinity``) moves the 16-bit weight
        shards too; the GPU holds only gathered layers. ZeRO-1 sends its gradients through the bucket as ZeRO-2
        does (at the boundary micro-batch; before it, with ``grad_accum`` > 1, it keeps them all on the GPU,
        :meth:`backward_extra`).

        Host memory beyond the states and the fp32 gradients (full fine-tuning): ZeRO-Offload stage 1/2 also pins
        a 16-bit partition buffer (``stage_1_and_2.py``, ``param_buffer_of_bit16_for_cpu_offload_groups``,
        2Ψ/N) and with ``grad_accum`` > 1 the 16-bit running sum (``accumulated_grads_in_cpu``, 2Ψ/N): 18Ψ/N, 20Ψ/N
        with accumulation; ZeRO-3 keeps its gradient partitions' 16-bit flat buffer on the host (2Ψ/N)."""
        if setup.offload == "none":
            return p_bytes, g_bytes, o_bytes, 0
        cpu_bytes = o_bytes + -(-4 * n_train // setup.shards)
        if setup.method == "full":
            part = -(-2 * n_train // setup.shards)
            cpu_bytes += part + (part if setup.zero_stage < 3 and setup.grad_accum > 1 else 0)
        if (setup.offload == "optimizer" and setup.zero_stage in (1, 2) and setup.method == "full"
                and not self.keeps_all_gradients(setup)):
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
        if setup.zero_stage == 0 or setup.offload != "none" or self.bf16_optimizer(setup):
            return 0, 0
        bucket = int(self.state_bytes(setup.precision, setup.optimizer)[1] * DS_REDUCE_BUCKET)
        return bucket, bucket if setup.zero_stage == 3 else 0

    def optimizer_step_bytes(self, cfg: ModelConfig, setup: TrainingSetup, n: int, n_train: int) -> int:
        """The step's fp32 gradient partition (the default optimizer is ``FusedAdam``,
        ``deepspeed/ops/adam/fused_adam.py``: no temporary of its own; ``optimizer_impl`` is ignored).

        Stages 1–2: ``DeepSpeedZeroOptimizer.step`` flattens the rank's gradient partition and converts it to
        fp32 (``single_grad_partition = self.flatten_dense_tensors_aligned(self.averaged_gradients[i], ...)
        .to(fp32)``, assigned to ``single_partition_of_fp32_groups[i].grad``, freed after the step): the flat
        16-bit copy ``torch.cat`` makes and its fp32 conversion coexist, 2·Ψ/N + 4·Ψ/N in mixed precision (the
        flat copy alone when the dtype already matches). Stage 3 (``stage3.py``,
        ``_prepare_fp32_grad_for_sub_group``: ``self.flatten(self.averaged_gradients[sub_group_id]).to(fp32)``)
        does the same one sub-group at a time: (2 + 4)·min(``sub_group_size`` = 10⁹, ⌈Ψ/N⌉) in mixed precision.
        Stage 0 in mixed precision is ``FP16_Optimizer`` (the engine's ``_do_optimizer_sanity_check`` routes bf16
        there too while ``grad_accum_dtype`` is the model's): its step makes per-parameter fp32 gradient copies
        (4Ψ) and flattens them (4Ψ): 8Ψ, so 2 + 2 + 12 + 8 = 24 bytes/param at the step. In fp32 or pure bf16
        stage 0 steps the client's optimizer (0 here). With offload the step runs on the CPU: 0.
        """
        if setup.offload != "none":
            return 0
        n_step = n if setup.method == "full" else n_train
        mixed = setup.precision.endswith("-mixed")
        if setup.zero_stage == 0:
            return 8 * n_step if mixed else 0  # FP16_Optimizer; else no ZeRO wrapper: the client's optimizer
        if self.bf16_optimizer(setup):
            return 0  # the fp32 partition's gradients are views of the fp32 buffer
        part = -(-n_step // setup.shards)
        flat = 4 if setup.precision == "fp32" or setup.method != "full" else 2  # torch.cat's flat copy
        per = flat + (4 if mixed and setup.method == "full" else 0)  # + its fp32 conversion
        if setup.zero_stage == 3:
            return per * min(DS_SUB_GROUP_SIZE, part)
        return (flat + (4 if mixed else 0)) * part


#: The DeepSpeed framework object.
DEEPSPEED = DeepSpeed()
