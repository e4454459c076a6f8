"""The question bank: chapters, the typed Question record, and ``bank.json`` loaded and validated (Drills part).

Pure Python (standard library only, so it also runs in the reader's browser). The questions themselves are data,
``memlib/drills/bank.json``, read with :mod:`importlib.resources` (so it works from a wheel, a zip or the
browser's file system) and checked once on import: unknown or missing keys, wrong types, duplicate ids and
invalid chapters, difficulties or sources raise :class:`~memlib.core.errors.MemlibError` naming the entry.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from ..core.errors import MemlibError, check_choice

__all__ = [
    "CHAPTERS",
    "CHAPTER_PAGES",
    "DIFFICULTIES",
    "SOURCES",
    "TOPICS",
    "FREQUENCIES",
    "SAY_MAX_WORDS",
    "BANK_FILE",
    "Question",
    "parse_bank",
    "load_bank",
    "QUESTIONS",
    "SEED_QUESTIONS_ZH",
]

#: The book's chapters, as planned (numbers used in "proved in Chapter N").
CHAPTERS: dict[int, str] = {
    1: "Where the memory goes",
    2: "Number formats",
    3: "Mixed precision",
    4: "Activations and checkpointing",
    5: "Gradient accumulation and DDP no_sync",
    6: "ZeRO and FSDP",
    7: "Offloading",
    8: "8-bit optimizers",
    9: "LoRA, QLoRA and paged optimizers",
    10: "FlashAttention",
    11: "Inference memory and quantization",
    12: "Profiling and MFU",
    13: "Putting it together",
    14: "Serving memory",
    15: "Tensor, pipeline, context and expert parallelism",
    16: "Out of memory",
    17: "Kernels and compilers: FP8, torch.compile, fused losses",
    18: "Post-training memory",
}
#: Each chapter's page in the book (chapters/<stem>.ipynb), for the "Proved in Chapter N" links.
CHAPTER_PAGES: dict[int, str] = {
    1: "01_where_memory_goes", 2: "02_number_formats", 3: "03_mixed_precision", 4: "04_activations_checkpointing",
    5: "05_gradient_accumulation", 6: "06_zero_fsdp", 7: "07_offloading", 8: "08_8bit_optimizers",
    9: "09_lora_qlora", 10: "10_flash_attention", 11: "11_inference_memory", 12: "12_profiling",
    13: "13_putting_it_together", 14: "14_serving_memory", 15: "15_parallelism", 16: "16_out_of_memory",
    17: "17_kernels_and_compilers",
    18: "18_post_training",
}
DIFFICULTIES = ("E", "M", "H")
SOURCES = ("Tips notes, top", "Tips notes §八", "Strategies notes", "book")
#: The practice topics (at most 15), English name → Chinese name; every question has one.
TOPICS: dict[str, str] = {
    "training memory": "训练显存", "precision": "数值精度", "activations & recompute": "激活与重算",
    "data parallel & ZeRO": "数据并行与 ZeRO", "offload": "卸载", "optimizers & fine-tuning": "优化器与微调",
    "attention": "注意力", "parallelism": "模型并行", "MoE": "MoE", "inference & KV cache": "推理与 KV cache",
    "serving": "推理服务", "quantization": "量化", "profiling & MFU": "性能分析与 MFU",
    "OOM & allocator": "OOM 与分配器", "post-training": "后训练",
}
#: How often 2025–2026 interviews ask a question.
FREQUENCIES = ("high", "medium", "low")
#: The most words a spoken answer (``say``) may have.
SAY_MAX_WORDS = 40


@dataclass(frozen=True)
class Question:
    """One interview question with its model answer. Introduced in the Drills part.

    Attributes:
        id: stable identifier (``"s000-top-1"`` for the Tips notes' questions, ``"s004-1"`` for the
            Strategies notes', ``"b06-2"`` for the book's).
        chapter: the chapter that proves the answer (see :data:`CHAPTERS`).
        difficulty: ``"E"`` (easy), ``"M"`` (medium) or ``"H"`` (hard).
        topic: one of :data:`TOPICS` (``"data parallel & ZeRO"``).
        text: the question in English (a translation for the source notes' questions).
        answer: the model answer in MyST Markdown; ``{{name}}`` placeholders are numbers from
            :func:`memlib.drills.answers.answer_numbers`.
        source: ``"Tips notes, top"``, ``"Tips notes §八"``, ``"Strategies notes"`` or ``"book"``.
        text_zh: the question in Chinese (the source notes' original wording for theirs).
        key: a term the chapter's page contains (``"ZeRO"``); a test checks the "Proved in" link with it.
        frequency: ``"high"``, ``"medium"`` or ``"low"`` (:data:`FREQUENCIES`).
        say: the spoken answer a candidate gives first (at most :data:`SAY_MAX_WORDS` words, the key number in
            bold); ``answer`` is the deep dive that follows.
        say_zh: the spoken answer in Chinese.
    """

    id: str
    chapter: int
    difficulty: str
    topic: str
    text: str
    answer: str
    source: str = "book"
    text_zh: str = ""
    key: str = ""
    frequency: str = "medium"
    say: str = ""
    say_zh: str = ""

    def __post_init__(self) -> None:
        check_choice("topic", self.topic, TOPICS)
        check_choice("frequency", self.frequency, FREQUENCIES)
        check_choice("difficulty", self.difficulty, DIFFICULTIES)
        check_choice("source", self.source, SOURCES)
        check_choice("chapter", self.chapter, CHAPTERS)


#: The bank's file name inside the ``memlib.drills`` package.
BANK_FILE = "bank.json"
_REQUIRED = {"id": str, "chapter": int, "difficulty": str, "topic": str, "key": str, "frequency": str, "text": str,
             "text_zh": str, "say": str, "say_zh": str, "answer": list}
_OPTIONAL = {"source": str}
_TOP_KEYS = ("about", "questions")


def _entry(raw: Any, index: int, origin: str) -> Question:
    """One validated :class:`Question` from the ``index``-th entry of ``origin``'s ``questions`` list."""
    name = f"{origin} question {index}" + (f" ({raw['id']!r})" if isinstance(raw, dict) and "id" in raw else "")
    if not isinstance(raw, dict):
        raise MemlibError(f"{name}: expected an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise MemlibError(f"{name}: unknown key {unknown[0]!r}; expected one of: "
                          + ", ".join([*_REQUIRED, *_OPTIONAL]))
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise MemlibError(f"{name}: missing key {missing[0]!r}; required: " + ", ".join(_REQUIRED))
    for key, kind in {**_REQUIRED, **_OPTIONAL}.items():
        value = raw.get(key)
        if key in raw and (not isinstance(value, kind) or isinstance(value, bool)):
            raise MemlibError(f"{name}: {key} must be {kind.__name__}, got {value!r}")
    lines = raw["answer"]
    if not lines or not all(isinstance(line, str) for line in lines):
        raise MemlibError(f"{name}: answer must be a non-empty list of strings (lines joined with spaces)")
    answer = " ".join(" ".join(lines).split())
    text, say = " ".join(raw["text"].split()), " ".join(raw["say"].split())
    if not raw["id"].strip() or not text or not answer:
        raise MemlibError(f"{name}: id, text and answer must not be empty")
    if not all(raw[k].strip() for k in ("key", "text_zh", "say", "say_zh")):
        raise MemlibError(f"{name}: key, text_zh, say and say_zh must not be empty")
    try:
        return Question(raw["id"], raw["chapter"], raw["difficulty"], raw["topic"], text, answer,
                        raw.get("source", "book"), raw["text_zh"].strip(), raw["key"].strip(), raw["frequency"],
                        say, raw["say_zh"].strip())
    except MemlibError as err:
        raise MemlibError(f"{name}: {err}") from None


def parse_bank(data: Any, origin: str = BANK_FILE) -> tuple[Question, ...]:
    """Validate a decoded question bank and return its questions in file order. Introduced in the Drills part.

    Args:
        data: the decoded JSON: an object with ``questions`` (a list of question objects) and optionally
            ``about`` (a description, ignored).
        origin: the file name used in error messages.

    Returns:
        The questions, in the order of the file.

    Raises:
        MemlibError: naming the entry, for an unknown or missing key, a value of the wrong type, an invalid
            chapter, difficulty or source, or a duplicate id.
    """
    if not isinstance(data, dict):
        raise MemlibError(f"{origin}: expected a JSON object with 'questions', got {type(data).__name__}")
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        raise MemlibError(f"{origin}: unknown key {unknown[0]!r}; expected one of: " + ", ".join(_TOP_KEYS))
    if not isinstance(data.get("questions"), list):
        raise MemlibError(f"{origin}: 'questions' must be a list of question objects")
    out: list[Question] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(data["questions"]):
        q = _entry(raw, i, origin)
        if q.id in seen:
            raise MemlibError(f"{origin} question {i} ({q.id!r}): duplicate id, first used by question {seen[q.id]}")
        seen[q.id] = i
        out.append(q)
    return tuple(out)


@lru_cache(maxsize=1)
def load_bank() -> tuple[Question, ...]:
    """The book's question bank, read from the package's ``bank.json`` and validated (:func:`parse_bank`).

    Introduced in the Drills part.

    Raises:
        MemlibError: if the file is not valid JSON or an entry is invalid (the message names it).
    """
    text = resources.files("memlib.drills").joinpath(BANK_FILE).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise MemlibError(f"{BANK_FILE} is not valid JSON: {err}") from None
    return parse_bank(data)


#: Every interview question of the two source notes (the Tips notes, 显存优化技巧, and the Strategies notes,
#: 常用的显存优化策略), quoted in the original Chinese with an English translation, plus the book's own, each with
#: a difficulty tag, a model answer and the chapter that proves it. Loaded from ``bank.json``.
QUESTIONS: tuple[Question, ...] = load_bank()

#: The 16 interview questions of the two source notes, verbatim, in bank order (the Tips notes: 6 at the top and 4
#: in §八; the Strategies notes: 6 at the end).
SEED_QUESTIONS_ZH: tuple[str, ...] = tuple(q.text_zh for q in QUESTIONS if q.source != "book")
