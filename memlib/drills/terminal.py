"""``memlib drill`` in a terminal: ask cards, reveal the spoken answer and the deep dive, self-grade, remember
(Drills part).

The session's input, output and clock are arguments, so a test drives it with a list of answers and a fake clock.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import MemlibError
from .engine import parse_answer
from .practice import GRADES, Card, Progress, mock_report

__all__ = ["DEFAULT_MOCK_SECONDS", "plain", "card_dict", "drill_session"]

#: Seconds per question in a mock interview.
DEFAULT_MOCK_SECONDS = 120
_GRADE_KEYS = {"a": "again", "again": "again", "h": "hard", "hard": "hard", "g": "good", "good": "good", "": "good"}


def plain(text: str) -> str:
    """Markdown bold and code marks dropped, for a terminal."""
    return re.sub(r"\*\*(.+?)\*\*", r"\1", text).replace("`", "")


def card_dict(card: Card, lang: str) -> dict[str, Any]:
    """One card as the JSON ``memlib drill --json`` prints."""
    out: dict[str, Any] = {"id": card.id, "kind": card.kind, "topic": card.topic, "frequency": card.frequency,
                           "difficulty": card.difficulty, "chapter": card.chapter, "question": card.question(lang),
                           "say": card.spoken(lang), "deep_dive": card.answer}
    if card.kind == "numeric":
        out.update(value=card.value, unit=card.unit, tolerance=card.tolerance, hint=card.hint)
    return out


def _ask_grade(ask: Callable[[str], str], say: Callable[[str], None]) -> str:
    while True:
        key = ask("grade: [a]gain, [h]ard, [g]ood (Enter = good) > ").strip().lower()
        if key in _GRADE_KEYS:
            return _GRADE_KEYS[key]
        say(f"expected one of: {', '.join(GRADES)}")


def _numeric_try(card: Card, ask: Callable[[str], str], say: Callable[[str], None]) -> str | None:
    """Ask for a number (``?`` shows the hint); return "good" or "again" if one was given, None to self-grade."""
    while True:
        given = ask(f"your answer in {card.unit} (? for a hint, Enter to reveal) > ").strip()
        if given == "?":
            say(f"hint: {card.hint or 'no hint for this kind'}")
            continue
        if not given:
            return None
        try:
            value = parse_answer(given, card.unit)
        except MemlibError as err:
            say(str(err))
            continue
        ok = card.value is not None and abs(value - card.value) <= max(card.abs_tol, card.rel_tol * abs(card.value))
        say("right" if ok else "not within the tolerance")
        return "good" if ok else "again"


def drill_session(cards: Sequence[Card], *, lang: str, progress: Progress, path: Path,
                  ask: Callable[[str], str], say: Callable[[str], None], mock_seconds: int | None = None,
                  clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Ask each card, reveal, take a grade, move the card between Leitner boxes and save after each grade.

    Args:
        cards: the cards, in order.
        lang: ``"en"``, ``"zh"`` or ``"both"``.
        progress: the Leitner boxes, updated in place and saved to ``path``.
        path: the progress file.
        ask: reads one line given a prompt (``input``); EOFError ends the session early.
        say: prints one block of text.
        mock_seconds: a mock interview: seconds allowed per question, a report by topic at the end.
        clock: seconds, for the mock interview's timing.

    Returns:
        ``{"progress_file", "asked", "grades", "weakest_topics"}`` plus ``"mock"`` (:func:`mock_report`) in a mock.
    """
    grades: list[str] = []
    late: list[bool] = []
    asked: list[Card] = []
    for i, card in enumerate(cards, 1):
        limit = f" — {mock_seconds} s" if mock_seconds else ""
        say(f"\nQ{i}/{len(cards)} [{card.topic}] [{card.difficulty}]{limit}\n{plain(card.question(lang))}")
        start = clock()
        try:
            auto = _numeric_try(card, ask, say) if card.kind == "numeric" else None
            if auto is None and card.kind == "concept":
                ask("(Enter to reveal) > ")
            say(f"say: {plain(card.spoken(lang))}\ndeep dive: {plain(card.answer)}")
            grade = auto or _ask_grade(ask, say)
        except EOFError:
            break
        elapsed = clock() - start
        late.append(bool(mock_seconds) and elapsed > (mock_seconds or 0))
        box = progress.grade(card, grade)
        progress.save(path)
        grades.append(grade)
        asked.append(card)
        say(f"{grade}: box {box}" + (f" (over time: {elapsed:.0f} s)" if late[-1] else ""))
    out: dict[str, Any] = {"progress_file": str(path), "asked": len(asked), "grades": grades,
                           "weakest_topics": [t for t, _ in progress.weakest_topics()]}
    if mock_seconds:
        out["mock"] = mock_report(asked, grades, late)
    return out
