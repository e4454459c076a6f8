"""One object per framework (memlib.core.frameworks): one interface, composed by the estimator without a name."""
from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from memlib.core import frameworks
from memlib.core.choices import FRAMEWORK_SUPPORT, FRAMEWORKS
from memlib.core.configs import load_config
from memlib.core.errors import MemlibError
from memlib.core.estimate import compose_training, estimate_training
from memlib.core.frameworks import FRAMEWORK_OBJECTS, Framework, framework_for, get_framework
from memlib.core.params import count_params
from memlib.core.setup import TrainingSetup

FRAMEWORK_WORDS = ("pytorch", "deepspeed", "fsdp2", "megatron", "ddp")
INTERFACE = ("check", "activation_terms", "layout", "state_bytes", "optimizer_state_bytes", "extra_state_bytes", "model_state_bytes", "shard",
             "working_set", "working_set_at_step", "offload", "gradient_buffers", "comm_buffers", "backward_extra",
             "optimizer_step_bytes", "step_temp_bytes")


def _code_without_docstrings(fn: object) -> str:
    """The function's code as the AST sees it: docstrings dropped (they name the choices), comments gone."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))  # type: ignore[arg-type]
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return ast.unparse(tree).lower()


def test_estimate_training_names_no_framework() -> None:
    code = _code_without_docstrings(estimate_training) + _code_without_docstrings(compose_training)
    assert "framework_for" in code  # it composes the setup's framework object...
    found = [w for w in FRAMEWORK_WORDS if w in code.replace("framework_for", "")]
    assert not found, f"estimate_training's code names {found}: move that term into the framework's module"


def test_the_check_sees_a_framework_name() -> None:
    def branches(setup: TrainingSetup) -> int:
        """A docstring may name megatron."""
        return 1 if setup.framework == "megatron" else 0

    assert "megatron" in _code_without_docstrings(branches)
    assert "docstring" not in _code_without_docstrings(branches)


def test_every_framework_choice_is_one_object_with_the_interface() -> None:
    assert tuple(FRAMEWORK_OBJECTS) == FRAMEWORKS
    for name, fw in FRAMEWORK_OBJECTS.items():
        assert isinstance(fw, Framework) and fw.name == name
        assert all(callable(getattr(fw, m)) for m in INTERFACE)
        assert (fw.supports.zero_stages, fw.supports.offload, fw.supports.parallelism) == FRAMEWORK_SUPPORT[name]
        assert get_framework(name) is fw
    with pytest.raises(MemlibError, match="unknown framework 'jax'; expected one of: pytorch"):
        get_framework("jax")
    with pytest.raises(MemlibError, match="framework 'deepspeed' does not support ep parallelism with zero 3; valid"):
        get_framework("deepspeed").check(3, "none", ("ep",))
    with pytest.raises(MemlibError, match="framework 'deepspeed' does not support ep parallelism with offload"):
        get_framework("deepspeed").check(2, "optimizer", ("ep",))
    get_framework("deepspeed").check(2, "none", ("ep",))  # DeepSpeed-MoE: ZeRO 0-2 without offload
    with pytest.raises(MemlibError, match="framework 'pytorch' does not support zero 2; valid combinations"):
        get_framework("pytorch").check(2, "none", ())


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_each_object_owns_its_module(name: str) -> None:
    fw = FRAMEWORK_OBJECTS[name]
    assert type(fw).__module__ == f"memlib.core.frameworks.{name}"
    assert framework_for(TrainingSetup(framework=name, zero_stage=FRAMEWORK_SUPPORT[name][0][0])) is fw


def test_the_kept_per_term_functions_are_the_objects_methods() -> None:
    cfg = load_config("llama-2-7b")
    pc = count_params(cfg)
    for setup in (TrainingSetup(framework="deepspeed", zero_stage=3, num_gpus=8),
                  TrainingSetup(framework="fsdp2", zero_stage=2, num_gpus=4),
                  TrainingSetup(framework="pytorch", zero_stage=1, num_gpus=2),
                  TrainingSetup(framework="megatron", zero_stage=1, num_gpus=8)):
        fw = framework_for(setup)
        states = frameworks.model_state_bytes(cfg, pc.params, pc.small_tensor_params, setup)
        assert states == fw.model_state_bytes(cfg, pc.params, pc.small_tensor_params, setup)
        assert frameworks.shard_states(*states[:3], setup) == fw.shard(*states[:3], setup)
        assert frameworks.bucket_bytes(setup) == fw.comm_buffers(setup)
        assert frameworks.ddp_bucket_bytes(setup, 10**9) == fw.gradient_buffers(setup, 10**9)
        assert (frameworks.optimizer_step_bytes(cfg, setup, 0, pc.params, pc.params)
                == fw.optimizer_step_bytes(cfg, setup, pc.params, pc.params))


class _Doubled(type(FRAMEWORK_OBJECTS["deepspeed"])):  # type: ignore[misc]
    """A stand-in framework: DeepSpeed with 16-bit gradients counted twice (an extra fp16 gradient copy)."""

    def layout(self, precision: str) -> tuple[float, float, float, float]:
        w, g, master, moment = super().layout(precision)
        return w, 2 * g, master, moment


def test_the_estimator_composes_whatever_object_the_registry_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = TrainingSetup(framework="deepspeed", zero_stage=1, num_gpus=4, batch_size=2, seq_len=256, grad_accum=2)
    before = estimate_training("llama-2-7b", setup)
    monkeypatch.setitem(FRAMEWORK_OBJECTS, "deepspeed", _Doubled())
    after = estimate_training("llama-2-7b", setup)
    n = count_params(load_config("llama-2-7b")).params
    assert after.grads_bytes == before.grads_bytes + 2 * n  # the new layout's 2 more bytes per parameter, unsharded
    assert (after.params_bytes, after.optimizer_bytes) == (before.params_bytes, before.optimizer_bytes)
    states_only = estimate_training(None, params=n, framework="deepspeed", zero_stage=2, num_gpus=4)
    assert states_only.grads_bytes == -(-4 * n // 4)  # sharded at ZeRO-2: 4 bytes per parameter over 4 GPUs
