"""The value types memlib's estimates are made of: a saved activation, a parameter count, an estimate (pure Python).

Defined below every module that builds them: :mod:`memlib.core.params`, :mod:`memlib.core.activations` and the
family modules (:mod:`memlib.core.families_dense`, :mod:`memlib.core.families_moe`) make the first two,
:mod:`memlib.core.states`, :mod:`memlib.core.parallel` and :mod:`memlib.core.estimate` the estimates. Each is
re-exported where it is taught (``memlib.core.estimate.TrainingEstimate``, ``memlib.core.params.ParamCount``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .categories import estimate_by_category

__all__ = ["ActivationTerm", "ParamCount", "sum_terms", "TrainingEstimate", "InferenceEstimate"]


@dataclass(frozen=True)
class ActivationTerm:
    """One tensor kind that the forward pass saves for backward, in one transformer layer (or outside).

    Attributes:
        name: what it is (``"MLP gate output"``).
        bytes: its size in bytes for the batch and sequence asked for.
        formula: the size as a formula in b (batch), s (sequence), h, f, a, V...
        per_layer: True if every layer saves one; False for a tensor saved once per model.
    """

    name: str
    bytes: int
    formula: str
    per_layer: bool = True


@dataclass(frozen=True)
class ParamCount:
    """Parameter count of a model, by component. Introduced in Chapter 1.

    Attributes:
        params: total number of parameters (a tied LM head is counted once).
        embeddings: token (and learned position) embeddings.
        attention: all q/k/v/o projections with their biases, all layers.
        mlp: all MLP matrices with their biases, all layers.
        norms: all LayerNorm/RMSNorm weights (and biases), final norm included.
        lm_head: the output projection (0 when tied to the embeddings).
        per_layer: parameters of one transformer block.
        small_tensor_params: parameters in tensors of fewer than 4096 elements (norms, biases): what
            8-bit optimizers keep in 32-bit.
        num_tensors: number of parameter tensors.
    """

    params: int
    embeddings: int
    attention: int
    mlp: int
    norms: int
    lm_head: int
    per_layer: int
    small_tensor_params: int
    num_tensors: int

    def as_dict(self) -> dict[str, int]:
        """The fields as a plain dict (for JSON)."""
        return asdict(self)


def sum_terms(terms: list[ActivationTerm]) -> tuple[int, int]:
    """(bytes of one layer's terms, bytes of the terms outside the layers)."""
    per_layer = sum(t.bytes for t in terms if t.per_layer)
    outside = sum(t.bytes for t in terms if not t.per_layer)
    return per_layer, outside


@dataclass(frozen=True)
class TrainingEstimate:
    """Estimated training memory per GPU, in bytes. Introduced in Chapter 1.

    Attributes:
        params_bytes: working weights (fp32 under PyTorch AMP and FSDP2's sharded params, 16-bit under
            DeepSpeed/Megatron mixed precision; :mod:`memlib.core.frameworks`).
        grads_bytes: gradients; under PyTorch DDP with ``gradient_as_bucket_view=False`` (its default) the
            Reducer's flat buckets too, one more gradient copy (:func:`memlib.core.frameworks.ddp_bucket_bytes`).
        optimizer_bytes: optimizer states, fp32 master weights included (the ZeRO paper's KΨ; no master under
            PyTorch AMP and FSDP2, whose fp32 params are stepped directly).
        activations_bytes: bytes saved for backward at the end of the forward pass (None with ``params=``).
        temp_bytes: at an optimizer-step peak, the step's temporaries; at a backward peak, everything on top of
            the weights, optimizer states and saved activations at that moment (the loss's and the backward's
            temporaries, and the gradients accumulated so far, which ``grads_bytes`` also counts: use
            :attr:`beyond_states_bytes` for what the peak holds beyond the model states); 0 with ``params=``.
        total_bytes: the estimated peak: max(forward/backward peak, optimizer-step peak).
        peak_phase: ``"backward"`` or ``"optimizer"``: where the peak is expected; ``"states"`` with ``params=``.
        settings: the inputs, echoed (with ``params`` and ``trainable_params``).
        cpu_bytes: host memory for offloaded states (Chapter 7); 0 without offload.
        logits_bytes: the fp32 logits (log-softmax) live at the loss (Chapter 17): 4·b·s·V for the standard loss,
            one chunk's 4·c·V for a chunked or fused loss; part of ``activations_bytes`` for the standard loss
            and of the backward temporaries always. 0 with ``params=``.
    """

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int | None
    temp_bytes: int
    total_bytes: int
    peak_phase: str
    settings: dict[str, Any]
    cpu_bytes: int = 0
    logits_bytes: int = 0

    @property
    def model_states_bytes(self) -> int:
        """Parameters + gradients + optimizer states."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def beyond_states_bytes(self) -> int:
        """What the peak holds on top of the model states: ``total_bytes`` − :attr:`model_states_bytes` (the
        activations and temporaries live at that moment; at a backward peak the gradients accumulated so far are
        in the states already, not counted twice). Chapter 1's "on top of the states at the peak" column."""
        return self.total_bytes - self.model_states_bytes

    @property
    def peak_bytes(self) -> int:
        """The estimated peak, named as the trace names it (:mod:`memlib.core.categories`): ``total_bytes``."""
        return self.total_bytes

    @property
    def by_category(self) -> dict[str, int]:
        """Bytes live at the peak per :class:`~memlib.core.categories.MemCategory` value, as the trace reports."""
        return estimate_by_category(self)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (all byte values are ints)."""
        return asdict(self)


@dataclass(frozen=True)
class InferenceEstimate:
    """Estimated inference memory: weights + KV cache, in bytes. Introduced in Chapter 1.

    Attributes:
        weights_bytes: weights in the chosen format, quantization constants included.
        kv_cache_bytes: 2 (K and V) × layers × kv_heads × head_dim × tokens × bytes; for MLA (DeepSeek)
            layers × (kv_lora_rank + qk_rope_head_dim) × tokens × bytes.
        total_bytes: weights + KV cache (activations of a forward pass and the CUDA context not included).
        settings: the inputs, echoed.
    """

    weights_bytes: int
    kv_cache_bytes: int
    total_bytes: int
    settings: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (all byte values are ints)."""
        return asdict(self)
