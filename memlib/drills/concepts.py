"""The concept drills: the bank's questions filtered, looked up and rendered as MyST with numbered questions.

Pure Python (Drills part). :func:`question_markdown` writes "Question N [difficulty] [topic]" with the answer
in a dropdown and a link to the chapter that proves it; :func:`chapter_markdown` numbers a chapter's questions.
"""
from __future__ import annotations

import re

from ..core.errors import MemlibError, check_choice
from .answers import answer_numbers
from .bank import CHAPTER_PAGES, CHAPTERS, DIFFICULTIES, QUESTIONS, SOURCES, Question

__all__ = ["render_answer", "questions", "find_question", "question_markdown", "chapter_markdown"]

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def render_answer(q: Question) -> str:
    """The model answer with its ``{{name}}`` placeholders replaced by memlib's numbers.

    Raises:
        MemlibError: if a placeholder has no number.
    """
    numbers = answer_numbers()

    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in numbers:
            raise MemlibError(f"unknown number {key!r} in the answer to {q.id}")
        return numbers[key].value

    return _PLACEHOLDER.sub(sub, q.answer)


def questions(chapter: int | None = None, source: str | None = None,
              difficulty: str | None = None) -> list[Question]:
    """Questions of the bank, filtered by chapter, source and/or difficulty, in bank order."""
    if chapter is not None:
        check_choice("chapter", chapter, CHAPTERS)
    if source is not None:
        check_choice("source", source, SOURCES)
    if difficulty is not None:
        check_choice("difficulty", difficulty, DIFFICULTIES)
    return [q for q in QUESTIONS if (chapter is None or q.chapter == chapter)
            and (source is None or q.source == source) and (difficulty is None or q.difficulty == difficulty)]


def _norm(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()


def find_question(text: str) -> Question | None:
    """The first question whose Chinese or English wording contains ``text`` (whitespace ignored)."""
    key = _norm(text)
    for q in QUESTIONS:
        if key and (key in _norm(q.text_zh) or key in _norm(q.text)):
            return q
    return None


def question_markdown(q: Question, number: int) -> str:
    """MyST Markdown for one question: the question, the Chinese original if any, and an Answer dropdown."""
    origin = f" ({q.source})" if q.source != "book" else ""
    head = f"**Question {number} [{q.difficulty}] [{q.topic}].**{origin} "
    if q.text_zh:
        head += f"{q.text_zh} — *{q.text}*"
    else:
        head += q.text
    proof = f"*Proved in {{doc}}`Chapter {q.chapter} <../chapters/{CHAPTER_PAGES[q.chapter]}>` ({CHAPTERS[q.chapter]}).*"
    return f"{head}\n\n```{{dropdown}} Answer\n{render_answer(q)}\n\n{proof}\n```\n"


def chapter_markdown(chapter: int, start: int = 1) -> str:
    """MyST Markdown for all of a chapter's questions, numbered from ``start``."""
    return "\n".join(question_markdown(q, start + i) for i, q in enumerate(questions(chapter=chapter)))
