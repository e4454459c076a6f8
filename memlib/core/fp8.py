"""FP8 training: what each recipe's Linear layers save for backward, as terms beside the 16-bit ones (Chapter 17).

Pure Python. ``precision="fp8-mixed"`` is bf16 mixed precision whose Linears run their matmuls in FP8; the model
states do not change (master weights, gradients and Adam moments stay as the framework keeps them under
bf16-mixed). What changes is what the Linears keep for backward. :func:`fp8_terms` returns the difference from the
16-bit terms as signed terms, so every other term (and every backward moment built from them) stays as it was.

* ``tensorwise`` and ``rowwise`` (torchao 0.18.0, ``convert_to_float8_training``): the autograd function
  ``matmul_with_hp_or_float8_args`` (``torchao/float8/float8_linear.py``) saves the **high-precision** input and
  weight and casts them to FP8 again in backward. Its activations are bf16's (traced on CPU in Chapter 17). Under
  torch.autocast the Linear casts its input to bf16 itself and its fp32 weight straight to FP8, so autocast's
  cached 16-bit weight copies of the converted Linears are gone. The LM head stays bf16 (TorchTitan's
  ``filter_fqns=["output"]``).
* ``blockwise`` (DeepSeek-V3, ``deepseekai2024v3`` §3.3): every Linear caches its input in FP8 with one fp32 scale
  per 1×128 tile (1 + 4/128 bytes per element) instead of the 16-bit input, one copy per Linear (q, k, v, gate and
  up quantize their shared input each; a fused QKV or gate-up GEMM keeps one). Weights are quantized in 128×128
  blocks from the master copy and not kept. Derived for the llama family (llama, mistral, qwen2); the book's
  plain-PyTorch implementation (:mod:`memlib._book.ch17_kernels_and_compilers`) is traced against it.
"""
from __future__ import annotations

from .activations import WEIGHT_COPIES
from .configs import ModelConfig
from .errors import MemlibError
from .formats import block_bytes_per_element
from .setup import TrainingSetup
from .terms import ActivationTerm

__all__ = ["FP8_SCALED_FAMILIES", "fp8_terms", "tile_bytes"]

#: The families whose blockwise terms are derived (and traced).
FP8_SCALED_FAMILIES = ("llama", "mistral", "qwen2")


def tile_bytes(numel: int) -> int:
    """Bytes of ``numel`` FP8 elements with one fp32 scale per 1×128 tile (DeepSeek-V3's activation format)."""
    return numel + 4 * (-(-numel // 128))


def fp8_terms(cfg: ModelConfig, setup: TrainingSetup, terms: list[ActivationTerm]) -> list[ActivationTerm]:
    """What ``precision="fp8-mixed"`` adds to (negative: removes from) the 16-bit ``terms`` (Chapter 17).

    Args:
        cfg: the model; setup: the settings (``fp8_recipe`` chooses the recipe); terms: the 16-bit terms.

    Returns:
        Signed per-layer terms; empty for a precision other than ``fp8-mixed``.

    Raises:
        MemlibError: ``blockwise`` for a family outside :data:`FP8_SCALED_FAMILIES` or an MoE/MLA model.
    """
    if setup.precision != "fp8-mixed":
        return []
    copies = sum(t.bytes for t in terms if t.per_layer and t.name == WEIGHT_COPIES)
    out = []
    if copies:
        out.append(ActivationTerm("FP8 Linears: no autocast 16-bit weight copies", -copies,
                                  "−2·(Linear weights of a layer)"))
    if setup.fp8_recipe != "blockwise":
        return out
    if cfg.model_type not in FP8_SCALED_FAMILIES or cfg.moe is not None or cfg.mla is not None:
        raise MemlibError(f"fp8 recipe 'blockwise' is derived for {', '.join(FP8_SCALED_FAMILIES)} (dense), not "
                          f"{cfg.name} ({cfg.model_type}); expected fp8 recipe one of: tensorwise, rowwise")
    T, h, q, f, e = setup.batch_size * setup.seq_len, cfg.hidden_size, cfg.q_dim, cfg.intermediate_size, 2
    # the 16-bit Linear inputs no longer saved: under autocast five casts (q, k, v; gate, up), else the two
    # weighted norm outputs; eager attention's o_proj input (SDPA keeps its output for itself); down_proj's input
    dropped = (5 if setup.autocast else 2) * e * T * h + e * T * f + (e * T * q if setup.attention == "eager" else 0)
    cached = 5 * tile_bytes(T * h) + tile_bytes(T * q) + tile_bytes(T * f)
    out.append(ActivationTerm("FP8 blockwise: 16-bit Linear inputs not saved", -dropped,
                              ("−5·2·bsh" if setup.autocast else "−2·2·bsh") + " − 2·bsf"
                              + (" − 2·bs·a·d" if setup.attention == "eager" else "")))
    out.append(ActivationTerm("FP8 blockwise: Linear inputs in FP8, 1×128 fp32 scales", cached,
                              "(1 + 4/128)·bs·(5h + a·d + f)"))
    assert block_bytes_per_element("fp8-1x128") == 1 + 4 / 128  # the one format table agrees
    return out
