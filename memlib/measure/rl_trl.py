"""TRL's DPO and GRPO trainers run for real on CPU with memlib's tracker attached: each phase's peak (Chapter 18).

:func:`measure_trl` builds a tiny Llama from a config and a word-level tokenizer in code (no download), runs
``trl.DPOTrainer`` or ``trl.GRPOTrainer`` (TRL 1.16.0, its plain ``model.generate`` path, no vLLM) for two
optimizer steps with a :class:`memlib.measure.tracker.MemoryTracker` on the CPU, and returns the peak of each phase
of the second (steady-state) step, named as :func:`memlib.core.rl.estimate_rl` names them. The phases are marked by
wrapping the trainers' own methods (TRL 1.16.0, ``trl/trainer/grpo_trainer.py``):
``GRPOTrainer._generate_single_turn`` (rollout), ``GRPOTrainer._get_per_token_logps_and_entropies`` called with
``self.ref_model`` (reference), ``Trainer.compute_loss`` + ``accelerator.backward`` + ``optimizer.step``
(training); for DPO (``trl/trainer/dpo_trainer.py``) the reference model's ``forward``, which
``DPOTrainer._compute_loss`` calls under ``torch.no_grad()`` after the policy's forward (reference, nested in
training), and the same training calls. torch, transformers, datasets and trl are imported lazily.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..core.errors import MemlibError, check_choice, check_positive
from .deps import require_torch
from .tracker import MemoryTracker

__all__ = ["TINY_RL_LLAMA", "TrlMeasurement", "measure_trl", "TRL_VERSION"]

#: The TRL release this measurement was written against (requirements.txt pins it).
TRL_VERSION = "1.16.0"

#: The tiny Llama the CPU runs train (HF config fields; memlib reads the same dict).
TINY_RL_LLAMA: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256,
    "tie_word_embeddings": False}


@dataclass(frozen=True)
class TrlMeasurement:
    """Peaks of one traced TRL step on CPU, bytes.

    Attributes:
        algo: ``dpo`` or ``grpo``.
        phases: phase name -> the largest live bytes in it (the second optimizer step's).
        peak_bytes: the largest of them.
        params: parameters of the policy.
        settings: the run's settings, echoed.
    """

    algo: str
    phases: dict[str, int]
    peak_bytes: int
    params: int
    settings: dict[str, Any]


class _PhasePeaks:
    """Per-phase maxima of a tracker's live bytes; phases nest (the innermost names the bytes)."""

    def __init__(self, tracker: MemoryTracker) -> None:
        self.tracker = tracker
        self.peaks: dict[str, int] = {}
        self.recording = False

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        tr = self.tracker
        outer = tr.peak
        tr.reset_peak()
        try:
            yield
        finally:
            if self.recording:
                self.peaks[name] = max(self.peaks.get(name, 0), tr.peak)
            tr.peak = max(outer, tr.peak)

    def wrap(self, obj: Any, method: str, name: str | Callable[..., str | None]) -> None:
        original = getattr(obj, method)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            label = name(*args, **kwargs) if callable(name) else name
            if label is None:
                return original(*args, **kwargs)
            with self.phase(label):
                return original(*args, **kwargs)

        setattr(obj, method, wrapped)


def _tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer over ``w0 … w{V-4}`` plus pad, eos and unk, built in code (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size - 3)}
    vocab.update({"<pad>": vocab_size - 3, "<eos>": vocab_size - 2, "<unk>": vocab_size - 1})
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def _length_reward(completions: list[str], **kwargs: Any) -> list[float | None]:
    """GRPO's reward function of the CPU runs: the completion's length in characters (any number will do)."""
    return [float(len(c)) for c in completions]


def _words(i: int, n: int, vocab: int) -> str:
    return " ".join(f"w{(7 * i + 3 * j) % (vocab - 3)}" for j in range(n))


def measure_trl(algo: str, *, group: int | None = None, prompts: int = 1, prompt_len: int = 16, completion_len: int = 16,
                reference: str = "model", seed: int = 0) -> TrlMeasurement:
    """Run two steps of TRL's ``algo`` trainer on CPU (fp32, ``adamw_torch_fused``) and return each phase's peak.

    Introduced in Chapter 18. The model is :data:`TINY_RL_LLAMA`, saved to a temporary folder (TRL builds its
    reference model from the policy's path, ``trl/trainer/utils.py``: ``create_model_from_path``). Gradient
    checkpointing is off (TRL's configs turn it on by default). GRPO's completions always run to
    ``completion_len`` (the tiny model has no reason to stop: ``<eos>`` is masked out of generation).

    Args:
        algo: ``grpo`` or ``dpo``.
        group: GRPO's ``num_generations`` (G; default 4); None for DPO.
        prompts: prompts per step (GRPO: the step's batch is prompts × G completions; DPO: pairs per step).
        prompt_len: prompt tokens.
        completion_len: completion tokens (GRPO's ``max_completion_length``, every completion generated to it
            with ``min_new_tokens``; DPO's chosen and rejected lengths, their EOS included).
        reference: ``model`` (a frozen copy; GRPO ``beta=0.04``, DPO the default) or ``none`` (GRPO ``beta=0``;
            DPO ``precompute_ref_log_probs=True``, whose reference pass runs before training).
        seed: torch seed.

    Returns:
        The measurement.

    Raises:
        MemlibError: for a bad value; ImportError (saying what to install) without trl.
    """
    check_choice("algo", algo, ("grpo", "dpo"))
    check_choice("reference", reference, ("model", "none"))
    if algo == "dpo" and (group is not None or completion_len < 2):
        raise MemlibError(f"DPO takes no group and completion_len ≥ 2 (its EOS is added); got group={group}, "
                          f"completion_len={completion_len}")
    group = 4 if group is None else group
    for label, value in (("group", group), ("prompts", prompts), ("prompt_len", prompt_len),
                         ("completion_len", completion_len)):
        check_positive(label, value)
    if algo == "grpo" and group < 2:
        raise MemlibError(f"group must be ≥ 2 for GRPO's advantages (got {group})")
    torch = require_torch("memlib.measure.rl_trl")
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # silences DeepSpeed's "setting accelerator" warning
    with _quiet():
        return _measure(algo, group, prompts, prompt_len, completion_len, reference, seed, torch)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the libraries' loggers, warnings, progress bars and the trainer's printed metrics."""
    import logging
    import warnings

    # torchao (when installed, transformers imports it) logs the CUDA extensions it cannot load on a CPU machine;
    # torch's pytree logs a deprecation it triggers
    names = ("transformers", "trl", "datasets", "DeepSpeed", "accelerate", "bitsandbytes", "kernels", "torchao",
             "torch")
    old = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for n, level in old.items():
            logging.getLogger(n).setLevel(level)


def _measure(algo: str, group: int, prompts: int, prompt_len: int, completion_len: int, reference: str, seed: int,
             torch: Any) -> TrlMeasurement:
    try:
        import trl
        from datasets import Dataset
        from transformers import LlamaConfig, LlamaForCausalLM
        from datasets import disable_progress_bars
    except ImportError as e:  # pragma: no cover - the requirements pin trl
        raise ImportError(f"memlib.measure.rl_trl needs trl=={TRL_VERSION} and datasets: pip install "
                          f"trl=={TRL_VERSION} datasets ({e})") from e
    from huggingface_hub.utils import disable_progress_bars as hub_quiet
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bars()  # datasets' map bars, transformers' and the hub's loading and saving bars
    disable_progress_bar()
    hub_quiet()
    cfg_d = dict(TINY_RL_LLAMA)
    v = cfg_d["vocab_size"]
    tok = _tokenizer(v)
    cfg = LlamaConfig(**{k: x for k, x in cfg_d.items() if k != "model_type"}, pad_token_id=v - 3,
                      eos_token_id=v - 2, bos_token_id=None)
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        model = LlamaForCausalLM(cfg)
        model.save_pretrained(tmp)
        model.config._name_or_path = tmp
        n = sum(p.numel() for p in model.parameters())
        common: dict[str, Any] = dict(output_dir=tmp, max_steps=2, report_to=[], logging_steps=1000, save_strategy="no",
                                      use_cpu=True, bf16=False, learning_rate=1e-4, dataloader_num_workers=0,
                                      gradient_checkpointing=False, seed=seed, disable_tqdm=True)
        args: Any
        trainer: Any
        if algo == "grpo":
            ds = Dataset.from_dict({"prompt": [_words(i, prompt_len, v) for i in range(2 * prompts)]})
            args = trl.GRPOConfig(per_device_train_batch_size=prompts * group, num_generations=group,
                                  max_completion_length=completion_len, beta=0.04 if reference == "model" else 0.0,
                                  generation_kwargs={"min_new_tokens": completion_len},
                                  **common)
            trainer = trl.GRPOTrainer(model=model, reward_funcs=_length_reward, args=args, train_dataset=ds,
                                      processing_class=tok)
        else:
            ds = Dataset.from_dict({"prompt": [_words(i, prompt_len, v) for i in range(2 * prompts)],
                                    "chosen": [" " + _words(i + 1, completion_len - 1, v) for i in range(2 * prompts)],
                                    "rejected": [" " + _words(i + 2, completion_len - 1, v)
                                                 for i in range(2 * prompts)]})
            args = trl.DPOConfig(per_device_train_batch_size=prompts, max_length=None,
                                 precompute_ref_log_probs=reference == "none", **common)
            trainer = trl.DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
        phases = _run(trainer, algo, torch)
    peaks = dict(phases.peaks)
    return TrlMeasurement(algo, peaks, max(peaks.values()), n, {
        "algo": algo, "group": group if algo == "grpo" else None, "prompts": prompts, "prompt_len": prompt_len,
        "completion_len": completion_len, "reference": reference, "trl": trl.__version__})


def _run(trainer: Any, algo: str, torch: Any) -> _PhasePeaks:
    """Train two steps under a CPU tracker; record the second step's phase peaks."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    tracker = MemoryTracker("cpu")
    pp = _PhasePeaks(tracker)
    ref = getattr(trainer, "ref_model", None)
    if algo == "grpo":
        pp.wrap(trainer, "_generate_single_turn", "rollout")
        pp.wrap(trainer, "_get_per_token_logps_and_entropies",
                lambda model, *a, **k: "reference" if model is ref and ref is not None else None)
    elif ref is not None:  # DPOTrainer._compute_loss calls self.ref_model(...) under no_grad
        pp.wrap(ref, "forward", "reference")
    pp.wrap(trainer, "compute_loss", "training")
    pp.wrap(trainer.accelerator, "backward", "training")

    class _Steps(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            pp.recording = state.global_step == 1  # the second step: the optimizer states exist

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.ctx = pp.phase("training")
            self.ctx.__enter__()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.ctx.__exit__(None, None, None)

    trainer.add_callback(_Steps())
    trainer.remove_callback(PrinterCallback)  # with disable_tqdm it prints every logged metric (timings included)
    tracker.track_model(trainer.model, grad_hooks=False)
    if ref is not None:
        tracker.track_model(ref, grad_hooks=False)
    with tracker.mode():
        trainer.train()
    return pp
