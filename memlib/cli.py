"""The ``memlib`` command line: params, train, infer, plan, serve, trace (Chapter 1), oom (Chapter 16), rl
(Chapter 18), drill (Drills part)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from .core.choices import (ATTENTION, FRAMEWORKS, GRAD_ACCUM_DTYPES, KV_DTYPES, LORA_TARGETS, METHODS, OFFLOAD,
                           OPTIMIZER_IMPLS, OPTIMIZER_SOURCES,
                           OPTIMIZERS, PRECISIONS, FP8_RECIPES, LOSSES, RECOMPUTE, SCHEDULES, WEIGHT_FORMATS, ZERO_STAGES, OneLineParser, positive_int)
from .core.configs import shipped_models
from .core.dtypes import GiB
from .core.errors import MemlibError
from .cli_text import _glance, _parallel_plan_text, _plan_text, _serve_glance, _serve_text, _table

__all__ = ["main", "build_parser"]

_Parser = OneLineParser  # one-line errors, exit status 2 (shared with python -m memlib.measure.distributed)
_positive_int = positive_int

#: Two or three examples ending each subcommand's --help (the README's "memlib CLI" section shows the same ones).
EXAMPLES: dict[str, tuple[str, ...]] = {
    "memlib": ("memlib train meta-llama/Llama-3.1-8B --seq 4096 --gpu h100   # does it fit, and by how much",
               "memlib plan llama-2-7b --gpus 8 --gpu-mem 80GiB --batch 4 --seq 4096",
               "memlib serve llama-3-8b --gpu h100 --max-model-len 8192"),
    "params": ("memlib params llama-2-7b", "memlib params Qwen/Qwen2.5-7B-Instruct --json"),
    "train": ("memlib train llama-2-7b --batch 4 --seq 4096 --precision bf16-mixed",
              "memlib train meta-llama/Llama-3.1-8B --seq 4096 --gpu h100",
              "memlib train llama-2-7b --framework deepspeed --zero 2 --gpus 8 --offload optimizer"),
    "infer": ("memlib infer llama-2-7b --batch 8 --seq 2048 --weights fp16",
              "memlib infer meta-llama/Llama-3.1-8B-Instruct --seq 8192 --gpu rtx-4090"),
    "plan": ("memlib plan llama-2-7b --gpus 8 --gpu-mem 80GiB --batch 4 --seq 4096",
             "memlib plan llama-2-70b --job qlora --gpu rtx-4090 --seq 512",
             "memlib plan llama-3.1-405b --parallel --gpus 128 --seq 8192"),
    "serve": ("memlib serve llama-3-8b --gpu h100 --max-model-len 8192",
              "memlib serve Qwen/Qwen2.5-7B-Instruct --gpu l40s --max-model-len 32768 --kv-dtype fp8"),
    "trace": ("memlib trace llama-2-7b --batch 1 --seq 2048",
              "memlib trace llama-2-7b --seq 2048 --framework megatron"),
    "oom": ('memlib oom "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; ...)"',
            "memlib oom - < train.log   # the message from a log, on standard input"),
}


def _add_examples(parser: argparse.ArgumentParser, name: str) -> None:
    """End ``parser``'s --help with the examples of :data:`EXAMPLES` (kept as written, one per line)."""
    if name in EXAMPLES:
        parser.epilog = "examples:\n" + "\n".join(f"  {e}" for e in EXAMPLES[name])
        parser.formatter_class = argparse.RawDescriptionHelpFormatter


def _gpu_arg(text: str) -> str:
    """A --gpu value: a name or alias of memlib's GPU table (``h100`` → ``h100-sxm``), as its table name."""
    from .core.hardware import get_gpu

    try:
        return get_gpu(text).name
    except MemlibError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _fit_flags(p: argparse.ArgumentParser) -> None:
    """--gpu and --reserve of train and infer: the one-line verdict (the planner's fit rule)."""
    from .core.hardware import gpu_names

    p.add_argument("--gpu", type=_gpu_arg, default=None,
                   help=f"say first whether it fits this GPU, and by how much ({', '.join(gpu_names())}; h100, a100 "
                        f"and 4090 are aliases); without it, which common cards it fits")
    p.add_argument("--reserve", default="1GiB",
                   help="CUDA context and workspaces kept free per GPU (default 1GiB); 5%% of the estimate is added "
                        "for fragmentation, as memlib plan does")


def _parallel_flags(p: argparse.ArgumentParser) -> None:
    """Model-parallel degrees (Chapter 15): --gpus is the total, dp = gpus / (tp·pp·cp)."""
    p.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (with --tp)")
    p.add_argument("--pp", type=_positive_int, default=1, help="pipeline stages (default 1)")
    p.add_argument("--micro-batches", type=_positive_int, default=1, help="micro-batches per step (default 1)")
    p.add_argument("--pp-schedule", choices=SCHEDULES, default="1f1b", help="pipeline schedule (default 1f1b)")
    p.add_argument("--cp", type=_positive_int, default=1, help="context-parallel degree (default 1)")
    p.add_argument("--ep", type=_positive_int, default=1, help="expert-parallel degree (default 1)")
    p.add_argument("--etp", type=_positive_int, default=None,
                   help="expert tensor-parallel degree (Megatron-Core MoE folding; default 1 with --ep, else --tp)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``memlib`` (exposed for the docs and tests)."""
    from .core.hardware import gpu_names
    from .core.plan import JOBS

    models_help = (f"shipped model ({', '.join(shipped_models(all_models=True))}), its Hugging Face id "
                   f"(meta-llama/Llama-3.1-8B), an id in the local Hugging Face cache, or a path to a config.json")
    plan_help = (f"shipped model ({', '.join(shipped_models())}), a Hugging Face id or a path to a config.json")
    parser = _Parser(prog="memlib", description="GPU memory estimates and measurements for training and inference.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("params", help="exact parameter count with a breakdown")
    p.add_argument("model", help=models_help)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    t = sub.add_parser("train", help="estimated training memory per GPU")
    t.add_argument("model", nargs="?", help=models_help)
    t.add_argument("--params", type=_positive_int,
                   help="parameter count instead of a model: model states only (weights, gradients, optimizer "
                        "states), no activations")
    t.add_argument("--batch", "--batch-size", type=_positive_int, default=1, help="micro-batch size per GPU (default 1)")
    t.add_argument("--seq", "--seq-len", type=_positive_int, default=512, help="sequence length (default 512)")
    t.add_argument("--precision", choices=PRECISIONS, default="bf16-mixed")
    t.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    t.add_argument("--fp8-recipe", choices=FP8_RECIPES, default="tensorwise",
                   help="with --precision fp8-mixed (Chapter 17): tensorwise (default, torchao), rowwise (torchao) or "
                        "blockwise (DeepSeek-V3: Linear inputs cached in FP8 with 1x128 scales)")
    t.add_argument("--loss", choices=LOSSES, default="standard",
                   help="standard (fp32 log-softmax of all logits saved), chunked (checkpointed chunks of "
                        "--loss-chunk tokens) or fused (Liger's fused linear cross-entropy) (Chapter 17)")
    t.add_argument("--loss-chunk", type=_positive_int, default=1024, help="tokens per chunk of --loss chunked")
    t.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS, default="foreach",
                   help="torch.optim.AdamW implementation: foreach (default, CUDA's), fused or for-loop")
    t.add_argument("--optimizer-source", choices=OPTIMIZER_SOURCES, default="framework",
                   help="DeepSpeed only: framework (default: FusedAdam from the config) or client (a torch.optim "
                        "optimizer passed to deepspeed.initialize, stepped with --optimizer-impl)")
    t.add_argument("--framework", choices=FRAMEWORKS, default="pytorch",
                   help="whose memory layout: pytorch (default: torch.autocast AMP, ZeRO-1 as ZeroRedundancyOptimizer), "
                        "deepspeed (ZeRO 0-3, offload), fsdp2 (ZeRO 2-3) or megatron (tp/pp, distributed optimizer; "
                        "zero 2-3: Megatron-FSDP)")
    t.add_argument("--zero", type=int, choices=ZERO_STAGES, default=0, help="ZeRO stage")
    t.add_argument("--gpus", type=_positive_int, default=1, help="data-parallel GPUs")
    t.add_argument("--bucket-view", action="store_true",
                   help="PyTorch DDP (--framework pytorch, --gpus > 1) with gradient_as_bucket_view=True: the "
                        "gradients are views of the Reducer's buckets (default False, DDP's: one more gradient copy)")
    t.add_argument("--grad-accum", type=_positive_int, default=1,
                   help="micro-batches per optimizer step (gradient accumulation, default 1)")
    t.add_argument("--grad-accum-dtype", choices=GRAD_ACCUM_DTYPES, default="model",
                   help="DeepSpeed's data_types.grad_accum_dtype: model (default) or fp32 (with --zero 1 and "
                        "bf16-mixed: BF16_Optimizer, an unsharded fp32 gradient buffer)")
    t.add_argument("--recompute", choices=RECOMPUTE, default="none")
    t.add_argument("--attention", choices=ATTENTION, default=None,
                   help="default sdpa (eager for gemma2, which transformers runs eager only)")
    t.add_argument("--checkpoint-every", type=_positive_int, default=1,
                   help="with --recompute full: decoder layers per checkpointed segment (default 1)")
    t.add_argument("--offload", choices=OFFLOAD, default="none",
                   help="states kept in CPU memory (params+optimizer needs --zero 3)")
    t.add_argument("--method", choices=METHODS, default="full", help="full fine-tuning, LoRA or QLoRA")
    t.add_argument("--lora-rank", type=_positive_int, default=16, help="LoRA rank (default 16)")
    t.add_argument("--lora-targets", choices=LORA_TARGETS, default="all-linear")
    _parallel_flags(t)
    _fit_flags(t)
    t.add_argument("--json", action="store_true", help="machine-readable output")

    i = sub.add_parser("infer", help="estimated inference memory: weights + KV cache")
    i.add_argument("model", help=models_help)
    i.add_argument("--batch", "--batch-size", type=_positive_int, default=1)
    i.add_argument("--seq", "--seq-len", type=_positive_int, default=2048,
                   help="tokens held per sequence (default 2048)")
    i.add_argument("--weights", choices=tuple(WEIGHT_FORMATS), default="fp16")
    i.add_argument("--kv-dtype", choices=tuple(KV_DTYPES), default="fp16")
    _fit_flags(i)
    i.add_argument("--json", action="store_true", help="machine-readable output")

    pl = sub.add_parser("plan", help="cheapest combination of memory techniques that fits the GPUs")
    pl.add_argument("model", help=plan_help)
    pl.add_argument("--job", choices=JOBS + ("grpo", "dpo", "ppo"), default="train",
                    help="train, lora, qlora, infer; or a post-training step, grpo, dpo, ppo (memlib rl's defaults)")
    pl.add_argument("--gpus", type=_positive_int, default=1, help="number of GPUs (default 1)")
    pl.add_argument("--gpu-mem", default=None,
                    help="memory of one GPU, e.g. 80GiB, 24GiB (default 80GiB; GPU capacities are binary)")
    pl.add_argument("--gpu", type=_gpu_arg, choices=gpu_names(), default=None,
                    help="take the GPU memory from memlib's spec table (GiB) instead of --gpu-mem")
    pl.add_argument("--batch", type=_positive_int, default=1,
                    help="sequences per GPU per optimizer step (training) or concurrent sequences (default 1)")
    pl.add_argument("--seq", type=_positive_int, default=2048, help="sequence length (default 2048)")
    pl.add_argument("--reserve", default="1GiB",
                    help="CUDA context and workspaces kept free per GPU (default 1GiB); 5%% of the estimate is "
                         "added for fragmentation")
    pl.add_argument("--lora-rank", type=_positive_int, default=16)
    pl.add_argument("--grad-accum", type=_positive_int, default=1,
                    help="micro-batches per optimizer step to start from (divides --batch; default 1)")
    pl.add_argument("--framework", choices=FRAMEWORKS, default="pytorch",
                    help="training framework whose layout and rungs the ladder uses (default pytorch; ZeRO-2/3 "
                         "and offload rungs for deepspeed/fsdp2, a 'switch to DeepSpeed' rung for pytorch/megatron;"
                         " --parallel plans Megatron/DeepSpeed layouts)")
    pl.add_argument("--parallel", action="store_true",
                    help="pre-training layout over data, tensor, pipeline and context parallelism (Chapter 15)")
    pl.add_argument("--gpus-per-node", type=_positive_int, default=8, help="GPUs per node for --parallel (default 8)")
    pl.add_argument("--trace-fragmentation", action="store_true",
                    help="replace the 5%% fragmentation allowance by the simulated figure: the chosen step traced on "
                         "the meta device and replayed through the caching allocator (Chapter 16; needs torch)")
    _parallel_flags(pl)
    pl.add_argument("--json", action="store_true", help="machine-readable output")

    from .core.serve import (DEFAULT_BLOCK_SIZE, DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_MAX_NUM_BATCHED_TOKENS,
                        DEFAULT_MAX_NUM_SEQS, SERVE_KV_DTYPES)

    sv = sub.add_parser("serve", help="vLLM-style serving budget: KV blocks and concurrent requests per GPU")
    sv.add_argument("model", help=models_help)
    sv.add_argument("--gpu", default=None, help=f"GPU from memlib's spec table ({', '.join(gpu_names())})")
    sv.add_argument("--gpu-mem", default=None, help="memory of one GPU instead of --gpu, e.g. 80GiB")
    sv.add_argument("--max-model-len", type=_positive_int, required=True,
                    help="tokens per request (prompt + output)")
    sv.add_argument("--gpu-memory-utilization", type=float, default=DEFAULT_GPU_MEMORY_UTILIZATION,
                    help=f"the engine's share of GPU memory, in (0, 1] (default {DEFAULT_GPU_MEMORY_UTILIZATION})")
    sv.add_argument("--kv-dtype", choices=tuple(SERVE_KV_DTYPES), default="fp16")
    sv.add_argument("--weights", choices=tuple(WEIGHT_FORMATS), default="fp16")
    sv.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE,
                    help=f"tokens per KV block, a power of two (default {DEFAULT_BLOCK_SIZE})")
    sv.add_argument("--max-num-batched-tokens", type=_positive_int, default=None,
                    help="tokens per scheduler step / prefill chunk (default: vLLM's for the GPU and version; "
                         f"{DEFAULT_MAX_NUM_BATCHED_TOKENS} with --vllm-version book)")
    sv.add_argument("--max-num-seqs", type=_positive_int, default=None,
                    help="requests per scheduler step (default: vLLM's for the GPU and version; "
                         f"{DEFAULT_MAX_NUM_SEQS} with --vllm-version book)")
    from .core.vllm_engine import CURRENT_VLLM_VERSION, VLLM_ENTRY_POINTS, VLLM_RELEASES

    sv.add_argument("--vllm-version", default=CURRENT_VLLM_VERSION,
                    help=f"the vLLM release whose start-up accounting to follow (rows {', '.join(VLLM_RELEASES)}; "
                         f"default {CURRENT_VLLM_VERSION}); 'book' for Chapter 14's simple model")
    sv.add_argument("--entry-point", choices=VLLM_ENTRY_POINTS, default="serve",
                    help="vllm serve or the LLM class (their batch defaults differ)")
    sv.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    sv.add_argument("--kv-cache-memory", default=None, help="vLLM's --kv-cache-memory, e.g. 20GiB (skips profiling)")
    sv.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel GPUs (default 1)")
    sv.add_argument("--draft", default=None, help="draft model for speculative decoding")
    sv.add_argument("--num-speculative-tokens", type=int, default=0, help="tokens the draft proposes per step")
    sv.add_argument("--prefix-cache-hit-rate", type=float, default=0.0,
                    help="fraction of each request that is a prefix shared by all, in [0, 1) (default 0)")
    sv.add_argument("--json", action="store_true", help="machine-readable output")

    _rl_parser(sub, models_help)

    r = sub.add_parser("trace", help="measure a real training step on the meta device (needs torch)")
    r.add_argument("model", help=models_help)
    r.add_argument("--batch", "--batch-size", type=_positive_int, default=1)
    r.add_argument("--seq", "--seq-len", type=_positive_int, default=512)
    r.add_argument("--precision", choices=PRECISIONS, default="bf16-mixed")
    r.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    r.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS, default="foreach",
                   help="torch.optim.AdamW implementation: foreach (default), fused or for-loop")
    r.add_argument("--attention", choices=ATTENTION, default="sdpa")
    r.add_argument("--recompute", choices=tuple(x for x in RECOMPUTE if x != "selective"), default="none",
                   help="the trace runs transformers' gradient checkpointing (full) or none")
    r.add_argument("--framework", choices=("pytorch", "deepspeed", "megatron"), default="pytorch",
                   help="whose mixed-precision step: pytorch (default: torch.autocast, fp32 weights and grads), "
                        "deepspeed (16-bit weights and grads, fp32 flat master) or megatron (16-bit weights, fp32 "
                        "main_grad buffer and main params); deepspeed and megatron: mixed precisions only. FSDP2 "
                        "is traced from Python on real tensors (memlib.measure.trace.trace_training)")
    r.add_argument("--ddp", action="store_true",
                   help="wrap the model in PyTorch DistributedDataParallel (a one-rank group): its gradient buckets")
    r.add_argument("--bucket-view", action="store_true", help="with --ddp: gradient_as_bucket_view=True")
    r.add_argument("--expandable-segments", action="store_true",
                   help="also replay the step with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (Chapter 16)")
    r.add_argument("--json", action="store_true", help="machine-readable output")
    _oom_parser(sub)
    _drill_parser(sub)
    _add_examples(parser, "memlib")
    for name, sp in sub.choices.items():
        _add_examples(sp, name)
    return parser


def _drill_parser(sub: Any) -> None:
    """``memlib drill`` (Drills part): practise interview questions in the terminal, with Leitner boxes."""
    d = sub.add_parser("drill", help="practise interview questions: reveal, self-grade, remember (Leitner boxes)")
    d.add_argument("--topic", help="one topic (e.g. 'serving', 'OOM & allocator' or oom-allocator)")
    d.add_argument("--frequency", help="high, medium or low: how often interviews ask it")
    d.add_argument("--difficulty", help="E, M or H")
    d.add_argument("--lang", default="en", help="en, zh or both (default en)")
    d.add_argument("--mock", type=_positive_int, metavar="N", help="a timed mock interview of N questions")
    d.add_argument("--seconds", type=_positive_int, default=None, help="seconds per mock question (default 120)")
    d.add_argument("--seed", type=int, help="the same questions for the same seed")
    d.add_argument("--count", type=_positive_int, default=10, help="questions to ask (default 10)")
    d.add_argument("--progress", help="progress file (default $MEMLIB_DRILL_PROGRESS or ~/.memlib/drill_progress.json)")
    d.add_argument("--json", action="store_true", help="print the chosen questions with answers as JSON; ask nothing")
    d.add_argument("--sheet", choices=("questions", "numbers"),
                   help="print a printable instead: the questions only, or the numbers to know")


def _drill_run(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Run ``memlib drill``: choose the cards, then print them (--json) or ask them one by one."""
    from pathlib import Path

    from .core.errors import check_choice
    from .drills.practice import LANGS, Progress, default_progress_path, select_cards
    from .drills.terminal import DEFAULT_MOCK_SECONDS, card_dict, drill_session

    check_choice("lang", args.lang, LANGS)
    if args.sheet:
        from .drills.printables import numbers_to_know, question_sheet_markdown

        if args.sheet == "questions":
            text = question_sheet_markdown(args.lang, args.frequency)
            return {"sheet": "questions", "markdown": text}, text
        facts = [{"rule": f.rule, "example": f.example, "value": f.value} for f in numbers_to_know()]
        return {"sheet": "numbers", "facts": facts}, "\n".join(f"{f['rule']}\n    {f['example']}: {f['value']}"
                                                              for f in facts)
    path = Path(args.progress).expanduser() if args.progress else default_progress_path()
    progress = Progress.load(path)
    count = args.mock or args.count
    cards = select_cards(count, args.seed, topic=args.topic, frequency=args.frequency,
                         difficulty=args.difficulty, progress=progress)
    if args.json:
        return {"progress_file": str(path), "questions": [card_dict(c, args.lang) for c in cards]}, ""
    print(f"progress file: {path}")
    seconds = (args.seconds or DEFAULT_MOCK_SECONDS) if args.mock else None
    out = drill_session(cards, lang=args.lang, progress=progress, path=path, ask=input, say=print,
                        mock_seconds=seconds)
    lines = [f"asked {out['asked']}; progress saved to {path}"]
    if out["weakest_topics"]:
        lines.append("weakest topics: " + ", ".join(out["weakest_topics"]))
    if "mock" in out:
        m = out["mock"]
        lines.append(f"mock interview: {m['good']}/{m['asked']} good")
        lines += [f"  {t:<26} {r['good']}/{r['asked']} good, {r['over_time']} over time" for t, r in m["topics"].items()]
    return out, "\n".join(lines)


def _oom_parser(sub: Any) -> None:
    """``memlib oom "<message>"`` (Chapter 16): read a CUDA out-of-memory message, give a verdict and advice."""
    o = sub.add_parser("oom", help="explain a PyTorch CUDA out-of-memory message (paste it, or - for stdin)")
    o.add_argument("message", help="the OOM message (quote it), or - to read it from stdin")
    o.add_argument("--json", action="store_true", help="machine-readable output")


def _oom_run(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Run ``memlib oom``: :func:`memlib.core.oom.parse_oom`, then the verdict and what to do."""
    from .core.oom import oom_dict, oom_text, parse_oom

    report = parse_oom(sys.stdin.read() if args.message == "-" else args.message)
    return oom_dict(report), oom_text(report)


def _run(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    if args.command == "oom":
        return _oom_run(args)
    if args.command == "drill":
        return _drill_run(args)
    if args.command == "params":
        from .measure.hf_config import count_params_any, load_any_config  # any causal LM transformers knows

        pc = count_params_any(args.model)
        data = pc.as_dict()
        if load_any_config(args.model).moe is not None:  # MoE: what one token passes through
            from .core.families_moe import moe_params

            data["active_params"] = moe_params(args.model).active
        return data, _table(list(data.items()), f"parameters of {args.model}")
    if args.command == "train":
        from .core.configs import load_config
        from .core.estimate import estimate_training

        if args.model is None and args.params is None:
            raise MemlibError("give a model (shipped name or config.json) or --params N")
        cfg = None if args.model is None else load_config(args.model)  # the one load of this call
        attention = args.attention
        if attention is None:  # transformers has no sdpa attention for gemma2 (soft-capped logits)
            attention = "eager" if cfg is not None and cfg.model_type == "gemma2" else "sdpa"
        setup = _training_setup(args, attention)
        est = estimate_training(cfg, setup, params=args.params)
        data = est.as_dict()
        rows = [(k, v) for k, v in data.items() if k != "settings"]
        head = ", ".join(f"{k}={v}" for k, v in est.settings.items())
        text = _table(rows, f"training memory per GPU ({head})")
        if args.model is None:
            text += ("\nnote: --params counts model states only (weights, gradients, optimizer states), no "
                     "activations; give a model (shipped name or config.json) to add them")
        from .core.categories import estimate_by_category

        glance = _glance(data, est.total_bytes, estimate_by_category(est), args, per_gpu=args.gpus > 1)
        return data, glance + "\n" + text
    if args.command == "infer":
        from .core.estimate import estimate_inference
        from .core.setup import InferenceSetup

        inf = estimate_inference(args.model, InferenceSetup(batch_size=args.batch, seq_len=args.seq,
                                                            weights=args.weights, kv_dtype=args.kv_dtype))
        data = inf.as_dict()
        rows = [(k, v) for k, v in data.items() if k != "settings"]
        head = ", ".join(f"{k}={v}" for k, v in inf.settings.items())
        glance = _glance(data, inf.total_bytes, {"weights": inf.weights_bytes, "kv_cache": inf.kv_cache_bytes}, args)
        return data, glance + "\n" + _table(rows, f"inference memory ({head})")
    if args.command == "rl":
        return _rl_run(args)
    if args.command == "plan":
        from .core.plan import plan

        if args.job in ("grpo", "dpo", "ppo"):
            return _rl_plan(args)

        if args.gpu is not None and args.gpu_mem is not None:
            raise MemlibError("give --gpu or --gpu-mem, not both")
        if args.gpu is not None:
            from .core.hardware import get_gpu

            gpu_mem: int | str = get_gpu(args.gpu).memory_bytes
        else:
            gpu_mem = args.gpu_mem or "80GiB"
        par = (args.tp, args.pp, args.cp, args.ep) != (1, 1, 1, 1) or args.sequence_parallel or \
            args.micro_batches != 1 or args.pp_schedule != "1f1b"
        if par and not args.parallel:
            raise MemlibError("--tp, --pp, --cp, --ep, --sequence-parallel, --micro-batches and --pp-schedule "
                              "need --parallel (the 3D/4D ladder)")
        if args.parallel:
            from .core.plan import plan_parallel

            if args.job != "train":
                raise MemlibError(f"--parallel plans job 'train', not {args.job!r}; expected --job train")
            pres = plan_parallel(args.model, num_gpus=args.gpus, gpu_memory=gpu_mem, seq_len=args.seq,
                                 batch_size=args.batch, gpus_per_node=args.gpus_per_node,
                                 micro_batches=args.micro_batches if args.micro_batches != 1 else None,
                                 pp_schedule=args.pp_schedule, reserve=args.reserve,
                                 tp=args.tp if args.tp != 1 else None, pp=args.pp if args.pp != 1 else None,
                                 cp=args.cp if args.cp != 1 else None, ep=args.ep if args.ep != 1 else None)
            return pres.as_dict(), _parallel_plan_text(pres)
        result = plan(args.model, job=args.job, num_gpus=args.gpus, gpu_memory=gpu_mem, batch_size=args.batch,
                      seq_len=args.seq, reserve=args.reserve, lora_rank=args.lora_rank, framework=args.framework,
                      grad_accum=args.grad_accum)
        if args.trace_fragmentation:
            result = _plan_traced_fragmentation(args, result, gpu_mem)
        return result.as_dict(), _plan_text(result)
    if args.command == "serve":
        from .core.serve import serve

        if (args.gpu is None) == (args.gpu_mem is None):
            raise MemlibError("give --gpu NAME or --gpu-mem SIZE (one of them)")
        fit = serve(args.model, max_model_len=args.max_model_len, gpu=args.gpu, gpu_memory=args.gpu_mem,
                    gpu_memory_utilization=args.gpu_memory_utilization, kv_dtype=args.kv_dtype,
                    weights=args.weights, block_size=args.block_size,
                    max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                    tensor_parallel=args.tp, draft=args.draft, num_speculative_tokens=args.num_speculative_tokens,
                    prefix_cache_hit_rate=args.prefix_cache_hit_rate,
                    vllm_version=None if args.vllm_version == "book" else args.vllm_version,
                    entry_point=args.entry_point, enforce_eager=args.enforce_eager,
                    kv_cache_memory=None if args.kv_cache_memory is None else _parse_size(args.kv_cache_memory))
        return fit.as_dict(), _serve_glance(fit, args.gpu) + "\n" + _serve_text(fit)
    from .measure.trace import trace_training

    res = trace_training(args.model, batch_size=args.batch, seq_len=args.seq, precision=args.precision,
                         optimizer=args.optimizer, attention=args.attention, recompute=args.recompute,
                         optimizer_impl=args.optimizer_impl, framework=args.framework,
                         data_parallel="ddp" if args.ddp else "none", gradient_as_bucket_view=args.bucket_view,
                         reserved=True, expandable_segments=args.expandable_segments)
    data = res.as_dict()
    rows = [(k, v) for k, v in data.items() if k.endswith("bytes") or k in ("peak_phase", "device")]
    return data, _table(rows, f"traced training step ({res.device} device) of {args.model}")


def _plan_traced_fragmentation(args: argparse.Namespace, result: Any, gpu_mem: int | str) -> Any:
    """``memlib plan --trace-fragmentation``: plan again with the chosen step's simulated fragmentation (Chapter 16).

    The fraction is that of the first plan's chosen step (or its closest rung); rungs the trace cannot run keep the
    5 % allowance. Either way a note says which figure the plan used.
    """
    import dataclasses

    from .core.plan import plan
    from .measure.fragmentation import traced_fragmentation

    if args.job == "infer":
        raise MemlibError("--trace-fragmentation traces a training step; expected --job train, lora or qlora")
    frac, note = traced_fragmentation(args.model, (result.chosen or result.closest).settings)
    if frac is not None:
        result = plan(args.model, job=args.job, num_gpus=args.gpus, gpu_memory=gpu_mem, batch_size=args.batch,
                      seq_len=args.seq, reserve=args.reserve, fragmentation=frac, lora_rank=args.lora_rank,
                      framework=args.framework, grad_accum=args.grad_accum)
    return dataclasses.replace(result, notes=[*result.notes, note])
def _rl_parser(sub: Any, models_help: str) -> None:
    """``memlib rl``: each phase's peak per GPU of one DPO, PPO or GRPO step (Chapter 18)."""
    from .core.rl import ALGOS, ENGINES, REFERENCES, ROLLOUTS, SLEEP_LEVELS

    q = sub.add_parser("rl", help="post-training memory per GPU, phase by phase: DPO, PPO, GRPO (Chapter 18)")
    q.add_argument("model", help=models_help)
    q.add_argument("--algo", choices=ALGOS, required=True)
    q.add_argument("--group", type=_positive_int, default=None,
                   help="completions per prompt (GRPO's G; default 8 for grpo, 1 for ppo)")
    q.add_argument("--prompts", type=_positive_int, default=1, help="prompts (DPO: pairs) per GPU per step")
    q.add_argument("--prompt-len", type=_positive_int, default=512, help="prompt tokens (default 512)")
    q.add_argument("--completion-len", type=_positive_int, default=1024, help="completion tokens (default 1024)")
    q.add_argument("--rollout", choices=ROLLOUTS, default="colocated",
                   help="the rollout engine on the training GPUs (colocated) or on its own (separate)")
    q.add_argument("--engine", choices=ENGINES, default="vllm",
                   help="vllm (a second, 16-bit copy of the weights) or hf (the trainer's model.generate)")
    q.add_argument("--sleep-level", type=int, choices=SLEEP_LEVELS, default=None,
                   help="vLLM sleep mode while training (colocated): 0 awake, 1 weights to CPU, 2 all discarded "
                        "(default 1 colocated, else 0)")
    q.add_argument("--rollout-tp", type=_positive_int, default=1, help="the rollout engine's tensor parallelism")
    q.add_argument("--reference", choices=REFERENCES, default="model",
                   help="a frozen copy (model), the LoRA policy with its adapter off (lora) or none (GRPO beta=0, "
                        "DPO precomputed log-probs)")
    q.add_argument("--offload-idle", action="store_true",
                   help="optimizer states and frozen models in CPU memory outside their phases")
    q.add_argument("--critic", default=None, help="PPO's value model (default: the policy's architecture)")
    q.add_argument("--reward-model", default=None, help="a reward model (PPO default: the policy's architecture)")
    q.add_argument("--gpus", type=_positive_int, default=1, help="training GPUs (default 1)")
    q.add_argument("--zero", type=int, choices=ZERO_STAGES, default=0, help="ZeRO stage of the trainer")
    q.add_argument("--framework", choices=FRAMEWORKS, default="pytorch", help="the trainer's memory layout")
    q.add_argument("--precision", choices=PRECISIONS, default="bf16-mixed")
    q.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    q.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS, default="foreach")
    q.add_argument("--recompute", choices=RECOMPUTE, default="none")
    q.add_argument("--method", choices=METHODS, default="full", help="full fine-tuning, LoRA or QLoRA")
    q.add_argument("--lora-rank", type=_positive_int, default=16)
    q.add_argument("--json", action="store_true", help="machine-readable output")


def _rl_setups(args: argparse.Namespace) -> tuple[Any, Any]:
    """The :class:`memlib.core.rl.RLSetup` and trainer :class:`memlib.core.setup.TrainingSetup` of ``memlib rl``."""
    from .core.rl import RLSetup
    from .core.setup import TrainingSetup

    rl = RLSetup(algo=args.algo, prompts=args.prompts, group=args.group, prompt_len=args.prompt_len,
                 completion_len=args.completion_len, reference=args.reference, rollout=args.rollout,
                 engine=args.engine, sleep_level=args.sleep_level, rollout_tp=args.rollout_tp,
                 offload_idle=args.offload_idle, critic=args.critic, reward_model=args.reward_model)
    train = TrainingSetup(precision=args.precision, optimizer=args.optimizer, optimizer_impl=args.optimizer_impl,
                          zero_stage=args.zero, num_gpus=args.gpus, recompute=args.recompute, method=args.method,
                          lora_rank=args.lora_rank, framework=args.framework)
    return rl, train


def _rl_run(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from .core.rl import estimate_rl

    rl, train = _rl_setups(args)
    est = estimate_rl(args.model, rl, train)
    st = est.settings
    lines = [f"{args.algo.upper()} step of {st['model']} per GPU: {st['completions']} sequences × {st['seq_len']} "
             f"tokens, {st['num_gpus']} GPU(s), ZeRO-{st['zero_stage']}, rollout {st['rollout']} ({st['engine']}"
             f", sleep level {st['sleep_level']})",
             f"  trained: {', '.join(est.trained_models)}; frozen: {', '.join(est.frozen_models) or 'none'}",
             f"  {'phase':<16} {'GPUs':<8} {'peak (GiB)':>10}  resident (GiB)"]
    for ph in est.phases:
        parts = ", ".join(f"{k} {v / GiB:.2f}" for k, v in ph.resident.items())
        lines.append(f"  {ph.name:<16} {ph.gpus:<8} {ph.peak_bytes / GiB:>10.2f}  {parts}")
    lines.append(f"  peak per GPU: {est.peak_bytes:,} B ({est.peak_bytes / GiB:.2f} GiB)"
                 + (f"; CPU memory per GPU {est.cpu_bytes / GiB:.2f} GiB" if est.cpu_bytes else ""))
    return est.as_dict(), "\n".join(lines)


def _rl_plan(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """``memlib plan --job grpo|dpo|ppo``: :func:`memlib.core.rl.plan_rl` with memlib rl's default step."""
    from .core.rl import RLSetup, plan_rl

    if args.gpu is not None:
        from .core.hardware import get_gpu

        mem: int | str = get_gpu(args.gpu).memory_bytes
    else:
        mem = args.gpu_mem or "80GiB"
    res = plan_rl(args.model, RLSetup(algo=args.job, prompts=args.batch), num_gpus=args.gpus, gpu_memory=mem,
                  reserve=args.reserve)
    lines = [f"{args.job.upper()} plan for {res.settings['model']}: {args.gpus} GPU(s) × "
             f"{res.gpu_memory_bytes / GiB:.2f} GiB"]
    for i, s in enumerate(res.steps):
        lines.append(f"  {i:>2}  {s.technique:<34} {s.per_gpu_bytes / GiB:>9.2f} GiB + reserve "
                     f"{s.reserve_bytes / GiB:.2f}  {'fits' if s.fits else 'no'}")
    lines.append(f"fits: {res.chosen.technique}" if res.chosen else "does not fit on any rung")
    return res.as_dict(), "\n".join(lines)


def _training_setup(args: argparse.Namespace, attention: str) -> Any:
    """The :class:`memlib.core.setup.TrainingSetup` of ``memlib train``, built (and validated) once."""
    from .core.setup import TrainingSetup

    return TrainingSetup(batch_size=args.batch, seq_len=args.seq, precision=args.precision, optimizer=args.optimizer,
                         zero_stage=args.zero, num_gpus=args.gpus, recompute=args.recompute, attention=attention,
                         checkpoint_every=args.checkpoint_every, offload=args.offload, method=args.method,
                         lora_rank=args.lora_rank, lora_targets=args.lora_targets, tp=args.tp, pp=args.pp,
                         cp=args.cp, ep=args.ep, sequence_parallel=args.sequence_parallel,
                         micro_batches=args.micro_batches, pp_schedule=args.pp_schedule,
                         optimizer_impl=args.optimizer_impl, framework=args.framework,
                         gradient_as_bucket_view=args.bucket_view, etp=args.etp,
                         grad_accum=args.grad_accum, fp8_recipe=args.fp8_recipe, loss=args.loss,
                         loss_chunk=args.loss_chunk, optimizer_source=args.optimizer_source,
                         grad_accum_dtype=args.grad_accum_dtype)


def _parse_size(text: str) -> int:
    from .core.dtypes import parse_size

    return parse_size(text)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``memlib`` and ``python -m memlib``. Returns the exit status (2 on bad input)."""
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else list(argv)):  # `memlib` alone: the help, not an error
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    try:
        data, text = _run(args)
    except MemlibError as e:
        print(f"memlib: error: {e}", file=sys.stderr)
        return 2
    try:
        print(json.dumps(data, indent=2, sort_keys=False) if args.json else text, flush=True)
    except BrokenPipeError:  # `memlib train ... | head`: the reader left; say nothing more, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
