"""Measure the real DeepSpeed engine's tensor memory on CPU, ZeRO stages 0-3, one and several micro-batches (issue 42).

Run (two gloo ranks, or one with ``--nproc_per_node 1``; DeepSpeed JIT-builds its CPU ops with g++ on first use)::

    DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=/tmp/ds_ext torchrun --nproc_per_node 2 \
        bench/deepspeed_cpu_memory.py --stage 2 --grad-accum 1 --out /tmp/ds_z2_k1.json

A ``TorchDispatchMode`` entered before the model is built registers every op's output storage once, and a
``weakref.finalize`` on it removes the bytes when it dies: the live bytes of rank 0 and their peak over the second
optimizer step (the steady state: ZeRO creates Adam's m and v at the first step). The tiny Llama is bf16-mixed,
``{"type": "Adam"}`` (DeepSpeed's FusedAdam), ``stage3_param_persistence_threshold`` 0 so that ZeRO-3 partitions
every parameter. Allocations inside c10d kernels (gloo's buffers) are not seen. ``--grad-accum-dtype fp32`` sets
``data_types.grad_accum_dtype``: at stage 1 DeepSpeed then runs ``BF16_Optimizer``, which has no reduce bucket.
At stage 3 the record also holds ``gathered_peak_bytes``: the storages allocated inside ``partition_parameters.py``
(the coalesced all-gather's flat buffer and the per-parameter copies) at their most over the measured step;
``--prefetch-bucket``, ``--max-live`` and ``--max-reuse`` set the coordinator's ``stage3_prefetch_bucket_size``,
``stage3_max_live_parameters`` and ``stage3_max_reuse_distance``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

CONFIG = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=4, max_position_embeddings=64, tie_word_embeddings=False)
SEQ = 16


def _in_gather() -> bool:
    """Whether the op runs inside ``partition_parameters.py`` (ZeRO-3's all-gather: the coalesced call's flat buffer
    and the per-parameter copies its ``wait`` makes)."""
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename.endswith("partition_parameters.py"):
            return True
        f = f.f_back
    return False


class Live(TorchDispatchMode):
    """Live CPU tensor bytes, one count per storage, and their peak; with ``gather`` on, the same for the storages
    ZeRO-3's all-gather allocates (``gathered``, ``gathered_peak``)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.total = self.peak = 0
        self.gather = False
        self.gathered_keys: set[int] = set()
        self.gathered = self.gathered_peak = 0

    def add(self, t: torch.Tensor) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            return
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in self.live or st.nbytes() == 0:
            return
        self.live[key] = st.nbytes()
        self.total += st.nbytes()
        self.peak = max(self.peak, self.total)
        if self.gather and _in_gather():
            self.gathered_keys.add(key)
            self.gathered += st.nbytes()
            self.gathered_peak = max(self.gathered_peak, self.gathered)
        weakref.finalize(st, self.remove, key)

    def remove(self, key: int) -> None:
        if key in self.gathered_keys:
            self.gathered_keys.discard(key)
            self.gathered -= self.live.get(key, 0)
        self.total -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            self.add(t)
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", type=int, default=2)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--grad-accum-dtype", default=None, choices=["fp32"],
                    help="data_types.grad_accum_dtype (fp32 with --stage 1: BF16_Optimizer)")
    ap.add_argument("--prefetch-bucket", type=int, default=None, help="stage3_prefetch_bucket_size (elements)")
    ap.add_argument("--max-live", type=int, default=None, help="stage3_max_live_parameters (elements)")
    ap.add_argument("--max-reuse", type=int, default=None, help="stage3_max_reuse_distance (elements)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import deepspeed
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    deepspeed.init_distributed(dist_backend="gloo")
    world = torch.distributed.get_world_size()
    ds_config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": args.grad_accum,
                 "bf16": {"enabled": True}, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
                 "zero_optimization": {"stage": args.stage, "stage3_param_persistence_threshold": 0}}
    if args.grad_accum_dtype:
        ds_config["data_types"] = {"grad_accum_dtype": args.grad_accum_dtype}
    knobs = {k: v for k, v in (("stage3_prefetch_bucket_size", args.prefetch_bucket),
                                ("stage3_max_live_parameters", args.max_live),
                                ("stage3_max_reuse_distance", args.max_reuse)) if v is not None}
    ds_config["zero_optimization"].update(knobs)
    tracker = Live()
    with tracker:
        model = LlamaForCausalLM(LlamaConfig(**CONFIG, attn_implementation="sdpa"))
        for p in model.parameters():
            tracker.add(p)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
        ids = torch.randint(0, CONFIG["vocab_size"], (1, SEQ))
        peaks = []
        for _step in range(2):
            tracker.peak = tracker.total
            tracker.gather, tracker.gathered_peak = _step == 1, tracker.gathered
            for _micro in range(args.grad_accum):
                loss = engine(input_ids=ids, labels=ids).loss
                engine.backward(loss)
                engine.step()
                del loss
            peaks.append(tracker.peak)
    n_params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    bf16_optimizer = type(engine.optimizer).__name__ == "BF16_Optimizer"  # no ZeRO reduce bucket
    result = {"deepspeed": deepspeed.__version__, "torch": torch.__version__, "stage": args.stage,
              "grad_accum": args.grad_accum, "world_size": world, "params": n_params, "seq_len": SEQ,
              "config": CONFIG, "peak_step1_bytes": peaks[0], "peak_bytes": peaks[1],
              "reduce_bucket_bytes": 2 * 500_000_000 if args.stage >= 1 and not bf16_optimizer else 0,
              "optimizer": type(engine.optimizer).__name__,
              "command": f"DS_ACCELERATOR=cpu torchrun --nproc_per_node {world} bench/deepspeed_cpu_memory.py "
                         f"--stage {args.stage} --grad-accum {args.grad_accum}"
                         + (f" --grad-accum-dtype {args.grad_accum_dtype}" if args.grad_accum_dtype else "")}
    if args.grad_accum_dtype:
        result["grad_accum_dtype"] = args.grad_accum_dtype
    if args.stage == 3:  # the all-gather's storages at their most over the measured step
        result["gathered_peak_bytes"] = tracker.gathered_peak
        result.update(knobs)
        if knobs:
            result["command"] += "".join(f" --{flag} {v}" for flag, v in (
                ("prefetch-bucket", args.prefetch_bucket), ("max-live", args.max_live),
                ("max-reuse", args.max_reuse)) if v is not None)
    write_record(result, args.out)


def write_record(result: dict, out: str | None) -> None:
    """Rank 0 prints the record and writes it to ``out`` (when given)."""
    if torch.distributed.get_rank() == 0:
        text = json.dumps(result, indent=1)
        if out:
            with open(out, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        print(text)


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    main()
