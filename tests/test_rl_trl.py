"""TRL's DPO and GRPO trainers run on CPU with memlib's tracker: each phase's peak against memlib rl (Chapter 18)."""
import functools

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

pytest.importorskip("trl")
pytest.importorskip("datasets")

from memlib.core.errors import MemlibError  # noqa: E402
from memlib.core.rl import RLSetup, estimate_rl  # noqa: E402
from memlib.core.setup import TrainingSetup  # noqa: E402
from memlib.measure.rl_trl import TINY_RL_LLAMA, TrlMeasurement, measure_trl  # noqa: E402

CPU_TRAIN = TrainingSetup(precision="fp32", optimizer="adamw", optimizer_impl="fused")  # TRL's adamw_torch_fused


@functools.cache
def measured(algo: str, reference: str, prompts: int = 1, prompt_len: int = 16,
             completion_len: int = 16) -> TrlMeasurement:
    return measure_trl(algo, reference=reference, prompts=prompts, prompt_len=prompt_len,
                       completion_len=completion_len)


@pytest.mark.parametrize("algo, reference, shape", [
    ("grpo", "model", (1, 16, 16)), ("grpo", "none", (1, 16, 16)), ("dpo", "model", (2, 8, 24)),
    ("dpo", "none", (1, 16, 16))])
def test_each_phase_within_3_percent(algo: str, reference: str, shape: tuple) -> None:
    prompts, p, c = shape
    m = measured(algo, reference, prompts, p, c)
    rl = RLSetup(algo=algo, reference=reference, prompts=prompts, prompt_len=p, completion_len=c,
                 group=4 if algo == "grpo" else None, engine="hf")
    est = estimate_rl(TINY_RL_LLAMA, rl, CPU_TRAIN)
    assert sorted(m.phases) == sorted(ph.name for ph in est.phases)
    for ph in est.phases:
        assert abs(ph.peak_bytes - m.phases[ph.name]) / m.phases[ph.name] < 0.03, ph.name
    assert abs(est.peak_bytes - m.peak_bytes) / m.peak_bytes < 0.03


def test_beta_zero_frees_exactly_the_reference_copy() -> None:
    with_ref, without = measured("grpo", "model"), measured("grpo", "none")
    weights = 4 * with_ref.params  # the fp32 reference copy TRL builds from the policy's path
    assert "reference" in with_ref.phases and "reference" not in without.phases
    drop = with_ref.phases["rollout"] - without.phases["rollout"]
    assert abs(drop - weights) / weights < 0.01


def test_the_fused_head_buffer_dominates_the_tiny_model() -> None:
    # TRL 1.16.0's ChunkedLogProbFunction allocates min(N, 4096) × 32768 fp32 logits whatever the vocabulary (256)
    m = measured("grpo", "model")
    tile = 4 * 31 * 32768 * 4
    assert m.phases["reference"] - m.phases["rollout"] > tile


def test_bad_input() -> None:
    with pytest.raises(MemlibError, match="unknown algo 'ppo'; expected one of: grpo, dpo"):
        measure_trl("ppo")
    with pytest.raises(MemlibError, match="DPO takes no group"):
        measure_trl("dpo", group=4)
