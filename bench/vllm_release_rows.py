"""Check the release rows of memlib.core.vllm_engine against vLLM's own source distributions.

Each row of ``VLLM_RELEASES`` claims a change first shipped in its release. This script looks for the line that
shows the change (a marker) in that release's source and in the release just before it: the marker must be in
the row's release, absent from the one before, and still in the newest release. It needs the source
distributions unpacked under one folder, one subfolder per release (``SDIST_DIR/0.20.1/vllm/...``); only the
files named below are read. To fetch them (PyPI's JSON API gives each release's ``vllm-<version>.tar.gz``)::

    python bench/vllm_release_rows.py --fetch /tmp/vllm_sdists   # needs the network, about 600 MB
    python bench/vllm_release_rows.py /tmp/vllm_sdists

Bisected on 2026-12-03 over every release from 0.7.3 to 0.34.0: every row checks.
"""
from __future__ import annotations

import io
import json
import os
import re
import sys
import tarfile
import urllib.parse
import urllib.request

from memlib.core import vllm_engine as ve

ENVS, ARGS, KVU = "vllm/envs.py", "vllm/engine/arg_utils.py", "vllm/v1/core/kv_cache_utils.py"
SAMPLER = "vllm/v1/sample/ops/topk_topp_sampler.py"
PLAN = "vllm/v1/core/kv_cache_planning.py"  # the page-size padding moved here in 0.33

# row: (release before it, files to search, marker). The V1 switch itself is gone from the newest release (V0
# was removed, and VLLM_USE_V1 with it), so that row is not looked for there.
GONE_SINCE = {"0.8"}
MARKERS = {
    "0.8": ("0.7.3", (ENVS,), r'"VLLM_USE_V1", "1"'),
    "0.8.5": ("0.8.4", (ARGS,), r"device_memory >= 70 \* GiB_bytes"),
    "0.9": ("0.8.5", (ARGS,), r'"a100" not in device_name'),
    "0.9.1": ("0.9.0", (KVU, PLAN), r"Add %d padding layers"),
    "0.17": ("0.16.0", (SAMPLER,), r"return apply_top_k_top_p_triton\("),
    "0.20": ("0.19.1", (ENVS,), r'"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1"'),
    "0.20.1": ("0.20.0", (KVU,), r"int\(max_concurrency \* max_model_len\)"),
    "0.21": ("0.20.2", (ENVS,), r'"VLLM_USE_FLASHINFER_SAMPLER"\]\)\)\s*if "VLLM_USE_FLASHINFER_SAMPLER" in '
                                r'os\.environ\s*else True'),
    "0.28": ("0.27.0", (ARGS,), r"device_memory >= 160 \* GiB_bytes"),
}
FILES = sorted({f for _, files, _ in MARKERS.values() for f in files})


def _full(version: str) -> str:
    return version if version.count(".") >= 2 else version + ".0"


def has_marker(root: str, version: str, files: tuple[str, ...], marker: str) -> bool:
    text = ""
    for f in files:
        path = os.path.join(root, _full(version), f)
        if os.path.exists(path):
            text += open(path, encoding="utf-8").read()
    return re.search(marker, text) is not None


def fetch(root: str) -> None:
    index = json.load(urllib.request.urlopen("https://pypi.org/pypi/vllm/json", timeout=120))
    wanted = {_full(v) for v in MARKERS} | {before for before, _, _ in MARKERS.values()}
    wanted.add(_full(ve.CURRENT_VLLM_VERSION))
    for v in sorted(wanted):
        if os.path.isdir(os.path.join(root, v)):
            continue
        sdist = next(f for f in index["releases"][v] if f["packagetype"] == "sdist")
        data = urllib.request.urlopen(urllib.parse.urljoin("https://pypi.org/pypi/vllm/json", sdist["url"]),
                                      timeout=600).read()
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar.getmembers():
                rel = m.name.split("/", 1)[-1]
                if rel in FILES and m.isfile():
                    out = os.path.join(root, v, rel)
                    os.makedirs(os.path.dirname(out), exist_ok=True)
                    with open(out, "wb") as fh:
                        fh.write(tar.extractfile(m).read())
        print(f"fetched {v}")


def main(root: str) -> int:
    bad = 0
    newest = _full(ve.CURRENT_VLLM_VERSION)
    print(f"{'row':<7} {'before':<7} {'absent before':>13} {'in row':>6} {'in ' + newest:>9}  note")
    for row, (before, files, marker) in MARKERS.items():
        checks = (not has_marker(root, before, files, marker), has_marker(root, row, files, marker),
                  row in GONE_SINCE or has_marker(root, newest, files, marker))
        bad += not all(checks)
        print(f"{row:<7} {before:<7} {str(checks[0]):>13} {str(checks[1]):>6} {str(checks[2]):>9}  "
              f"{ve.VLLM_RELEASES[row].note[:70]}")
    print("every row checks" if not bad else f"{bad} row(s) do not check")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--fetch":
        fetch(sys.argv[2])
        sys.exit(0)
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
