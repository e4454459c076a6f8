"""Measurement side of Chapter 12: FlopCounterMode on CPU, torch.profiler, DeepSpeed, snapshots, figures."""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from memlib.core.errors import MemlibError
from memlib.core.flops import forward_flops, training_flops
from memlib._book import ch12_profiling as ch12
from memlib._book.ch12_profiling import op_intensities
from memlib.core.hardware import get_gpu
from memlib.core.params import count_params

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from memlib.measure import profiling  # noqa: E402
from memlib.viz.plots_profiling import memory_timeline_figure, roofline_figure  # noqa: E402

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256}


def test_meta_count_equals_real_cpu_count() -> None:
    meta = profiling.count_training_flops(TINY, batch_size=2, seq_len=32)
    cpu = profiling.count_training_flops(TINY, batch_size=2, seq_len=32, device="cpu")
    assert meta.total == cpu.total == training_flops(TINY, 2, 32).model_flops
    assert meta.forward == forward_flops(TINY, 2, 32).model_flops
    assert set(meta.by_op) == {"aten.mm", "aten.bmm"}


def test_cpu_flash_kernel_is_not_counted() -> None:
    # FlopCounterMode has no formula for the CPU flash-attention op: attention FLOPs vanish from the count.
    got = profiling.count_training_flops(TINY, batch_size=2, seq_len=32, device="cpu", attention="sdpa")
    assert got.total == training_flops(TINY, 2, 32, attention="none").model_flops


def test_profiler_tables_and_trace(tmp_path: Path) -> None:
    prof = profiling.profile_training_step(TINY, batch_size=2, seq_len=32, trace_dir=tmp_path, row_limit=5)
    assert Path(prof.trace_path).is_file() and prof.trace_events > 100
    assert json.loads(Path(prof.trace_path).read_text())["traceEvents"]
    assert len(prof.by_time) == 5 and prof.by_time[0].self_time_us >= prof.by_time[-1].self_time_us
    assert prof.by_memory[0].self_memory_bytes > 0
    # The profiler's FLOPs are the matmuls (mm) plus a few element-wise muls, never attention on CPU.
    no_attn = training_flops(TINY, 2, 32, attention="none").model_flops
    assert no_attn <= prof.total_flops < 1.05 * no_attn


def test_deepspeed_profile_counts_one_forward() -> None:
    pytest.importorskip("deepspeed")
    ds = ch12.deepspeed_profile(TINY, batch_size=2, seq_len=32)
    fwd = forward_flops(TINY, 2, 32).model_flops
    assert fwd <= ds.flops < 1.05 * fwd  # matmuls plus element-wise ops
    assert ds.params == count_params(TINY).params
    assert ds.macs * 2 <= ds.flops


def test_matmul_benchmark_and_step_timing() -> None:
    mb = profiling.matmul_benchmark(128, repeats=2)
    assert mb.best_flops_per_s >= mb.median_flops_per_s > 0
    st = profiling.time_training_step(TINY, batch_size=1, seq_len=16, steps=2, warmup=1)
    assert len(st.step_times_s) == 2 and st.tokens == 16 and st.tokens_per_s > 0
    with pytest.raises(MemlibError):
        profiling.matmul_benchmark(128, dtype="int8")
    rec = profiling.mfu_run(TINY, batch_size=1, seq_len=16, device="cpu", dtype="fp32", peak_flops_per_s=1e12,
                            steps=1, warmup=0)
    assert rec["model_flops_per_step"] == training_flops(TINY, 1, 16).model_flops
    assert rec["mfu"] == pytest.approx(rec["achieved_tflops"] / 1.0)
    with pytest.raises(MemlibError, match="pass peak_flops_per_s"):
        profiling.mfu_run(TINY, batch_size=1, seq_len=16, device="cpu", dtype="fp32", steps=1, warmup=0)


def test_meta_snapshot_timeline_matches_the_tracer() -> None:
    from memlib.measure.trace import trace_training

    snap = ch12.meta_memory_snapshot(TINY, batch_size=2, seq_len=32)
    tl = profiling.snapshot_timeline(snap)
    assert tl.baseline_bytes == 0 and tl.num_events == len(snap["device_traces"][0])
    second_step = dict(snap["phases"])  # last occurrence of each phase: the second step
    i0 = [i for name, i in snap["phases"] if name == "forward"][-1]
    traced = trace_training(TINY, batch_size=2, seq_len=32, precision="bf16", optimizer="adamw")
    assert max(tl.allocated_bytes[i0:]) == traced.peak_bytes
    assert "end" in second_step


def test_snapshot_timeline_of_a_cuda_style_pickle(tmp_path: Path) -> None:
    # The layout torch.cuda.memory._dump_snapshot writes; 100 bytes were allocated before recording began.
    snap = {"segments": [{"device": 0, "blocks": [{"size": 100, "state": "active_allocated"},
                                                   {"size": 50, "state": "active_allocated"},
                                                   {"size": 30, "state": "inactive"}]}],
            "device_traces": [[{"action": "segment_alloc", "size": 1000, "time_us": 1},
                               {"action": "alloc", "size": 50, "time_us": 2},
                               {"action": "alloc", "size": 30, "time_us": 3},
                               {"action": "free_requested", "size": 30, "time_us": 4},
                               {"action": "free_completed", "size": 30, "time_us": 5}]]}
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snap))
    tl = profiling.snapshot_timeline(path)
    assert tl.baseline_bytes == 100
    assert tl.allocated_bytes == [150, 180, 150] and tl.times_us == [2.0, 3.0, 5.0] and tl.peak_bytes == 180
    with pytest.raises(MemlibError, match="no trace for device 1"):
        profiling.snapshot_timeline(snap, device=1)
    (tmp_path / "bad.pickle").write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(MemlibError, match="not a memory snapshot"):
        profiling.load_snapshot(tmp_path / "bad.pickle")
    small = profiling.downsample_timeline(tl, max_points=2)
    assert small["allocated_bytes"] == [180, 150] and small["peak_bytes"] == 180


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_functions_say_no_gpu() -> None:
    with pytest.raises(MemlibError, match="needs a CUDA device"):
        profiling.record_memory_history()
    with pytest.raises(MemlibError, match="needs a CUDA device"):
        profiling.dump_memory_snapshot("/tmp/never.pickle")


def test_figures() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = roofline_figure([get_gpu("a100-80gb"), get_gpu("h100-sxm")], op_intensities("llama-2-7b", 1, 2048))
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and len(ax.get_legend().get_texts()) == 2
    plt.close(fig)
    fig = memory_timeline_figure([0, 1, 2, 3], [0, 2**30, 2**31, 0], phases=[("forward", 0), ("backward", 2),
                                                                            ("end", 3)])
    assert any("peak 2.00 GiB" in t.get_text() for t in fig.axes[0].texts)
    plt.close(fig)
    with pytest.raises(MemlibError):
        memory_timeline_figure([0, 1], [1])
    with pytest.raises(MemlibError):
        roofline_figure([])
