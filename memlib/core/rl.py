"""Post-training memory: which models are resident in each phase of DPO, PPO and GRPO, per GPU (Chapter 18).

A post-training step is a sequence of phases — generate (rollout), score (reference, reward, critic forwards),
train (the policy's, and PPO's critic's, forward + backward + optimizer step) — and each GPU's memory in a phase
is what stays resident through every phase (trained models' weights and optimizer states, frozen models' weights,
a colocated rollout engine that is not asleep) plus that phase's own working set. :func:`estimate_rl` composes
the public estimators: :func:`memlib.core.estimate.estimate_training` for each trained model,
:func:`memlib.core.estimate.estimate_inference` for frozen weights, :func:`memlib.core.inference.kv_cache_bytes`,
:func:`memlib.core.serve.serve_kv_bytes_per_token` and :func:`memlib.core.inference.forward_activation_bytes`
for generation and no-grad forwards.

Sources (pinned): TRL 1.16.0 (``trl/trainer/grpo_trainer.py``, ``trl/trainer/dpo_trainer.py``,
``trl/trainer/utils.py``: ``add_fused_lm_head``, ``trl/kernels/chunked_logprob.py``: ``ChunkedLogProbFunction``);
vLLM's sleep mode (``vllm/device_allocator/cumem.py``: ``CuMemAllocator.sleep``, ``LLM.sleep(level)``); verl
(HybridFlow, Sheng et al. 2024) and OpenRLHF (Hu et al. 2024) for PPO's four models.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .configs import ModelConfig, load_config
from .errors import MemlibError, check_choice, check_positive
from .estimate import estimate_inference, estimate_training
from .inference import forward_activation_bytes, kv_cache_bytes
from .serve import serve_kv_bytes_per_token
from .setup import TrainingSetup

__all__ = ["ALGOS", "ROLLOUTS", "ENGINES", "REFERENCES", "SLEEP_LEVELS", "TRL_TOKEN_CHUNK", "TRL_VOCAB_CHUNK",
           "RLSetup", "RLPhase", "RLEstimate", "RLPlanStep", "RLPlan", "estimate_rl", "plan_rl",
           "logprob_head_bytes"]

ALGOS = ("dpo", "ppo", "grpo")
ROLLOUTS = ("colocated", "separate")
ENGINES = ("vllm", "hf")
REFERENCES = ("model", "lora", "none")
SLEEP_LEVELS = (0, 1, 2)
#: ``trl/kernels/chunked_logprob.py`` (TRL 1.16.0): ``TOKEN_CHUNK_SIZE`` rows and ``_CHUNKED_LOGPROB_CHUNK_SIZE``
#: (``trl/trainer/utils.py``) vocabulary columns per tile of the fused LM head's logits buffer ``mm_buf``.
TRL_TOKEN_CHUNK = 4096
TRL_VOCAB_CHUNK = 32768

ModelLike = str | Path | dict[str, Any] | ModelConfig


@dataclass(frozen=True)
class RLSetup:
    """One post-training step: the algorithm, its batch and where the rollout runs. Introduced in Chapter 18.

    Attributes:
        algo: ``dpo``, ``ppo`` or ``grpo``.
        prompts: prompts per GPU per step (DPO: preference pairs per GPU).
        group: completions per prompt (GRPO's G, TRL's ``num_generations``); 1 for PPO by default, DPO takes 1.
        prompt_len: prompt tokens.
        completion_len: completion tokens (DPO: of the chosen and of the rejected answer).
        reference: ``model`` (a frozen copy), ``lora`` (the policy with its adapter disabled; needs a LoRA
            policy) or ``none`` (GRPO's ``beta=0``; DPO's precomputed reference log-probs).
        rollout: ``colocated`` (the engine shares the training GPUs) or ``separate`` (its own GPUs).
        engine: ``vllm`` or ``hf`` (the trainer's own ``model.generate``: no second copy of the weights; always
            colocated, no sleep mode). DPO generates nothing.
        sleep_level: vLLM's sleep mode while the colocated trainer trains: 0 (awake: weights and KV cache stay),
            1 (weights offloaded to CPU memory, KV cache discarded), 2 (both discarded); None: 1 for a colocated
            vLLM engine, else 0.
        rollout_tp: the rollout engine's tensor-parallel degree.
        offload_idle: move what a phase does not use to CPU memory between phases (verl's ``param_offload`` /
            ``optimizer_offload``): the optimizer states outside the training phase, frozen models outside their
            forward.
        critic: PPO's value model (None: the policy's architecture); only PPO has one.
        reward_model: a reward model's architecture (PPO default: the policy's; GRPO default: none, rule-based).
        kv_dtype: the rollout's KV cache dtype (default: the weights' 16-bit dtype).

    Raises:
        MemlibError: on construction, one line naming the bad value or combination and the valid choices.
    """

    algo: str = "grpo"
    prompts: int = 1
    group: int | None = None
    prompt_len: int = 512
    completion_len: int = 1024
    reference: str = "model"
    rollout: str = "colocated"
    engine: str = "vllm"
    sleep_level: int | None = None
    rollout_tp: int = 1
    offload_idle: bool = False
    critic: ModelLike | None = None
    reward_model: ModelLike | None = None
    kv_dtype: str = "bf16"

    def __post_init__(self) -> None:
        check_choice("algo", self.algo, ALGOS)
        check_choice("reference", self.reference, REFERENCES)
        check_choice("rollout", self.rollout, ROLLOUTS)
        check_choice("engine", self.engine, ENGINES)
        engine_sleeps = self.algo != "dpo" and self.engine == "vllm" and self.rollout == "colocated"
        if self.sleep_level is None:
            object.__setattr__(self, "sleep_level", 1 if engine_sleeps else 0)
        check_choice("sleep level", self.sleep_level, SLEEP_LEVELS)
        if self.algo == "dpo" and self.sleep_level != 0:
            raise MemlibError(f"sleep level {self.sleep_level} is a rollout engine's; DPO generates nothing "
                              "(expected sleep level: 0)")
        for name in ("prompts", "prompt_len", "completion_len", "rollout_tp"):
            object.__setattr__(self, name, check_positive(name, getattr(self, name)))
        group = self.group if self.group is not None else (8 if self.algo == "grpo" else 1)
        group = check_positive("group", group)
        object.__setattr__(self, "group", group)
        if self.algo == "grpo" and group < 2:
            raise MemlibError(f"group must be ≥ 2 for GRPO (its advantage is relative to the group); got {group}")
        if self.algo == "dpo" and group != 1:
            raise MemlibError(f"group {group} needs a rollout; DPO generates nothing (expected algo: grpo, ppo)")
        if self.critic is not None and self.algo != "ppo":
            raise MemlibError(f"a critic is PPO's value model; algo {self.algo!r} has none (expected algo: ppo)")
        if self.algo == "dpo" and self.reward_model is not None:
            raise MemlibError("DPO has no reward model (the preference pairs replace it); expected algo: ppo, grpo")
        if self.algo == "dpo" and self.rollout == "separate":
            raise MemlibError("rollout 'separate' places a rollout engine; DPO generates nothing (expected rollout: "
                              "colocated)")
        if self.engine == "hf" and self.rollout == "separate":
            raise MemlibError("rollout 'separate' needs a rollout engine (engine 'hf' generates with the trainer's "
                              "own model); expected engine: vllm")
        if self.rollout == "separate" and self.sleep_level != 0:
            raise MemlibError(f"sleep level {self.sleep_level} applies to a colocated engine; with rollout "
                              "'separate' expected sleep level: 0")
        if self.engine == "hf" and self.sleep_level != 0:
            raise MemlibError(f"sleep level {self.sleep_level} is vLLM's; engine 'hf' expected sleep level: 0")
        if self.rollout_tp != 1 and self.engine == "hf":
            raise MemlibError(f"rollout_tp {self.rollout_tp} is the rollout engine's; engine 'hf' expected: 1")

    @property
    def completions(self) -> int:
        """Sequences per GPU per step: prompts × group (DPO: chosen + rejected, 2 × pairs)."""
        return 2 * self.prompts if self.algo == "dpo" else self.prompts * (self.group or 1)

    @property
    def seq_len(self) -> int:
        """Tokens per trained sequence: prompt + completion."""
        return self.prompt_len + self.completion_len


@dataclass(frozen=True)
class RLPhase:
    """One phase of the step on one kind of GPU.

    Attributes:
        name: ``rollout``, ``reference``, ``reward``, ``values``, ``training`` or ``critic training``.
        gpus: ``trainer`` or ``rollout`` (the separate rollout GPUs).
        peak_bytes: the phase's peak per GPU.
        resident: bytes per GPU of what is resident in the phase, by component (the timeline's rows);
            ``working`` is the phase's own transient (activations, logits tiles, backward temporaries).
    """

    name: str
    gpus: str
    peak_bytes: int
    resident: dict[str, int]


@dataclass(frozen=True)
class RLEstimate:
    """Estimated post-training memory per GPU, phase by phase. Introduced in Chapter 18.

    Attributes:
        phases: the phases in step order.
        peak_bytes: the largest phase peak (over trainer and rollout GPUs).
        trained_models: the models with gradients and optimizer states (policy; PPO's critic too).
        frozen_models: the models held for forwards only (reference, reward model).
        cpu_bytes: host memory per GPU of what is offloaded (vLLM level-1 weights, ``offload_idle``).
        settings: the inputs, echoed.
    """

    phases: tuple[RLPhase, ...]
    peak_bytes: int
    trained_models: tuple[str, ...]
    frozen_models: tuple[str, ...]
    cpu_bytes: int
    settings: dict[str, Any] = field(default_factory=dict)

    def phase(self, name: str) -> RLPhase:
        """The phase called ``name``."""
        for p in self.phases:
            if p.name == name:
                return p
        raise MemlibError(f"unknown phase {name!r}; expected one of: {', '.join(p.name for p in self.phases)}")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (bytes are ints)."""
        return asdict(self)


def logprob_head_bytes(model: ModelLike, tokens: int, compute_bytes: int, *, backward: bool = False) -> int:
    """Bytes of TRL's fused log-prob LM head beyond the backbone (TRL 1.16.0). Introduced in Chapter 18.

    ``add_fused_lm_head`` (``trl/trainer/utils.py``) never materializes the (tokens, V) logits: the
    ``ChunkedLogProbFunction`` (``trl/kernels/chunked_logprob.py``) projects into one buffer ``mm_buf`` of
    min(tokens, 4096) × 32768 elements in the compute dtype, whatever the vocabulary (a 256-token vocabulary gets
    the same 32768 columns), plus seven fp32 per-token statistics. Its backward allocates the buffer again with
    fp32 accumulators for the hidden states' gradient (tokens × h) and the head's (V × h).

    Args:
        model: the model.
        tokens: positions scored (batch × (sequence − 1)).
        compute_bytes: bytes of the compute dtype (4 in fp32, 2 under bf16 autocast).
        backward: the backward's working set instead of the forward's.

    Returns:
        Bytes.
    """
    cfg = load_config(model)
    n = check_positive("tokens", tokens)
    tile = min(n, TRL_TOKEN_CHUNK) * TRL_VOCAB_CHUNK * compute_bytes
    if not backward:
        return tile + 7 * 4 * n
    return tile + 4 * n * cfg.hidden_size + 4 * cfg.vocab_size * cfg.hidden_size


def _frozen_weights(model: ModelLike, train: TrainingSetup) -> int:
    """A frozen copy's weights per GPU: the trained model's dtype, sharded by ZeRO-3/FSDP."""
    fmt = "fp32" if train.precision == "fp32" or train.autocast else "bf16"
    w = estimate_inference(model, batch_size=1, seq_len=1, weights=fmt).weights_bytes
    return -(-w // train.num_gpus) if train.zero_stage == 3 else w


def _scoring_forward(model: ModelLike, rl: RLSetup, train: TrainingSetup, head: bool = True) -> int:
    """A no-grad forward over the step's sequences (per GPU): the widest layer moment or the log-prob head."""
    b, s = rl.completions, rl.seq_len
    act = 4 if train.precision == "fp32" else 2
    body = forward_activation_bytes(model, b * s, b, act)
    if not head:
        return body
    h = load_config(model).hidden_size  # after the backbone: its output and the shifted copy the head reads
    return max(body, 2 * act * b * s * h + logprob_head_bytes(model, b * (s - 1), act))


def estimate_rl(model: ModelLike, rl: RLSetup | None = None, train: TrainingSetup | None = None) -> RLEstimate:
    """Estimate each phase's peak per GPU of one DPO, PPO or GRPO step. Introduced in Chapter 18.

    Every phase holds the *resident* set — each trained model's weights and optimizer states (gradients are freed
    by ``zero_grad(set_to_none=True)`` between steps), each frozen model's weights, a colocated vLLM engine's
    weights and KV pool unless asleep — plus its working set:

    * rollout: the KV cache of prompts × G sequences of prompt + completion tokens and the prefill's widest
      moment (``engine="hf"``: TRL's ``model.generate`` path, ``GRPOTrainer._generate_single_turn``; ``vllm``: a
      second copy of the weights in 16 bits split over ``rollout_tp`` GPUs, its KV split the same way);
    * reference / reward / values: a no-grad forward over those sequences (TRL's ``_get_per_token_logps_and_
      entropies`` with ``self.ref_model``, its fused log-prob head, :func:`logprob_head_bytes`); the reference is
      dropped with ``reference="none"`` (GRPO ``beta=0``: ``self.ref_model = None``);
    * training: :func:`memlib.core.estimate.estimate_training` of the policy at prompts × G sequences (DPO: 2 ×
      pairs, chosen and rejected in one batch) plus the fused head's backward; DPO's reference forward runs inside
      ``DPOTrainer._compute_loss`` after the policy's forward, so its moment holds the policy's saved activations;
    * PPO adds a critic (trained: its own ``estimate_training``) and a reward model (frozen).

    Args:
        model: the policy (shipped name, config.json path, dict or ModelConfig).
        rl: the step (default :class:`RLSetup`).
        train: the trainer's layout (precision, optimizer, ZeRO stage, GPUs, LoRA...); its ``batch_size`` and
            ``seq_len`` are replaced by the step's.

    Returns:
        The estimate.

    Raises:
        MemlibError: a bad combination (``reference="lora"`` without a LoRA policy).

    Limitations:
        No CUDA context, CUDA graphs or NCCL buffers; vLLM's KV pool is counted as the tokens the step needs, not
        as ``gpu_memory_utilization`` × the GPU; the critic's scalar head is taken as the LM head; the weight
        sync between the trainer's layout and the engine's (a gathered layer at a time) is not counted.
    """
    cfg = load_config(model)
    rl = rl if rl is not None else RLSetup()
    train = train if train is not None else TrainingSetup()
    if rl.reference == "lora" and train.method == "full":
        raise MemlibError("reference 'lora' disables the policy's adapter; it needs method lora or qlora "
                          "(got method 'full'); expected reference: model, none")
    t = replace(train, batch_size=rl.completions, seq_len=rl.seq_len)
    policy = estimate_training(cfg, t)
    act = 4 if t.precision == "fp32" else 2
    scored = rl.completions * (rl.seq_len - 1)
    resident: dict[str, int] = {"policy weights": policy.params_bytes, "policy optimizer": policy.optimizer_bytes}
    frozen: dict[str, int] = {}
    if rl.reference == "model":
        frozen["reference weights"] = _frozen_weights(cfg, t)
    reward = rl.reward_model if rl.reward_model is not None else (cfg if rl.algo == "ppo" else None)
    if reward is not None:
        frozen["reward weights"] = _frozen_weights(reward, t)
    critic = None
    if rl.algo == "ppo":
        critic = estimate_training(rl.critic if rl.critic is not None else cfg, t)
        resident.update({"critic weights": critic.params_bytes, "critic optimizer": critic.optimizer_bytes})
    cpu = 0
    idle = dict(resident)
    if rl.offload_idle:  # optimizer states and frozen weights wait in CPU memory outside their phases
        for k in [k for k in idle if k.endswith("optimizer")]:
            cpu += idle.pop(k)
        cpu += sum(frozen.values())
        idle_frozen: dict[str, int] = {}
    else:
        idle_frozen = dict(frozen)
    engine_awake: dict[str, int] = {}
    phases: list[RLPhase] = []

    def add(name: str, parts: dict[str, int], working: int, gpus: str = "trainer") -> None:
        parts = {k: v for k, v in parts.items() if v} | {"working": working}
        phases.append(RLPhase(name, gpus, sum(parts.values()), parts))

    if rl.algo != "dpo":
        seqs = rl.completions
        if rl.engine == "hf":  # the trainer's model generates: its KV cache (a DynamicCache) and the prefill
            kv = kv_cache_bytes(cfg, rl.seq_len, seqs, "fp32" if act == 4 else rl.kv_dtype)
            prefill = forward_activation_bytes(cfg, seqs * rl.prompt_len, seqs, act)
            add("rollout", idle | idle_frozen | {"KV cache": kv}, prefill)
        else:
            tp = rl.rollout_tp
            w = -(-estimate_inference(cfg, batch_size=1, seq_len=1, weights="bf16").weights_bytes // tp)
            kv = seqs * tp * rl.seq_len * serve_kv_bytes_per_token(cfg, rl.kv_dtype, tp)  # the TP group's sequences
            prefill = forward_activation_bytes(cfg, seqs * tp * rl.prompt_len, seqs * tp, 2, tp)
            engine = {"rollout weights": w, "KV cache": kv}
            if rl.rollout == "separate":
                add("rollout", engine, prefill, gpus="rollout")
            else:
                add("rollout", idle | idle_frozen | engine, prefill)
                if rl.sleep_level == 0:
                    engine_awake = engine
                elif rl.sleep_level == 1:
                    cpu += w  # CuMemAllocator.sleep(offload_tags=("weights",)): weights copied to pinned host memory
        for name, m in (("reward", reward), ("reference", cfg if rl.reference == "model" else None)):
            if m is None:
                continue
            key = f"{name} weights"
            add(name, idle | idle_frozen | {key: frozen[key]} | engine_awake, _scoring_forward(m, rl, t, name != "reward"))
        if rl.reference == "lora":
            add("reference", idle | idle_frozen | engine_awake, _scoring_forward(cfg, rl, t))
        if critic is not None:
            add("values", idle | idle_frozen | engine_awake, _scoring_forward(
                rl.critic if rl.critic is not None else cfg, rl, t, head=False))
    train_resident = idle | idle_frozen | engine_awake
    train_resident.update({"policy weights": policy.params_bytes, "policy optimizer": policy.optimizer_bytes})
    if rl.algo == "dpo" and rl.reference != "none":  # DPOTrainer._compute_loss: policy forward, then the reference's
        # saved activations less the fp32 logits' log-softmax that TRL's fused head never makes (4·T·V)
        saved = (policy.activations_bytes or 0) - 4 * rl.completions * rl.seq_len * cfg.vocab_size
        ref = {"reference weights": frozen.get("reference weights", 0)}
        add("reference", train_resident | ref | {"policy activations": saved}, _scoring_forward(cfg, rl, t))
    head = logprob_head_bytes(cfg, scored, act, backward=True)
    add("training", train_resident, policy.total_bytes - policy.params_bytes - policy.optimizer_bytes + head)
    if critic is not None:
        cr = idle | idle_frozen | engine_awake | {"critic weights": critic.params_bytes,
                                                  "critic optimizer": critic.optimizer_bytes}
        add("critic training", cr, critic.total_bytes - critic.params_bytes - critic.optimizer_bytes)
    trained = ("policy", "critic") if critic is not None else ("policy",)
    frozen_names = tuple(k.removesuffix(" weights") for k in frozen)
    settings = {"model": cfg.name, **{k: (v if isinstance(v, (int, str, bool)) or v is None else str(v))
                                      for k, v in asdict(rl).items()},
                "group": rl.group, "completions": rl.completions, "seq_len": rl.seq_len,
                "precision": t.precision, "optimizer": t.optimizer, "zero_stage": t.zero_stage,
                "num_gpus": t.num_gpus, "method": t.method, "framework": t.framework}
    return RLEstimate(tuple(phases), max(p.peak_bytes for p in phases), trained, frozen_names, cpu, settings)


@dataclass(frozen=True)
class RLPlanStep:
    """One rung of :func:`plan_rl`: the technique added, the settings and the peak per GPU.

    Attributes:
        technique: what this rung adds.
        settings: the rung's step and layout settings.
        per_gpu_bytes: the estimate's peak (over phases and GPU kinds).
        reserve_bytes: CUDA context + fragmentation beside it (:func:`memlib.core.inference.reserve_bytes`).
        fits: per_gpu_bytes + reserve_bytes ≤ the GPU's memory.
    """

    technique: str
    settings: dict[str, Any]
    per_gpu_bytes: int
    reserve_bytes: int
    fits: bool


@dataclass(frozen=True)
class RLPlan:
    """The ladder of :func:`plan_rl` and the first rung that fits (None when none does). Chapter 18."""

    steps: tuple[RLPlanStep, ...]
    chosen: RLPlanStep | None
    gpu_memory_bytes: int
    settings: dict[str, Any]

    @property
    def fits(self) -> bool:
        """True when some rung fits."""
        return self.chosen is not None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self) | {"fits": self.fits}


def plan_rl(model: ModelLike, rl: RLSetup, *, num_gpus: int = 1, gpu_memory: int | str = "80GiB",
            reserve: int | str = "1GiB") -> RLPlan:
    """Climb a ladder of post-training memory techniques until the step fits. Introduced in Chapter 18.

    Rungs, each keeping the ones before: bf16-mixed DeepSpeed ZeRO-0 (the plain layout); ZeRO-3 (weights,
    gradients and states of the trained models, and the frozen models' weights, sharded over the GPUs); vLLM
    sleep level 2 where the rollout is colocated (nothing of the engine stays while training); full activation
    recomputation; ``offload_idle`` (optimizer states and frozen models in CPU memory outside their phases);
    LoRA with the adapter-disabled policy as the reference (no reference copy, no full optimizer states).

    Args:
        model: the policy.
        rl: the step (its sleep level, reference and engine are the first rung's).
        num_gpus: training GPUs.
        gpu_memory: one GPU's memory (bytes or a size such as ``"80GiB"``).
        reserve: CUDA context and workspaces kept free per GPU; 5 % of the estimate is added for fragmentation.

    Returns:
        The plan.
    """
    from .dtypes import parse_size
    from .inference import reserve_bytes

    mem = parse_size(gpu_memory) if isinstance(gpu_memory, str) else check_positive("gpu_memory", gpu_memory)
    res = parse_size(reserve) if isinstance(reserve, str) else int(reserve)
    n = check_positive("num_gpus", num_gpus)
    train = TrainingSetup(precision="bf16-mixed", framework="deepspeed", num_gpus=n)
    colocated_vllm = rl.algo != "dpo" and rl.engine == "vllm" and rl.rollout == "colocated"
    rungs: list[tuple[str, RLSetup, TrainingSetup]] = [("DeepSpeed ZeRO-0, bf16-mixed", rl, train)]
    train = replace(train, zero_stage=3)
    rungs.append(("ZeRO-3 (all models sharded)", rl, train))
    if colocated_vllm and rl.sleep_level != 2:
        rl = replace(rl, sleep_level=2)
        rungs.append(("vLLM sleep level 2", rl, train))
    train = replace(train, recompute="full")
    rungs.append(("full recomputation", rl, train))
    rl = replace(rl, offload_idle=True)
    rungs.append(("offload idle states to CPU", rl, train))
    if rl.algo != "ppo":
        rl = replace(rl, reference="lora" if rl.reference == "model" else rl.reference)
        rungs.append(("LoRA (reference = adapter off)", rl, replace(train, method="lora")))
    steps = []
    for name, r, t in rungs:
        est = estimate_rl(model, r, t)
        rb = reserve_bytes(est.peak_bytes, cuda_context_bytes=res)
        steps.append(RLPlanStep(name, {"zero_stage": t.zero_stage, "recompute": t.recompute, "method": t.method,
                                       "sleep_level": r.sleep_level, "offload_idle": r.offload_idle,
                                       "reference": r.reference}, est.peak_bytes, rb, est.peak_bytes + rb <= mem))
    chosen = next((s for s in steps if s.fits), None)
    return RLPlan(tuple(steps), chosen, mem, {"model": load_config(model).name, "algo": rl.algo, "num_gpus": n,
                                              "group": rl.group, "prompts": rl.prompts, "prompt_len": rl.prompt_len,
                                              "completion_len": rl.completion_len, "rollout": rl.rollout})
