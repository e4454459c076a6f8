"""torch.autocast on the meta device: an emulation of autocast's cast policies for memory traces (Chapter 3).

``torch.autocast`` works in the dispatcher (the ``AutocastCPU``/``AutocastCUDA`` keys,
``aten/src/ATen/autocast_mode.cpp``), and meta tensors carry no autocast key: under ``torch.autocast`` a matmul
of fp32 meta tensors stays fp32. :func:`emulate_autocast` returns a ``TorchFunctionMode`` that applies the same
policies above autograd, so each cast is an autograd node and the 16-bit copies are saved for backward exactly
as real autocast saves them:

* ``lower_precision_fp`` ops (matmuls, linear, convolutions, SDPA) cast every eligible floating argument
  (same device, not float64) to the autocast dtype. As ``at::autocast::cached_cast`` does, the cast of an fp32
  leaf that requires grad and is not a view (a weight) is cached until the outermost autocast region exits
  (``torch.autocast.__exit__`` calls ``torch.clear_autocast_cache``), so a weight used twice is cast once.
* ``fp32`` ops cast eligible arguments to fp32; ``fp32_set_opt_dtype`` ops (CUDA: softmax, log_softmax, sum,
  cumsum, prod, vector norms) run with ``dtype=torch.float32`` unless a dtype is given; ``promote`` ops cast
  to the widest floating dtype among their arguments.

The state lives in the real CPU autocast flags: the emulation acts while ``torch.is_autocast_enabled("cpu")``
(meta traces enter ``torch.autocast("cpu", dtype)``, which leaves meta tensors alone), with
``torch.get_autocast_dtype("cpu")`` as the 16-bit dtype. ``torch.utils.checkpoint`` records and restores the CPU
autocast state around a recomputation, so recomputed layers are cast as in the forward pass, as on a GPU.

The op lists are those of the installed PyTorch (``aten/src/ATen/autocast_mode.cpp`` for CPU; the
``AT_FORALL_*`` macros of ``autocast_mode.h`` for CUDA; the dispatcher's ``AutocastCPU``/``AutocastCUDA``
kernels of torch 2.13 agree). The mode sees Python-level calls: a call is matched by its name
(``F.linear``, ``torch.matmul``, ``Tensor.__matmul__``, ``Tensor.softmax``...), and ``F.cross_entropy``, which
CPU autocast runs as fp32 (``cross_entropy_loss``) and CUDA decomposes into ``log_softmax`` (fp32 dtype) and
``nll_loss`` (fp32), is fp32 on both.

CPU and CUDA lists differ in ways that change memory: CUDA runs ``pow``, ``exp``, ``log``, ``rsqrt``,
``layer_norm`` and more in fp32 and gives ``softmax``/``log_softmax``/``sum`` an fp32 output; CPU does not.
For Llama, Qwen2 and Gemma this changes nothing (their RMSNorms, RoPE and softmax already work in fp32 on
fp32 inputs, eager softmax is called with ``dtype=torch.float32``), but for GPT-2 it does: its ``gelu_new``
(``torch.pow(x, 3.0)`` on the 16-bit ``c_fc`` output) runs in fp32 on CUDA, so the MLP's elementwise
activations are fp32 on CUDA and 16-bit on CPU. (GPT-2's eager ``softmax`` has no dtype, but its input is
already fp32: the 16-bit scores plus the fp32 additive mask.) Meta traces emulate CUDA's lists by default (the
estimator targets GPUs).
torch is imported lazily.
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

from ..core.errors import check_choice
from .deps import require_torch

__all__ = ["AUTOCAST_DEVICES", "POLICIES", "emulate_autocast", "emulated", "autocast_dtype", "cast_like_autocast"]

#: Whose autocast op lists the emulation mirrors.
AUTOCAST_DEVICES = ("cuda", "cpu")

_CONV = ("conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
         "_convolution", "prelu")
_LOWER_CPU = _CONV + ("bmm", "mm", "linalg_vecdot", "baddbmm", "addmm", "_addmm_activation", "addbmm", "linear",
                      "matmul", "mkldnn_rnn_layer", "scaled_dot_product_attention", "_native_multi_head_attention")
_FP32_CPU = ("avg_pool3d", "binary_cross_entropy", "grid_sampler", "polar", "prod", "quantile", "nanquantile",
             "stft", "cdist", "grid_sampler_2d", "grid_sampler_3d", "trace", "view_as_complex", "cholesky",
             "cholesky_inverse", "cholesky_solve", "inverse", "lu_solve", "orgqr", "ormqr", "pinverse",
             "max_pool3d", "max_unpool2d", "max_unpool3d", "adaptive_avg_pool3d", "reflection_pad1d",
             "reflection_pad2d", "replication_pad1d", "replication_pad2d", "replication_pad3d", "mse_loss",
             "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "poisson_nll_loss",
             "smooth_l1_loss", "cross_entropy_loss", "l1_loss", "huber_loss", "margin_ranking_loss",
             "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "ctc_loss", "kl_div",
             "multilabel_margin_loss", "binary_cross_entropy_with_logits", "fft_fft", "fft_ifft", "fft_fft2",
             "fft_ifft2", "fft_fftn", "fft_ifftn", "fft_rfft", "fft_irfft", "fft_rfft2", "fft_irfft2", "fft_rfftn",
             "fft_irfftn", "fft_hfft", "fft_ihfft", "linalg_cond", "linalg_matrix_rank", "linalg_solve",
             "linalg_cholesky", "linalg_svdvals", "linalg_eigvals", "linalg_eigvalsh", "linalg_inv",
             "linalg_householder_product", "linalg_tensorinv", "linalg_tensorsolve",
             "fake_quantize_per_tensor_affine", "geqrf", "_lu_with_info", "qr", "svd", "triangular_solve",
             "fractional_max_pool2d", "fractional_max_pool3d", "adaptive_max_pool3d", "linalg_qr",
             "linalg_cholesky_ex", "linalg_svd", "linalg_eig", "linalg_eigh", "linalg_lstsq", "linalg_inv_ex")
_LOWER_CUDA = _CONV + ("convolution", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot",
                       "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "lstm_cell",
                       "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
                       "_scaled_dot_product_flash_attention", "scaled_dot_product_attention")
_FP32_CUDA = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
              "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm",
              "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss",
              "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
              "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
              "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist",
              "cdist", "renorm", "logsumexp", "rms_norm", "upsample_nearest1d", "upsample_nearest2d",
              "upsample_nearest3d", "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d",
              "upsample_bicubic2d", "norm")
_SET_OPT_DTYPE_CUDA = ("prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
                       "linalg_matrix_norm", "sum")
_PROMOTE_CPU = ("stack", "cat", "index_copy")
_PROMOTE_CUDA = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
                 "tensordot", "scatter_add")


def _policies(lower: tuple[str, ...], fp32: tuple[str, ...], set_opt: tuple[str, ...],
              promote: tuple[str, ...]) -> dict[str, str]:
    table = {name: "fp32" for name in fp32}
    table.update({name: "fp32_set_opt_dtype" for name in set_opt})
    table.update({name: "promote" for name in promote})
    table.update({name: "lower" for name in lower})
    table["cross_entropy"] = "fp32"  # F.cross_entropy (see the module docstring)
    return table


#: Cast policy per op name, for each device type whose lists are mirrored.
POLICIES: dict[str, dict[str, str]] = {
    "cpu": _policies(_LOWER_CPU, _FP32_CPU, (), _PROMOTE_CPU),
    "cuda": _policies(_LOWER_CUDA, _FP32_CUDA, _SET_OPT_DTYPE_CUDA, _PROMOTE_CUDA),
}

_ALIASES = {"__matmul__": "matmul", "__rmatmul__": "matmul", "__pow__": "pow", "__rpow__": "pow"}

#: Emulation modes now entered (their device and weight cache); the innermost acts.
_ACTIVE: list[Any] = []


def _torch() -> Any:
    return require_torch("memlib.measure.autocast")


def _op_name(func: Any) -> str:
    name = str(getattr(func, "__name__", ""))
    return _ALIASES.get(name, name)


def autocast_dtype(device_type: str) -> Any:
    """The 16-bit dtype autocast gives ``device_type``'s tensors now (real CPU/CUDA autocast, or the meta
    emulation), or None where autocast is off."""
    torch = _torch()
    if device_type == "meta":
        active = bool(_ACTIVE) and torch.is_autocast_enabled("cpu")
        return torch.get_autocast_dtype("cpu") if active else None
    if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def cast_like_autocast(*tensors: Any) -> tuple[Any, ...]:
    """The tensors as autocast's ``lower_precision_fp`` policy hands them to an op (``cached_cast``).

    For a function that replaces a listed op outside the dispatcher (the trace's flash-attention routing of
    ``scaled_dot_product_attention``): eligible floating tensors are cast to the autocast dtype, nothing
    changes where autocast is off.
    """
    torch = _torch()
    first = next((t for t in tensors if isinstance(t, torch.Tensor)), None)
    dtype = autocast_dtype(first.device.type) if first is not None else None
    if dtype is None:
        return tensors
    return tuple(t.to(dtype) if _eligible(t, t.device.type if isinstance(t, torch.Tensor) else "") and
                 t.dtype != dtype else t for t in tensors)


def _eligible(x: Any, device_type: str) -> bool:
    torch = _torch()
    return (isinstance(x, torch.Tensor) and x.device.type == device_type and x.is_floating_point()
            and x.dtype != torch.float64)


def emulate_autocast(device_type: str = "cuda", *, tensor_device: str = "meta") -> Any:
    """A ``TorchFunctionMode`` applying ``device_type``'s autocast policies to ``tensor_device`` tensors.

    Enter it around the whole step (forward, backward, optimizer) and ``torch.autocast("cpu", dtype)``
    around the forward pass: the mode casts only while CPU autocast is enabled (see the module docstring).

    Args:
        device_type: whose op lists to mirror: ``"cuda"`` (meta traces' default) or ``"cpu"`` (the tests
            compare it with real CPU autocast).
        tensor_device: the device of the tensors it casts.
    """
    torch = _torch()
    check_choice("autocast device", device_type, AUTOCAST_DEVICES)
    from torch.overrides import TorchFunctionMode

    policies = POLICIES[device_type]
    cache: dict[int, tuple[Any, Any]] = {}

    def cast(x: Any, dtype: Any, lower: Any) -> Any:
        if not _eligible(x, tensor_device) or x.dtype == dtype:
            return x
        if (dtype == lower and x.dtype == torch.float32 and x.requires_grad and x.is_leaf and not x._is_view()
                and torch.is_autocast_cache_enabled()):
            hit = cache.get(id(x))
            if hit is not None and hit[0]() is x:
                return hit[1]
            out = x.to(dtype)
            cache[id(x)] = (weakref.ref(x), out)
            return out
        return x.to(dtype)

    class _Emulation(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = dict(kwargs or {})
            policy = policies.get(_op_name(func)) if torch.is_autocast_enabled("cpu") else None
            if policy is None:
                return func(*args, **kwargs)
            from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

            lower = torch.get_autocast_dtype("cpu")
            if policy == "fp32_set_opt_dtype":
                first = next((a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)), None)
                given = kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args)
                if first is not None and _eligible(first, tensor_device) and not given:
                    kwargs["dtype"] = torch.float32
                return func(*args, **kwargs)
            if policy == "promote":
                floats = [a.dtype for a in tree_leaves((args, kwargs)) if _eligible(a, tensor_device)]
                if not floats:
                    return func(*args, **kwargs)
                to = floats[0]
                for d in floats[1:]:
                    to = torch.promote_types(to, d)
            else:
                to = lower if policy == "lower" else torch.float32
            # Right to left: autocast's kernels cast their arguments in a C++ pack expansion, which GCC (PyTorch's
            # Linux builds) evaluates from the last argument; the order of the casts' autograd nodes decides
            # the order of the backward pass's gradient computations.
            leaves, spec = tree_flatten((args, kwargs))
            cast_leaves = [cast(a, to, lower) for a in reversed(leaves)][::-1]
            args, kwargs = tree_unflatten(cast_leaves, spec)
            return func(*args, **kwargs)

    mode = _Emulation()
    mode.cache = cache  # type: ignore[attr-defined]
    return mode


@contextlib.contextmanager
def emulated(device_type: str = "cuda", *, tensor_device: str = "meta") -> Iterator[Any]:
    """Enter :func:`emulate_autocast`'s mode; the weight cache empties when the outermost autocast exits."""
    torch = _torch()
    mode = emulate_autocast(device_type, tensor_device=tensor_device)
    original_clear = torch.clear_autocast_cache

    def clear() -> None:
        mode.cache.clear()
        original_clear()

    # The autograd engine runs a meta backward (and torch.utils.checkpoint's recomputation in it) on a thread
    # without the mode: entering CPU autocast there (the recomputation does) enters the mode too.
    from torch.amp.autocast_mode import autocast
    from torch.overrides import _get_current_function_mode_stack

    original_enter, original_exit = autocast.__enter__, autocast.__exit__

    def enter(self: Any) -> Any:
        out = original_enter(self)
        if self.device == "cpu" and mode not in _get_current_function_mode_stack():
            mode.__enter__()
            self._memlib_emulation = True
        return out

    def exit(self: Any, *exc: Any) -> Any:
        if getattr(self, "_memlib_emulation", False):
            self._memlib_emulation = False
            mode.__exit__(None, None, None)
        return original_exit(self, *exc)

    torch.clear_autocast_cache = clear
    autocast.__enter__, autocast.__exit__ = enter, exit  # type: ignore[method-assign]
    _ACTIVE.append(mode)
    try:
        with mode:
            yield mode
    finally:
        _ACTIVE.remove(mode)
        torch.clear_autocast_cache = original_clear
        autocast.__enter__, autocast.__exit__ = original_enter, original_exit  # type: ignore[method-assign]
