"""Models named by their Hugging Face id: the shipped table, the local cache read offline, the one-line error."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from memlib.core.configs import load_config, shipped_models
from memlib.core.errors import MemlibError
from memlib.core.hub import (HF_IDS, ID_OVERRIDES, cached_config, close_matches, hf_cache_dir, hub_ids,
                             looks_like_hub_id, shipped_for_id)

TINY = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 512}


def fake_cache(root: Path, repo: str, snapshots: dict[str, dict | None], main: str | None = None) -> Path:
    """A hub cache as huggingface_hub lays it out: models--ORG--NAME/{refs/main, snapshots/<commit>/config.json}."""
    folder = root / ("models--" + repo.replace("/", "--"))
    for i, (commit, cfg) in enumerate(snapshots.items()):
        snap = folder / "snapshots" / commit
        snap.mkdir(parents=True)
        if cfg is not None:
            (snap / "config.json").write_text(json.dumps(cfg))
        os.utime(snap, (1_000_000 + i, 1_000_000 + i))  # later entries are newer
    if main is not None:
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(main + "\n")
    return folder


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty local cache: HF_HUB_CACHE points at it (the user's real cache is never read)."""
    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    return root


def test_every_shipped_config_has_its_ids_and_each_id_names_one_config() -> None:
    names = shipped_models(all_models=True)
    assert sorted(HF_IDS) == names
    ids = [i.lower() for v in HF_IDS.values() for i in v]
    assert len(ids) == len(set(ids)) and all(looks_like_hub_id(i) for i in ids)
    assert set(ID_OVERRIDES) <= set(ids)
    for name in names:
        for model_id in hub_ids(name):
            assert shipped_for_id(model_id.upper())[0] == name  # type: ignore[index]


@pytest.mark.parametrize("model_id, name", [
    ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"), ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("meta-llama/llama-2-7b-HF", "llama-2-7b"), ("openai-community/gpt2", "gpt2"), ("google/gemma-2b", "gemma-2b"),
    ("mistralai/Mistral-7B-v0.1", "mistral-7b"), ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
    ("Qwen/Qwen2.5-7B", "qwen2.5-7b")])
def test_an_id_loads_the_shipped_config(model_id: str, name: str, hub: Path) -> None:
    assert load_config(model_id) == load_config(name) and load_config(model_id).name == name


def test_an_instruct_id_keeps_its_own_positions(hub: Path) -> None:
    base, chat = load_config("Qwen/Qwen2.5-7B"), load_config("Qwen/Qwen2.5-7B-Instruct")
    assert (base.max_positions, chat.max_positions) == (131072, 32768)
    assert chat.hidden_size == base.hidden_size and chat.num_layers == base.num_layers


def test_cache_dir_follows_huggingface_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hf_cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hf_cache_dir() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "old"))
    assert hf_cache_dir() == tmp_path / "old"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "new"))
    assert hf_cache_dir() == tmp_path / "new"


def test_refs_main_picks_the_snapshot(hub: Path) -> None:
    fake_cache(hub, "someorg/Tiny", {"aaa": TINY, "bbb": {**TINY, "num_hidden_layers": 3}}, main="aaa")
    assert cached_config("someorg/Tiny") == hub / "models--someorg--Tiny" / "snapshots" / "aaa" / "config.json"
    cfg = load_config("someorg/Tiny")
    assert cfg.num_layers == 2 and cfg.name == "someorg/Tiny"


def test_without_refs_the_newest_snapshot_with_a_config(hub: Path) -> None:
    fake_cache(hub, "someorg/Tiny", {"old": TINY, "new": {**TINY, "num_hidden_layers": 3}, "partial": None})
    assert load_config("someorg/Tiny").num_layers == 3  # "partial" is newer but holds no config.json


def test_the_cache_is_matched_case_insensitively_and_found_through_hf_home(monkeypatch: pytest.MonkeyPatch,
                                                                           tmp_path: Path) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    fake_cache(tmp_path / "hf" / "hub", "SomeOrg/Tiny-Chat", {"c1": TINY}, main="c1")
    assert load_config("someorg/tiny-chat").hidden_size == 64


def test_an_unknown_id_is_one_line_naming_the_cache_and_the_close_matches(hub: Path) -> None:
    with pytest.raises(MemlibError) as err:
        load_config("meta-llama/Llama-3.1-8C")
    msg = str(err.value)
    assert "\n" not in msg and "'meta-llama/Llama-3.1-8C'" in msg and "not shipped" in msg
    assert f"not in the local Hugging Face cache ({hub})" in msg and "config.json" in msg
    assert "close matches: " in msg and "meta-llama/Llama-3.1-8B" in msg


def test_an_existing_path_wins_over_an_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub: Path) -> None:
    local = tmp_path / "meta-llama" / "Llama-3.1-8B"
    local.mkdir(parents=True)
    (local / "config.json").write_text(json.dumps(TINY))
    monkeypatch.chdir(tmp_path)
    assert load_config("meta-llama/Llama-3.1-8B").hidden_size == 64


@pytest.mark.parametrize("text, expected", [("meta-llama/Llama-3.1-8B", True), ("Qwen/Qwen2.5-7B-Instruct", True),
                                            ("gpt2", False), ("/abs/config.json", False), ("a/b/c", False),
                                            ("org/config.json", False), ("./org", False)])
def test_looks_like_hub_id(text: str, expected: bool) -> None:
    assert looks_like_hub_id(text) is expected


def test_close_matches_use_the_name_part_of_an_unknown_org() -> None:
    assert "llama-2-7b" in close_matches("someone/llama-2-7b-finetuned", shipped_models(all_models=True))
    assert close_matches("zzzzzz", shipped_models(all_models=True)) == []


def test_live_model_list_shows_and_takes_the_ids() -> None:
    from memlib.viz.live import render

    by_id = render("training", {"model": "meta-llama/Llama-2-7b-hf"})
    assert by_id == render("training", {"model": "llama-2-7b"})
    assert '<option value="llama-2-7b" selected>llama-2-7b · meta-llama/Llama-2-7b-hf</option>' in by_id
    for kind in ("serving_fit", "serve", "plan"):
        assert "openai-community/gpt2" in render(kind)
    with pytest.raises(MemlibError, match="unknown model 'org/none'"):
        render("plan", {"model": "org/none"})
