"""The numeric drills' engine: the Drill record, the kind registry, answer parsing, grading and drill mode.

Pure Python (Drills part). A kind is one function registered with :func:`drill_kind` (the kinds themselves
live in :mod:`memlib.drills.numeric`); :func:`generate` builds one drill from a seed with ``random.Random(seed)``;
:func:`grade` checks an answer against memlib's value within the drill's tolerance; :func:`make_drills` and
:func:`drill_mode` ask N random drills and return a score, deterministic for a given seed.
"""
from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.dtypes import GB, GiB, MB, MiB
from ..core.errors import MemlibError, check_choice, check_positive
from .bank import CHAPTERS

__all__ = [
    "Drill",
    "DrillKind",
    "DRILL_KINDS",
    "drill_kind",
    "generate",
    "BYTE_UNITS",
    "MULTIPLIERS",
    "UNIT_WORDS",
    "parse_answer",
    "grade",
    "drill_markdown",
    "DrillResult",
    "DrillScore",
    "make_drills",
    "score",
    "drill_mode",
]


def estimate_training(*args: Any, **kwargs: Any) -> Any:
    """:func:`memlib.core.estimate.estimate_training` with ``framework="deepspeed"``: the drills and the model
    answers count model states as the ZeRO paper does (16-bit params and grads, fp32 master and Adam states,
    partitioned by ZeRO stage; DeepSpeed's layout, :mod:`memlib.core.frameworks`). ZeRO-1 is the paper's P_os,
    all gradients kept: DeepSpeed's ZeRO-1 with gradient accumulation (``grad_accum=2`` unless given; with one
    micro-batch per step it frees them as ZeRO-2 does)."""
    from ..core.estimate import estimate_training as estimate

    if kwargs.get("zero_stage") == 1 and kwargs.get("setup") is None:
        kwargs.setdefault("grad_accum", 2)
    return estimate(*args, framework="deepspeed", **kwargs)


def _gb(n: float, digits: int = 1) -> str:
    return f"{n / GB:,.{digits}f} GB"


def _gib(n: float, digits: int = 1) -> str:
    return f"{n / GiB:,.{digits}f} GiB"


@dataclass(frozen=True)
class Drill:
    """One numeric drill, with memlib's answer. Introduced in the Drills part.

    Attributes:
        kind: the generator's name (a key of :data:`DRILL_KINDS`).
        seed: the seed it was generated from (``generate(kind, seed)`` rebuilds it).
        question: the question text, units stated.
        answer: memlib's value, in ``unit``.
        unit: ``"GB"`` (10⁹ bytes), ``"GiB"``, ``"MiB"``, ``"GPUs"``, ``"sequences"``, ``"parameters"``, ``"%"``...
        rel_tol: relative tolerance of :func:`grade`.
        abs_tol: absolute tolerance (in ``unit``); the larger of the two applies.
        difficulty: ``"E"``, ``"M"`` or ``"H"``.
        chapter: the chapter that teaches it.
        explanation: how memlib computed the answer.
        settings: the randomized parameters.
        hint: the formula to use, shown behind a Hint button (never in the question); "" if none.
    """

    kind: str
    seed: int
    question: str
    answer: float
    unit: str
    rel_tol: float
    abs_tol: float
    difficulty: str
    chapter: int
    explanation: str
    settings: dict[str, Any] = field(default_factory=dict, compare=False)
    hint: str = ""

    @property
    def tolerance_text(self) -> str:
        """The tolerance in words (``"±5 %"``, ``"exact"``)."""
        if self.rel_tol > 0:
            return f"±{100 * self.rel_tol:g} %"
        if self.abs_tol >= 0.5 and float(self.answer).is_integer():
            return "exact" if self.abs_tol < 1 else f"±{self.abs_tol:g}"
        return f"±{self.abs_tol:g} {self.unit}"

    @property
    def answer_text(self) -> str:
        """memlib's answer with its unit (``"7,372,800 parameters"``, ``"43.22 GB"``)."""
        if float(self.answer).is_integer() and self.unit not in ("GB", "GiB", "MiB", "%"):
            unit = self.unit[:-1] if self.answer == 1 and self.unit.endswith("s") else self.unit
            return f"{int(self.answer):,} {unit}"
        return f"{self.answer:,.2f} {self.unit}"


@dataclass(frozen=True)
class DrillKind:
    """A registered drill generator. Introduced in the Drills part.

    Attributes:
        name: the kind's name.
        chapter: the chapter it drills.
        description: one line saying what is asked.
        make: ``make(rng, seed) -> Drill``.
    """

    name: str
    chapter: int
    description: str
    make: Callable[[random.Random, int], Drill]


#: Registered generators, by name. Add one with the :func:`drill_kind` decorator.
DRILL_KINDS: dict[str, DrillKind] = {}


def drill_kind(name: str, chapter: int, description: str) -> Callable[[Callable[[random.Random, int], Drill]],
                                                                      Callable[[random.Random, int], Drill]]:
    """Register a drill generator ``f(rng, seed) -> Drill`` under ``name``. Introduced in the Drills part.

    A new kind is one function: draw its parameters from ``rng`` (a ``random.Random``), compute the answer
    with memlib, and return a :class:`Drill`.
    """
    check_choice("chapter", chapter, CHAPTERS)

    def register(f: Callable[[random.Random, int], Drill]) -> Callable[[random.Random, int], Drill]:
        if name in DRILL_KINDS:
            raise MemlibError(f"drill kind {name!r} is already registered")
        DRILL_KINDS[name] = DrillKind(name, chapter, description, f)
        return f

    return register


def generate(kind: str, seed: int) -> Drill:
    """Build the drill of ``kind`` for ``seed`` (deterministic). Introduced in the Drills part.

    Raises:
        MemlibError: for an unknown kind, listing the registered ones.
    """
    check_choice("drill kind", kind, DRILL_KINDS)
    seed = check_positive("seed", seed, allow_zero=True)
    return DRILL_KINDS[kind].make(random.Random(seed), seed)


#: Memory units an answer may carry, in bytes (decimal KB…TB as in papers, binary KiB…TiB as in torch).
BYTE_UNITS: dict[str, int] = {"B": 1, "KB": 10**3, "MB": MB, "GB": GB, "TB": 10**12, "KiB": 2**10, "MiB": MiB,
                              "GiB": GiB, "TiB": 2**40}
#: Multipliers a number may carry: SI suffixes (``7.37M``; ``B`` for billion where the answer is not in bytes) and
#: words.
MULTIPLIERS: dict[str, float] = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12, "thousand": 1e3,
                                 "million": 1e6, "mn": 1e6, "billion": 1e9, "bn": 1e9, "trillion": 1e12}
#: Words accepted for a count unit (case-insensitive).
UNIT_WORDS: dict[str, tuple[str, ...]] = {
    "sequences": ("seq", "seqs", "sequence", "sequences", "sample", "samples"),
    "GPUs": ("gpu", "gpus", "card", "cards"),
    "parameters": ("param", "params", "parameter", "parameters"),
    "tokens": ("tok", "toks", "token", "tokens"),
    "%": ("%", "percent", "pct"),
}
_BYTE_UNITS_LOWER = {u.lower(): n for u, n in BYTE_UNITS.items()} | {"byte": 1, "bytes": 1}
_NUMBER = re.compile(r"\s*(?P<num>[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+(?:_\d+)*)(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
                     r"\s*(?P<rest>.*?)\s*")


def _unit_words(unit: str) -> tuple[str, ...]:
    return UNIT_WORDS.get(unit, (unit.lower(), unit.lower().rstrip("s")))


def parse_answer(text: str | float | int, unit: str) -> float:
    """Read an answer and return it in ``unit``. Introduced in the Drills part.

    Accepted: a number with optional thousands separators (``7,372,800``) or exponent (``7.4e6``), then
    optionally an SI multiplier (``k``/``K``, ``M``, ``G``, ``B`` = billion, ``T``, or a word such as
    ``million``) and/or a unit. Memory units (``B``, ``KB``…``TB``, ``KiB``…``TiB``, any case) are converted to
    a memory ``unit`` (``parse_answer("1.225 TB", "GB") == 1225``, ``parse_answer("20 GiB", "GB") == 21.47…``);
    for a memory question a bare multiplier means decimal bytes (``"1.2T"`` = 1.2 TB) and ``B`` means bytes.
    Count units take a multiplier and their own words (``"7.37M params"``, ``"775 seqs"``, ``"8 GPUs"``,
    ``"32 %"``).

    Raises:
        MemlibError: if the text is not a finite number with an optional multiplier and unit, or if its unit
            does not fit ``unit`` (``"3 GB"`` for a count of sequences).
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _NUMBER.fullmatch(str(text))
        if not m:
            raise MemlibError(f"cannot read the answer {text!r}; expected a number such as 12.5, 7.4M or "
                              f"'12.5 {unit}'")
        value = float(m.group("num").replace(",", "").replace("_", ""))
        value = _apply_unit(value, m.group("rest"), unit, text)
    if not math.isfinite(value):
        raise MemlibError(f"answer must be a finite number, got {text!r}")
    return value


def _apply_unit(value: float, rest: str, unit: str, text: object) -> float:
    """``value`` followed by ``rest`` (multiplier and/or unit), expressed in ``unit``."""
    memory = unit in BYTE_UNITS
    words = rest.replace("\u00a0", " ").replace("\u202f", " ").split()
    if not words:
        return value
    if len(words) == 1 and not memory and words[0] not in MULTIPLIERS and words[0].lower() not in MULTIPLIERS:
        # "7.37Mparams": split a leading SI letter off a unit word
        w = words[0]
        if w[0] in MULTIPLIERS and w[1:].lower() in _unit_words(unit):
            words = [w[0], w[1:]]
    mult = 1.0
    head = words[0]
    if memory and head.lower() in _BYTE_UNITS_LOWER and len(words) == 1:
        return value * _BYTE_UNITS_LOWER[head.lower()] / BYTE_UNITS[unit]
    if head in MULTIPLIERS or head.lower() in MULTIPLIERS:
        mult = MULTIPLIERS.get(head, MULTIPLIERS.get(head.lower(), 1.0))
        words = words[1:]
        if unit == "%":
            raise MemlibError(f"a multiplier ({head!r}) makes no sense for an answer in %; got {text!r}")
        if memory:  # "1.2G" for a question in GB: decimal bytes
            if words:
                raise MemlibError(f"cannot read the unit of {text!r}; expected one of: "
                                  + ", ".join(BYTE_UNITS))
            return value * mult / BYTE_UNITS[unit]
    if not words:
        return value * mult
    if len(words) > 1:
        raise MemlibError(f"cannot read the unit of {text!r}; expected at most a multiplier and a unit")
    given = words[0]
    if memory:
        raise MemlibError(f"unit {given!r} does not match the drill's unit {unit!r}; expected one of: "
                          + ", ".join(BYTE_UNITS))
    if given.lower() in _unit_words(unit):
        return value * mult
    if given.lower() in _BYTE_UNITS_LOWER:
        raise MemlibError(f"unit {given!r} is memory; the drill asks for {unit}")
    raise MemlibError(f"unit {given!r} does not match the drill's unit {unit!r}; expected one of: "
                      + ", ".join(_unit_words(unit)))


def grade(drill: Drill, answer: str | float | int | None) -> bool:
    """True if ``answer`` is within the drill's tolerance of memlib's value. Introduced in the Drills part.

    Args:
        drill: the drill.
        answer: a number in the drill's unit, or text such as ``"21.5"``, ``"20 GiB"``, ``"7.37M"`` or
            ``"775 seqs"`` (see :func:`parse_answer`);
            None or unreadable text counts as wrong.
    """
    if answer is None:
        return False
    try:
        value = parse_answer(answer, drill.unit)
    except MemlibError:
        return False
    return abs(value - drill.answer) <= max(drill.abs_tol, drill.rel_tol * abs(drill.answer))


def drill_markdown(drill: Drill, number: int) -> str:
    """MyST Markdown for one drill: the question and an Answer dropdown with memlib's value and how."""
    return (f"**Drill {number} [{drill.difficulty}] [{drill.kind}].** {drill.question}\n\n"
            f"```{{dropdown}} Answer\n**{drill.answer_text}** (graded {drill.tolerance_text}). "
            f"{drill.explanation}.\n\n*Chapter {drill.chapter} ({CHAPTERS[drill.chapter]}).*\n```\n")


# --------------------------------------------------------------------------------------------------------
# Drill mode
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DrillResult:
    """One asked drill, the answer given and whether it was right."""

    drill: Drill
    given: str | float | int | None
    correct: bool


@dataclass(frozen=True)
class DrillScore:
    """The outcome of a drill session. Introduced in the Drills part."""

    results: tuple[DrillResult, ...]

    @property
    def correct(self) -> int:
        """Number of right answers."""
        return sum(r.correct for r in self.results)

    @property
    def total(self) -> int:
        """Number of drills asked."""
        return len(self.results)

    @property
    def fraction(self) -> float:
        """correct / total (0 for an empty session)."""
        return self.correct / self.total if self.total else 0.0

    def by_kind(self) -> dict[str, tuple[int, int]]:
        """kind → (correct, asked)."""
        out: dict[str, tuple[int, int]] = {}
        for r in self.results:
            c, t = out.get(r.drill.kind, (0, 0))
            out[r.drill.kind] = (c + r.correct, t + 1)
        return dict(sorted(out.items()))


def make_drills(n: int, seed: int = 0, kinds: Iterable[str] | None = None) -> list[Drill]:
    """N random drills, deterministic for a given seed. Introduced in the Drills part.

    Args:
        n: how many drills.
        seed: seeds ``random.Random``; each drill gets its own seed drawn from it.
        kinds: restrict to these kinds (default: all registered kinds).
    """
    n = check_positive("n", n)
    names = sorted(DRILL_KINDS) if kinds is None else list(kinds)
    if not names:
        raise MemlibError("kinds is empty; expected one or more of: " + ", ".join(sorted(DRILL_KINDS)))
    for k in names:
        check_choice("drill kind", k, DRILL_KINDS)
    rng = random.Random(seed)
    return [generate(rng.choice(names), rng.randrange(2**31)) for _ in range(n)]


def score(drills: Sequence[Drill], answers: Sequence[str | float | int | None]) -> DrillScore:
    """Grade ``answers`` against ``drills`` (same length). Introduced in the Drills part."""
    if len(drills) != len(answers):
        raise MemlibError(f"got {len(answers)} answers for {len(drills)} drills")
    return DrillScore(tuple(DrillResult(d, a, grade(d, a)) for d, a in zip(drills, answers)))


def drill_mode(n: int, answer: Callable[[Drill], str | float | int | None], seed: int = 0,
               kinds: Iterable[str] | None = None) -> DrillScore:
    """Ask N random drills, get each answer from ``answer(drill)``, and return the score.

    Introduced in the Drills part. Deterministic for a given seed and a deterministic ``answer``, so a
    notebook can run it under nbval; interactively, ``answer`` can be ``lambda d: input(d.question + " ")``.
    """
    drills = make_drills(n, seed, kinds)
    return score(drills, [answer(d) for d in drills])

