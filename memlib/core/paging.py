"""A simulation of paged optimizer states: GPU memory budget, unified-memory page-out and page-in (Chapter 9).

Pure Python. Paged optimizers (bitsandbytes ``PagedAdamW``, used by QLoRA) allocate the optimizer states in
CUDA unified memory. When activations spike and the GPU runs out, the driver evicts state pages to CPU RAM
instead of failing; before the optimizer step needs them they are prefetched back (Dettmers et al. 2023, §3).
This module replays a sequence of training steps against a memory budget and counts what moves.

Model of a step: the forward/backward phase needs ``fixed + activations[t]`` bytes plus whatever optimizer
pages are resident; pages that do not fit are paged out (least recently used first: all state pages are used
together in the step, so any order gives the same byte counts). The optimizer phase needs every state page on
the GPU (activations are gone by then) next to the step's own temporaries, so the pages that were evicted are
paged back in. Without paging the step fails (out of memory) whenever fixed + states + activations (or the
step's temporaries) exceed the budget.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .errors import MemlibError, check_positive

__all__ = ["UM_PAGE_BYTES", "PagingStep", "PagingResult", "simulate_paging"]

#: Granularity of the simulation: 2 MiB, the large-page size the CUDA driver migrates managed memory in.
UM_PAGE_BYTES = 2 * 2**20


@dataclass(frozen=True)
class PagingStep:
    """What one training step did. Introduced in Chapter 9.

    Attributes:
        step: index.
        activation_bytes: activations (and temporaries) of the step's forward/backward.
        paged_out_bytes: optimizer-state bytes evicted to CPU during forward/backward.
        paged_in_bytes: bytes brought back for the optimizer step.
        states_on_gpu_bytes: state bytes resident at the activation peak.
        gpu_peak_bytes: the step's peak GPU use.
        oom: the step cannot run (even with every state page on the CPU, or, without paging, at all).
    """

    step: int
    activation_bytes: int
    paged_out_bytes: int
    paged_in_bytes: int
    states_on_gpu_bytes: int
    gpu_peak_bytes: int
    oom: bool


@dataclass(frozen=True)
class PagingResult:
    """A run of steps against a budget. Introduced in Chapter 9.

    Attributes:
        steps: per step.
        capacity_bytes: the GPU budget.
        paged: whether states were in unified memory.
        page_bytes: the page size.
    """

    steps: tuple[PagingStep, ...]
    capacity_bytes: int
    paged: bool
    page_bytes: int

    @property
    def ooms(self) -> int:
        """Steps that ran out of memory."""
        return sum(s.oom for s in self.steps)

    @property
    def traffic_bytes(self) -> int:
        """Bytes moved over the CPU-GPU link, both directions."""
        return sum(s.paged_out_bytes + s.paged_in_bytes for s in self.steps)

    def transfer_seconds(self, link_bytes_per_s: float = 25e9) -> float:
        """Time to move :attr:`traffic_bytes` at ``link_bytes_per_s`` (PCIe 4.0 x16 ≈ 25 GB/s in practice)."""
        if link_bytes_per_s <= 0:
            raise MemlibError(f"link_bytes_per_s must be > 0, got {link_bytes_per_s!r}")
        return self.traffic_bytes / link_bytes_per_s


def simulate_paging(capacity_bytes: int, fixed_bytes: int, optimizer_bytes: int,
                    activation_bytes: Sequence[int], *, step_bytes: int = 0, paged: bool = True,
                    page_bytes: int = UM_PAGE_BYTES) -> PagingResult:
    """Replay training steps against a GPU budget with (or without) paged optimizer states.

    Introduced in Chapter 9.

    Args:
        capacity_bytes: GPU memory available to the process.
        fixed_bytes: what never moves: weights, gradients, CUDA context, buffers.
        optimizer_bytes: optimizer states (paged if ``paged``).
        activation_bytes: activations at each step's peak (they differ with sequence length).
        step_bytes: temporaries of the optimizer step itself (e.g. ``torch.optim.AdamW``'s foreach buffer).
        paged: states in unified memory (evicted on pressure, prefetched for the step) or plain device memory.
        page_bytes: migration granularity.

    Returns:
        Per-step page traffic, resident states and out-of-memory flags.
    """
    cap = check_positive("capacity_bytes", capacity_bytes)
    fixed = check_positive("fixed_bytes", fixed_bytes, allow_zero=True)
    states = check_positive("optimizer_bytes", optimizer_bytes, allow_zero=True)
    page = check_positive("page_bytes", page_bytes)
    step = check_positive("step_bytes", step_bytes, allow_zero=True)
    n_pages = -(-states // page)
    page_size = [page] * (n_pages - 1) + ([states - page * (n_pages - 1)] if n_pages else [])
    resident = n_pages  # pages on the GPU; the first pages evicted are the last in the list (sizes are equal)
    out: list[PagingStep] = []
    for t, act in enumerate(activation_bytes):
        a = check_positive(f"activation_bytes[{t}]", act, allow_zero=True)
        if not paged:
            peak = fixed + states + max(a, step)
            oom = peak > cap
            out.append(PagingStep(t, a, 0, 0, states, min(peak, cap) if oom else peak, oom))
            continue
        room = cap - fixed - a  # what is left for state pages during forward/backward
        if room < 0:
            out.append(PagingStep(t, a, 0, 0, 0, cap, True))
            continue
        # evict from the end until the resident pages fit
        resident_bytes = sum(page_size[:resident])
        evicted = 0
        while resident > 0 and resident_bytes > room:
            resident -= 1
            resident_bytes -= page_size[resident]
            evicted += page_size[resident]
        peak_fb = fixed + a + resident_bytes
        # optimizer step: activations are freed; all pages must be on the GPU, with the step's temporaries
        if fixed + states + step > cap:
            out.append(PagingStep(t, a, evicted, 0, resident_bytes, max(peak_fb, cap), True))
            continue
        paged_in = states - resident_bytes
        resident = n_pages
        out.append(PagingStep(t, a, evicted, paged_in, resident_bytes, max(peak_fb, fixed + states + step), False))
    return PagingResult(tuple(out), cap, paged, page)
