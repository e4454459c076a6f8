"""FSDP2 (``torch.distributed.fsdp.fully_shard``) with ``MixedPrecisionPolicy`` and ``CPUOffloadPolicy`` (Chapter 6).

``torch/distributed/fsdp/_fully_shard``: ``fully_shard`` with ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)``: sharded fp32 params, grads and Adam states, (4 + 4 + 8)/N, at both of memlib's stages (2
and 3 are ``reshard_after_forward`` False and True and differ in the working set, :meth:`FSDP2.working_set`),
plus the unsharded working set, live in the backward pass only (:func:`fsdp2_backward_bytes`; checked against
real ``fully_shard`` traces on one and two gloo ranks, ``tests/test_trace_fsdp2.py``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from ..configs import ModelConfig
from ..losses import loss_logits
from ..setup import TrainingSetup
from ..terms import sum_terms
from ..terms import ActivationTerm
from .base import Framework, Saved, torch_adamw_step_bytes
from .torchtitan import torchtitan_activation_terms

__all__ = ["FSDP2", "FSDP_2", "traced_layout", "fsdp2_backward_bytes"]


def traced_layout(setup: TrainingSetup) -> bool:
    """Whether FSDP2's working set is modelled moment by moment (:func:`fsdp2_backward_bytes`, checked against
    real ``fully_shard`` traces): full fine-tuning without offload. LoRA and ``CPUOffloadPolicy`` keep the
    coarser :meth:`FSDP2.working_set` (two gathered units, or every layer at zero 2, live at both peaks)."""
    return setup.method == "full" and setup.offload == "none"


class FSDP2(Framework):
    """FSDP2: sharded fp32 params, grads and optimizer states; an unsharded working set in the backward pass."""

    name: ClassVar[str] = "fsdp2"
    mixed_layout: ClassVar[tuple[float, float, float, float]] = (4.0, 4.0, 0.0, 4.0)
    sharded_optimizer: ClassVar[str] = "FSDP2's fully_shard"
    offload_traffic: ClassVar[str] = "fsdp2"

    def parallel_activation_terms(self, cfg: ModelConfig, setup: TrainingSetup) -> list[ActivationTerm]:
        """With tp/pp/cp FSDP2 is TorchTitan's layout, and the model TorchTitan's Llama 3
        (:func:`memlib.core.frameworks.torchtitan.torchtitan_activation_terms`) for the dense llama-like
        families; the others keep the transformers terms."""
        if cfg.moe is not None or cfg.mla is not None or cfg.model_type not in ("llama", "mistral", "qwen2", "olmo2"):
            return super().parallel_activation_terms(cfg, setup)
        return torchtitan_activation_terms(cfg, setup.batch_size, setup.seq_len, 4 if setup.precision == "fp32" else 2)

    def shard_stage(self, setup: TrainingSetup) -> int:
        """``fully_shard`` shards parameters, gradients and optimizer states at both stages."""
        return 3

    def working_set(self, cfg: ModelConfig | None, layer_params: int, p_sharded: int, n: int, n_train: int,
                    setup: TrainingSetup) -> tuple[int, int]:
        """The unsharded weights and gradients (``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``).

        All-gathered weights in ``param_dtype`` (2 bytes under mixed precision or bf16, 4 in fp32): with
        ``reshard_after_forward=True`` (zero 3) the layer being computed and the prefetched next, 2·p·U; with
        ``False`` (zero 2) every layer's from the forward to its backward, p·Ψ. Gradients: one layer's unsharded
        gradient in ``param_dtype`` plus its fp32 copy for ``reduce_dtype`` before the reduce-scatter
        (``_fsdp_collectives.py``: ``foreach_reduce``), (p + 4)·U under mixed precision, p·U otherwise. That is
        the coarse model kept for LoRA and ``CPUOffloadPolicy``; full fine-tuning without offload
        (:func:`traced_layout`) returns the working set at its largest as :func:`fsdp2_backward_bytes` follows
        it, which the estimate counts in the backward pass only (FSDP2 reshards every group after its backward:
        none of it is live at the step): weights p·U_r (the root group: embedding, final norm, LM head) + p·U_l
        for each layer unsharded at once (zero 2: all L; zero 3: 1, or 2 with the prefetch of N > 1 ranks);
        gradients the LM head's and final norm's p·(V·h + h) + one layer's unsharded gradients and
        reduce-scatter input, (p + r)·U_l.
        """
        if cfg is None:
            return 0, 0
        if traced_layout(setup):  # freed before the step: fsdp2_backward_bytes' moments
            p, r = (4, 4) if setup.precision == "fp32" else (2, 2) if setup.precision == "bf16" else (2, 4)
            u_root = n - cfg.num_layers * layer_params
            layers = cfg.num_layers if setup.zero_stage == 2 else 1 + (1 if setup.num_gpus > 1 else 0)
            return (p * (u_root + layers * layer_params),
                    p * (cfg.vocab_size * cfg.hidden_size + cfg.hidden_size) + (p + r) * layer_params)
        biggest = max(layer_params, cfg.vocab_size * cfg.hidden_size)
        pb = 4 if setup.precision == "fp32" else 2
        weights = pb * n if setup.zero_stage == 2 else 2 * pb * biggest
        grads = (pb + (4 if setup.precision.endswith("-mixed") else 0)) * biggest
        return int(weights), int(grads) if setup.method == "full" else 0

    def working_set_at_step(self, setup: TrainingSetup) -> bool:
        """The traced layout reshards every group after its backward: nothing of the working set at the step."""
        return not traced_layout(setup)

    def offload(self, p_bytes: int, g_bytes: int, o_bytes: int, n_train: int,
                setup: TrainingSetup) -> tuple[int, int, int, int]:
        """``CPUOffloadPolicy``: the sharded fp32 params, grads and optimizer states all live on the host."""
        if setup.offload == "none":
            return p_bytes, g_bytes, o_bytes, 0
        return 0, 0, 0, p_bytes + g_bytes + o_bytes

    def backward_extra(self, cfg: ModelConfig, setup: TrainingSetup, saved: Saved, g_bytes: int, n: int,
                       layer_params: int, generic_peak: Callable[[int], int]) -> int:
        """FSDP2's own backward moments (:func:`fsdp2_backward_bytes`) for the traced layout; else the default."""
        if not traced_layout(setup):
            return super().backward_extra(cfg, setup, saved, g_bytes, n, layer_params, generic_peak)
        layer_acts = (saved.bytes - sum_terms(saved.terms)[1]) // cfg.num_layers
        return fsdp2_backward_bytes(cfg, setup, saved.bytes, layer_acts, saved.live_layer, n, layer_params)

    def optimizer_step_bytes(self, cfg: ModelConfig, setup: TrainingSetup, n: int, n_train: int) -> int:
        """``torch.optim.AdamW`` over the rank's 1/N shards, each tensor sharded too
        (:func:`memlib.core.frameworks.base.torch_adamw_step_bytes`)."""
        return torch_adamw_step_bytes(cfg, setup, n, n_train, setup.num_gpus, setup.num_gpus)


#: The FSDP2 framework object.
FSDP_2 = FSDP2()


def fsdp2_backward_bytes(cfg: ModelConfig, setup: TrainingSetup, acts_bytes: int, layer_acts: int, live_layer: int,
                         n: int, layer_params: int) -> int:
    """FSDP2's bytes on top of its sharded parameters and optimizer states at the backward pass's peak.

    Followed through ``torch/distributed/fsdp/_fully_shard`` (``fully_shard`` on every decoder layer, then the
    root: embedding, final norm and LM head; traced for real by :mod:`memlib.measure.recipes`). A = saved
    activations, ``layer_acts`` one layer's (or one segment input's) share of them, e the activation bytes,
    p the ``param_dtype`` bytes (2 under mixed precision and bf16, 4 in fp32), r the ``reduce_dtype`` bytes (4
    under mixed precision), q the sharded gradient's (the model's own dtype), U_l a layer's and U_r the root's
    parameters, N the ranks:

    * working set (``_fsdp_param_group.py``, ``FSDPParamGroup.unshard``/``wait_for_unshard``/``reshard``): the
      root is unsharded from the loss to the end of the backward (its embedding's gradient comes last), p·U_r;
      a layer from its ``pre_backward`` to its ``post_backward``. With ``reshard_after_forward=True`` (zero 3)
      that is one layer, plus the next one ``_backward_prefetch`` all-gathers when N > 1 (one rank skips the
      all-gather: ``unshard`` returns at once for world size 1 and ``wait_for_unshard`` copies); with ``False``
      (zero 2) every layer not yet through its backward stays unsharded from the forward on.
    * gradients: autograd's unsharded gradients in ``param_dtype``; ``post_backward`` reshards the layer, then
      ``_fsdp_collectives.py``'s ``foreach_reduce`` copies them into a reduce-scatter input in
      ``reduce_dtype`` (r·U_l) and reduces into the sharded gradient (q·U_l/N). The input is kept in
      ``reduce_scatter_states`` until the next group's ``post_backward`` (``reduce_scatter_max_input_buffers``
      1), so one layer's r·U_l lives through the next layer's backward. The root's LM-head and final-norm
      gradients, p·(V·h + h), wait for the root's reduce at the end.

    The peak is the largest of these moments (the activation temporaries as in
    :func:`memlib.core.estimate.backward_peak_bytes`):

    * loss backward: A + 2·4·T·V + p·U_r + the layers unsharded then (zero 2: all; zero 3: the prefetched
      top layer when N > 1);
    * the top layer's backward: A − 4TV + p·(V·h + h) + p·U_r + its unsharded layers + the re-materialized
      segment + the MLP's backward temporaries;
    * layer i's backward, i < L (the peak under full recomputation, low in the stack): the saved activations
      of layers 1..i, i·``layer_acts``, + the sharded gradients of the L − i layers above, q·(L − i)·U_l/N, the
      reduce-scatter input of layer i + 1, r·U_l, p·(V·h + h), p·U_r, the unsharded layers (zero 2: layers
      1..i; zero 3: layer i, and i − 1 prefetched when N > 1), the segment and the MLP temporaries;
    * the root's reduce: q·L·U_l/N + the root's gradients p·U_r and their reduce-scatter input r·U_r.

    Limitations: the re-materialized layer's backward is :func:`memlib.core.estimate.backward_peak_bytes`' bound
    (the whole layer's activations plus the larger of the MLP's and the eager attention's temporaries); the
    traced peak falls inside the attention's backward with the MLP's activations already freed, so full
    recomputation is over-estimated by a few percent on tiny models (see ``bench/accuracy.py --frameworks``).
    N > 1 assumes dim-0 sizes divisible by N (FSDP2 pads each parameter's shard otherwise) and leaves out the
    all-gather's transient copy-in and output buffers (``foreach_all_gather``) beside the prefetched layer.
    """
    b, s, e, N = setup.batch_size, setup.seq_len, setup.act_bytes, setup.num_gpus
    L, h, V, f, T = cfg.num_layers, cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size, b * s
    p = 4 if setup.precision == "fp32" else 2
    q = 2 if setup.precision == "bf16" else 4
    r = 4 if setup.precision != "bf16" else 2
    u_l, u_r = layer_params, n - L * layer_params
    prefetch = 1 if N > 1 else 0
    zero3 = setup.zero_stage == 3
    head_grads = p * (V * h + h)
    saved_logits, logsm, _ = loss_logits(cfg, setup)  # Chapter 17: the loss chosen
    mlp_temp = 3 * e * T * f + 2 * e * T * h
    if setup.attention == "eager" and setup.recompute != "none":
        mlp_temp = max(mlp_temp, (2 * e + 1) * b * cfg.num_heads * s * s)
    at_loss = p * u_l * (prefetch if zero3 else L)
    at_top = p * u_l * (1 + prefetch if zero3 else L)
    candidates = [
        acts_bytes - saved_logits + 3 * logsm + p * u_r + at_loss,
        acts_bytes - saved_logits + head_grads + p * u_r + at_top + live_layer + mlp_temp,
        -(-q * L * u_l // N) + (p + r) * u_r,
    ]
    for i in range(1, L):  # layer i's backward, below the top one: layers i+1..L are reduced and resharded
        unsharded = p * u_l * (i if not zero3 else 1 + (prefetch if i > 1 else 0))
        candidates.append(i * layer_acts + -(-q * (L - i) * u_l // N) + r * u_l + head_grads + p * u_r + unsharded
                          + live_layer + mlp_temp)
    return max(candidates)
