"""The engines' own models in the step estimate: Megatron-Core's ``GPTModel`` and TorchTitan's Llama 3 (Chapter 15).

:func:`memlib.core.estimate.estimate_training` follows a framework's model states and buffers on the model a user
brings (transformers' Llama): Megatron's 2 + 4 + 12 bytes per parameter are checked against memlib's trace of a
transformers model. Megatron-LM and TorchTitan run their own models, which save other tensors
(:func:`memlib.core.frameworks.megatron.megatron_core_activation_terms`,
:func:`memlib.core.frameworks.torchtitan.torchtitan_activation_terms`). :func:`estimate_engine_step` is the same
composition (:func:`memlib.core.estimate.compose_training`: states, the backward pass's moments, the optimizer
step) with the engine's model's saved activations, on the GPU's kernels (``device="cuda"``, the default) or on
a CPU without TransformerEngine or apex (``device="cpu"``: the named implementation that
``bench/engines_on_cpu.py`` runs, recorded in ``tests/data/engines_on_cpu.json``).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from .activations import ActivationTerm
from .configs import ModelConfig, load_config
from .errors import MemlibError, check_choice
from .estimate import _model_size, compose_training, saved_activations
from .frameworks.megatron import megatron_core_activation_terms
from .frameworks.torchtitan import torchtitan_activation_terms
from .setup import TrainingSetup
from .terms import TrainingEstimate

__all__ = ["ENGINE_MODELS", "ENGINE_DEVICES", "engine_activation_terms", "estimate_engine_step"]

#: The model each engine runs, by memlib's framework name (fsdp2: TorchTitan's composition of FSDP2).
ENGINE_MODELS = {"megatron": "Megatron-Core GPTModel", "fsdp2": "TorchTitan Llama3Model"}
#: ``cuda``: the GPU's kernels (TransformerEngine / flash attention / fused RMSNorm); ``cpu``: the CPU run's.
ENGINE_DEVICES = ("cuda", "cpu")
#: The dense families both engines' Llama-like models cover.
_FAMILIES = ("llama", "mistral", "qwen2", "olmo2")


def engine_activation_terms(cfg: ModelConfig, framework: str, batch_size: int, seq_len: int, act_bytes: int = 2,
                            attention: str = "sdpa", device: str = "cuda") -> list[ActivationTerm]:
    """What the engine's own model saves for backward, one GPU before any tp split. Introduced in Chapter 15.

    ``megatron``: Megatron-Core's ``GPTModel`` (TransformerEngine spec on ``cuda``, the local spec on ``cpu``,
    where the attention is unfused whatever ``attention`` says); ``fsdp2``: TorchTitan's ``Llama3Model``.
    """
    check_choice("framework", framework, tuple(ENGINE_MODELS))
    check_choice("device", device, ENGINE_DEVICES)
    if cfg.moe is not None or cfg.mla is not None or cfg.model_type not in _FAMILIES:
        raise MemlibError(f"model_type {cfg.model_type!r} is not one of the engines' dense models; expected one "
                          f"of: {', '.join(_FAMILIES)}")
    if framework == "megatron":
        return megatron_core_activation_terms(cfg, batch_size, seq_len, act_bytes, attention,
                                              "local-cpu" if device == "cpu" else "te")
    return torchtitan_activation_terms(cfg, batch_size, seq_len, act_bytes, device=device)


def estimate_engine_step(model: str | Path | dict[str, Any] | ModelConfig, *, framework: str, device: str = "cuda",
                         **settings: Any) -> TrainingEstimate:
    """The peak of one data-parallel training step of Megatron-LM or TorchTitan on its own model. Chapter 15.

    The settings are :class:`memlib.core.setup.TrainingSetup`'s (``zero_stage``, ``num_gpus``, ``batch_size``,
    ...); the model states, the backward pass's moments and the optimizer step are
    :func:`memlib.core.estimate.estimate_training`'s (:func:`memlib.core.estimate.compose_training`), the
    saved activations the engine's (:func:`engine_activation_terms`). Checked against the engines run on one
    gloo rank (``tests/test_engine_steps.py``).

    Raises:
        MemlibError: a framework other than megatron or fsdp2, a device other than cuda or cpu, a model the
            engines do not build, model-parallel settings (:func:`memlib.core.parallel.estimate_parallel`
            already runs the engines' models), or a method, loss or precision the engines' terms do not cover.
    """
    check_choice("framework", framework, tuple(ENGINE_MODELS))
    check_choice("device", device, ENGINE_DEVICES)
    setup = TrainingSetup(framework=framework, **settings)
    if setup.model_parallel:
        raise MemlibError("estimate_engine_step is the data-parallel step; with tp/pp/cp/ep use estimate_training "
                          f"(got {', '.join(setup.parallel_degrees)})")
    for name, value, expected in (("method", setup.method, "full"), ("loss", setup.loss, "standard")):
        if value != expected:
            raise MemlibError(f"{name} {value!r} is not estimated for the engines' models; expected {name} "
                              f"{expected!r}")
    if setup.precision == "fp8-mixed":
        raise MemlibError("precision 'fp8-mixed' is not estimated for the engines' models; expected one of: "
                          "fp32, fp16-mixed, bf16-mixed, bf16")
    cfg = load_config(model)
    cfg_checked, n, small, layer_params = _model_size(cfg, None, setup)
    assert cfg_checked is not None
    terms = engine_activation_terms(cfg, framework, setup.batch_size, setup.seq_len, setup.act_bytes,
                                    setup.attention, device)
    est = compose_training(cfg, n, small, layer_params, setup, saved_activations(cfg, setup, terms))
    return replace(est, settings={**est.settings, "engine_model": ENGINE_MODELS[framework], "device": device})
