"""Exact parameter counts against the transformers classes built on the meta device."""
import json

import pytest

import memlib
from memlib.core.configs import load_config, shipped_models
from memlib.core.errors import MemlibError
from memlib.core.params import count_params

PUBLISHED = {  # ../shared/REFERENCES.md: counts of the transformers classes
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "llama-7b": 6_738_415_616,
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_counts(name: str) -> None:
    assert count_params(name).params == PUBLISHED[name]


@pytest.mark.parametrize("name", shipped_models(all_models=True))
def test_counts_equal_transformers(name: str) -> None:
    torch = pytest.importorskip("torch")
    from memlib.measure.trace import build_model

    net = build_model(name, device="meta", attention="eager")
    tensors = list(net.parameters())
    pc = count_params(name)
    assert pc.params == sum(p.numel() for p in tensors)
    assert pc.num_tensors == len(tensors)
    assert pc.small_tensor_params == sum(p.numel() for p in tensors if p.numel() < 4096)
    assert pc.params == pc.embeddings + pc.attention + pc.mlp + pc.norms + pc.lm_head
    assert all(p.device == torch.device("meta") for p in tensors)


def test_gqa_and_head_dim_and_biases() -> None:
    base = dict(load_config("llama-2-7b").raw)
    mha = count_params(base).attention
    gqa = count_params({**base, "num_key_value_heads": 8}).attention
    assert mha - gqa == 32 * 2 * 4096 * (4096 - 1024)
    qwen = count_params("qwen2-0.5b")
    cfg = load_config("qwen2-0.5b")
    no_bias = count_params({**cfg.raw, "model_type": "llama"})
    assert qwen.attention - no_bias.attention == cfg.num_layers * (cfg.q_dim + 2 * cfg.kv_dim)
    gemma = load_config("gemma-2b")
    assert gemma.head_dim == 256 and gemma.q_dim == 2048 and gemma.kv_dim == 256


def test_tied_embeddings() -> None:
    assert count_params("gpt2").lm_head == 0
    assert count_params("llama-2-7b").lm_head == 32000 * 4096


@pytest.mark.parametrize(
    "bad, message",
    [
        ("nosuch-model", "unknown model 'nosuch-model'; expected one of: deepseek-v2-lite"),
        ({"model_type": "nosuch_lm", "hidden_size": 8}, "unsupported model_type 'nosuch_lm'; expected one of: gpt2, llama"),
        ({**load_config("llama-2-7b").raw, "num_attention_heads": 30}, "num_attention_heads 30 does not divide hidden_size 4096"),
        ({**load_config("llama-2-7b").raw, "hidden_size": -4096}, "'hidden_size' must be a positive integer, got -4096"),
        ({**load_config("llama-2-7b").raw, "num_key_value_heads": 5}, "num_key_value_heads 5 does not divide"),
    ],
)
def test_bad_configs(bad: object, message: str) -> None:
    with pytest.raises(memlib.MemlibError, match=message.replace("(", r"\(").replace(")", r"\)")):
        count_params(bad)  # type: ignore[arg-type]


def test_config_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    good = tmp_path / "config.json"
    good.write_text(json.dumps(load_config("gpt2").raw))
    assert count_params(str(good)).params == 124_439_808
    assert count_params(str(tmp_path)).params == 124_439_808  # a model folder
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(memlib.MemlibError, match="malformed JSON"):
        load_config(str(bad))
    with pytest.raises(memlib.MemlibError, match="does not exist"):
        load_config(str(tmp_path / "missing.json"))
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(memlib.MemlibError, match="expected a JSON object"):
        load_config(str(listed))


def test_core_never_imports_measure() -> None:
    # the layers: memlib.core is pure; the transformers/torch side of configs and params is memlib.measure.hf_config
    import ast
    from pathlib import Path

    import memlib.core

    for path in Path(memlib.core.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                target = ("." * node.level) + (node.module or "")
                assert "measure" not in target and not target.startswith(".."), (path.name, target)
                assert (node.module or "").split(".")[0] not in ("torch", "transformers"), (path.name, target)
            elif isinstance(node, ast.Import) and path.name != "errors.py":  # errors.require_torch: the install hint
                assert all(a.name.split(".")[0] not in ("torch", "transformers", "memlib") for a in node.names)


def test_families_only_transformers_knows_are_read_and_counted_in_measure() -> None:
    pytest.importorskip("transformers")
    from memlib.measure.hf_config import count_params_any, load_any_config
    from memlib.measure.trace import build_model

    tiny = {"model_type": "starcoder2", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256}
    cfg = load_any_config(tiny)
    assert not cfg.native and cfg.num_layers == 2 and cfg.num_kv_heads == 2
    built = sum(p.numel() for p in build_model(tiny, device="meta").parameters())
    assert count_params_any(tiny).params == built
    assert count_params_any("gpt2") == count_params("gpt2")  # memlib's own families: the pure count
    with pytest.raises(MemlibError, match="unsupported model_type 'starcoder2'"):
        count_params(tiny)
    with pytest.raises(MemlibError, match="model_type 'starcoder2' is counted from its transformers class: use "
                                          "memlib.measure.hf_config.count_params_any"):
        count_params(cfg)
    with pytest.raises(MemlibError, match="unsupported model_type 'nosuch_lm'; expected one of: gpt2, .* or a "
                                          "causal-LM model_type transformers knows"):
        load_any_config({**tiny, "model_type": "nosuch_lm"})
