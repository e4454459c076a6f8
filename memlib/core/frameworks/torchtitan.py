"""What TorchTitan's Llama 3 model saves for backward (Chapter 15): the activations of the FSDP2 + TP + PP + CP layout.

TorchTitan 0.3.0, ``torchtitan/models/llama3`` (``Llama3TransformerBlock``: ``RMSNorm``, fused ``wqkv``,
``ComplexRoPE``, ``ScaledDotProductAttention``, ``FeedForward`` = ``w2(F.silu(w1(x)) * w3(x))``). Under FSDP2's
``MixedPrecisionPolicy(param_dtype=bf16)`` the parameters are bf16 in compute and every activation is 16-bit
(no autocast). Measured on CPU to the byte (``bench/engines_on_cpu.py``, ``tests/data/engines_on_cpu.json``).
"""
from __future__ import annotations

from ..configs import ModelConfig
from ..terms import ActivationTerm

__all__ = ["torchtitan_activation_terms"]


def torchtitan_activation_terms(cfg: ModelConfig, batch_size: int, seq_len: int, act_bytes: int = 2,
                                device: str = "cuda") -> list[ActivationTerm]:
    """The terms of TorchTitan's Llama 3 forward, per GPU before the tp split. Introduced in Chapter 15.

    Per layer: two ``nn.RMSNorm`` (``device="cuda"``: torch's fused ``_fused_rms_norm`` saves the 16-bit input
    and the fp32 rstd; ``"cpu"``: the composite path saves an fp32 copy of the input, the fp32 normalized tensor
    and the rstd) whose 16-bit outputs the next linear saves; RoPE multiplies by the complex ``freqs_cis``
    buffer and saves nothing new; SDPA (flash) saves q, k, v (KV heads not repeated), the output (``wo``'s input,
    one storage) and the fp32 log-sum-exp; the SwiGLU saves w1's and w3's outputs, the SiLU output and the
    product (w2's input): 4·e·b·s·f. Outside: the input ids (int64), the final norm and the fp32 log-softmax of
    the logits (``cross_entropy`` on ``logits.float()``).

    Under TorchTitan's TP plan (``torchtitan/models/llama3/sharding.py``, ``set_llama3_sharding_config``;
    ``models/common/decoder_sharding.py``: ``set_gqa_attention_sharding``, ``set_dense_ffn_sharding``,
    ``pre_lm_head_norm_config``) with sequence parallelism, the attention's and the feed-forward's inputs go
    Shard(1) → Replicate, one all-gather each, and the fused ``wqkv`` and ``w1``/``w3`` save the gathered
    tensor; the final norm's output is gathered for ``lm_head`` too. Those terms are named "all-gathered": they
    stay whole per rank (:func:`memlib.core.parallel.term_split`), where Megatron saves them sharded and
    gathers again in backward. Measured on two gloo ranks (``tests/data/engines_on_cpu.json``).
    """
    b, s, e = batch_size, seq_len, act_bytes
    T, h, f, q, kv = b * s, cfg.hidden_size, cfg.intermediate_size, cfg.q_dim, cfg.kv_dim
    norm = (8 * T * h if device == "cpu" else e * T * h) + 4 * T  # saved inside one norm
    return [
        ActivationTerm("RMSNorm inputs and rstd, two norms" + (" (CPU composite)" if device == "cpu" else ""),
                       2 * norm, "2·(e·b·s·h + 4·b·s)"),
        ActivationTerm("wqkv and w1/w3 inputs (norm outputs, all-gathered under SP)", 2 * e * T * h, "2·e·b·s·h"),
        ActivationTerm("q, k after rotary; v", e * T * (q + 2 * kv), "e·b·s·(q + 2kv)"),
        ActivationTerm("attention output (wo input)", e * T * q, "e·b·s·q"),
        ActivationTerm("log-sum-exp (fp32)", 4 * b * cfg.num_heads * s, "4·b·a·s"),
        ActivationTerm("MLP w1, w3, SiLU outputs and product", 4 * e * T * f, "4·e·b·s·f"),
        ActivationTerm("input ids (int64)", 8 * T, "8·b·s", False),
        ActivationTerm("final RMSNorm (input, rstd)", norm, "e·b·s·h + 4·b·s", False),
        ActivationTerm("lm_head input (final norm output, all-gathered under SP)", e * T * h, "e·b·s·h", False),
        ActivationTerm("log-softmax of the fp32 logits", 4 * T * cfg.vocab_size, "4·b·s·V", False),
    ]
