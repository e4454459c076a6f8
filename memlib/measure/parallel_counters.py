"""What Chapter 15's parallel runs count: bytes autograd saves for backward, and bytes collectives send.

Used by the workers of :mod:`memlib.measure.parallel`. :class:`SavedBytes` counts saved activations with
``torch.autograd.graph.saved_tensors_hooks`` (a storage counts from the moment autograd saves it until autograd
releases it; distinct storages, parameters excluded). :class:`CommCounter` counts collectives with a
``TorchDispatchMode`` on the ``_c10d_functional`` ops (what DTensor calls) and by wrapping ``torch.distributed``
p2p and all-to-all calls. torch is imported lazily.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .deps import require_torch

__all__ = ["SavedBytes", "CommCounter", "local_tensor", "nbytes"]


def _torch() -> Any:
    return require_torch("memlib.measure.parallel")


class SavedBytes:
    """Counts the bytes autograd keeps for backward while :meth:`hooks` is active (live and peak).

    Introduced in Chapter 15. The pack hook wraps each saved tensor in a handle; the storage counts once, from
    its first save until the last handle on it is released (backward frees them). Parameter storages
    (``exclude``) and DTensor wrappers (their local tensor counts) are handled.
    """

    def __init__(self, exclude: Sequence[Any] = ()) -> None:
        self.live = 0
        self.peak = 0
        self.enabled = True
        self._refs: dict[int, list[int]] = {}
        self.skipped: list[str] = []
        self._exclude = {local_tensor(p).untyped_storage().data_ptr() for p in exclude}

    def reset_peak(self) -> None:
        """Start a new peak from the bytes live now."""
        self.peak = self.live

    def _pack(self, t: Any) -> Any:
        if not self.enabled:
            return t
        local = local_tensor(t)
        try:
            st = local.untyped_storage()
            key = st.data_ptr()
        except RuntimeError:  # a tensor without storage of its own (a subclass wrapper)
            self.skipped.append(type(local).__name__)
            return t
        if key in self._exclude or st.nbytes() == 0:
            return t
        ref = self._refs.get(key)
        if ref is None:
            self._refs[key] = [1, st.nbytes()]
            self.live += st.nbytes()
            self.peak = max(self.peak, self.live)
        else:
            ref[0] += 1
        return _Handle(t, key, self)

    def _release(self, key: int) -> None:
        ref = self._refs.get(key)
        if ref is None:
            return
        ref[0] -= 1
        if ref[0] == 0:
            self.live -= ref[1]
            del self._refs[key]

    @contextmanager
    def hooks(self) -> Iterator[SavedBytes]:
        """Count inside the block."""
        torch = _torch()

        with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
            yield self


class _Handle:
    __slots__ = ("t", "key", "owner")

    def __init__(self, t: Any, key: int, owner: SavedBytes) -> None:
        self.t, self.key, self.owner = t, key, owner

    def __del__(self) -> None:
        self.owner._release(self.key)


def _unpack(x: Any) -> Any:
    return x.t if isinstance(x, _Handle) else x


def local_tensor(t: Any) -> Any:
    """The local shard of a DTensor, or the tensor itself."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def nbytes(t: Any) -> int:
    """Bytes of a tensor's elements."""
    return int(t.numel() * t.element_size())


class CommCounter:
    """Counts collectives: DTensor's ``_c10d_functional`` ops (a dispatch mode) and wrapped ``torch.distributed``
    calls; bytes sent by this rank in a ring ((n−1)/n of the full tensor, twice for all-reduce)."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.records: dict[str, list[int]] = {}

    def add(self, name: str, full_bytes: int, sent: int) -> None:
        """Count one call of ``name``: the full tensor's bytes and the bytes this rank sent."""
        rec = self.records.setdefault(name, [0, 0, 0])
        rec[0] += 1
        rec[1] += full_bytes
        rec[2] += sent

    @contextmanager
    def counting(self) -> Iterator[CommCounter]:
        """Count inside the block (the dispatch mode on, ``torch.distributed``'s calls wrapped)."""
        torch = _torch()
        from torch.utils._python_dispatch import TorchDispatchMode

        comm = self
        n = self.world
        ops = torch.ops._c10d_functional

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                kwargs = kwargs or {}
                packet = func._overloadpacket
                if packet is ops.all_reduce:
                    b = nbytes(args[0])
                    comm.add("all_reduce", b, 2 * b * (n - 1) // n)
                elif packet is ops.all_gather_into_tensor:
                    b = nbytes(args[0]) * n
                    comm.add("all_gather", b, b * (n - 1) // n)
                elif packet is ops.reduce_scatter_tensor:
                    b = nbytes(args[0])
                    comm.add("reduce_scatter", b, b * (n - 1) // n)
                elif packet is ops.all_to_all_single:
                    b = nbytes(args[0])
                    comm.add("all_to_all", b, b * (n - 1) // n)
                return func(*args, **kwargs)

        dist = torch.distributed
        originals = {name: getattr(dist, name) for name in ("send", "all_to_all_single", "P2POp")}

        def send(tensor: Any, *a: Any, **k: Any) -> Any:
            comm.add("send (p2p)", nbytes(tensor), nbytes(tensor))
            return originals["send"](tensor, *a, **k)

        def p2p_op(op: Any, tensor: Any, *a: Any, **k: Any) -> Any:  # what pipelining batches
            if op is dist.isend:
                comm.add("send (p2p)", nbytes(tensor), nbytes(tensor))
            return originals["P2POp"](op, tensor, *a, **k)

        def a2a(output: Any, input: Any, *a: Any, **k: Any) -> Any:
            b = nbytes(input)
            comm.add("all_to_all", b, b * (n - 1) // n)
            return originals["all_to_all_single"](output, input, *a, **k)

        dist.send = send
        dist.P2POp = p2p_op
        dist.all_to_all_single = a2a
        try:
            with _Mode():
                yield self
        finally:
            for name, orig in originals.items():
                setattr(dist, name, orig)
