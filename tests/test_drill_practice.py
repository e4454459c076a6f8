"""The practice loop (issue 34): the new numeric kinds graded by memlib with the formula behind a hint, cards,
Leitner boxes, the mock interview, ``memlib drill`` and the bank exported for the static page."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib.cli import main
from memlib.core.cluster import allreduce_time_s, critical_batch, min_gpus_serve, prefill_time, train_days
from memlib.drills import DRILL_KINDS, TOPICS, generate, grade
from memlib.drills.practice import (GRADES, LEITNER_BOXES, Progress, export_bank, numeric_card, select_cards,
                                    topic_choice)
from memlib.drills.terminal import drill_session

ROOT = Path(__file__).resolve().parents[1]
NEW_KINDS = ("train_days", "allreduce_time", "prefill_time", "arith_intensity", "min_gpus_serve")
FORMULA_MARKS = ("6·N", "6N", "2(N", "÷", "FLOP/byte", "ridge", "2b", "bytes per weight ×")


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_new_kinds_are_graded_by_memlib_and_hide_the_formula(kind: str) -> None:
    for seed in range(12):
        d = generate(kind, seed)
        assert d.hint and not any(m in d.question for m in FORMULA_MARKS), d.question
        assert grade(d, d.answer) and grade(d, f"{d.answer:.6g} {d.unit}")
        assert not grade(d, d.answer * 1.5 + 2)
        assert generate(kind, seed) == d


def test_cluster_arithmetic_by_hand() -> None:
    """The whiteboard numbers, worked here from the datasheet figures (not from memlib)."""
    assert train_days(7e9, 1e12, 64, "h100-sxm", 0.4) == pytest.approx(6 * 7e9 * 1e12 / (64 * 989.5e12 * 0.4) / 86400)
    assert allreduce_time_s(14e9, 64, 50e9) == pytest.approx(2 * 63 / 64 * 14e9 / 50e9)
    assert critical_batch("h100-sxm") == 296  # 989.5e12 / 3.35e12 = 295.4 FLOP/byte = b
    assert critical_batch("a100-80gb") == 154  # 312e12 / 2.039e12 = 153.0
    t = prefill_time("llama-3-8b", 4096)
    assert t.bound == "compute" and prefill_time("llama-3-8b", 8).bound == "memory"
    assert min_gpus_serve("deepseek-v3", "h100-sxm", "fp8").num_gpus == 16  # 671 GB > 8 × 0.9 × 80 GiB
    assert min_gpus_serve("deepseek-v3", "h200", "fp8").num_gpus == 8
    assert min_gpus_serve("deepseek-v3", "h20", "fp8").num_gpus == 8
    assert min_gpus_serve("deepseek-v3", "h200", "bf16").num_gpus == 16


def test_every_kind_has_a_topic_of_the_bank() -> None:
    for kind in DRILL_KINDS:
        assert numeric_card(kind, 0).topic in TOPICS


def test_topic_names_slugs_and_errors() -> None:
    assert topic_choice("oom-allocator") == "OOM & allocator" == topic_choice("OOM & Allocator")
    with pytest.raises(Exception, match=r"unknown topic 'gpu'; expected one of: training memory, precision"):
        topic_choice("gpu")


def test_selection_is_seeded_and_filtered() -> None:
    a = select_cards(5, 7, topic="serving", frequency="high")
    assert [c.id for c in a] == [c.id for c in select_cards(5, 7, topic="serving", frequency="high")]
    assert all(c.topic == "serving" and c.frequency == "high" for c in a)
    assert {c.kind for c in select_cards(200, 3)} == {"concept", "numeric"}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(GRADES), max_size=30))
def test_leitner_boxes_stay_in_range_and_follow_the_grades(grades: list[str]) -> None:
    card = numeric_card("dp_degree", 1)
    p = Progress()
    box = 1
    for g in grades:
        box = 1 if g == "again" else box if g == "hard" else min(box + 1, LEITNER_BOXES)
        assert p.grade(card, g) == box
    assert 1 <= p.box(card.id) <= LEITNER_BOXES and len(p.history) == len(grades)


def test_progress_round_trips_and_rejects_other_files(tmp_path: Path) -> None:
    p = Progress()
    cards = select_cards(3, 0)
    for c, g in zip(cards, ("again", "good", "hard")):
        p.grade(c, g)
    path = p.save(tmp_path / "sub" / "progress.json")
    assert Progress.load(path) == p
    assert Progress.load(tmp_path / "none.json") == Progress()
    (tmp_path / "bad.json").write_text("[1]")
    with pytest.raises(Exception, match="is not a drill progress file"):
        Progress.load(tmp_path / "bad.json")


def test_session_remembers_and_the_mock_reports_by_topic(tmp_path: Path) -> None:
    cards = select_cards(3, 11, topic="serving")
    answers = iter(["", "a", "", "", "h"] * 3)  # enter, grade (numeric: enter to reveal first)
    ticks = iter(range(0, 1000, 100))  # 100 s per question on a fake clock
    path = tmp_path / "p.json"
    progress = Progress()
    out = drill_session(cards, lang="both", progress=progress, path=path, ask=lambda _: next(answers),
                        say=lambda _: None, mock_seconds=60, clock=lambda: float(next(ticks)))
    assert out["asked"] == 3 and out["progress_file"] == str(path)
    saved = json.loads(path.read_text())
    assert len(saved["history"]) == 3 and set(saved["boxes"]) == {c.id for c in cards}
    m = out["mock"]
    assert m["asked"] == 3 and m["topics"]["serving"]["over_time"] == 3
    assert out["weakest_topics"] == ["serving"]
    # without a seed, lower boxes come first: the cards graded "hard" stay in box 1, none moved up
    saved_progress = Progress.load(path)
    saved_progress.boxes["b14-1"] = LEITNER_BOXES  # one card learnt: it goes last
    first = select_cards(200, None, topic="serving", progress=saved_progress)
    boxes = [saved_progress.box(c.id) for c in first]
    assert boxes == sorted(boxes) and first[-1].id == "b14-1"


def test_numeric_card_graded_in_the_session(tmp_path: Path) -> None:
    card = numeric_card("effective_batch", 4)
    answers = iter(["?", f"{card.value:g}"])
    said: list[str] = []
    out = drill_session([card], lang="en", progress=Progress(), path=tmp_path / "p.json",
                        ask=lambda _: next(answers), say=said.append)
    assert out["grades"] == ["good"] and any(s.startswith("hint: ") for s in said)


def test_cli_drill_json_is_the_same_for_a_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMLIB_DRILL_PROGRESS", str(tmp_path / "p.json"))
    outs = []
    for _ in range(2):
        assert main(["drill", "--seed", "1", "--count", "3", "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0] == outs[1] and len(outs[0]["questions"]) == 3
    assert outs[0]["progress_file"] == str(tmp_path / "p.json")
    assert main(["drill", "--seed", "1", "--count", "2", "--json", "--lang", "zh", "--topic", "MoE"]) == 0
    qs = json.loads(capsys.readouterr().out)["questions"]
    assert all(q["topic"] == "MoE" for q in qs)


def test_cli_drill_interactive_saves_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "p.json"
    answers = iter(["", "g"] * 2)
    monkeypatch.setattr("builtins.input", lambda _="": next(answers))
    assert main(["drill", "--seed", "3", "--count", "2", "--topic", "attention", "--frequency", "high",
                 "--progress", str(path), "--mock", "2"]) == 0
    out = capsys.readouterr().out
    assert f"progress file: {path}" in out and "mock interview: 2/2 good" in out and "attention" in out
    assert len(json.loads(path.read_text())["history"]) == 2


@pytest.mark.parametrize("args, message", [
    (["--topic", "gpus"], "memlib: error: unknown topic 'gpus'; expected one of: training memory, precision"),
    (["--lang", "fr"], "memlib: error: unknown lang 'fr'; expected one of: en, zh, both"),
    (["--frequency", "often"], "memlib: error: unknown frequency 'often'; expected one of: high, medium, low"),
])
def test_cli_drill_bad_input_is_one_line_exit_2(args: list[str], message: str) -> None:
    r = subprocess.run([sys.executable, "-m", "memlib", "drill", "--json", *args], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 2 and r.stderr.strip().startswith(message) and len(r.stderr.strip().splitlines()) == 1


def test_export_for_the_static_page() -> None:
    data = export_bank(numeric_seeds=2)
    assert set(data["topics"]) == set(TOPICS) and data["grades"] == list(GRADES)
    kinds = {c["kind"] for c in data["cards"]}
    assert kinds == {"concept", "numeric"}
    for c in data["cards"]:
        assert "{{" not in c["say"] + c["answer"] and c["page"]
        if c["kind"] == "numeric":
            assert c["hint"] and c["value"] is not None


def test_jupyter_trainer_grades_after_reveal_and_saves(tmp_path: Path) -> None:
    from memlib.drills.widgets import TrainerState, trainer

    path = tmp_path / "p.json"
    st = TrainerState(2, seed=5, path=path)
    with pytest.raises(Exception, match="reveal the answer before grading it"):
        st.grade("good")
    st.revealed = True
    assert st.grade("good") == 2 and st.index == 1
    assert json.loads(path.read_text())["history"][0]["grade"] == "good"
    box = trainer(2, seed=5, path=path)
    assert "practised 1 questions" in box.children[-1].value


def test_cli_prints_the_printables(capsys: pytest.CaptureFixture[str]) -> None:
    from memlib.drills.printables import numbers_to_know

    assert main(["drill", "--sheet", "questions", "--frequency", "high", "--lang", "zh"]) == 0
    sheet = capsys.readouterr().out
    assert "## serving (推理服务)" in sheet and "Say first" not in sheet and "deep dive" not in sheet.lower()
    assert main(["drill", "--sheet", "numbers", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)["facts"]
    assert [f["value"] for f in facts] == [f.value for f in numbers_to_know()]
    assert any("2Ψ + 14Ψ/N" in f["rule"] for f in facts) and any("2 · L · n_kv" in f["rule"] for f in facts)
