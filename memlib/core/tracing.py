"""The pure half of the tracer: its result record and the exact extrapolation of a few traced layers (Chapter 1).

No torch: :class:`TraceResult` is what :func:`memlib.measure.trace.trace_training` returns, and
:func:`extrapolate_segments` turns the per-segment maxima of traces at 3, 4 and 5 layers into the peak of a
deep model (integers, checked exactly on every traced point).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .categories import MemCategory

__all__ = ["TraceResult", "extrapolate_segments", "SegmentPeaks"]

#: Per-segment maxima of one trace: label -> (live bytes, bytes per category, phase) at the segment's maximum.
SegmentPeaks = dict[Any, tuple[int, dict[MemCategory, int], str]]


@dataclass(frozen=True)
class TraceResult:
    """Peak memory of a measured training step. Introduced in Chapter 1.

    Attributes:
        peak_bytes: steady-state peak of live tensor bytes on the traced device.
        by_category: bytes per :class:`MemCategory` value at the moment of the peak.
        peak_phase: ``"forward"``, ``"backward"`` or ``"optimizer"``: where the peak happened.
        device: the device traced (``"meta"``, ``"cpu"``, ``"cuda"``).
        settings: the settings traced (model, batch, seq, precision, optimizer, attention, recompute).
        method: ``"full"`` (every layer traced) or ``"extrapolated"`` (3 to 5 layers traced, exactly
            extrapolated; see :func:`memlib.measure.trace.trace_training`).
        reserved_peak_bytes: the CUDA caching allocator's reserved peak for the traced steps, replayed by
            :func:`memlib.core.allocator.replay` (Chapter 16); None unless asked for.
        reserved_peak_expandable_bytes: the same with ``expandable_segments:True``; None unless asked for.
        events: the :func:`memlib.core.allocator.replay` events (setup, then two steps) behind them; None unless
            asked for. Not in :meth:`as_dict`.
    """

    peak_bytes: int
    by_category: dict[str, int]
    peak_phase: str
    device: str
    settings: dict[str, Any] = field(default_factory=dict)
    method: str = "full"
    reserved_peak_bytes: int | None = None
    reserved_peak_expandable_bytes: int | None = None
    events: list[list[Any]] | None = field(default=None, repr=False, compare=False)

    @property
    def params_bytes(self) -> int:
        """Parameter bytes at the peak."""
        return self.by_category[MemCategory.PARAM.value]

    @property
    def grads_bytes(self) -> int:
        """Gradient bytes at the peak."""
        return self.by_category[MemCategory.GRAD.value]

    @property
    def optimizer_bytes(self) -> int:
        """Optimizer-state bytes (fp32 master weights included) at the peak."""
        return self.by_category[MemCategory.OPTIMIZER.value]

    @property
    def activations_bytes(self) -> int:
        """Bytes of tensors saved by the forward pass still alive at the peak."""
        return self.by_category[MemCategory.ACTIVATION.value]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``peak_bytes``, ``<category>_bytes``, ``peak_phase``, ``device``, settings."""
        out: dict[str, Any] = {"peak_bytes": self.peak_bytes}
        out.update({f"{k}_bytes": v for k, v in self.by_category.items()})
        if self.reserved_peak_bytes is not None:
            out["reserved_peak_bytes"] = self.reserved_peak_bytes
        if self.reserved_peak_expandable_bytes is not None:
            out["reserved_peak_expandable_bytes"] = self.reserved_peak_expandable_bytes
        out["peak_phase"] = self.peak_phase
        out["device"] = self.device
        out.update(self.settings)
        return out



_LAYER_ORDER = {"F": 1, "B": -1, "Q": 1}  # direction of time along the layer index in each kind


def extrapolate_segments(runs: dict[int, SegmentPeaks],
                 num_layers: int, lead: int = 0) -> tuple[int, dict[MemCategory, int], str] | None:
    """Peak of an ``num_layers``-layer step from segment maxima traced at 3, 4 and 5 layers, or None.

    A non-layer segment's maximum must be affine in the depth L; a layer segment's, affine in (k, L). Every
    traced point is checked exactly; any mismatch returns None (the caller then traces the full model).
    With ``lead`` layers that differ from the rest (DeepSeek's dense first layers), the depths traced are
    lead + 3, 4, 5 and each of the first lead + 1 layers is its own affine function of the depth.
    """
    cats = list(MemCategory)

    def vec(entry: tuple[int, dict[MemCategory, int], str]) -> tuple[int, ...]:
        return (entry[0], *(entry[1][c] for c in cats))

    depths = sorted(runs)
    first = runs[depths[0]]
    plain = [lab for lab in first if not isinstance(lab, tuple)]
    kinds = sorted({lab[0] for run in runs.values() for lab in run if isinstance(lab, tuple)})
    if any({lab for lab in run if not isinstance(lab, tuple)} != set(plain) for run in runs.values()):
        return None
    candidates: list[tuple[tuple[int, ...], str, int]] = []  # (vector, phase, time order)
    order = {lab: i for i, lab in enumerate(first)}
    for lab in plain:
        vs = [vec(runs[d][lab]) for d in depths]
        if len({runs[d][lab][2] for d in depths}) != 1:
            return None
        step = tuple(b - a for a, b in zip(vs[0], vs[1]))
        for d, v in zip(depths, vs):
            if tuple(a + (d - depths[0]) * st for a, st in zip(vs[0], step)) != v:
                return None
        candidates.append((tuple(a + (num_layers - depths[0]) * st for a, st in zip(vs[0], step)),
                           runs[depths[0]][lab][2], order[lab] * 10**6))
    for kind in kinds:
        pts = {(lab[1], d): runs[d][lab] for d in depths for lab in runs[d] if isinstance(lab, tuple) and lab[0] == kind}
        if set(pts) != {(k, d) for d in depths for k in range(1, d + 1)} or len({e[2] for e in pts.values()}) != 1:
            return None
        phase = next(iter(pts.values()))[2]
        t0 = order.get((kind, 1), 10**9)
        forward_in_k = _LAYER_ORDER.get(kind, 1) > 0
        # The first and the last layer may differ from the others (the embedding output stays referenced
        # through the forward; the last output feeds the final norm): each is its own affine function of the
        # depth. The layers in between are affine in (k, depth).
        for edge in [*range(1, lead + 2), 0]:  # the first lead + 1 layers, then the last (0)
            ks = {d: edge or d for d in depths}
            vs = [vec(pts[(ks[d], d)]) for d in depths]
            step = tuple(b - a for a, b in zip(vs[0], vs[1]))
            if any(tuple(a + (d - depths[0]) * st for a, st in zip(vs[0], step)) != v for d, v in zip(depths, vs)):
                return None
            k_at = edge or num_layers
            rank = k_at if forward_in_k else num_layers - k_at
            candidates.append((tuple(a + (num_layers - depths[0]) * st for a, st in zip(vs[0], step)), phase,
                               t0 * 10**6 + rank))
        mid = {(k, d): vec(e) for (k, d), e in pts.items() if lead + 1 < k < d}
        if not mid:
            continue
        (k0, d0) = min(mid, key=lambda kd: (kd[1], kd[0]))
        if (k0 + 1, d0 + 1) not in mid or (k0, d0 + 1) not in mid:
            return None
        v00, v01, v11 = mid[(k0, d0)], mid[(k0, d0 + 1)], mid[(k0 + 1, d0 + 1)]
        bk = tuple(y - x for x, y in zip(v01, v11))
        cd = tuple(y - x for x, y in zip(v00, v01))

        def at(k: int, depth: int) -> tuple[int, ...]:
            return tuple(a + (k - k0) * b + (depth - d0) * c for a, b, c in zip(v00, bk, cd))

        if len(mid) < 4 or any(at(k, d) != v for (k, d), v in mid.items()):
            return None
        if num_layers >= lead + 3:
            for k in (lead + 2, num_layers - 1):
                rank = k if forward_in_k else num_layers - k
                candidates.append((at(k, num_layers), phase, t0 * 10**6 + rank))
    if not candidates:
        return None
    candidates.sort(key=lambda c: c[2])
    best = max(candidates, key=lambda c: c[0][0])  # max() keeps the first (earliest) of equal peaks
    return best[0][0], dict(zip(cats, best[0][1:])), best[1]

