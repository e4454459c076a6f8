"""Models named as on the Hugging Face Hub: the shipped configs' ids, and the local cache read offline (Chapter 1).

Pure Python, no network and no ``huggingface_hub`` import: an id memlib ships (``meta-llama/Llama-3.1-8B``)
resolves to its shipped config; any other id is looked up in the local Hugging Face cache, where
``huggingface_hub`` stores a download as ``<cache>/models--ORG--NAME/snapshots/<commit>/config.json`` with
``refs/main`` naming the commit (``huggingface_hub/file_download.py``, ``repo_folder_name`` and
``hf_hub_download``). :func:`memlib.core.configs.config_source` calls :func:`shipped_for_id` and
:func:`cached_config`; every command and the live calculators go through it.
"""
from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

__all__ = ["HF_IDS", "ID_OVERRIDES", "hub_ids", "shipped_for_id", "looks_like_hub_id", "hf_cache_dir",
           "cached_config", "close_matches"]

#: The Hugging Face ids of each shipped config (``memlib/core/configs/<name>.json``), the first one the repository
#: the file was taken from. Only ids whose ``config.json`` agrees with the shipped file in every field memory depends
#: on are listed, or whose differences :data:`ID_OVERRIDES` states. The legacy unprefixed ids (``gpt2``,
#: ``gpt2-medium``, ...) are the shipped names themselves. ``google/gemma-3-27b-it`` and ``-pt`` are multimodal
#: repositories; the shipped ``gemma-3-27b`` is their language model (``text_config``, Gemma3ForCausalLM): the
#: SigLIP vision tower is not counted.
HF_IDS: dict[str, tuple[str, ...]] = {
    "deepseek-v2-lite": ("deepseek-ai/DeepSeek-V2-Lite", "deepseek-ai/DeepSeek-V2-Lite-Chat"),
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-Base"),
    "falcon-7b": ("tiiuae/falcon-7b", "tiiuae/falcon-7b-instruct"),
    "gemma-2-27b": ("google/gemma-2-27b", "google/gemma-2-27b-it"),
    "gemma-2-9b": ("google/gemma-2-9b", "google/gemma-2-9b-it"),
    "gemma-2b": ("google/gemma-2b", "google/gemma-2b-it"),
    "gemma-3-27b": ("google/gemma-3-27b-it", "google/gemma-3-27b-pt"),
    "gpt2": ("openai-community/gpt2",),
    "gpt2-large": ("openai-community/gpt2-large",),
    "gpt2-medium": ("openai-community/gpt2-medium",),
    "gpt2-xl": ("openai-community/gpt2-xl",),
    "llama-2-13b": ("meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-13b-chat-hf"),
    "llama-2-70b": ("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf"),
    "llama-2-7b": ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf"),
    "llama-3-70b": ("meta-llama/Meta-Llama-3-70B", "meta-llama/Meta-Llama-3-70B-Instruct"),
    "llama-3-8b": ("meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct"),
    "llama-3.1-405b": ("meta-llama/Llama-3.1-405B", "meta-llama/Llama-3.1-405B-Instruct",
                       "meta-llama/Meta-Llama-3.1-405B", "meta-llama/Meta-Llama-3.1-405B-Instruct"),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct",
                      "meta-llama/Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B-Instruct"),
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct",
                     "meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct"),
    "llama-7b": ("huggyllama/llama-7b",),
    "mistral-7b": ("mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.1"),
    "mixtral-8x22b": ("mistralai/Mixtral-8x22B-Instruct-v0.1",),
    "mixtral-8x7b": ("mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
    "olmo-2-7b": ("allenai/OLMo-2-1124-7B", "allenai/OLMo-2-1124-7B-Instruct"),
    "phi-3-mini": ("microsoft/Phi-3-mini-4k-instruct",),
    "pythia-1.4b": ("EleutherAI/pythia-1.4b", "EleutherAI/pythia-1.4b-deduped"),
    "qwen2-0.5b": ("Qwen/Qwen2-0.5B", "Qwen/Qwen2-0.5B-Instruct"),
    "qwen2.5-72b": ("Qwen/Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct"),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B",),
    "qwen3-32b": ("Qwen/Qwen3-32B",),
    "qwen3-8b": ("Qwen/Qwen3-8B",),
}

#: Fields where an id's ``config.json`` differs from the shipped file it maps to (the rest is identical): the
#: Qwen2.5 instruct models state 32,768 positions where the base models (the shipped files) state 131,072.
ID_OVERRIDES: dict[str, dict[str, Any]] = {
    "qwen/qwen2.5-7b-instruct": {"max_position_embeddings": 32768},
    "qwen/qwen2.5-72b-instruct": {"max_position_embeddings": 32768},
}

_BY_ID: dict[str, str] = {i.lower(): name for name, ids in HF_IDS.items() for i in ids}
_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def hub_ids(name: str) -> tuple[str, ...]:
    """The Hugging Face ids of the shipped config ``name`` (empty for an unknown name). Chapter 1."""
    return HF_IDS.get(name, ())


def shipped_for_id(model_id: str) -> tuple[str, dict[str, Any]] | None:
    """The shipped config an id names (case-insensitive) and the fields its own config.json states otherwise.

    Introduced in Chapter 1. ``"meta-llama/Llama-3.1-8B-Instruct"`` → ``("llama-3.1-8b", {})``;
    ``"Qwen/Qwen2.5-7B-Instruct"`` → ``("qwen2.5-7b", {"max_position_embeddings": 32768})``; an id memlib does not
    ship → None.
    """
    key = model_id.strip().lower()
    name = _BY_ID.get(key)
    return None if name is None else (name, dict(ID_OVERRIDES.get(key, {})))


def looks_like_hub_id(text: str) -> bool:
    """Whether ``text`` has the shape of a Hub model id, ``ORG/NAME`` (not a .json file, not an absolute path)."""
    return bool(_ID_RE.match(text)) and not text.endswith(".json") and not text.startswith(".")


def hf_cache_dir() -> Path:
    """The local Hugging Face hub cache, found as ``huggingface_hub/constants.py`` finds it. Chapter 1.

    ``HF_HUB_CACHE``, else the older ``HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``. The folder need not exist.
    """
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def cached_config(model_id: str, cache_dir: Path | None = None) -> Path | None:
    """The ``config.json`` of ``model_id`` in the local Hugging Face cache, or None. Never touches the network.

    Introduced in Chapter 1. The repository folder is ``models--ORG--NAME`` (matched case-insensitively: the Hub's
    ids are, and the folder keeps the case the download was asked with). The snapshot is the commit
    ``refs/main`` names when that file exists and its snapshot holds a config.json; otherwise the most recently
    modified snapshot that holds one.

    Args:
        model_id: ``ORG/NAME`` (or a legacy unprefixed name such as ``distilgpt2``).
        cache_dir: the hub cache; default :func:`hf_cache_dir`.
    """
    root = hf_cache_dir() if cache_dir is None else cache_dir
    want = "models--" + "--".join(model_id.strip().split("/"))
    try:
        repos = [p for p in root.iterdir() if p.name.lower() == want.lower() and p.is_dir()]
    except OSError:
        return None
    for repo in sorted(repos, key=lambda p: p.name != want):  # the exact case first
        ref = repo / "refs" / "main"
        if ref.is_file():
            pinned = repo / "snapshots" / ref.read_text().strip() / "config.json"
            if pinned.is_file():
                return pinned
        try:
            snaps = [s / "config.json" for s in (repo / "snapshots").iterdir() if (s / "config.json").is_file()]
        except OSError:
            continue
        if snaps:
            return max(snaps, key=lambda c: (c.parent.stat().st_mtime, c.parent.name))
    return None


def close_matches(text: str, names: list[str]) -> list[str]:
    """Shipped names and Hub ids close to ``text`` (difflib ratio ≥ 0.6, case-insensitive), best first, at most five.

    Each candidate is scored by its best match of the whole text or of its name part against the whole candidate
    or its name part, so ``someone/llama-2-7b-finetuned`` finds ``llama-2-7b`` and ``meta-llama/Llama-2-7b-hf``.
    """
    pool = {n.lower(): n for n in names}
    pool.update({i.lower(): i for ids in HF_IDS.values() for i in ids})
    key = text.strip().lower()
    tail = key.rsplit("/", 1)[-1]

    def score(cand: str) -> float:
        ctail = cand.rsplit("/", 1)[-1]
        return max(difflib.SequenceMatcher(None, a, b).ratio() for a in {key, tail} for b in {cand, ctail})

    scored = sorted(((score(c), c) for c in pool), key=lambda sc: (-sc[0], sc[1]))
    return [pool[c] for s, c in scored if s >= 0.6][:5]
