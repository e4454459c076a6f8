"""The concept drills: the bank's questions filtered, looked up and rendered as MyST with numbered questions.

Pure Python (Drills part). :func:`question_markdown` writes "Question N [difficulty] [topic]" with the answer
in a dropdown and a link to the chapter that proves it; :func:`chapter_markdown` numbers a chapter's questions.
"""
from __future__ import annotations

import re

from ..core.errors import MemlibError, check_choice
from .answers import answer_numbers
from .bank import CHAPTER_PAGES, CHAPTERS, DIFFICULTIES, FREQUENCIES, QUESTIONS, SOURCES, TOPICS, Question

__all__ = ["render_answer", "render_say", "say_words", "questions", "find_question", "question_markdown",
           "chapter_markdown"]

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def render_answer(q: Question) -> str:
    """The model answer with its ``{{name}}`` placeholders replaced by memlib's numbers.

    Raises:
        MemlibError: if a placeholder has no number.
    """
    return _fill(q.answer, q)


def render_say(q: Question, lang: str = "en") -> str:
    """The spoken answer (``"en"``: :attr:`Question.say`, ``"zh"``: :attr:`Question.say_zh`), numbers filled in.

    Raises:
        MemlibError: for another ``lang`` or a placeholder without a number.
    """
    check_choice("lang", lang, ("en", "zh"))
    return _fill(q.say if lang == "en" else q.say_zh, q)


def say_words(q: Question) -> int:
    """Words of the English spoken answer as said (numbers filled in, Markdown bold marks dropped)."""
    return len(render_say(q).replace("**", "").split())


def _fill(text: str, q: Question) -> str:
    numbers = answer_numbers()

    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in numbers:
            raise MemlibError(f"unknown number {key!r} in the answer to {q.id}")
        return numbers[key].value

    return _PLACEHOLDER.sub(sub, text)


def questions(chapter: int | None = None, source: str | None = None, difficulty: str | None = None,
              topic: str | None = None, frequency: str | None = None) -> list[Question]:
    """Questions of the bank, filtered by chapter, source, difficulty, topic and/or frequency, in bank order."""
    if topic is not None:
        check_choice("topic", topic, TOPICS)
    if frequency is not None:
        check_choice("frequency", frequency, FREQUENCIES)
    if chapter is not None:
        check_choice("chapter", chapter, CHAPTERS)
    if source is not None:
        check_choice("source", source, SOURCES)
    if difficulty is not None:
        check_choice("difficulty", difficulty, DIFFICULTIES)
    return [q for q in QUESTIONS if (chapter is None or q.chapter == chapter)
            and (source is None or q.source == source) and (difficulty is None or q.difficulty == difficulty)
            and (topic is None or q.topic == topic) and (frequency is None or q.frequency == frequency)]


def _norm(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()


def find_question(text: str) -> Question | None:
    """The first question whose Chinese or English wording contains ``text`` (whitespace ignored)."""
    key = _norm(text)
    for q in QUESTIONS:
        if key and (key in _norm(q.text_zh) or key in _norm(q.text)):
            return q
    return None


def question_markdown(q: Question, number: int, page_prefix: str = "../chapters/") -> str:
    """MyST Markdown for one question: the question in English and Chinese, and an Answer dropdown holding the
    spoken answer (both languages), the deep dive and the link to the chapter that demonstrates it.

    Args:
        q: the question.
        number: its number on the page.
        page_prefix: the path from the page to the chapters (``""`` on a chapter page itself).
    """
    origin = f" ({q.source})" if q.source != "book" else ""
    head = f"**Question {number} [{q.difficulty}] [{q.topic}].**{origin} {q.text} ({q.text_zh})"
    proof = (f"*Proved in {{doc}}`Chapter {q.chapter} <{page_prefix}{CHAPTER_PAGES[q.chapter]}>` "
             f"({CHAPTERS[q.chapter]}).*")
    return (f"{head}\n\n```{{dropdown}} Answer\n**Say first:** {render_say(q)}\n\n**先说：** {render_say(q, 'zh')}"
            f"\n\n**Deep dive:** {render_answer(q)}\n\n{proof}\n```\n")


def chapter_markdown(chapter: int, start: int = 1, page_prefix: str = "../chapters/") -> str:
    """MyST Markdown for all of a chapter's questions, numbered from ``start``; a chapter's own "Interview
    questions" section renders it with ``page_prefix=""`` (one bank, no second copy)."""
    return "\n".join(question_markdown(q, start + i, page_prefix) for i, q in enumerate(questions(chapter=chapter)))
