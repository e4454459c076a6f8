"""Interview drills: the question bank, randomized numeric drills graded by memlib, and a drill mode (Drills).

Pure Python on top of the estimators (no torch, no ipywidgets): imports :mod:`memlib.core` and :mod:`memlib.viz`,
never :mod:`memlib.measure`. Dependency direction inside (``tests/test_import_cycles.py``): ``bank`` → ``engine`` →
``numeric``, ``widgets`` → ``answers`` → ``concepts``. The package:

* :mod:`~memlib.drills.bank` — the chapters and the question bank, :data:`QUESTIONS`: every interview question
  of the two source notes, the Tips notes (显存优化技巧) and the Strategies notes (常用的显存优化策略) (quoted in
  the original Chinese with an English translation) plus the book's own, each with a difficulty tag (E/M/H), a
  model answer and the chapter that proves it. The questions are data, ``bank.json``, validated on load.
* :mod:`~memlib.drills.answers` — the numbers the model answers quote (``{{name}}`` placeholders), computed by
  :func:`answer_numbers` with memlib, never by hand.
* :mod:`~memlib.drills.concepts` — the concept drills: questions filtered, looked up and rendered as MyST.
* :mod:`~memlib.drills.engine` — numeric drills: :func:`generate` builds one drill of a registered kind from a
  seed with ``random.Random(seed)``; :func:`grade` checks an answer against memlib's value within the drill's
  tolerance; :func:`make_drills` and :func:`drill_mode` ask N random drills and return a score, deterministic
  for a given seed. New kinds are one decorated function (see :func:`drill_kind`).
* :mod:`~memlib.drills.numeric` — the registered kinds, each answered by a memlib function.
* :mod:`~memlib.drills.widgets` — the ipywidgets flashcard and the Jupyter trainer (ipywidgets imported only when
  one is built).
* :mod:`~memlib.drills.practice` — the practice loop that remembers: cards, seeded selection, Leitner boxes in a
  JSON file, weakest topics, the mock interview's report, and the bank exported for the static practice page.
* :mod:`~memlib.drills.terminal` — ``memlib drill``'s session (input, output and clock injected).
* :mod:`~memlib.drills.printables` — the question-only sheet and the numbers-to-know table.
"""
from __future__ import annotations

from . import engine as _engine
from . import numeric as _numeric  # noqa: F401  (registers the drill kinds, in the order of DRILL_KINDS)
from .answers import Number, answer_numbers
from .bank import (CHAPTER_PAGES, CHAPTERS, DIFFICULTIES, FREQUENCIES, QUESTIONS, SEED_QUESTIONS_ZH, SOURCES, TOPICS,
                   Question)
from .concepts import chapter_markdown, find_question, question_markdown, questions, render_answer, render_say, say_words
from .engine import (
    BYTE_UNITS,
    DRILL_KINDS,
    MULTIPLIERS,
    UNIT_WORDS,
    Drill,
    DrillKind,
    DrillResult,
    DrillScore,
    drill_kind,
    drill_markdown,
    drill_mode,
    generate,
    grade,
    make_drills,
    parse_answer,
    score,
)
from .numeric import KORTHIKANTI_RULE, korthikanti_bytes

__all__ = [
    "CHAPTERS",
    "CHAPTER_PAGES",
    "DIFFICULTIES",
    "SOURCES",
    "TOPICS",
    "FREQUENCIES",
    "Question",
    "Number",
    "QUESTIONS",
    "SEED_QUESTIONS_ZH",
    "answer_numbers",
    "render_answer",
    "render_say",
    "say_words",
    "questions",
    "find_question",
    "question_markdown",
    "chapter_markdown",
    *_engine.__all__,  # the numeric drills' engine, re-exported whole
    "KORTHIKANTI_RULE",
    "korthikanti_bytes",
]
