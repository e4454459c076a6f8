"""One self-attaching memory tracker for every measurement: live tensor storages by category (Chapter 1).

:class:`MemoryTracker` counts the bytes of every live tensor storage on one device type, by
:class:`memlib.core.categories.MemCategory`, and the peak with the phase it fell in. It attaches itself to what a
training step holds, as PyTorch's own ``torch.distributed._tools.mem_tracker.MemTracker`` does
(``track_external`` and ``_track_module_params_and_buffers``: parameters, buffers, gradients through
``register_post_accumulate_grad_hook``, optimizer states): :meth:`MemoryTracker.track_model`,
:meth:`MemoryTracker.track_optimizer`, :meth:`MemoryTracker.track_inputs`; its :meth:`MemoryTracker.mode`
(a ``TorchDispatchMode``) sees every op's outputs, and :meth:`MemoryTracker.forward`,
:meth:`MemoryTracker.backward` and :meth:`MemoryTracker.optimizer_step` mark the phases. Unlike PyTorch's, it
runs on the ``meta`` device (a 70B step traces in seconds) and caches meta kernels' output shapes
(:func:`_cached_meta_mode`). Every traced number of the book (``trace_training``, Chapters 4, 5, 9, 10 and
12) comes from this class. torch is imported lazily.
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..core.categories import MemCategory
from .deps import require_torch

__all__ = ["MemoryTracker", "META_CACHE"]

#: The categories of model and optimizer state; everything else (activations, temporaries) is "activation-like".
_STATES = (MemCategory.PARAM, MemCategory.GRAD, MemCategory.BUFFER, MemCategory.OPTIMIZER)


def _torch() -> Any:
    return require_torch("memlib.measure.tracker")


class MemoryTracker:
    """Track live tensor storages on one device type with a TorchDispatchMode and weak references.

    Introduced in Chapter 1. Each op's outputs are registered once per storage (views share their base's
    storage), under the category of the current phase; a weak-reference finalizer removes the bytes when the
    storage dies. ``reclassify`` moves a storage to another category (a gradient that becomes ``param.grad``).

    A step is traced in four moves (cf. ``torch.distributed._tools.mem_tracker.MemTracker``)::

        tracker = MemoryTracker("meta")
        tracker.track_model(net)              # parameters, buffers; gradients as they accumulate
        tracker.track_inputs(input_ids)
        with tracker.mode():
            tracker.track_optimizer(opt)      # states of a warmed-up optimizer
            tracker.reset_peak()
            with tracker.forward():
                loss = net(input_ids=input_ids, labels=input_ids).loss
            with tracker.backward():
                loss.backward()
            with tracker.optimizer_step():
                opt.step()
        tracker.peak, tracker.peak_by_category(), tracker.peak_phase

    Args:
        device_type: ``"meta"``, ``"cpu"`` or ``"cuda"``: storages on other devices are not counted.
        activation_peak: also keep :attr:`act_peak`, the peak of the bytes that are not parameters, gradients,
            buffers or optimizer states (Chapter 4's measure of recomputation).
        on_event: called as ``on_event("alloc" | "free", key, nbytes)`` when a storage is counted or released
            (Chapter 12's snapshot-format log of a meta trace).

    Attributes:
        totals: live bytes per category; ``total`` their sum.
        peak: the largest ``total`` since the last :meth:`reset_peak`; ``peak_totals`` and ``peak_phase`` at it.
        act_peak: see ``activation_peak`` (0 unless asked for).
    """

    def __init__(self, device_type: str, *, activation_peak: bool = False,
                 on_event: Callable[[str, int, int], None] | None = None) -> None:
        self.device_type = device_type
        self.live: dict[int, tuple[int, MemCategory]] = {}
        self.totals: dict[MemCategory, int] = {c: 0 for c in MemCategory}
        self.total = 0
        self.peak = 0
        self.peak_totals: dict[MemCategory, int] = dict(self.totals)
        self.phase = "setup"
        self.peak_phase = "setup"
        self.category = MemCategory.ACTIVATION
        self.act_peak = 0
        self._activation_peak = activation_peak
        self.on_event = on_event
        self._handles: list[Any] = []
        self._forgotten: set[int] = set()  # storages never to count (see :meth:`forget`)
        # Optional per-segment maxima (segments: a layer's forward, its backward, ...), used to extrapolate a
        # trace of a few layers to many (see trace_training's ``extrapolate``).
        self.segment: Any = None
        self.seg_peaks: dict[Any, tuple[int, dict[MemCategory, int], str]] = {}

    # ------------------------------------------------------------------------------------------- storages
    def _release(self, key: int) -> None:
        entry = self.live.pop(key, None)
        if entry is not None:
            self.total -= entry[0]
            self.totals[entry[1]] -= entry[0]
            if self.on_event is not None:
                self.on_event("free", key, entry[0])

    def register(self, t: Any, category: MemCategory | None = None) -> None:
        """Count the storage of tensor ``t`` (once) under ``category`` (default: the phase's).

        A tensor subclass that wraps others (FSDP2's sharded ``DTensor`` parameters, gradients and optimizer
        states) counts its inner tensors (the rank's local shard), never the wrapper's own storage.
        """
        torch = _torch()
        if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
            return
        if (inner := _inner_tensors(t)) is not None:
            for x in inner:
                self.register(x, category)
            return
        st = t.untyped_storage()
        key = st._cdata
        if key in self.live or key in self._forgotten:
            return
        nbytes = st.nbytes()
        cat = category or self.category
        self.live[key] = (nbytes, cat)
        self.totals[cat] += nbytes
        self.total += nbytes
        weakref.finalize(st, self._release, key)
        if self.on_event is not None:
            self.on_event("alloc", key, nbytes)
        if self.total > self.peak:
            self.peak = self.total
            self.peak_totals = dict(self.totals)
            self.peak_phase = self.phase
        if self._activation_peak:
            states = sum(self.totals[c] for c in _STATES)
            self.act_peak = max(self.act_peak, self.total - states)
        if self.segment is not None:
            sp = self.seg_peaks.get(self.segment)
            if sp is None or self.total > sp[0]:
                self.seg_peaks[self.segment] = (self.total, dict(self.totals), self.phase)

    def set_segment(self, label: Any) -> None:
        """Start (or re-enter) segment ``label``; its maximum starts from the live bytes now."""
        self.segment = label
        sp = self.seg_peaks.get(label)
        if sp is None or self.total > sp[0]:
            self.seg_peaks[label] = (self.total, dict(self.totals), self.phase)

    def reclassify(self, t: Any, category: MemCategory) -> None:
        """Move the storage of ``t`` to ``category`` (registering it first if needed)."""
        torch = _torch()
        if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
            return
        if (inner := _inner_tensors(t)) is not None:
            for x in inner:
                self.reclassify(x, category)
            return
        key = t.untyped_storage()._cdata
        if key not in self.live:
            self.register(t, category)
            return
        nbytes, old = self.live[key]
        self.live[key] = (nbytes, category)
        self.totals[old] -= nbytes
        self.totals[category] += nbytes

    def forget(self, t: Any) -> None:
        """Stop counting the storage of ``t``, now and later (e.g. optimizer step counters, which live on the
        host: in a CPU trace ``step_t += 1`` would otherwise count them again as the in-place op's output)."""
        torch = _torch()
        if (inner := _inner_tensors(t)) is not None:
            for x in inner:
                self.forget(x)
            return
        if isinstance(t, torch.Tensor) and t.device.type == self.device_type:
            st = t.untyped_storage()
            key = st._cdata
            self._release(key)
            if key not in self._forgotten:
                self._forgotten.add(key)
                weakref.finalize(st, self._forgotten.discard, key)

    def resized(self, t: Any, category: MemCategory | None = None) -> None:
        """Recount the storage of ``t`` after ``UntypedStorage.resize_``, which no dispatch mode sees.

        FSDP2 keeps each unsharded parameter's storage for the whole run and gives it memory, or takes it back,
        with ``storage.resize_`` (``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``: ``alloc_storage``,
        ``free_storage``): the tracker is told (:mod:`memlib.measure.recipes` wraps both). A storage resized to
        0 bytes stops counting; one given memory counts again under ``category`` (default: the phase's).
        """
        torch = _torch()
        if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
            return
        self._release(t.untyped_storage()._cdata)
        if t.untyped_storage().nbytes() > 0:
            self.register(t, category)

    # ------------------------------------------------------------------------------------ attach to a step
    def track_model(self, net: Any, *, grad_hooks: bool = True) -> int:
        """Count a module's parameters (PARAM) and buffers (BUFFER), and its gradients as they accumulate.

        As ``MemTracker._track_module_params_and_buffers`` does: every parameter counts as PARAM (frozen ones
        too), a gradient already there as GRAD; with ``grad_hooks`` each trainable parameter gets a
        ``register_post_accumulate_grad_hook`` that moves its accumulated ``.grad`` to GRAD (the backward pass
        made it as a temporary). :meth:`detach` removes the hooks.

        Returns:
            The parameter bytes now counted.
        """
        for p in net.parameters():
            self.register(p, MemCategory.PARAM)
            if p.grad is not None:
                self.reclassify(p.grad, MemCategory.GRAD)
        for b in net.buffers():
            self.register(b, MemCategory.BUFFER)
        if grad_hooks:
            self.track_grads(p for p in net.parameters() if p.requires_grad)
        return self.totals[MemCategory.PARAM]

    def track_grads(self, params: Iterable[Any]) -> None:
        """Move each parameter's ``.grad`` to GRAD once the backward pass has accumulated it (a grad hook)."""
        for p in params:
            self._handles.append(
                p.register_post_accumulate_grad_hook(lambda p: self.reclassify(p.grad, MemCategory.GRAD)))

    def track_optimizer(self, *optimizers: Any) -> None:
        """Count the states of (warmed-up) optimizers as OPTIMIZER, and their parameters' gradients as GRAD.

        As ``MemTracker._track_optimizer_states`` does. PyTorch's ``step`` counters are host-side scalars on a
        GPU (``capturable=False``), not device memory: they are forgotten. Call it inside :meth:`mode` where
        the states were made under it.
        """
        for opt in optimizers:
            for state in opt.state.values():
                for name, value in state.items():
                    if name == "step":
                        self.forget(value)
                    else:
                        self.reclassify(value, MemCategory.OPTIMIZER)
            for group in opt.param_groups:
                for p in group["params"]:
                    if p.grad is not None:  # zero-filled gradients kept by zero_grad(set_to_none=False)
                        self.reclassify(p.grad, MemCategory.GRAD)

    def track_inputs(self, *tensors: Any) -> None:
        """Count input tensors (token ids, a batch) as ACTIVATION: the backward pass may read them."""
        for t in tensors:
            self.register(t, MemCategory.ACTIVATION)

    def detach(self) -> None:
        """Remove the gradient hooks :meth:`track_model` and :meth:`track_grads` installed."""
        for h in self._handles:
            h.remove()
        self._handles = []

    # ------------------------------------------------------------------------------------- phases and peaks
    def reset_peak(self) -> None:
        """Start a new peak measurement from the current live bytes."""
        self.peak = self.total
        self.peak_totals = dict(self.totals)
        self.peak_phase = self.phase
        self.seg_peaks = {}
        if self.segment is not None:
            self.set_segment("start")

    @contextlib.contextmanager
    def phase_of(self, phase: str, category: MemCategory) -> Iterator[None]:
        """Within the block, new storages are counted as ``category`` and peaks are labelled ``phase``."""
        old = (self.phase, self.category)
        self.phase, self.category = phase, category
        try:
            yield
        finally:
            self.phase, self.category = old

    def forward(self) -> contextlib.AbstractContextManager[None]:
        """The forward phase: what ops make is ACTIVATION (saved for backward, or freed soon)."""
        return self.phase_of("forward", MemCategory.ACTIVATION)

    def backward(self) -> contextlib.AbstractContextManager[None]:
        """The backward phase: what ops make is TEMP (gradients move to GRAD when accumulated)."""
        return self.phase_of("backward", MemCategory.TEMP)

    def optimizer_step(self) -> contextlib.AbstractContextManager[None]:
        """The optimizer phase: what ops make is TEMP (states were counted by :meth:`track_optimizer`)."""
        return self.phase_of("optimizer", MemCategory.TEMP)

    def peak_by_category(self) -> dict[str, int]:
        """Bytes per category value (``"param"``, ``"grad"``, ...) at the peak."""
        return {c.value: self.peak_totals[c] for c in MemCategory}

    def mode(self, *, cache: bool | None = None) -> Any:
        """The TorchDispatchMode that registers every op's outputs.

        Args:
            cache: on the meta device, cache meta kernels' output shapes (:func:`_cached_meta_mode`; the same
                storages); default :data:`META_CACHE`.
        """
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        tracker = self
        if self.device_type == "meta" and (META_CACHE if cache is None else cache):
            return _cached_meta_mode(tracker)

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                out = func(*args, **(kwargs or {}))
                for t in tree_leaves(out):
                    tracker.register(t)
                return out

        return _Mode()


def _inner_tensors(t: Any) -> list[Any] | None:
    """The tensors a wrapper subclass (``DTensor``: its ``_local_tensor``) holds, or None for a plain tensor."""
    torch = _torch()
    if type(t) in (torch.Tensor, torch.nn.Parameter):  # the common case, without the import below
        return None
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not is_traceable_wrapper_subclass(t):
        return None
    names, _ = t.__tensor_flatten__()
    return [getattr(t, name) for name in names]


#: Cache output metadata of functional ops on the meta device (see :func:`_cached_meta_mode`); the tests
#: switch it off to check that the trace is the same without it.
META_CACHE = True

_SIMPLE_LEAVES = (int, float, bool, str, type(None))


def _strided_nbytes(t: Any) -> int:
    """Bytes that ``torch.empty_strided`` allocates for ``t``'s sizes, strides and dtype."""
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))) * t.element_size()


# Output metadata of functional meta ops, and the keys of in-place meta ops known to change no metadata; shared
# by all traces in the process (the keys hold sizes, strides and dtypes only, never tensors).
_META_OUT: dict[Any, Any] = {}
_META_NOOP: set[Any] = set()
_OP_KIND: dict[Any, Any] = {}


def _op_kind(func: Any) -> Any:
    """"functional", ("inplace", [argument index per return]), or None (not cacheable)."""
    kind = _OP_KIND.get(func, False)
    if kind is not False:
        return kind
    torch = _torch()
    schema = func._schema
    kind = None
    if torch.Tag.nondeterministic_seeded in func.tags or torch.Tag.inplace_view in func.tags:
        kind = None
    elif not schema.is_mutable and schema.returns and all(r.alias_info is None for r in schema.returns):
        kind = "functional"
    elif schema.is_mutable and all(r.alias_info is not None and r.alias_info.is_write for r in schema.returns):
        sets = [frozenset(a.alias_info.before_set) if a.alias_info is not None else None for a in schema.arguments]
        where = []
        for r in schema.returns:
            match = [k for k, st in enumerate(sets) if st == frozenset(r.alias_info.before_set)]
            where.append(match[0] if len(match) == 1 else None)
        if None not in where:
            kind = ("inplace", where, [a.name for a in schema.arguments])
    _OP_KIND[func] = kind
    return kind


def _cached_meta_mode(tracker: MemoryTracker | None) -> Any:
    """A dispatch mode for the meta device that caches what meta kernels compute (and tracks memory).

    Identical decoder layers call the same ops on tensors of the same shapes dozens of times; the meta kernels
    (many written in Python) then compute the same output sizes again and again. The outputs of an op that
    neither mutates nor aliases its inputs, and whose outputs are fresh tensors, depend only on its arguments'
    metadata: on a cache hit new meta tensors with the cached sizes, strides and dtypes are made directly. An
    in-place op on meta tensors does nothing but check shapes; once a call with the same metadata has been seen
    to leave every argument's metadata unchanged, later ones return their aliased arguments at once. The
    storages, and so the memory trace, are the same as without the cache (the tests compare them). With
    ``tracker=None`` the mode only caches (the untraced warm-up step).
    """
    torch = _torch()
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten, tree_unflatten

    Tensor = torch.Tensor
    simple = _SIMPLE_LEAVES + (torch.dtype, torch.device, torch.layout, torch.memory_format)

    def key_of(func: Any, args: Any, kwargs: Any) -> Any:
        leaves, spec = tree_flatten((args, kwargs))
        parts: list[Any] = [func, spec]
        for x in leaves:
            if isinstance(x, Tensor):
                if x.device.type != "meta":
                    return None
                parts.append((tuple(x.shape), x.stride(), x.dtype, x.storage_offset()))
            elif isinstance(x, simple):
                parts.append((type(x), x))
            else:
                return None
        return tuple(parts)

    def tensor_meta(x: Any) -> Any:
        return [(tuple(t.shape), t.stride(), t.dtype, t.storage_offset())
                for t in tree_flatten(x)[0] if isinstance(t, Tensor)]

    class _Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            kind = _op_kind(func)
            key = key_of(func, args, kwargs) if kind is not None else None
            if kind is not None and kind != "functional":  # in-place
                _, where, names = kind
                if key is not None and key in _META_NOOP:
                    outs = [args[k] if k < len(args) else kwargs[names[k]] for k in where]
                    return None if not outs else outs[0] if len(outs) == 1 else tuple(outs)
                before = tensor_meta((args, kwargs)) if key is not None else None
                out = func(*args, **kwargs)
                if key is not None and tensor_meta((args, kwargs)) == before:
                    _META_NOOP.add(key)
                return out
            hit = _META_OUT.get(key) if key is not None else None
            if hit is not None:
                metas, spec = hit
                outs = [torch.empty_strided(size, stride, dtype=dtype, device="meta") for size, stride, dtype in metas]
                out = tree_unflatten(outs, spec)
            else:
                out = func(*args, **kwargs)
                if key is not None:
                    leaves, spec = tree_flatten(out)
                    if leaves and all(isinstance(t, Tensor) and t.device.type == "meta" and t.storage_offset() == 0
                                      and t.untyped_storage().nbytes() == _strided_nbytes(t) for t in leaves):
                        storages = {t.untyped_storage()._cdata for t in leaves}
                        fresh = len(storages) == len(leaves) and not any(
                            isinstance(a, Tensor) and a.untyped_storage()._cdata in storages
                            for a in tree_flatten((args, kwargs))[0])
                        if fresh:
                            _META_OUT[key] = ([(tuple(t.shape), t.stride(), t.dtype) for t in leaves], spec)
                outs = tree_flatten(out)[0]
            if tracker is not None:
                for t in outs:
                    tracker.register(t)
            return out

    return _Mode()
