"""The interview trainer's bank (issue 34): every question has a topic of at most fifteen, a frequency, a spoken
answer in English and Chinese of at most 40 words without memlib or note references, and a "Proved in" link to a
chapter whose page contains the question's key term."""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from memlib.drills import CHAPTER_PAGES, QUESTIONS, TOPICS, questions, render_say, say_words
from memlib.drills.bank import FREQUENCIES, SAY_MAX_WORDS

ROOT = Path(__file__).resolve().parents[1]
#: Words a candidate would not say to an interviewer: the library's names and the source notes.
_NOT_SAID = re.compile(r"memlib|Tips notes|Strategies notes|estimate_\w+|answer_numbers|\bthe notes\b", re.I)


def _page_text(chapter: int) -> str:
    nb = json.loads((ROOT / "chapters" / f"{CHAPTER_PAGES[chapter]}.ipynb").read_text(encoding="utf-8"))
    return " ".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown").lower()


def test_bank_size_topics_and_frequencies() -> None:
    assert len(QUESTIONS) >= 140
    assert len(TOPICS) <= 15
    used = Counter(q.topic for q in QUESTIONS)
    assert set(used) == set(TOPICS), f"topics without a question: {set(TOPICS) - set(used)}"
    assert set(Counter(q.frequency for q in QUESTIONS)) == set(FREQUENCIES)
    assert sum(q.frequency == "high" for q in QUESTIONS) >= 45


@pytest.mark.parametrize("q", QUESTIONS, ids=lambda q: q.id)
def test_spoken_answer_is_short_bold_and_speakable(q) -> None:  # type: ignore[no-untyped-def]
    en, zh = render_say(q), render_say(q, "zh")
    assert say_words(q) <= SAY_MAX_WORDS, f"{q.id}: {say_words(q)} words"
    assert "**" in en and "**" in zh, "the key number or term is in bold"
    assert not _NOT_SAID.search(en + zh + q.text + q.text_zh), _NOT_SAID.search(en + zh)
    assert re.search(r"[\u4e00-\u9fff]", zh) and re.search(r"[\u4e00-\u9fff]", q.text_zh)
    assert len(zh.replace("**", "")) <= 130, f"{q.id}: the Chinese answer runs {len(zh)} characters"
    assert "{{" not in en + zh


@pytest.mark.parametrize("chapter", sorted({q.chapter for q in QUESTIONS}))
def test_proved_in_links_reach_a_page_with_the_key_term(chapter: int) -> None:
    text = _page_text(chapter)
    missing = [(q.id, q.key) for q in questions(chapter=chapter) if q.key.lower() not in text]
    assert not missing, f"Chapter {chapter}'s page lacks the key term of {missing}"


def test_moe_and_mla_questions_link_where_the_book_has_them() -> None:
    """Issue 34: MoE and MLA questions once said 'Proved in Chapter 13', which has neither."""
    for q in QUESTIONS:
        if re.search(r"\bMoE\b|\bMLA\b|Mixtral|DeepSeek", q.text):
            assert q.chapter != 13, q.id


def test_issue_questions_are_in_the_bank() -> None:
    """The questions issue 34 asks for, found by their wording."""
    text = " ".join(q.text for q in QUESTIONS).lower()
    for phrase in ("nvidia-smi shows free memory", "ttft and tpot", "blockwise", "holds the memory at the point",
                   "7b model on 1t tokens on 64 h100s", "capacity factor", "deepseek-v3/r1", "(pd) disaggregation",
                   "ring all-reduce", "decode matmul become compute-bound", "find the bottleneck", "mfu and hfu",
                   "gptq", "w4a16", "flashattention 1, 2 and 3", "ddp overlap", "dualpipe", "grpo", "torch.compile",
                   "recompute and swap", "offloading the kv cache", "ulysses", "mxfp8", "cuda graphs",
                   "gradscaler", "fsdp2 cpu offload"):
        assert phrase in text, phrase


#: Every chapter's "Interview questions" section is rendered from the bank (one copy of each question).
RENDERED_FROM_BANK = tuple(range(1, 19))


@pytest.mark.parametrize("chapter", RENDERED_FROM_BANK)
def test_chapter_section_is_rendered_from_the_bank(chapter: int) -> None:
    from memlib.drills import chapter_markdown

    nb = json.loads((ROOT / "chapters" / f"{CHAPTER_PAGES[chapter]}.ipynb").read_text(encoding="utf-8"))
    md = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert "**Question " not in md, "a second copy of the questions in the chapter's Markdown"
    call = f'chapter_markdown({chapter}, page_prefix="")'
    (cell,) = [c for c in nb["cells"] if c["cell_type"] == "code" and call in "".join(c["source"])]
    shown = "".join("".join(o["data"]["text/markdown"]) for o in cell["outputs"] if "text/markdown" in o.get("data", {}))
    assert shown == chapter_markdown(chapter, page_prefix="")
    assert "remove-input" in cell["metadata"]["tags"] and nb["metadata"]["mystnb"]["render_markdown_format"] == "myst"
