"""The hardware table: every GPU's memory, dense peaks, memory and link bandwidths, with sources (Chapter 12).

Pure Python. One table for the whole book: the estimator's and planner's capacities, the offload model's peaks
and links (:mod:`memlib.core.offload`), the serving model, the drills and the chapters all read it. Every peak here is **dense** (no 2:4 structured sparsity). NVIDIA's datasheets for A100, H100,
H200, L4 and A10 print the with-sparsity figure next to (or, for H100/H200/L4, instead of) the dense one,
marked with an asterisk; the sparse figure is exactly twice the dense one, and no dense training step can use
it. Tensor-core peaks for the GeForce cards (RTX 3090, 4090) are the fp16/bf16 figures **with fp32
accumulation**, what mixed-precision training uses; their fp16-accumulate figure is twice as high.

Memory is stored in bytes and is **binary**: DRAM chips and HBM stacks come in powers of two, so the
datasheet's "80 GB" is 80 GiB (80 × 2³⁰ bytes) and a "24 GB" RTX 3090 is 24 GiB (12 GDDR6X chips of 2 GiB;
nvidia-smi shows 24,576 MiB). The H200's "141 GB" is likewise 141 GiB enabled of its six 24 GiB HBM3e stacks.
The usable amount is less: the driver reserves some (a 4090 shows 24,564 MiB) and ECC, on by default on
data-centre cards (T4, A10, L4, L40S), more; ask ``torch.cuda.mem_get_info()`` on the card. Bandwidth is in
bytes per second (datasheet GB/s × 10⁹: a rate is decimal).

Links: PCIe is stored as its generation; :func:`pcie_bandwidth` turns it into bytes per second per direction
(GT/s × lanes × 128/130 / 8: Gen4 x16 = 31.5 GB/s; the datasheets' "64 GB/s" adds both directions). NVLink is
stored as the datasheet prints it, both directions together (H100 SXM: 900 GB/s = 18 links × 25 GB/s × 2);
None where the card has no NVLink. fp8 peaks exist from Ada Lovelace and Hopper on.
"""
from __future__ import annotations

from dataclasses import dataclass

from .dtypes import GiB
from .errors import MemlibError

__all__ = ["GpuSpec", "GPUS", "H20", "GPU_MEMORY", "GPU_MEMORY_MENU_GIB", "SERVE_GPUS", "LINK_BANDWIDTH", "PCIE_GT_PER_S",
           "pcie_bandwidth", "gpu_names", "get_gpu", "match_gpu"]

#: Transfer rate of one PCIe lane, in GT/s, by generation (PCI-SIG base specifications 3.0, 4.0, 5.0).
PCIE_GT_PER_S: dict[int, int] = {3: 8, 4: 16, 5: 32}


def pcie_bandwidth(gen: int, lanes: int = 16) -> float:
    """Theoretical bandwidth of one direction of a PCIe link, bytes/s: GT/s × lanes × 128/130 / 8.

    Introduced in Chapter 7. Gen3/4/5 use 128b/130b encoding: Gen4 x16 = 31.5 GB/s per direction.

    Raises:
        MemlibError: a generation not in :data:`PCIE_GT_PER_S`, or lanes < 1.
    """
    if gen not in PCIE_GT_PER_S:
        raise MemlibError(f"unknown PCIe generation {gen!r}; expected one of: {', '.join(map(str, PCIE_GT_PER_S))}")
    if lanes < 1:
        raise MemlibError(f"lanes must be >= 1; got {lanes!r}")
    return PCIE_GT_PER_S[gen] * 1e9 * lanes * 128 / 130 / 8


#: Theoretical bandwidth of one direction of a host link, bytes/s (the offload model's links, Chapter 7).
#: PCIe x16 by generation (:func:`pcie_bandwidth`). NVLink-C2C (Grace Hopper GH200): 900 GB/s both ways
#: together, 450 GB/s per direction (NVIDIA GH200 datasheet). NVMe: one drive's PCIe x4 link (drives read at up
#: to about this; writes are usually slower); RAID-0 over d drives multiplies it by d, and the drives share the
#: host's PCIe lanes.
LINK_BANDWIDTH: dict[str, float] = {
    "pcie3": pcie_bandwidth(3),          # 15.75 GB/s
    "pcie4": pcie_bandwidth(4),          # 31.5 GB/s
    "pcie5": pcie_bandwidth(5),          # 63.0 GB/s
    "nvlink-c2c": 450e9,                 # GH200 CPU<->GPU, per direction
    "nvme-gen4": pcie_bandwidth(4, 4),   # 7.88 GB/s, one PCIe 4.0 x4 drive
    "nvme-gen5": pcie_bandwidth(5, 4),   # 15.75 GB/s, one PCIe 5.0 x4 drive
}


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's datasheet figures. Introduced in Chapter 12.

    Attributes:
        name: short name used by :func:`get_gpu` (``"a100-80gb"``).
        full_name: the product as NVIDIA names it.
        architecture: Volta, Turing, Ampere, Ada Lovelace, Hopper, Blackwell.
        bf16_tflops: dense bf16 tensor-core TFLOP/s (10¹² FLOP/s); None where the GPU has no bf16 (V100, T4).
        fp16_tflops: dense fp16 tensor-core TFLOP/s (fp32 accumulate).
        tf32_tflops: dense tf32 tensor-core TFLOP/s; None before Ampere.
        fp32_tflops: fp32 TFLOP/s on the ordinary (non-tensor) cores.
        fp8_tflops: dense fp8 tensor-core TFLOP/s (fp32 accumulate); None before Ada Lovelace and Hopper.
        memory_bytes: memory in bytes, binary: the datasheet's "GB" × 2³⁰ (see the module docstring).
        bandwidth_bytes_per_s: memory bandwidth, datasheet GB/s × 10⁹.
        memory_type: HBM2, HBM2e, HBM3, HBM3e, GDDR6, GDDR6X.
        sparse_tflops_printed: the with-sparsity bf16/fp16 figure the datasheet prints (2 × dense), or None
            where the datasheet prints no sparsity figure.
        pcie_gen: the host interface's PCIe generation (x16); :attr:`pcie_bytes_per_s` is one direction.
        nvlink_bytes_per_s: NVLink bandwidth per GPU, both directions together as the datasheet prints it
            (datasheet GB/s × 10⁹); None where the card has no NVLink.
        source: the vendor document the numbers come from.
        note: anything a reader comparing with other tables should know.
    """

    name: str
    full_name: str
    architecture: str
    bf16_tflops: float | None
    fp16_tflops: float
    tf32_tflops: float | None
    fp32_tflops: float
    memory_bytes: int
    bandwidth_bytes_per_s: int
    memory_type: str
    sparse_tflops_printed: float | None
    fp8_tflops: float | None
    pcie_gen: int
    nvlink_bytes_per_s: int | None
    source: str
    note: str = ""

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense peak in FLOP/s for ``dtype`` (bf16, fp16, tf32, fp8 on tensor cores; fp32 on CUDA cores).

        Raises:
            MemlibError: unknown dtype, or one the GPU has no tensor-core support for (bf16 on a V100).
        """
        table = {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "tf32": self.tf32_tflops,
                 "fp32": self.fp32_tflops, "fp8": self.fp8_tflops}
        if dtype not in table:
            raise MemlibError(f"unknown dtype {dtype!r}; expected one of: {', '.join(table)}")
        value = table[dtype]
        if value is None:
            have = ", ".join(k for k, v in table.items() if v is not None)
            raise MemlibError(f"{self.full_name} has no {dtype} tensor cores; expected one of: {have}")
        return value * 1e12

    @property
    def bandwidth_gb_s(self) -> float:
        """Bandwidth in GB/s (10⁹ bytes per second)."""
        return self.bandwidth_bytes_per_s / 1e9

    @property
    def pcie_bytes_per_s(self) -> float:
        """Host link bandwidth, one direction, bytes/s (PCIe x16 of :attr:`pcie_gen`)."""
        return pcie_bandwidth(self.pcie_gen)

    @property
    def memory_gib(self) -> float:
        """Memory in GiB (2³⁰ bytes): the number the datasheet prints as "GB"."""
        return self.memory_bytes / GiB

    @property
    def memory_gb(self) -> float:
        """Memory in GB (10⁹ bytes): 80 GiB is 85.9 GB."""
        return self.memory_bytes / 1e9

    def ridge_point(self, dtype: str = "bf16") -> float:
        """Roofline ridge point: peak FLOP/s ÷ bandwidth, in FLOP per byte."""
        return self.peak_flops(dtype) / self.bandwidth_bytes_per_s


_A100_DS = ("NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100): BF16/FP16 Tensor Core "
            "312 | 624* TFLOPS (*with sparsity), TF32 156 | 312*, FP32 19.5; 40 GB HBM2 1,555 GB/s, 80 GB HBM2e "
            "2,039 GB/s; NVLink 600 GB/s, PCIe Gen4 64 GB/s")
_H100_DS = ("NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100): BF16/FP16 Tensor Core "
            "1,979* TFLOPS SXM / 1,513* PCIe, FP8 3,958* / 3,026*, TF32 989* / 756*, FP32 67 / 51; *with "
            "sparsity, dense is half; 80 GB, 3.35 TB/s SXM / 2 TB/s PCIe; NVLink 900 GB/s SXM / 600 GB/s PCIe "
            "(bridge), PCIe Gen5 128 GB/s")
_H200_DS = ("NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200): 141 GB HBM3e, 4.8 TB/s; "
            "BF16/FP16 Tensor Core 1,979* TFLOPS, FP8 3,958*, TF32 989*, FP32 67; *with sparsity, dense is half; "
            "NVLink 900 GB/s, PCIe Gen5 128 GB/s")
_B200_DS = ("NVIDIA DGX B200 datasheet (nvidia.com/en-us/data-center/dgx-b200): 8 × B200, 1,440 GB total GPU memory "
            "(180 GB each), 64 TB/s HBM3e (8 TB/s each), NVLink 1.8 TB/s per GPU; per-GPU dense peaks of the HGX "
            "B200 at 1,000 W from NVIDIA's Blackwell datasheet: FP16/BF16 2.25 | 4.5* PFLOPS, FP8 4.5 | 9*, TF32 "
            "1.1 | 2.2*, FP32 80 TFLOPS; *with sparsity")
_H20_PB = ("NVIDIA H20 (HGX H20, the China-market Hopper) product brief as reported by SemiAnalysis and vendors, "
           "2023-11: 96 GB HBM3, 4.0 TB/s; FP8 296 TFLOPS, BF16/FP16 148, TF32 74, FP32 44 (dense); NVLink 900 GB/s, "
           "PCIe Gen5 128 GB/s; NVIDIA publishes no public datasheet page for it")
_V100_DS = ("NVIDIA Tesla V100 datasheet (nvidia.com/en-us/data-center/v100): SXM2 Tensor Performance 125 TFLOPS, "
            "single precision 15.7 TFLOPS, 32/16 GB HBM2, 900 GB/s; NVLink 300 GB/s, PCIe (Gen3) 32 GB/s")
_T4_DS = ("NVIDIA T4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/tesla-t4): mixed precision FP16/FP32 "
          "65 TFLOPS, single precision 8.1 TFLOPS, 16 GB GDDR6, 320+ GB/s; PCIe Gen3 x16")
_L4_DS = ("NVIDIA L4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/l4): FP16/BF16 Tensor Core 242* "
          "TFLOPS, FP8 485*, TF32 120*, FP32 30.3, 24 GB GDDR6, 300 GB/s, PCIe Gen4 x16 64 GB/s; *with sparsity, "
          "dense is half")
_A10_DS = ("NVIDIA A10 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/products/a10-gpu): BF16/FP16 "
           "Tensor Core 125 | 250* TFLOPS, TF32 62.5 | 125*, FP32 31.2, 24 GB GDDR6, 600 GB/s, PCIe Gen4 64 GB/s")
_L40S_DS = ("NVIDIA L40S GPU datasheet (nvidia.com/en-us/data-center/l40s): BF16/FP16 Tensor Core 362.05 | "
            "733* TFLOPS, FP8 733 | 1,466*, TF32 183 | 366*, FP32 91.6, 48 GB GDDR6 with ECC, 864 GB/s, PCIe Gen4 "
            "x16 64 GB/s, no NVLink; *with sparsity")
_ADA_WP = ("NVIDIA Ada GPU Architecture whitepaper (RTX 4090 column): FP16/BF16 Tensor TFLOPS with FP32 "
           "accumulate 165.2 | 330.4*, FP8 with FP32 accumulate 330.3 | 660.6*, TF32 82.6 | 165.2*, FP32 82.6, "
           "24 GB GDDR6X, 1,008 GB/s, PCIe Gen4, no NVLink")
_GA102_WP = ("NVIDIA Ampere GA102 GPU Architecture whitepaper (RTX 3090 column): FP16/BF16 Tensor TFLOPS with "
             "FP32 accumulate 71 | 142*, TF32 35.6 | 71*, FP32 35.6, 24 GB GDDR6X, 936 GB/s, PCIe Gen4, NVLink "
             "(bridge) 112.5 GB/s")

_G = 10**9

#: The table, keyed by short name. Dense peaks throughout (see the module docstring). Columns: bf16, fp16, tf32,
#: fp32 TFLOP/s, memory, bandwidth, memory type, sparse figure printed, fp8 TFLOP/s, PCIe gen, NVLink.
GPUS: dict[str, GpuSpec] = {g.name: g for g in [
    GpuSpec("v100", "Tesla V100 SXM2 32 GB", "Volta", None, 125.0, None, 15.7, 32 * GiB, 900 * _G, "HBM2",
            None, None, 3, 300 * _G, _V100_DS, "no bf16; the PCIe card: 112 TFLOPS tensor, 14 fp32"),
    GpuSpec("t4", "Tesla T4", "Turing", None, 65.0, None, 8.1, 16 * GiB, 320 * _G, "GDDR6", None, None, 3, None,
            _T4_DS, "no bf16; 70 W card"),
    GpuSpec("a10", "A10", "Ampere", 125.0, 125.0, 62.5, 31.2, 24 * GiB, 600 * _G, "GDDR6", 250.0, None, 4, None,
            _A10_DS),
    GpuSpec("a100-40gb", "A100 SXM 40 GB", "Ampere", 312.0, 312.0, 156.0, 19.5, 40 * GiB, 1555 * _G, "HBM2",
            624.0, None, 4, 600 * _G, _A100_DS, "the Strategies notes' 312 TFLOPS"),
    GpuSpec("a100-80gb", "A100 SXM 80 GB", "Ampere", 312.0, 312.0, 156.0, 19.5, 80 * GiB, 2039 * _G,
            "HBM2e", 624.0, None, 4, 600 * _G, _A100_DS, "the PCIe 80 GB card: 1,935 GB/s"),
    GpuSpec("rtx-3090", "GeForce RTX 3090", "Ampere", 71.0, 71.0, 35.6, 35.6, 24 * GiB, 936 * _G, "GDDR6X",
            142.0, None, 4, 112_500_000_000, _GA102_WP,
            "with fp16 accumulation the fp16 tensor peak doubles (142 dense)"),
    GpuSpec("rtx-4090", "GeForce RTX 4090", "Ada Lovelace", 165.2, 165.2, 82.6, 82.6, 24 * GiB, 1008 * _G,
            "GDDR6X", 330.4, 330.3, 4, None, _ADA_WP,
            "with fp16 accumulation the fp16 tensor peak doubles (330.3 dense)"),
    GpuSpec("l4", "L4", "Ada Lovelace", 121.0, 121.0, 60.0, 30.3, 24 * GiB, 300 * _G, "GDDR6", 242.0, 242.5, 4,
            None, _L4_DS, "72 W card; the datasheet prints only the sparsity figures"),
    GpuSpec("l40s", "L40S", "Ada Lovelace", 362.05, 362.05, 183.0, 91.6, 48 * GiB, 864 * _G, "GDDR6", None,
            733.0, 4, None, _L40S_DS,
            "a 48 GiB card; the datasheet's sparsity figure (733) is not twice its dense 362.05"),
    GpuSpec("h100-sxm", "H100 SXM 80 GB", "Hopper", 989.5, 989.5, 494.5, 67.0, 80 * GiB, 3350 * _G, "HBM3",
            1979.0, 1979.0, 5, 900 * _G, _H100_DS),
    GpuSpec("h100-pcie", "H100 PCIe 80 GB", "Hopper", 756.5, 756.5, 378.0, 51.0, 80 * GiB, 2000 * _G,
            "HBM2e", 1513.0, 1513.0, 5, 600 * _G, _H100_DS, "NVLink through a bridge between two cards"),
    GpuSpec("h200", "H200 SXM 141 GB", "Hopper", 989.5, 989.5, 494.5, 67.0, 141 * GiB, 4800 * _G, "HBM3e",
            1979.0, 1979.0, 5, 900 * _G, _H200_DS, "same compute as H100 SXM; more and faster memory"),
    GpuSpec("b200", "B200 SXM 180 GB", "Blackwell", 2250.0, 2250.0, 1100.0, 80.0, 180 * GiB, 8000 * _G, "HBM3e",
            4500.0, 4500.0, 5, 1800 * _G, _B200_DS,
            "HGX B200 (1,000 W); nvidia-smi shows about 179 GiB; the first Blackwell announcement said 192 GB"),
]}

#: The H20 (China-market Hopper), kept out of :data:`GPUS` (whose table the chapters print) until a chapter
#: adds it; the drills' serving questions use it (:func:`memlib.core.cluster.min_gpus_serve` takes a GpuSpec).
H20 = GpuSpec("h20", "H20 96 GB", "Hopper", 148.0, 148.0, 74.0, 44.0, 96 * GiB, 4000 * _G, "HBM3", None, 296.0, 5,
              900 * _G, _H20_PB, "a sixth of H100's compute, more memory bandwidth: built for decode")

#: Memory of every GPU of :data:`GPUS`, in bytes (binary), keyed by short name (``"rtx-4090"``: 24 GiB).
GPU_MEMORY: dict[str, int] = {name: g.memory_bytes for name, g in GPUS.items()}

#: The GPU memory sizes offered by the calculators and widgets, GiB (a 16 GiB T4 to a 141 GiB H200).
GPU_MEMORY_MENU_GIB = (16.0, 24.0, 40.0, 48.0, 80.0, 141.0)
#: The GPUs offered for serving (the live serving calculator's menu and the serving drills): one list, here.
SERVE_GPUS = ("l4", "a10", "rtx-4090", "l40s", "a100-40gb", "a100-80gb", "h100-sxm", "h200")

_ALIASES = {"a100": "a100-80gb", "h100": "h100-sxm", "4090": "rtx-4090", "3090": "rtx-3090", "rtx4090": "rtx-4090",
            "rtx3090": "rtx-3090"}


def gpu_names() -> list[str]:
    """Short names accepted by :func:`get_gpu`, in table order. Introduced in Chapter 12."""
    return list(GPUS)


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU up by short name (case-insensitive; ``a100`` means the 80 GB SXM card, ``h100`` the SXM one).

    Introduced in Chapter 12.

    Raises:
        MemlibError: unknown name; the message lists the valid names.
    """
    key = str(name).strip().lower().replace(" ", "-").replace("_", "-")
    key = _ALIASES.get(key, key)
    if key not in GPUS:
        raise MemlibError(f"unknown GPU {name!r}; expected one of: {', '.join(GPUS)}")
    return GPUS[key]


def match_gpu(device_name: str) -> GpuSpec | None:
    """Best table entry for a CUDA device name (``torch.cuda.get_device_name()``), or None.

    Introduced in Chapter 12. ``"NVIDIA A100-SXM4-80GB"`` → a100-80gb, ``"NVIDIA H100 PCIe"`` → h100-pcie,
    ``"NVIDIA GeForce RTX 4090"`` → rtx-4090.
    """
    n = str(device_name).lower()
    if "b200" in n:
        return GPUS["b200"]
    if "h200" in n:
        return GPUS["h200"]
    if "h100" in n:
        return GPUS["h100-pcie" if "pcie" in n else "h100-sxm"]
    if "a100" in n:
        return GPUS["a100-40gb" if "40g" in n else "a100-80gb"]
    for key, needle in (("rtx-4090", "4090"), ("rtx-3090", "3090"), ("v100", "v100"), ("t4", "t4"),
                        ("l40s", "l40s"), ("l4", "l4"), ("a10", "a10")):
        if needle in n.replace("-", " ").split() or n.endswith(needle) or f" {needle} " in f" {n} ":
            return GPUS[key]
    return None
