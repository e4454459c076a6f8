"""The interview trainer on the static page works offline in Debian's chromium: reveal, grade, reload and the
progress is still shown; a mock interview ends with a report by topic (issue 34).

The page is drills/03_practice of the built book, served locally with every other request aborted; the
trainer runs on the bank memlib exported at build time (``_static/memlib-quiz-bank.js``), no kernel, no Pyodide.
"""
from __future__ import annotations

from pathlib import Path

from live_check import offline_page

from memlib.drills import TOPICS

PAGE = "drills/03_practice.html"


def _open(site: Path, body) -> tuple[list[str], list[str]]:  # noqa: ANN001 (a callable on the page)
    blocked: list[str] = []
    errors: list[str] = []
    with offline_page(site, PAGE, blocked, errors) as pg:
        body(pg)
    return blocked, errors


def test_reveal_grade_reload_keeps_progress(site: Path) -> None:
    seen: dict[str, str] = {}

    def body(pg) -> None:  # noqa: ANN001
        quiz = pg.locator(".memlib-quiz")
        assert quiz.count() == 1
        seen["before"] = quiz.locator(".memlib-quiz-progress").inner_text()
        assert quiz.locator(".memlib-quiz-answer").is_hidden()
        assert quiz.locator("[data-grade=good]").is_disabled()
        seen["question"] = quiz.locator(".memlib-quiz-question").inner_text()
        quiz.locator("[data-action=reveal]").click()
        assert quiz.locator(".memlib-quiz-answer").is_visible()
        seen["answer"] = quiz.locator(".memlib-quiz-answer").inner_text()
        quiz.locator("[data-grade=good]").click()
        quiz.locator("[data-action=reveal]").click()
        quiz.locator("[data-grade=again]").click()
        pg.reload(wait_until="load")
        seen["after"] = pg.locator(".memlib-quiz .memlib-quiz-progress").inner_text()
        seen["weakest"] = pg.locator(".memlib-quiz .memlib-quiz-weakest").inner_text()
        pg.locator(".memlib-quiz select[name=topic]").select_option("post-training")  # concept questions only
        pg.locator(".memlib-quiz select[name=lang]").select_option("zh")
        seen["zh"] = pg.locator(".memlib-quiz .memlib-quiz-question").inner_text()
        pg.locator(".memlib-quiz select[name=topic]").select_option("serving")
        seen["serving"] = pg.locator(".memlib-quiz .memlib-quiz-meta").inner_text()

    blocked, errors = _open(site, body)
    assert not blocked and not errors, (blocked, errors)
    assert seen["before"].startswith("Nothing practised yet")
    assert "Say first:" in seen["answer"] and "Proved in Chapter" in seen["answer"]
    assert seen["after"].startswith("Practised 2 questions") and "2 grades, 1 good" in seen["after"]
    assert seen["weakest"].startswith("Weakest topics:")
    assert any("\u4e00" <= ch <= "\u9fff" for ch in seen["zh"])
    assert "[serving]" in seen["serving"]


def test_mock_interview_ends_with_a_report_by_topic(site: Path) -> None:
    seen: dict[str, str] = {}

    def body(pg) -> None:  # noqa: ANN001
        quiz = pg.locator(".memlib-quiz")
        quiz.locator("input[name=mock_n]").fill("3")
        quiz.locator("input[name=mock_s]").fill("60")
        quiz.locator("[data-action=mock]").click()
        seen["timer"] = quiz.locator(".memlib-quiz-timer").inner_text()
        for grade in ("good", "hard", "good"):
            quiz.locator("[data-action=reveal]").click()
            quiz.locator(f"[data-grade={grade}]").click()
        report = quiz.locator(".memlib-quiz-report")
        assert report.is_visible()
        seen["report"] = report.inner_text()
        seen["rows"] = str(report.locator("tbody tr").count())

    blocked, errors = _open(site, body)
    assert not blocked and not errors, (blocked, errors)
    assert seen["timer"].endswith("s left")
    assert seen["report"].startswith("Mock interview report: 2 of 3 good")
    assert 1 <= int(seen["rows"]) <= 3 and any(t in seen["report"] for t in TOPICS)
