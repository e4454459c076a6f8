"""What the forward pass saves for backward under torch.autocast (PyTorch AMP), term by term: pure Python, no torch.

Under ``torch.autocast(device_type, dtype=torch.bfloat16)`` (or float16) the model stays in fp32 and autocast casts
the inputs of the ops on its lower-precision list (``linear``/``mm``/``matmul``, ``scaled_dot_product_attention``)
for each call (``aten/src/ATen/autocast_mode.h``, ``cached_cast``). What that means for the tensors saved for
backward, derived from transformers' Llama-family code and checked against real CPU traces of the step (tests):

* the embedding output and the residual stream are fp32; RMSNorm upcasts explicitly (``hidden_states.to(float32)``
  is then a no-op) and keeps its fp32 input, its rsqrt and the fp32 normalized tensor (for the weight's gradient);
* every Linear saves a 16-bit copy of its input, made by that call: autocast caches casts of leaf tensors that
  require grad (the weights) only, so the normalized output feeding q, k and v is cast three times and the one
  feeding gate and up twice;
* every Linear saves the 16-bit copy of its weight (autocast's weight cache, cleared when the outermost autocast
  block exits; the copies autograd saved live until the backward pass frees them): 2 bytes per Linear weight,
  the LM head's included. The tracer counts them as ``activations`` (made by the forward pass), and so does the
  estimate ("autocast 16-bit weight copies"). Bias copies are cached but not saved (addmm's backward does not
  need the bias): they die when the autocast block exits;
* rotary: cos and sin take the dtype of the fp32 embeddings, so q·cos promotes the 16-bit q to fp32 and the
  attention's autocast casts q and k back to 16 bits: the saved q, k, v, output and log-sum-exp are 16-bit as in
  pure bf16, and so are eager attention's saved tensors (its fp32 softmax, and the 16-bit cast that the second
  matmul's autocast makes instead of ``.to(query.dtype)``, which is a no-op on an fp32 query);
* the MLP runs in 16 bits after the casts (gate, up, activation, product), as in pure bf16; the logits come out of
  the LM head in 16 bits and transformers' loss upcasts them (``logits.float()``) before ``log_softmax``.

CPU and CUDA autocast differ in their op lists (CUDA runs ``pow``, ``rsqrt``, ``softmax``, ``log_softmax``,
``layer_norm`` in fp32; CPU's fp32 list has mostly losses and linear algebra), but for the Llama-style families
every such op already gets an fp32 input (the fp32 residual stream, the explicit upcasts), so the saved bytes
agree. GPT-2 is where they differ: its ``gelu_new`` calls ``pow`` on the 16-bit c_fc output, which CUDA's list runs
in fp32 and CPU's does not. The estimator targets GPUs: GPT-2's terms (:func:`_gpt2_terms`) follow CUDA's lists
and are checked against meta traces under :mod:`memlib.measure.autocast`'s emulation with those lists
(``trace_training(..., autocast_lists="cuda")``, the default), which the tests in turn check against real CPU
autocast with CPU's lists.

Full recomputation (transformers' non-reentrant ``torch.utils.checkpoint``) keeps each layer's fp32 input, the
int64 position ids every checkpointed layer receives and, for eager attention, the fp32 additive causal mask
(a boolean one for SDPA with a sliding window); the weight copies of the checkpointed layers are discarded from
the graph but stay in autocast's cache until the forward pass ends (:func:`autocast_forward_extra`).
"""
from __future__ import annotations

from typing import Protocol

# the autocast terms are built with the other families' terms (memlib.core.activations) and re-exported here
from .activations import (AUTOCAST_FAMILIES, WEIGHT_COPIES, ActivationTerm, _activation_terms,
                          autocast_activation_terms, linear_weight_params)
from .configs import ModelConfig
from .losses import loss_logits
from .setup import TrainingSetup

__all__ = ["AUTOCAST_FAMILIES", "WEIGHT_COPIES", "autocast_activation_terms", "linear_weight_params",
           "setup_activation_terms", "segment_input_bytes", "autocast_forward_extra", "autocast_backward_peak"]

def setup_activation_terms(cfg: ModelConfig, setup: TrainingSetup) -> list[ActivationTerm]:
    """The activation terms of a setup: autocast's for full fine-tuning under torch.autocast, else the dtype's.

    LoRA/QLoRA keep the 16-bit base's terms (:func:`memlib.core.activations.activation_terms`).
    """
    b, s = setup.batch_size, setup.seq_len
    if setup.autocast and setup.method == "full":
        return autocast_activation_terms(cfg, b, s, setup.attention, True)
    return _activation_terms(cfg, b, s, setup.act_bytes, setup.attention, True)


def segment_input_bytes(cfg: ModelConfig, setup: TrainingSetup, n_kept: int) -> int:
    """What full recomputation keeps at the end of the forward pass besides the tensors outside the layers.

    Each of the ``n_kept`` checkpointed segments keeps its input: e·b·s·h, fp32 under autocast (the residual
    stream). Under autocast (checked against CPU traces) also the int64 position ids (8·s; not GPT-2's, whose
    learned positions are added before the layers) and, with eager
    attention, the fp32 additive causal mask (4·b·s²), or with SDPA and a sliding window no longer than the
    sequence the boolean mask (s²), which every checkpointed layer receives as an input.
    """
    T, h = setup.batch_size * setup.seq_len, cfg.hidden_size
    if not (setup.autocast and setup.method == "full"):
        return n_kept * setup.act_bytes * T * h
    s = setup.seq_len
    window = cfg.raw.get("sliding_window") if cfg.model_type == "mistral" else None
    mask = 0
    if setup.attention == "eager":
        mask = 4 * setup.batch_size * s * s
    elif isinstance(window, int) and s >= window:
        mask = s * s
    if cfg.model_type == "gpt2":  # learned positions: the layers get no position ids (the embedding keeps them)
        return n_kept * 4 * T * h + mask
    return n_kept * 4 * T * h + 8 * s + mask


def autocast_forward_extra(cfg: ModelConfig, setup: TrainingSetup) -> int:
    """Bytes on top of the saved activations at the end of an autocast forward pass (the loss), before autocast exits.

    The 16-bit logits (2·bsV) and their fp32 copy (4·bsV) beside the log-softmax, the final RMSNorm's fp32 output
    that the model's output still holds (4·bsh), the padded labels (8·b·(s + 1)), the cached bias copies
    (2 bytes per bias) and, with full recomputation, the cached weight copies of every checkpointed layer (the
    graph dropped them, autocast's cache has not). With full recomputation of a large model this moment, not the
    backward pass, is the peak; 0 without autocast.
    """
    if not (setup.autocast and setup.method == "full"):
        return 0
    b, s = setup.batch_size, setup.seq_len
    T, h, V, L = b * s, cfg.hidden_size, cfg.vocab_size, cfg.num_layers
    biases = (cfg.q_dim + 2 * cfg.kv_dim) if cfg.qkv_bias else 0
    mlp_matrices = 1 if cfg.model_type == "gpt2" else 2  # GPT-2: c_fc (f) and c_proj (h); else gate, up and down
    biases += (h if cfg.out_bias else 0) + ((mlp_matrices * cfg.intermediate_size + h) if cfg.mlp_bias else 0)
    cached = L * 2 * linear_weight_params(cfg) if setup.recompute == "full" else 0
    return 6 * T * V + 4 * T * h + 8 * b * (s + 1) + 2 * L * biases + cached


class _Saved(Protocol):
    """The fields of :class:`memlib.core.estimate.SavedActivations` that :func:`autocast_backward_peak` reads."""

    @property
    def terms(self) -> list[ActivationTerm]: ...
    @property
    def bytes(self) -> int: ...
    @property
    def live_layer(self) -> int: ...
    @property
    def segment(self) -> int: ...


def autocast_backward_peak(cfg: ModelConfig, setup: TrainingSetup, acts: _Saved, g_bytes: int, n: int,
                           layer_params: int) -> int:
    """Bytes on top of the weights and optimizer states at the peak of an autocast step's forward/backward pass.

    Full fine-tuning under torch.autocast, fp32 gradients (g = g_bytes / n bytes per parameter). The largest of
    six moments (A = saved activations, T = b·s, G = all gradients), checked against CPU traces:

    * the end of the forward pass (:func:`autocast_forward_extra`): A + the loss's logits and the cached copies;
    * loss backward: A + 2·4·T·V, as without autocast;
    * LM-head backward: A − 4TV + the 16-bit logits' gradient 2TV + the input's gradient (2 + 4)·T·h + the head's
      weight gradient, 16-bit then fp32, (2 + g)·V·h;
    * the top segment's backward: A less the log-softmax, the final norm's tensors and the head's weight copy
      + the LM head's and final norm's gradients g·(Vh + h) + the re-materialized segment + the MLP's backward
      temporaries: the two 16-bit gradients of the product's factors, 2·2·T·f (the product's own gradient
      replaces the product, freed), and the fp32 gradient of the residual stream, 4·T·h (OLMo 2, whose
      layer backward starts with the post-MLP RMSNorm's: up to 5 fp32 b·s·h tensors, traced). Eager attention:
      the attention core's backward, if larger: the probabilities' fp32 gradient (cast from the 16-bit one) and
      the softmax's fp32 gradient less the 16-bit probabilities freed, (4 + 4 − 2)·b·a·s², once the MLP's, the
      post-attention norm's and o_proj's saved tensors are freed and their weights' gradients made. Eager
      attention with dropout and recomputation: the re-run forward holds the fp32 dropped-out probabilities (the
      attention's second output, discarded only when the layer returns; under autocast ``.to(query.dtype)``
      keeps them fp32), 4·b·a·s², beside the MLP's fp32 input and the residual stream's fp32 gradient, 2·4·T·h;
    * the bottom segment's backward: what the forward left for it (its saved input or layer, the rotary tables,
      ids and masks) + G less the bottom segment's and (untied) the embedding's gradients + the segment + the
      MLP temporaries;
    * the end: G + a tied embedding's out-of-place gradient sum (2·g·V·h) + the small tensors left.

    Args:
        cfg: the model; setup: the settings (autocast, full fine-tuning).
        acts: :func:`memlib.core.estimate.saved_activations` of the setup.
        g_bytes: gradient bytes (fp32: 4·n); n: parameters; layer_params: parameters of one decoder layer.

    Returns:
        The bytes; ``estimate_training`` adds them to the weights and optimizer states.
    """
    if cfg.model_type == "gpt2":
        return max(_gpt2_backward_moments(cfg, setup, acts, g_bytes, n, layer_params))
    acts_bytes, terms, live_layer, k_seg = acts.bytes, acts.terms, acts.live_layer, acts.segment
    b, s = setup.batch_size, setup.seq_len
    L, h, V, f, T = cfg.num_layers, cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size, b * s
    g = g_bytes / n
    (saved_logits, logsm, rows), vh = loss_logits(cfg, setup), int(g * V * h)
    mlp_temp = 2 * 2 * T * f + 4 * T * h
    if cfg.model_type == "olmo2":  # the post-MLP norm's fp32 backward runs first, beside all the layer's tensors
        mlp_temp = max(mlp_temp, 5 * 4 * T * h)
    if setup.attention == "eager":  # the attention core's backward, once the MLP, norm and o_proj are done
        q = cfg.q_dim
        freed = 8 * T * f + 4 * T * h + 2 * 3 * h * f + (8 * T * h + 4 * T) + 2 * T * q + 2 * q * h
        made = int(g * (3 * h * f + q * h + h))
        mlp_temp = max(mlp_temp, 6 * b * cfg.num_heads * s * s - freed + made)
        if cfg.attn_dropout > 0 and setup.recompute != "none":  # the re-run forward holds the fp32 dropout output
            mlp_temp = max(mlp_temp, 4 * b * cfg.num_heads * s * s + 2 * 4 * T * h)
    outside = sum(t.bytes for t in terms if not t.per_layer)
    small = outside - sum(t.bytes for t in terms if not t.per_layer and (
        t.name.startswith(("final", "log-softmax", WEIGHT_COPIES)) or "final" in t.name))
    if setup.recompute == "full":
        bottom = small + segment_input_bytes(cfg, setup, 1) + live_layer
    elif setup.recompute == "selective":
        bottom = small + (acts_bytes - outside) // L + live_layer
    else:
        bottom = small + (acts_bytes - outside) // L
    grad_layer = int(g * layer_params)
    g_all = int(g_bytes)
    candidates = [
        acts_bytes + autocast_forward_extra(cfg, setup),
        acts_bytes - saved_logits + 3 * logsm,
        acts_bytes - saved_logits + 2 * rows * V + 6 * T * h + (2 * V * h + vh),
        acts_bytes - (outside - small) + int(g * (V * h + h)) + live_layer + mlp_temp,
        bottom + g_all - k_seg * grad_layer - (0 if cfg.tie_word_embeddings else vh) + mlp_temp,
        g_all + (2 * vh if cfg.tie_word_embeddings else 0) + small,
    ]
    return max(candidates)


def _gpt2_backward_moments(cfg: ModelConfig, setup: TrainingSetup, acts: _Saved, g_bytes: int, n: int,
                           layer_params: int) -> list[int]:
    """:func:`autocast_backward_peak`'s moments for GPT-2 (CUDA's op lists), checked against meta traces.

    The end of the forward pass, the loss's and the LM head's backward as for the other families (the loss's
    backward has freed the labels, 8·bs); then, in the top and in the bottom segment, a layer's MLP backward and,
    with eager attention, its attention core's backward, whichever is larger; the end of the backward pass.
    """
    acts_bytes, terms, live_layer, k_seg = acts.bytes, acts.terms, acts.live_layer, acts.segment
    b, s = setup.batch_size, setup.seq_len
    L, h, V, f, T, a = cfg.num_layers, cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size, b * s, cfg.num_heads
    full = setup.recompute == "full"
    g = g_bytes / n
    (saved_logits, logsm, rows), vh = loss_logits(cfg, setup), int(g * V * h)
    labels = 8 * T  # the loss's backward frees the labels nll_loss kept
    resid_mask = T * h if cfg.resid_dropout > 0 else 0
    per_layer = sum(t.bytes for t in terms if t.per_layer)
    shared = 4 * T * h if full else 0  # a checkpointed layer's LayerNorm input is the segment's input, kept once
    # A layer's MLP backward, at the peak of gelu_new's backward: c_proj's input gradient (fp32, 4·bsf) and the
    # product's two fp32 gradients (2·4·bsf), then, without recomputation, the 16-bit cast of 0.5·x's gradient
    # (2·bsf; a checkpointed layer's product has let go of its recomputed factors, 2·bsf + 4·bsf, by then),
    # beside the residual stream's fp32 gradient (4·bsh) and c_proj's weight and bias gradients; c_proj's saved
    # input, weight copy and dropout mask are freed.
    mlp = (12 if full else 14) * T * f + 4 * T * h + int(g * (f * h + h)) - 2 * T * f - 2 * f * h - resid_mask
    # Eager attention: the core's backward, at softmax's: the probabilities' fp32 gradient (cast from the 16-bit
    # one) and softmax's fp32 gradient, 2·4·bas², beside the residual stream's fp32 gradient and v's 16-bit one,
    # (4 + 2)·bsh, and the gradients of the layer's c_proj, ln_2 and MLP; the layer keeps only ln_1's input,
    # mean, rstd and 16-bit cast, c_attn's weight copy, q, k, v and the fp32 softmax. (With one sequence
    # ``torch.matmul``'s q, k, v are views of c_attn's output, which stays whole; else v's copy is freed.)
    core = 0
    if setup.attention == "eager":
        qkv = 3 * 2 * T * h if b == 1 else 2 * 2 * T * h
        kept = 4 * T * h + 8 * T + 2 * T * h + 2 * 3 * h * h + qkv + 4 * b * a * s * s
        core = kept + 6 * T * h + 8 * b * a * s * s + int(g * (h * h + 2 * f * h + f + 4 * h)) - per_layer
    layer = max(per_layer + mlp, per_layer + core) - shared
    outside = sum(t.bytes for t in terms if not t.per_layer)
    small = outside - sum(t.bytes for t in terms if not t.per_layer and (
        t.name.startswith(("final", "log-softmax", WEIGHT_COPIES)) or "final" in t.name))
    top = acts_bytes - labels - (outside - small) + int(g * (V * h + 2 * h))
    if full:  # the top segment is re-materialized beside every segment's input
        top += live_layer - per_layer
        bottom = small + segment_input_bytes(cfg, setup, 1) + live_layer - per_layer
    else:
        top -= per_layer
        bottom = small
    # gradients made before the bottom segment's: all but its layers', the embeddings' (the tied LM head's
    # gradient waits, fp32, for the word embedding's) and those of the layer in flight (in ``layer``)
    made = int(g_bytes) - k_seg * int(g * layer_params) - int(g * cfg.max_position_embeddings * h)
    made -= 0 if cfg.tie_word_embeddings else vh
    return [
        acts_bytes + autocast_forward_extra(cfg, setup),
        acts_bytes - labels - saved_logits + 3 * logsm,
        acts_bytes - labels - saved_logits + 2 * rows * V + 6 * T * h + (2 * V * h + vh),
        top + layer,
        bottom - labels + made + layer,
        int(g_bytes) + 2 * vh + small,
    ]
