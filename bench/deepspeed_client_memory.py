"""Measure DeepSpeed stepping the client's torch.optim.AdamW on CPU: whole-step and optimizer-step peaks (issue 42).

Run (two gloo ranks, as ``bench/deepspeed_cpu_memory.py``, whose tiny Llama and live-bytes tracker it reuses)::

    DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=/tmp/ds_ext torchrun --nproc_per_node 2 \
        bench/deepspeed_client_memory.py --stage 1 --impl foreach --out /tmp/ds_client_z1_foreach.json

The optimizer is ``torch.optim.AdamW(model.parameters(), foreach=...)`` passed to ``deepspeed.initialize`` (no
``optimizer`` block in the config; ``zero_allow_untested_optimizer`` set), the Hugging Face Trainer's way. Rank 0's
live tensor bytes at the second step: the whole step's peak, and the peak inside ``engine.step()`` with the bytes
live when it starts (at stages 1-2 the whole step's peak is the backward pass's 1 GB reduce bucket, which hides the
optimizer step; the step's own peak is what the client's optimizer changes).
"""
from __future__ import annotations

import argparse
import os

import torch
from deepspeed_cpu_memory import CONFIG, SEQ, Live, write_record  # the same model and tracker (run from bench/ or its path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--impl", choices=("foreach", "fused", "for-loop"), default="foreach")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import deepspeed
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    deepspeed.init_distributed(dist_backend="gloo")
    world = torch.distributed.get_world_size()
    ds_config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_allow_untested_optimizer": True,
                 "zero_optimization": {"stage": args.stage, "stage3_param_persistence_threshold": 0}}
    tracker = Live()
    with tracker:
        model = LlamaForCausalLM(LlamaConfig(**CONFIG, attn_implementation="sdpa"))
        for p in model.parameters():
            tracker.add(p)
        client = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=args.impl == "foreach",
                                   fused=args.impl == "fused")
        engine, *_ = deepspeed.initialize(model=model, optimizer=client, config=ds_config)
        ids = torch.randint(0, CONFIG["vocab_size"], (1, SEQ))
        for _step in range(2):
            tracker.peak = tracker.total
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            whole, before = tracker.peak, tracker.total
            tracker.peak = tracker.total
            engine.step()
            step_peak, whole = tracker.peak, max(whole, tracker.peak)
            del loss
    n_params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    result = {"deepspeed": deepspeed.__version__, "torch": torch.__version__, "stage": args.stage, "impl": args.impl,
              "world_size": world, "params": n_params, "seq_len": SEQ, "config": CONFIG, "peak_bytes": whole,
              "before_step_bytes": before, "step_peak_bytes": step_peak,
              "reduce_bucket_bytes": 2 * 500_000_000 if args.stage >= 1 else 0,
              "optimizer": type(engine.optimizer).__name__,
              "command": f"DS_ACCELERATOR=cpu torchrun --nproc_per_node {world} bench/deepspeed_client_memory.py "
                         f"--stage {args.stage} --impl {args.impl}"}
    write_record(result, args.out)


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    main()
