"""vLLM's start-up accounting by release (memlib.core.vllm_engine): each mechanism pinned to the vLLM source it cites."""
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from memlib.core.configs import load_config
from memlib.core.dtypes import GiB
from memlib.core.errors import MemlibError
from memlib.core.serve import serve
from memlib.core import vllm_engine as ve


def test_release_rows_resolve_and_unknown_versions_fail():
    assert ve.get_release("0.11.0").version == "0.9.1"
    assert ve.get_release("v0.21.3").version == "0.21"
    assert ve.get_release(None).version == ve.CURRENT_VLLM_VERSION
    for bad in ("0.2", "9.9", "latest", "0.35"):
        with pytest.raises(MemlibError, match="unknown vLLM version"):
            ve.get_release(bad)


# The bisected boundaries (bench/vllm_release_rows.py checks each marker against the releases' source
# distributions): the last release without the change stays on the row before, the first with it opens its row.
@pytest.mark.parametrize("version, row", [
    ("0.7.3", "0.6"), ("0.8.0", "0.8"), ("0.8.4", "0.8"), ("0.8.5", "0.8.5"), ("0.8.5.post1", "0.8.5"),
    ("0.9.0", "0.9"), ("0.9.1", "0.9.1"), ("0.16.0", "0.9.1"), ("0.17.0", "0.17"), ("0.19.1", "0.17"), ("0.20.0", "0.20"), ("0.20.1", "0.20.1"),
    ("0.20.2", "0.20.1"), ("0.21.0", "0.21"), ("0.27.0", "0.21"), ("0.28.0", "0.28"), ("0.34.0", "0.34"),
])
def test_bisected_release_boundaries(version, row):
    assert ve.get_release(version).version == row


def test_each_row_changes_what_its_note_says():
    r = {v: ve.get_release(v) for v in ("0.8.4", "0.8.5", "0.9.0", "0.9.1", "0.16.0", "0.17.0", "0.19.1", "0.20.0",
                                         "0.20.1", "0.21.0", "0.27.0", "0.28.0")}
    h100, a100, big = round(79.15 * GiB), round(79.15 * GiB), 178 * GiB
    # arg_utils.py: by device name (0.8.0-0.8.4), by memory (0.8.5), A100 excluded (0.9), 160 GiB tier (0.28)
    assert ve.batch_defaults(r["0.8.4"], gpu_total_bytes=h100, gpu="h100-sxm", max_model_len=8192) == (8192, 1024)
    assert ve.batch_defaults(r["0.8.4"], gpu_total_bytes=a100, gpu="a100-80gb", max_model_len=8192) == (2048, 1024)
    assert ve.batch_defaults(r["0.8.5"], gpu_total_bytes=a100, gpu="a100-80gb", max_model_len=8192) == (8192, 1024)
    assert ve.batch_defaults(r["0.9.0"], gpu_total_bytes=a100, gpu="a100-80gb", max_model_len=8192) == (2048, 256)
    assert ve.batch_defaults(r["0.27.0"], gpu_total_bytes=big, gpu="b200", max_model_len=8192) == (8192, 1024)
    assert ve.batch_defaults(r["0.28.0"], gpu_total_bytes=big, gpu="b200", max_model_len=8192) == (16384, 1024)
    gemma = load_config("gemma-3-27b")  # kv_cache_utils.py "Add N padding layers" from 0.9.1
    assert (ve.kv_groups(gemma, r["0.9.0"]).padding_layers, ve.kv_groups(gemma, r["0.9.1"]).padding_layers) == (0, 8)
    llama = load_config("llama-3.1-8b")  # envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS default "1" from 0.20.0
    assert ve.cuda_graph_bytes(llama, r["0.19.1"], max_num_seqs=256) == 0 < ve.cuda_graph_bytes(
        llama, r["0.20.0"], max_num_seqs=256)
    assert not r["0.20.0"].tokens_from_concurrency and r["0.20.1"].tokens_from_concurrency
    # topk_topp_sampler.py: a vocabulary sort up to 0.16, the Triton top-k/top-p kernel from 0.17; FlashInfer's
    # sampler (default from 0.21) leaves the peak alone, the dummy run also warming the native path
    assert r["0.16.0"].sampler_bytes_per_logit == ve.SAMPLER_BYTES_SORT_V1
    assert r["0.17.0"].sampler_bytes_per_logit == r["0.21.0"].sampler_bytes_per_logit == ve.SAMPLER_BYTES_TRITON


def test_reported_total_is_mem_get_info_not_nominal():
    # gpu_worker.py: requested_memory = MemorySnapshot().total_memory × utilization (mem_get_info's total)
    fit = serve("llama-3.1-8b", max_model_len=8192, gpu="h100-sxm", vllm_version="0.11", weights="bf16")
    assert fit.gpu_memory_bytes == round(79.19 * GiB)
    assert fit.budget_bytes == int(round(79.19 * GiB) * 0.9)


def test_batch_defaults_by_gpu_and_entry_point():
    # arg_utils.py EngineArgs.get_batch_defaults
    r = ve.get_release("0.11")
    assert ve.batch_defaults(r, gpu_total_bytes=round(79.15 * GiB), gpu="h100-sxm", max_model_len=8192) == (8192, 1024)
    assert ve.batch_defaults(r, gpu_total_bytes=round(79.15 * GiB), gpu="h100-sxm", max_model_len=8192,
                             entry_point="llm") == (16384, 1024)
    assert ve.batch_defaults(r, gpu_total_bytes=round(79.15 * GiB), gpu="a100-80gb", max_model_len=8192) == (2048, 256)
    assert ve.batch_defaults(r, gpu_total_bytes=48 * GiB, gpu="l40s", max_model_len=8192) == (2048, 256)
    assert ve.batch_defaults(ve.get_release("0.34"), gpu_total_bytes=200 * GiB, gpu=None,
                             max_model_len=8192) == (16384, 1024)
    v0 = ve.get_release("0.6")  # V0: max(max_model_len, 2048); chunked prefill (512) beyond 32K
    assert ve.batch_defaults(v0, gpu_total_bytes=80 * GiB, gpu="h100-sxm", max_model_len=20000) == (20000, 256)
    assert ve.batch_defaults(v0, gpu_total_bytes=80 * GiB, gpu="h100-sxm", max_model_len=35000) == (512, 256)


def test_non_torch_grows_with_tensor_parallelism():
    assert ve.non_torch_bytes(1) < GiB / 2 < 2 * GiB < ve.non_torch_bytes(2) == ve.non_torch_bytes(4)


def test_non_torch_over_pcie_is_nccls_alone():
    # custom_all_reduce.py: off beyond two GPUs that are not fully connected; L40S has no NVLink
    assert ve.non_torch_bytes(4, nvlink=False) == ve.NON_TORCH_TP_PCIE < GiB / 2
    pcie = serve("llama-3.1-8b", max_model_len=8192, gpu="l40s", tensor_parallel=4, vllm_version="0.19")
    nvl = serve("llama-3.1-8b", max_model_len=8192, gpu="h100-sxm", tensor_parallel=4, vllm_version="0.19")
    assert (pcie.non_torch_bytes, nvl.non_torch_bytes) == (ve.NON_TORCH_TP_PCIE, ve.NON_TORCH_TP_MULTI)


def test_forward_peak_matches_v0_profile_on_rtx_3090():
    # vllm issue 10517: peak_torch_memory 17.06 GiB − weights 14.9888 GB(=GiB) = 2.07 GiB at 20,000 tokens
    peak = ve.forward_peak_bytes(load_config("llama-3.1-8b"), 20000)
    assert abs(peak / GiB - (17.06 - 14.9888)) < 0.03


def test_profile_peak_keeps_residual_and_logits_whole_under_tp():
    cfg = load_config("qwen2.5-72b")
    one = ve.profile_activation_bytes(cfg, max_num_batched_tokens=8192, max_num_seqs=1024)
    two = ve.profile_activation_bytes(cfg, max_num_batched_tokens=8192, max_num_seqs=1024, tensor_parallel=2)
    assert two > one / 2  # does not halve: the sampler's logits are whole on every rank
    small_vocab = ve.sampler_peak_bytes(load_config("llama-2-7b"), 256)
    assert ve.sampler_peak_bytes(load_config("llama-3.1-8b"), 256) > 3 * small_vocab  # 128,256 vs 32,000


def test_cuda_graph_estimate_only_from_v0_20_and_not_eager():
    cfg = load_config("llama-3.1-8b")
    assert ve.cuda_graph_bytes(cfg, ve.get_release("0.11"), max_num_seqs=256) == 0
    assert ve.cuda_graph_bytes(cfg, ve.get_release("0.20"), max_num_seqs=256) > 0
    assert ve.cuda_graph_bytes(cfg, ve.get_release("0.20"), max_num_seqs=256, enforce_eager=True) == 0
    assert ve.cudagraph_capture_sizes(256)[:5] == (1, 2, 4, 8, 16) and ve.cudagraph_capture_sizes(256)[-1] == 512


def test_gemma3_padding_layers():
    # kv_cache_utils.py: "Add 8 padding layers" for Gemma 3 27B (10 full, 52 sliding → 7 groups of 10)
    g = ve.kv_groups(load_config("gemma-3-27b"), ve.get_release("0.11"))
    assert (g.group_size, len(g.groups), g.padding_layers) == (10, 7, 8)
    assert g.stored_layers / 62 == pytest.approx(1.129, abs=1e-3)
    assert ve.kv_groups(load_config("gemma-3-27b"), ve.get_release("0.8")).groups == (None,)


@given(w=st.integers(1, 8192), chunk=st.integers(1, 16384), length=st.integers(1, 65536),
       bs=st.sampled_from([8, 16, 32]))
def test_sliding_window_admission_rule(w, chunk, length, bs):
    # kv_cache_interface.py SlidingWindowSpec.max_memory_usage_bytes
    g = ve.KVGroups(1, (w,), 0)
    n = ve.blocks_per_request(g, max_model_len=length, max_num_batched_tokens=chunk, block_size=bs)
    assert n == -(-min(w - 1 + chunk, length) // bs) + 1
    assert n >= -(-min(w, length) // bs)  # never fewer than the window itself


def test_kv_cache_memory_overrides_profile():
    fit = serve("llama-3.1-8b", max_model_len=8192, gpu="h100-sxm", vllm_version="0.21",
                kv_cache_memory=10 * GiB)
    assert fit.num_blocks == 10 * GiB // (16 * 131072)


def test_tokens_logged_by_release():
    old = serve("llama-3.1-8b", max_model_len=8192, gpu="h100-sxm", vllm_version="0.20", kv_cache_memory=10 * GiB)
    new = serve("llama-3.1-8b", max_model_len=8192, gpu="h100-sxm", vllm_version="0.34", kv_cache_memory=10 * GiB)
    assert old.vllm_tokens == old.num_blocks * 16
    assert new.vllm_tokens == int(new.num_blocks / 512 * 8192)


@pytest.mark.parametrize("args", [["--vllm-version", "0.1"], ["--gpu-memory-utilization", "0"],
                                  ["--gpu-memory-utilization", "1.5"]])
def test_cli_bad_input_one_line_exit_2(args):
    r = subprocess.run([sys.executable, "-m", "memlib", "serve", "llama-3.1-8b", "--gpu", "h100",
                        "--max-model-len", "8192", *args], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


# vLLM 0.11.0's own get_kv_cache_configs / get_max_concurrency_for_kv_cache_config, run on CPU by
# bench/serve_vs_vllm.py (Part 1) with the same available memory: (blocks, logged tokens, concurrency).
@pytest.mark.parametrize("name, tp, length, chunk, avail_gib, vllm", [
    ("llama-3.1-8b", 1, 8192, 8192, 40.0, (20480, 327680, 40.0)),
    ("qwen2.5-72b", 2, 32768, 8192, 8.0, (3276, 52416, 1.6)),
    ("mistral-7b", 1, 32768, 2048, 20.0, (10240, 163840, 26.6)),
    ("gemma-2-9b", 1, 8192, 2048, 30.0, (11702, 93616, 13.05)),
    ("gemma-3-27b", 1, 8192, 2048, 15.0, (12288, 28080, 7.36)),
    ("gemma-3-27b", 1, 32768, 8192, 15.0, (12288, 28080, 2.23)),
    ("qwen3-30b-a3b", 1, 40960, 8192, 12.0, (8192, 131072, 3.2)),
])
def test_block_arithmetic_matches_vllm_0_11(name, tp, length, chunk, avail_gib, vllm):
    fit = serve(name, max_model_len=length, gpu_memory="80GiB", tensor_parallel=tp, vllm_version="0.11",
                max_num_batched_tokens=chunk, max_num_seqs=256, kv_cache_memory=int(avail_gib * GiB),
                weights="bf16", kv_dtype="bf16")
    assert (fit.num_blocks, fit.vllm_tokens, fit.vllm_concurrency) == vllm


def test_sampler_share_of_the_peak_by_release():
    # 0.11: PyTorch top-k/top-p sorts the vocabulary; from 0.17 a Triton kernel does it without a sort
    cfg = load_config("llama-3.1-8b")
    sort = ve.profile_activation_bytes(cfg, max_num_batched_tokens=8192, max_num_seqs=1024,
                                       sampler_bytes_per_logit=ve.get_release("0.11").sampler_bytes_per_logit)
    fused = ve.profile_activation_bytes(cfg, max_num_batched_tokens=8192, max_num_seqs=1024,
                                        sampler_bytes_per_logit=ve.get_release("0.34").sampler_bytes_per_logit)
    assert sort - fused == 1024 * 128256 * (ve.SAMPLER_BYTES_SORT_V1 - ve.SAMPLER_BYTES_TRITON)
