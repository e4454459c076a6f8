"""The ``memlib`` command line: params, train, infer, plan, serve, trace (Chapter 1), oom (Chapter 16)."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from .core.choices import (ATTENTION, FRAMEWORKS, KV_DTYPES, LORA_TARGETS, METHODS, OFFLOAD, OPTIMIZER_IMPLS,
                           OPTIMIZERS, PRECISIONS, FP8_RECIPES, LOSSES, RECOMPUTE, SCHEDULES, WEIGHT_FORMATS, ZERO_STAGES, OneLineParser, positive_int)
from .core.configs import shipped_models
from .core.dtypes import GB, GiB
from .core.errors import MemlibError

__all__ = ["main", "build_parser"]

_Parser = OneLineParser  # one-line errors, exit status 2 (shared with python -m memlib.measure.distributed)
_positive_int = positive_int


def _parallel_flags(p: argparse.ArgumentParser) -> None:
    """Model-parallel degrees (Chapter 15): --gpus is the total, dp = gpus / (tp·pp·cp)."""
    p.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (with --tp)")
    p.add_argument("--pp", type=_positive_int, default=1, help="pipeline stages (default 1)")
    p.add_argument("--micro-batches", type=_positive_int, default=1, help="micro-batches per step (default 1)")
    p.add_argument("--pp-schedule", choices=SCHEDULES, default="1f1b", help="pipeline schedule (default 1f1b)")
    p.add_argument("--cp", type=_positive_int, default=1, help="context-parallel degree (default 1)")
    p.add_argument("--ep", type=_positive_int, default=1, help="expert-parallel degree (default 1)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``memlib`` (exposed for the docs and tests)."""
    from .core.hardware import gpu_names
    from .core.plan import JOBS

    models_help = f"shipped model ({', '.join(shipped_models(all_models=True))}) or path to a config.json"
    plan_help = f"shipped model ({', '.join(shipped_models())}) or path to a config.json"
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
    t.add_argument("--framework", choices=FRAMEWORKS, default="pytorch",
                   help="whose memory layout: pytorch (default: torch.autocast AMP, ZeRO-1 as ZeroRedundancyOptimizer), "
                        "deepspeed (ZeRO 0-3, offload), fsdp2 (ZeRO 2-3) or megatron (tp/pp, distributed optimizer)")
    t.add_argument("--zero", type=int, choices=ZERO_STAGES, default=0, help="ZeRO stage")
    t.add_argument("--gpus", type=_positive_int, default=1, help="data-parallel GPUs")
    t.add_argument("--bucket-view", action="store_true",
                   help="PyTorch DDP (--framework pytorch, --gpus > 1) with gradient_as_bucket_view=True: the "
                        "gradients are views of the Reducer's buckets (default False, DDP's: one more gradient copy)")
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
    t.add_argument("--json", action="store_true", help="machine-readable output")

    i = sub.add_parser("infer", help="estimated inference memory: weights + KV cache")
    i.add_argument("model", help=models_help)
    i.add_argument("--batch", "--batch-size", type=_positive_int, default=1)
    i.add_argument("--seq", "--seq-len", type=_positive_int, default=2048,
                   help="tokens held per sequence (default 2048)")
    i.add_argument("--weights", choices=tuple(WEIGHT_FORMATS), default="fp16")
    i.add_argument("--kv-dtype", choices=tuple(KV_DTYPES), default="fp16")
    i.add_argument("--json", action="store_true", help="machine-readable output")

    pl = sub.add_parser("plan", help="cheapest combination of memory techniques that fits the GPUs")
    pl.add_argument("model", help=plan_help)
    pl.add_argument("--job", choices=JOBS, default="train")
    pl.add_argument("--gpus", type=_positive_int, default=1, help="number of GPUs (default 1)")
    pl.add_argument("--gpu-mem", default=None,
                    help="memory of one GPU, e.g. 80GiB, 24GiB (default 80GiB; GPU capacities are binary)")
    pl.add_argument("--gpu", choices=gpu_names(), default=None,
                    help="take the GPU memory from memlib's spec table (GiB) instead of --gpu-mem")
    pl.add_argument("--batch", type=_positive_int, default=1,
                    help="sequences per GPU per optimizer step (training) or concurrent sequences (default 1)")
    pl.add_argument("--seq", type=_positive_int, default=2048, help="sequence length (default 2048)")
    pl.add_argument("--reserve", default="1GiB",
                    help="CUDA context and workspaces kept free per GPU (default 1GiB); 5%% of the estimate is "
                         "added for fragmentation")
    pl.add_argument("--lora-rank", type=_positive_int, default=16)
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
    sv.add_argument("--max-num-batched-tokens", type=_positive_int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
                    help=f"tokens per scheduler step / prefill chunk (default {DEFAULT_MAX_NUM_BATCHED_TOKENS})")
    sv.add_argument("--max-num-seqs", type=_positive_int, default=DEFAULT_MAX_NUM_SEQS,
                    help=f"requests per scheduler step (default {DEFAULT_MAX_NUM_SEQS})")
    sv.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel GPUs (default 1)")
    sv.add_argument("--draft", default=None, help="draft model for speculative decoding")
    sv.add_argument("--num-speculative-tokens", type=int, default=0, help="tokens the draft proposes per step")
    sv.add_argument("--prefix-cache-hit-rate", type=float, default=0.0,
                    help="fraction of each request that is a prefix shared by all, in [0, 1) (default 0)")
    sv.add_argument("--json", action="store_true", help="machine-readable output")

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
    return parser


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


def _table(rows: list[tuple[str, Any]], title: str) -> str:
    lines = [title]
    for name, value in rows:
        if isinstance(value, int) and name.endswith("bytes"):
            shown = f"{value:>20,d} B  {value / GB:10.2f} GB  {value / GiB:10.2f} GiB"
        elif isinstance(value, int):
            shown = f"{value:>20,d}"
        else:
            shown = f"{value!s:>20}"
        lines.append(f"  {name:<20} {shown}")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    if args.command == "oom":
        return _oom_run(args)
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
        return data, text
    if args.command == "infer":
        from .core.estimate import estimate_inference
        from .core.setup import InferenceSetup

        inf = estimate_inference(args.model, InferenceSetup(batch_size=args.batch, seq_len=args.seq,
                                                            weights=args.weights, kv_dtype=args.kv_dtype))
        data = inf.as_dict()
        rows = [(k, v) for k, v in data.items() if k != "settings"]
        head = ", ".join(f"{k}={v}" for k, v in inf.settings.items())
        return data, _table(rows, f"inference memory ({head})")
    if args.command == "plan":
        from .core.plan import plan

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
                      seq_len=args.seq, reserve=args.reserve, lora_rank=args.lora_rank, framework=args.framework)
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
                    prefix_cache_hit_rate=args.prefix_cache_hit_rate)
        return fit.as_dict(), _serve_text(fit)
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
                      framework=args.framework)
    return dataclasses.replace(result, notes=[*result.notes, note])


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
                         gradient_as_bucket_view=args.bucket_view, fp8_recipe=args.fp8_recipe, loss=args.loss,
                         loss_chunk=args.loss_chunk)


def _plan_text(result: Any) -> str:
    inp = result.inputs
    unit = "sequences" if inp["job"] == "infer" else "sequences per GPU per step"
    lines = [f"plan for {inp['model']}: {inp['job']} on {inp['num_gpus']} GPU(s) × {inp['gpu_memory'] / GiB:.2f} GiB "
             f"(reserve {inp['reserve'] / GiB:.2f} GiB + {100 * inp['fragmentation']:g} % of the estimate), "
             f"{inp['batch_size']} {unit} × {inp['seq_len']} tokens",
             f"  {'#':>2}  {'technique':<26} {'per GPU (GiB)':>13} {'w/ reserve':>10} {'CPU (GiB)':>9}  {'fits':<4}  "
             f"{'needed':<6}  cost"]
    for i, st in enumerate(result.steps):
        needed = "" if st.needed is None else ("yes" if st.needed else "no")
        fits = "-" if not st.applicable else ("yes" if st.fits else "no")
        lines.append(f"  {i:>2}  {st.technique:<26} {st.per_gpu_bytes / GiB:>13.2f} {st.total_bytes / GiB:>10.2f} "
                     f"{st.cpu_bytes / GiB:>9.2f}  {fits:<4}  {needed:<6}  {st.cost}")
    if result.fits:
        ch = result.chosen
        keys = ("framework", "precision", "attention", "batch_size", "accumulation_steps", "recompute",
                "gradient_as_bucket_view", "zero_stage",
                "optimizer", "method", "offload", "weights", "kv_dtype", "tensor_parallel", "pipeline_parallel")
        what = ", ".join(f"{k}={ch.settings[k]}" for k in keys if k in ch.settings)
        lines.append(f"fits: {what}")
        lines.append(f"  {ch.per_gpu_bytes / GiB:.2f} GiB per GPU + {ch.reserve_bytes / GiB:.2f} GiB reserve, headroom "
                     f"{(inp['gpu_memory'] - ch.total_bytes) / GiB:.2f} GiB"
                     + (f"; {ch.cpu_bytes / GiB:.2f} GiB of CPU memory" if ch.cpu_bytes else ""))
    else:
        cl = result.closest
        more = (f"; it would need {result.min_gpus} GPUs of this size" if result.min_gpus
                else "; more GPUs would not help (each still holds one micro-batch's activations)"
                if inp["job"] != "infer" else "")
        lines.append(f"does not fit: closest is '{cl.technique}' at {cl.total_bytes / GiB:.2f} GiB per GPU with the "
                     f"reserve, {(cl.total_bytes - inp['gpu_memory']) / GiB:.2f} GiB over{more}")
    lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines)


def _parallel_plan_text(result: Any) -> str:
    inp = result.inputs
    lines = [f"3D/4D plan for {inp['model']}: {inp['num_gpus']} GPU(s) × {inp['gpu_memory'] / GiB:.2f} GiB, "
             f"{inp['gpus_per_node']} per node, micro-batch {inp['batch_size']} × {inp['seq_len']} tokens",
             f"  {'#':>2}  {'rung':<28} {'tp':>3} {'pp':>3} {'cp':>3} {'dp':>5} {'zero':>4} {'recompute':<9} "
             f"{'per GPU (GiB)':>13}  fits"]
    moe = any("ep" in st.settings for st in result.steps)
    if moe:  # MoE models: an ep column after dp (dense plans print as before)
        lines[-1] = lines[-1].replace(f"{'dp':>5} ", f"{'dp':>5} {'ep':>3} ")
    for i, st in enumerate(result.steps):
        x = st.settings
        ep = f"{x['ep']:>3} " if moe else ""
        lines.append(f"  {i:>2}  {st.technique:<28} {x['tp']:>3} {x['pp']:>3} {x['cp']:>3} {x['dp']:>5} {ep}"
                     f"{x['zero_stage']:>4} {x['recompute']:<9} {st.per_gpu_bytes / GiB:>13.2f}  "
                     f"{'yes' if st.fits else 'no'}")
    if result.fits:
        x = result.chosen.settings
        lines.append(f"fits: tp={x['tp']} (sequence parallel), pp={x['pp']} ({x['pp_schedule']}, m={x['micro_batches']}), "
                     f"cp={x['cp']}, dp={x['dp']} with ZeRO-{x['zero_stage']}, recompute={x['recompute']}"
                     + (f", ep={x['ep']} (experts split over ep of the dp ranks)" if x.get("ep", 1) > 1 else ""))
    else:
        lines.append("does not fit" + (f"; it would need {result.min_gpus} GPUs of this size" if result.min_gpus
                                       else "; no layout up to 16384 GPUs fits"))
    lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines)


def _serve_text(fit: Any) -> str:
    st = fit.settings
    head = (f"serving {st['model']} at max-model-len {st['max_model_len']:,} on "
            f"{fit.gpu_memory_bytes / GiB:.2f} GiB × {st['gpu_memory_utilization']:g} "
            f"(weights {st['weights']}, KV {st['kv_dtype']}, tp {st['tensor_parallel']})")
    rows: list[tuple[str, Any]] = [
        ("budget_bytes", fit.budget_bytes), ("weights_bytes", fit.weights_bytes)]
    if fit.draft_weights_bytes:
        rows.append(("draft_weights_bytes", fit.draft_weights_bytes))
    rows += [("activation_bytes", fit.activation_bytes), ("non_torch_bytes", fit.non_torch_bytes),
             ("cuda_graph_bytes", fit.cuda_graph_bytes), ("kv_budget_bytes", fit.kv_budget_bytes),
             ("kv_cache_bytes", fit.kv_cache_bytes), ("kv_bytes_per_token", fit.kv_bytes_per_token),
             ("block_size", fit.block_size), ("num_blocks", fit.num_blocks), ("blocks_per_seq", fit.blocks_per_seq),
             ("max_concurrent_seqs", fit.max_concurrent_seqs)]
    if st["prefix_cache_hit_rate"]:
        rows.append(("max_concurrent_seqs_prefix", fit.max_concurrent_seqs_prefix))
    lines = [_table(rows, head)]
    if fit.fits:
        lines.append(f"fits: {fit.max_concurrent_seqs:,} requests of {st['max_model_len']:,} tokens at once "
                     f"({fit.kv_tokens:,} token slots in {fit.num_blocks:,} blocks)")
    else:
        lines.extend(f"does not fit: {r}" for r in fit.reasons)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``memlib`` and ``python -m memlib``. Returns the exit status (2 on bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        data, text = _run(args)
    except MemlibError as e:
        print(f"memlib: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=False))
    else:
        print(text)
    return 0
