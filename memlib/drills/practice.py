"""The practice loop that remembers: cards (concept questions and numeric drills), seeded selection, Leitner boxes
kept in a JSON file, weakest topics and a timed mock interview (Drills part).

Pure Python (standard library only). The terminal (``memlib drill``), the Jupyter trainer
(:mod:`memlib.drills.widgets`) and the static web page (``vendor/site/vendor/memlib-quiz.js``, fed by :func:`export_bank`)
share these rules: a card starts in box 1; **again** sends it back to box 1, **hard** keeps it where it is,
**good** moves it up one box (at most :data:`LEITNER_BOXES`); cards in lower boxes come first.
"""
from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import MemlibError, check_choice
from .bank import CHAPTER_PAGES, CHAPTERS, DIFFICULTIES, FREQUENCIES, QUESTIONS, TOPICS
from .concepts import render_answer, render_say
from .engine import DRILL_KINDS, generate

__all__ = [
    "GRADES",
    "LANGS",
    "LEITNER_BOXES",
    "KIND_TOPICS",
    "KIND_FREQUENCY",
    "PROGRESS_ENV",
    "Card",
    "topic_choice",
    "concept_cards",
    "numeric_card",
    "select_cards",
    "Progress",
    "default_progress_path",
    "mock_report",
    "export_bank",
]

GRADES = ("again", "hard", "good")
LANGS = ("en", "zh", "both")
LEITNER_BOXES = 5
#: The environment variable that overrides where the terminal keeps its progress.
PROGRESS_ENV = "MEMLIB_DRILL_PROGRESS"
#: The practice topic of each numeric drill kind.
KIND_TOPICS: dict[str, str] = {
    "model_states": "data parallel & ZeRO", "training_peak": "training memory", "activations": "activations & recompute",
    "kv_cache": "inference & KV cache", "inference_total": "inference & KV cache",
    "zero_min_gpus": "data parallel & ZeRO", "max_batch": "inference & KV cache", "serve_blocks": "serving",
    "serve_users": "serving", "decode_latency": "serving", "attention_matrix": "attention",
    "adam8bit_saving": "optimizers & fine-tuning", "mfu": "profiling & MFU", "effective_batch": "training memory",
    "lora_params": "optimizers & fine-tuning", "offload_host": "offload", "pp_bubble": "parallelism",
    "tp_activations": "parallelism", "pp_first_stage": "parallelism", "dp_degree": "parallelism",
    "train_days": "profiling & MFU", "allreduce_time": "data parallel & ZeRO", "prefill_time": "serving",
    "arith_intensity": "profiling & MFU", "min_gpus_serve": "serving",
}
#: How often interviews ask each kind (the rest: medium).
KIND_FREQUENCY: dict[str, str] = {k: "high" for k in (
    "model_states", "training_peak", "kv_cache", "mfu", "decode_latency", "train_days", "allreduce_time",
    "arith_intensity", "min_gpus_serve", "pp_bubble")}


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def topic_choice(name: str) -> str:
    """The topic of :data:`memlib.drills.TOPICS` that ``name`` means: its exact name in any case, or its slug
    (``"oom-allocator"`` for ``"OOM & allocator"``).

    Raises:
        MemlibError: for anything else, listing the valid topics.
    """
    for t in TOPICS:
        if name.strip().lower() == t.lower() or _slug(name) == _slug(t):
            return t
    raise MemlibError(f"unknown topic {name!r}; expected one of: " + ", ".join(TOPICS))


@dataclass(frozen=True)
class Card:
    """One thing to practise: a concept question of the bank or a numeric drill. Introduced in the Drills part.

    Attributes:
        id: the question's id, or ``"num:<kind>:<seed>"`` for a numeric drill.
        kind: ``"concept"`` or ``"numeric"``.
        topic, frequency, difficulty, chapter: as in :class:`memlib.drills.Question`.
        text, text_zh: the question (a numeric drill has no Chinese wording: ``text_zh`` is "").
        say, say_zh: the spoken answer (numeric: memlib's value with its unit).
        answer: the deep dive (numeric: how memlib computed the value).
        hint: the formula, shown on demand (numeric drills only).
        value, unit, tolerance: memlib's value, its unit and the tolerance in words (numeric drills only).
    """

    id: str
    kind: str
    topic: str
    frequency: str
    difficulty: str
    chapter: int
    text: str
    text_zh: str
    say: str
    say_zh: str
    answer: str
    hint: str = ""
    value: float | None = None
    unit: str = ""
    tolerance: str = ""
    rel_tol: float = 0.0
    abs_tol: float = 0.0

    def question(self, lang: str = "en") -> str:
        """The question in ``lang`` (``"en"``, ``"zh"`` or ``"both"``; English where there is no Chinese)."""
        check_choice("lang", lang, LANGS)
        zh = self.text_zh or self.text
        return {"en": self.text, "zh": zh, "both": self.text + (f"\n{self.text_zh}" if self.text_zh else "")}[lang]

    def spoken(self, lang: str = "en") -> str:
        """The spoken answer in ``lang``."""
        check_choice("lang", lang, LANGS)
        return {"en": self.say, "zh": self.say_zh, "both": f"{self.say}\n{self.say_zh}"}[lang]


def concept_cards() -> list[Card]:
    """Every question of the bank as a card, numbers filled in, in bank order."""
    return [Card(q.id, "concept", q.topic, q.frequency, q.difficulty, q.chapter, q.text, q.text_zh, render_say(q),
                 render_say(q, "zh"), render_answer(q)) for q in QUESTIONS]


def numeric_card(kind: str, seed: int) -> Card:
    """The numeric drill ``kind`` of ``seed`` as a card, graded by memlib (:func:`memlib.drills.grade`)."""
    d = generate(kind, seed)
    said = f"**{d.answer_text}** (graded {d.tolerance_text})"
    return Card(f"num:{kind}:{seed}", "numeric", KIND_TOPICS[kind], KIND_FREQUENCY.get(kind, "medium"),
                d.difficulty, d.chapter, d.question, "", said, f"**{d.answer_text}**（允许误差 {d.tolerance_text}）",
                d.explanation, d.hint or DRILL_KINDS[kind].description, d.answer, d.unit, d.tolerance_text,
                d.rel_tol, d.abs_tol)


def select_cards(count: int, seed: int | None = None, *, topic: str | None = None, frequency: str | None = None,
                 difficulty: str | None = None, progress: Progress | None = None,
                 numeric: bool = True) -> list[Card]:
    """``count`` cards matching the filters: concept questions and numeric drills (one per kind), shuffled.

    Deterministic for a given ``seed`` (the progress is then ignored, so the same seed always gives the same
    cards). Without a seed the shuffle is fresh and, given ``progress``, cards in lower Leitner boxes come first.

    Raises:
        MemlibError: for an unknown topic, frequency or difficulty, or when no card matches.
    """
    if count < 1:
        raise MemlibError(f"count must be a positive integer, got {count!r}")
    topic = None if topic is None else topic_choice(topic)
    if frequency is not None:
        check_choice("frequency", frequency, FREQUENCIES)
    if difficulty is not None:
        check_choice("difficulty", difficulty, DIFFICULTIES)
    rng = random.Random(seed)
    pool: list[Card] = concept_cards()
    if numeric:
        pool += [numeric_card(k, rng.randrange(2**31)) for k in DRILL_KINDS]
    pool = [c for c in pool if (topic is None or c.topic == topic) and (frequency is None or c.frequency == frequency)
            and (difficulty is None or c.difficulty == difficulty)]
    if not pool:
        raise MemlibError("no question matches these filters; widen --topic, --frequency or --difficulty")
    rng.shuffle(pool)
    if seed is None and progress is not None:
        pool.sort(key=lambda c: progress.box(c.id))
    return pool[:count]


@dataclass
class Progress:
    """Leitner boxes and the grades given, kept as JSON. Introduced in the Drills part.

    Attributes:
        boxes: card id → box (1…:data:`LEITNER_BOXES`); an unseen card is in box 1.
        history: the grades given, oldest first: ``{"id", "topic", "grade"}`` each.
    """

    boxes: dict[str, int] = field(default_factory=dict)
    history: list[dict[str, str]] = field(default_factory=list)

    def box(self, card_id: str) -> int:
        """The card's box (1 if never graded)."""
        return self.boxes.get(card_id, 1)

    def grade(self, card: Card, grade: str) -> int:
        """Record ``grade`` (again, hard or good) for ``card``; return its new box."""
        check_choice("grade", grade, GRADES)
        box = self.box(card.id)
        new = 1 if grade == "again" else box if grade == "hard" else min(box + 1, LEITNER_BOXES)
        self.boxes[card.id] = new
        self.history.append({"id": card.id, "topic": card.topic, "grade": grade})
        return new

    def by_topic(self) -> dict[str, dict[str, int]]:
        """Topic → counts of ``again``, ``hard`` and ``good`` grades."""
        out: dict[str, dict[str, int]] = {}
        for h in self.history:
            row = out.setdefault(h["topic"], dict.fromkeys(GRADES, 0))
            row[h["grade"]] += 1
        return out

    def weakest_topics(self, n: int = 3) -> list[tuple[str, float]]:
        """The ``n`` practised topics with the lowest share of ``good`` grades, as (topic, share)."""
        rows = [(t, g["good"] / sum(g.values())) for t, g in self.by_topic().items()]
        return sorted(rows, key=lambda r: (r[1], r[0]))[:n]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object saved to disk."""
        return {"version": 1, "boxes": dict(sorted(self.boxes.items())), "history": self.history}

    @classmethod
    def load(cls, path: str | Path) -> Progress:
        """The progress saved at ``path`` (empty if the file does not exist).

        Raises:
            MemlibError: if the file is not a progress file.
        """
        p = Path(path)
        if not p.exists():
            return cls()
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
            boxes = {str(k): int(v) for k, v in data["boxes"].items()}
            history = [{"id": str(h["id"]), "topic": str(h["topic"]), "grade": str(h["grade"])}
                       for h in data["history"]]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise MemlibError(f"{p} is not a drill progress file; delete it or pass another --progress") from None
        return cls(boxes, history)

    def save(self, path: str | Path) -> Path:
        """Write the progress to ``path`` (its folder is created); return the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return p


def default_progress_path() -> Path:
    """Where the terminal keeps progress: ``$MEMLIB_DRILL_PROGRESS`` or ``~/.memlib/drill_progress.json``."""
    env = os.environ.get(PROGRESS_ENV)
    return Path(env).expanduser() if env else Path.home() / ".memlib" / "drill_progress.json"


def mock_report(cards: Iterable[Card], grades: Iterable[str], overtime: Iterable[bool]) -> dict[str, Any]:
    """The end-of-interview report: per topic, questions asked, graded good, and answered over time."""
    topics: dict[str, dict[str, int]] = {}
    for c, g, late in zip(cards, grades, overtime):
        row = topics.setdefault(c.topic, {"asked": 0, "good": 0, "over_time": 0})
        row["asked"] += 1
        row["good"] += g == "good"
        row["over_time"] += bool(late)
    asked = sum(r["asked"] for r in topics.values())
    good = sum(r["good"] for r in topics.values())
    return {"asked": asked, "good": good, "topics": dict(sorted(topics.items()))}


def export_bank(numeric_seeds: int = 12) -> dict[str, Any]:
    """Everything the static practice page needs, as JSON-ready data: the topics (English and Chinese), every
    concept card and ``numeric_seeds`` drills of each numeric kind, values and tolerances computed by memlib.

    Introduced in the Drills part (written to ``_static/memlib-quiz-bank.json`` at build time).
    """
    cards = concept_cards() + [numeric_card(k, s) for k in DRILL_KINDS for s in range(numeric_seeds)]
    out = []
    for c in cards:
        row = asdict(c)
        row["page"] = CHAPTER_PAGES[c.chapter]
        row["chapter_title"] = CHAPTERS[c.chapter]
        out.append(row)
    return {"topics": TOPICS, "frequencies": list(FREQUENCIES), "difficulties": list(DIFFICULTIES),
            "grades": list(GRADES), "boxes": LEITNER_BOXES, "cards": out}
