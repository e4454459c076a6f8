"""Model states per GPU, composed from the setup's framework object: weights, gradients, optimizer states (Chapter 1).

The first half of :func:`memlib.core.estimate.estimate_training` and the whole of it with ``params=``: the
framework's states per parameter, its sharding, its working set, its offload split and its gradient buffers, in
that order, without naming a framework (:mod:`memlib.core.frameworks`). :mod:`memlib.core.parallel` builds each
pipeline stage's states here too, so this module sits below both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .configs import ModelConfig
from .frameworks import framework_for
from .setup import TrainingSetup
from .terms import TrainingEstimate

__all__ = ["ModelStates", "model_states", "states_estimate", "echo_settings"]


@dataclass(frozen=True)
class ModelStates:
    """One GPU's model states, in bytes, as the framework lays them out.

    Attributes:
        params_bytes, grads_bytes, optimizer_bytes: on the GPU, the working set included.
        cpu_bytes: offloaded to host memory.
        trainable_params: Ψ_train (all parameters for full fine-tuning, the adapters' for LoRA).
        gathered_params_bytes, gathered_grads_bytes: the unsharded working set inside the two above.
        buffer_backward, buffer_step: gradient buffers (DDP's buckets), through the backward pass and at the step
            on top of the gradients.
    """

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    cpu_bytes: int
    trainable_params: int
    gathered_params_bytes: int
    gathered_grads_bytes: int
    buffer_backward: int
    buffer_step: int


def model_states(cfg: ModelConfig | None, n: int, small: int, layer_params: int, setup: TrainingSetup) -> ModelStates:
    """The framework's model states for Ψ = ``n`` parameters (``small`` of them in tensors under 4096 elements,
    ``layer_params`` in one decoder layer): states per parameter, sharding, working set, offload split, buffers."""
    fw = framework_for(setup)
    p_bytes, g_bytes, o_bytes, n_train = fw.model_state_bytes(cfg, n, small, setup)
    p_bytes, g_bytes, o_bytes = fw.shard(p_bytes, g_bytes, o_bytes, setup)
    gathered_p, gathered_g = fw.working_set(cfg, layer_params, p_bytes, n, n_train, setup)
    p_bytes, g_bytes, o_bytes, cpu_bytes = fw.offload(p_bytes, g_bytes, o_bytes, n_train, setup)
    p_bytes += gathered_p
    g_bytes += gathered_g
    buf_backward, buf_step = fw.gradient_buffers(setup, g_bytes)
    return ModelStates(p_bytes, g_bytes, o_bytes, cpu_bytes, n_train, gathered_p, gathered_g, buf_backward, buf_step)


def states_estimate(n: int, setup: TrainingSetup) -> TrainingEstimate:
    """The estimate for ``n`` parameters without a model: model states only (``estimate_training(params=n)``)."""
    st = model_states(None, n, 0, 0, setup)
    g_bytes = st.grads_bytes + st.buffer_step
    return TrainingEstimate(st.params_bytes, g_bytes, st.optimizer_bytes, None, 0,
                            st.params_bytes + g_bytes + st.optimizer_bytes, "states",
                            echo_settings(setup, None, n, st.trainable_params), st.cpu_bytes)


def echo_settings(setup: TrainingSetup, cfg: ModelConfig | None, n: int, n_train: int) -> dict[str, Any]:
    """The settings echoed in :attr:`memlib.core.estimate.TrainingEstimate.settings`."""
    settings: dict[str, Any] = {
        "batch_size": setup.batch_size, "seq_len": setup.seq_len, "precision": setup.precision,
        "optimizer": setup.optimizer, "zero_stage": setup.zero_stage, "num_gpus": setup.num_gpus,
        "recompute": setup.recompute, "attention": setup.attention, "checkpoint_every": setup.checkpoint_every,
        "offload": setup.offload, "method": setup.method, "framework": setup.framework}
    if setup.optimizer_impl != "foreach":  # the default is not echoed, so default JSON stays as it was
        settings["optimizer_impl"] = setup.optimizer_impl
    if setup.gradient_as_bucket_view:  # likewise
        settings["gradient_as_bucket_view"] = True
    if setup.optimizer_source != "framework":  # likewise
        settings["optimizer_source"] = setup.optimizer_source
    if setup.grad_accum != 1:  # likewise
        settings["grad_accum"] = setup.grad_accum
    if setup.grad_accum_dtype != "model":  # likewise
        settings["grad_accum_dtype"] = setup.grad_accum_dtype
    if setup.precision == "fp8-mixed":  # Chapter 17
        settings["fp8_recipe"] = setup.fp8_recipe
    if setup.loss != "standard":
        settings.update(loss=setup.loss, **({"loss_chunk": setup.loss_chunk} if setup.loss == "chunked" else {}))
    if setup.method != "full":
        settings.update(lora_rank=setup.lora_rank, lora_targets=setup.lora_targets)
    if cfg is not None:
        settings["model"] = cfg.name
    settings["params"] = n
    settings["trainable_params"] = n_train
    return settings
