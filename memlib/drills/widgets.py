"""An ipywidgets flashcard for the numeric drills (Drills part). Only wiring lives here."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypedDict

from .bank import CHAPTERS
from .engine import Drill, grade, make_drills, parse_answer
from ..core.errors import MemlibError

__all__ = ["CardState", "check_card", "reveal_card", "next_card", "flashcard_widget", "TrainerState", "trainer"]


@dataclass(frozen=True)
class CardState:
    """What the flashcard shows after an action. Introduced in the Drills part.

    Attributes:
        drill: the current drill.
        message: the feedback line (HTML-free text).
        correct: True/False after a check, None before one or after a reveal.
    """

    drill: Drill
    message: str
    correct: bool | None


def check_card(drill: Drill, text: str) -> CardState:
    """The Check button's callback: grade ``text`` against memlib's answer (pure; tested without widgets)."""
    if not str(text).strip():
        return CardState(drill, "Type a number first (units optional, e.g. 21.5, 20 GiB, 7.4M or 775 seqs).", None)
    try:
        value = parse_answer(text, drill.unit)
    except MemlibError as err:
        return CardState(drill, f"Cannot read that: {err}", False)
    ok = grade(drill, text)
    if ok:
        return CardState(drill, f"Correct: {value:,.4g} {drill.unit} matches memlib's {drill.answer_text} "
                                f"(tolerance {drill.tolerance_text}).", True)
    side = "high" if value > drill.answer else "low"
    return CardState(drill, f"Not quite: {value:,.4g} {drill.unit} is too {side} (tolerance "
                            f"{drill.tolerance_text}). Try again or reveal.", False)


def reveal_card(drill: Drill) -> CardState:
    """The Reveal button's callback: memlib's answer and how it was computed."""
    return CardState(drill, f"Answer: {drill.answer_text} ({drill.tolerance_text}). {drill.explanation}. "
                            f"Chapter {drill.chapter}: {CHAPTERS[drill.chapter]}.", None)


def next_card(seed: int, kinds: Iterable[str] | None = None) -> CardState:
    """The Next button's callback: the drill for ``seed`` (one random kind among ``kinds``)."""
    drill = make_drills(1, seed, kinds)[0]
    return CardState(drill, "", None)


class _FlashcardState(TypedDict):
    """The flashcard widget's mutable state: the current seed and the card on show."""

    seed: int
    card: CardState


def flashcard_widget(seed: int = 0, kinds: Iterable[str] | None = None) -> Any:
    """A flashcard: the question, an answer box, Check, Reveal and Next buttons.

    Introduced in the Drills part. ``seed`` picks the first card; Next moves to seed + 1, seed + 2, …
    """
    try:
        import ipywidgets as w
    except ImportError:  # pragma: no cover
        raise ImportError("the flashcard needs ipywidgets: pip install ipywidgets") from None
    kinds = None if kinds is None else list(kinds)
    state: _FlashcardState = {"seed": seed, "card": next_card(seed, kinds)}
    question = w.HTML()
    box = w.Text(placeholder="e.g. 21.5, 20 GiB or 7.4M", description="Answer:")
    check, reveal, nxt = w.Button(description="Check"), w.Button(description="Reveal"), w.Button(description="Next")
    feedback = w.HTML()

    def show(card: CardState) -> None:
        state["card"] = card
        d = card.drill
        question.value = (f"<b>[{d.difficulty}] {d.kind}</b> (seed {state['seed']}): {d.question} "
                          f"<i>Answer in {d.unit}.</i>")
        colour = {True: "green", False: "firebrick", None: "black"}[card.correct]
        feedback.value = f"<span style='color:{colour}'>{card.message}</span>"

    def on_check(_: Any) -> None:
        show(check_card(state["card"].drill, box.value))

    def on_reveal(_: Any) -> None:
        show(reveal_card(state["card"].drill))

    def on_next(_: Any) -> None:
        state["seed"] += 1
        box.value = ""
        show(next_card(state["seed"], kinds))

    check.on_click(on_check)
    reveal.on_click(on_reveal)
    nxt.on_click(on_next)
    show(state["card"])
    return w.VBox([question, w.HBox([box, check, reveal, nxt]), feedback])



class TrainerState:
    """The Jupyter trainer's logic without widgets (tested directly): the cards, the one on show, the progress.

    Introduced in the Drills part. Same rules as ``memlib drill`` and the web page (:mod:`memlib.drills.practice`).
    """

    def __init__(self, count: int = 10, seed: int | None = None, topic: str | None = None,
                 frequency: str | None = None, path: Any = None) -> None:
        from .practice import Progress, default_progress_path, select_cards

        self.path = default_progress_path() if path is None else path
        self.progress = Progress.load(self.path)
        self.cards = select_cards(count, seed, topic=topic, frequency=frequency, progress=self.progress)
        self.index = 0
        self.revealed = False

    @property
    def card(self) -> Any:
        """The card on show, or None after the last one."""
        return self.cards[self.index] if self.index < len(self.cards) else None

    def grade(self, grade_name: str) -> int:
        """Grade the card on show (again, hard, good), save the progress, move on; return the card's new box."""
        if self.card is None or not self.revealed:
            raise MemlibError("reveal the answer before grading it")
        box = self.progress.grade(self.card, grade_name)
        self.progress.save(self.path)
        self.index += 1
        self.revealed = False
        return box


def trainer(count: int = 10, seed: int | None = None, topic: str | None = None, frequency: str | None = None,
            lang: str = "both", path: Any = None) -> Any:
    """The interview trainer in Jupyter: question, Reveal, Again / Hard / Good, progress and weakest topics.

    Introduced in the Drills part; progress is the terminal's JSON file (``memlib drill``).
    """
    try:
        import ipywidgets as w
    except ImportError:  # pragma: no cover
        raise ImportError("the trainer needs ipywidgets: pip install ipywidgets") from None
    import html

    st = TrainerState(count, seed, topic, frequency, path)
    question, answer, status = w.HTML(), w.HTML(), w.HTML()
    reveal = w.Button(description="Reveal")
    grades = [w.Button(description=g.capitalize()) for g in ("again", "hard", "good")]

    def bold(text: str) -> str:
        import re

        return re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(text))

    def show() -> None:
        c = st.card
        if c is None:
            question.value, answer.value = "<b>Done.</b>", ""
        else:
            question.value = f"<b>[{c.difficulty}] [{c.topic}]</b> {bold(c.question(lang))}".replace("\n", "<br>")
            answer.value = (f"<p><b>Say first:</b> {bold(c.spoken(lang))}</p><p><b>Deep dive:</b> {bold(c.answer)}</p>"
                            .replace("\n", "<br>") if st.revealed else "")
        weak = ", ".join(t for t, _ in st.progress.weakest_topics())
        status.value = (f"practised {len(st.progress.boxes)} questions; weakest topics: {weak or '—'}; "
                        f"progress file {html.escape(str(st.path))}")
        for b in grades:
            b.disabled = not st.revealed

    def on_reveal(_: Any) -> None:
        st.revealed = st.card is not None
        show()

    def on_grade(b: Any) -> None:
        st.grade(b.description.lower())
        show()

    reveal.on_click(on_reveal)
    for b in grades:
        b.on_click(on_grade)
    show()
    return w.VBox([question, w.HBox([reveal, *grades]), answer, status])
