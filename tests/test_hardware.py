"""The one hardware table (memlib.core.hardware): dense peaks, capacities, links, units, lookups."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memlib.core.errors import MemlibError
from memlib.core.hardware import GPU_MEMORY, GPUS, LINK_BANDWIDTH, PCIE_GT_PER_S, get_gpu, gpu_names, match_gpu, pcie_bandwidth

EXPECTED = {"v100", "t4", "a10", "a100-40gb", "a100-80gb", "rtx-3090", "rtx-4090", "l4", "l40s", "h100-sxm",
            "h100-pcie", "h200", "b200"}


def test_table_has_the_issue_gpus_with_sources() -> None:
    assert set(gpu_names()) == EXPECTED
    for g in GPUS.values():
        assert g.source and "nvidia" in g.source.lower()
        assert isinstance(g.memory_bytes, int) and isinstance(g.bandwidth_bytes_per_s, int)
        assert g.fp16_tflops > g.fp32_tflops or g.architecture == "Ada Lovelace"


def test_dense_is_half_the_sparse_figure_printed() -> None:
    for g in GPUS.values():
        if g.sparse_tflops_printed is not None:
            assert g.sparse_tflops_printed == pytest.approx(2 * g.fp16_tflops, rel=0.002)


def test_known_numbers() -> None:
    a100 = get_gpu("A100")
    assert a100.peak_flops("bf16") == 312e12
    assert a100.memory_gib == 80 and a100.bandwidth_gb_s == 2039
    assert a100.memory_bytes == 80 * 2**30 and round(a100.memory_gb, 1) == 85.9
    assert get_gpu("a100-40gb").bandwidth_gb_s == 1555
    assert get_gpu("h100").peak_flops() == pytest.approx(989.5e12)
    assert get_gpu("h200").memory_bytes == 141 * 2**30
    assert get_gpu("h200").peak_flops() == get_gpu("h100-sxm").peak_flops()
    assert get_gpu("h200").ridge_point() < get_gpu("h100-sxm").ridge_point()
    assert get_gpu("a100-80gb").ridge_point() == pytest.approx(312 / 2.039)


def test_no_bf16_on_volta_and_turing() -> None:
    for name in ("v100", "t4"):
        with pytest.raises(MemlibError, match="no bf16"):
            get_gpu(name).peak_flops("bf16")
        assert get_gpu(name).peak_flops("fp16") > 0


def test_unknown_names_list_the_choices() -> None:
    with pytest.raises(MemlibError, match="unknown GPU 'b300'; expected one of: v100, t4"):
        get_gpu("b300")
    with pytest.raises(MemlibError, match="unknown dtype 'int8'"):
        get_gpu("a100").peak_flops("int8")


@pytest.mark.parametrize("device_name, expected", [
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-40gb"), ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H200", "h200"), ("NVIDIA B200", "b200"), ("Tesla V100-SXM2-32GB", "v100"), ("Tesla T4", "t4"), ("NVIDIA L4", "l4"),
    ("NVIDIA A10", "a10"), ("NVIDIA L40S", "l40s"), ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("NVIDIA GeForce RTX 3090", "rtx-3090"),
])
def test_match_device_names(device_name: str, expected: str) -> None:
    spec = match_gpu(device_name)
    assert spec is not None and spec.name == expected


def test_match_unknown_is_none() -> None:
    assert match_gpu("Intel Arc A770") is None


@given(st.sampled_from(sorted(EXPECTED)))
def test_lookup_roundtrip(name: str) -> None:
    assert get_gpu(name.upper()).name == name


def test_capacities_are_binary_and_one_table() -> None:
    # DRAM chips and HBM stacks come in powers of two: the datasheet's "24 GB" is 24 GiB (nvidia-smi: 24,576 MiB
    # on a 3090), "80 GB" is 80 GiB; memlib.core.inference.GPU_MEMORY is this table, not a second one.
    for name in ("rtx-3090", "rtx-4090", "a10", "l4"):
        assert get_gpu(name).memory_bytes == 24 * 2**30
    for name in ("a100-80gb", "h100-sxm", "h100-pcie"):
        assert get_gpu(name).memory_bytes == 80 * 2**30
    assert get_gpu("t4").memory_bytes == 16 * 2**30 and get_gpu("v100").memory_bytes == 32 * 2**30
    assert get_gpu("l40s").memory_bytes == 48 * 2**30 and get_gpu("a100-40gb").memory_bytes == 40 * 2**30
    assert GPU_MEMORY == {name: g.memory_bytes for name, g in GPUS.items()}


def test_every_row_is_complete_and_in_consistent_units() -> None:
    for g in GPUS.values():
        # capacity: an integer number of GiB (the vendor's "GB" of DRAM/HBM is binary), in bytes
        assert isinstance(g.memory_bytes, int) and g.memory_bytes % 2**30 == 0 and g.memory_gib >= 16, g.name
        assert f"{g.memory_gib:.0f} GB" in g.full_name or g.name in ("t4", "a10", "rtx-3090", "rtx-4090", "l4", "l40s")
        assert f"{g.memory_gib:.0f} GB" in g.source, g.name  # the datasheet figure the row is read from
        # rates are decimal bytes/s, whole GB/s for memory, and in a plausible range
        assert isinstance(g.bandwidth_bytes_per_s, int) and g.bandwidth_bytes_per_s % 10**9 == 0
        assert 250e9 <= g.bandwidth_bytes_per_s <= 8e12  # GDDR6 to HBM3e (B200: 8 TB/s)
        # dense peaks in TFLOP/s: positive, tensor cores above the CUDA cores, fp8 twice bf16 where it exists
        peaks = {d: g.peak_flops(d) for d in ("fp16", "fp32", "bf16", "tf32", "fp8")
                 if getattr(g, f"{d}_tflops") is not None}
        assert all(v > 0 for v in peaks.values()) and 1e12 < peaks["fp16"] < 1e16
        if "fp8" in peaks:
            assert peaks["fp8"] == pytest.approx(2 * peaks["fp16"], rel=0.015), g.name  # L40S prints 733 vs 362.05
            assert g.architecture in ("Ada Lovelace", "Hopper", "Blackwell")
        if "tf32" in peaks:
            assert peaks["tf32"] == pytest.approx(peaks["fp16"] / 2, rel=0.025), g.name  # B200 prints 1.1 vs 2.25
        # links: PCIe generation known; NVLink (both directions together) faster than that PCIe link, or absent
        assert g.pcie_gen in PCIE_GT_PER_S and g.pcie_bytes_per_s == pcie_bandwidth(g.pcie_gen)
        assert g.nvlink_bytes_per_s is None or g.nvlink_bytes_per_s > 2 * g.pcie_bytes_per_s
        assert g.source.startswith("NVIDIA") and ("datasheet" in g.source or "whitepaper" in g.source)


def test_known_links_and_fp8() -> None:
    assert get_gpu("h100-sxm").nvlink_bytes_per_s == 900e9 and get_gpu("a100").nvlink_bytes_per_s == 600e9
    assert get_gpu("v100").nvlink_bytes_per_s == 300e9 and get_gpu("rtx-4090").nvlink_bytes_per_s is None
    assert get_gpu("h100").pcie_bytes_per_s == pytest.approx(63.0e9, rel=1e-3)  # Gen5 x16, one direction
    assert get_gpu("a100").pcie_bytes_per_s == pytest.approx(31.5e9, rel=1e-3)  # the datasheet's 64 GB/s, both ways
    assert get_gpu("h100").peak_flops("fp8") == 1979e12
    with pytest.raises(MemlibError, match="no fp8"):
        get_gpu("a100").peak_flops("fp8")
    with pytest.raises(MemlibError, match="unknown PCIe generation 6"):
        pcie_bandwidth(6)


def test_other_modules_read_this_table() -> None:
    # one fact, one place: the offload model's peaks and links, the inference capacities and ZeRO's V100 are
    # views of this table, not copies
    from memlib._book import ch06_zero_fsdp as zero
    from memlib.core import inference, offload

    assert offload.LINK_BANDWIDTH is LINK_BANDWIDTH and inference.GPU_MEMORY is GPU_MEMORY
    assert offload.GPU_PEAK_FLOPS == {k: get_gpu(k).peak_flops("fp16") for k in offload.GPU_PEAK_FLOPS}
    assert set(offload.GPU_PEAK_FLOPS) == {"v100", "a100", "h100", "h200", "rtx4090"}
    assert zero.V100_BYTES == get_gpu("v100").memory_bytes
