"""Recorded GPU results: one provenance record, and ``load_or_measure`` for every GPU cell of the book.

Introduced in Chapter 1's lab. A GPU cell measures when a CUDA GPU is present and saves the result under
``labs/results/<name>.json``; without one it shows that recorded file and says where it was recorded, or says
that nothing is recorded yet. Every file there is the measured data (a JSON object) plus one key,
``"provenance"``, written by :class:`Provenance` and only by it::

    {"provenance": {"device": "NVIDIA H100 80GB HBM3", "torch": "2.13.0+cu128", "cuda": "12.8",
                    "date": "2026-12-01T21:33:25Z", "command": "python labs/gpu_suite.py --only inference",
                    "memlib": "0.1.0", "git_commit": "f8deb38a1c2e"},
     "rows": [...]}

``date`` is UTC in ISO 8601 (``YYYY-MM-DDTHH:MM:SSZ``). Files written before this record existed kept
``device``/``device_name``/``cuda_device_name``, ``torch`` and ``date``/``date_utc`` at the top level:
:func:`normalise_record` lifts those keys into the record (a date-only value stays a date) and leaves every
measured value as it was. Measurement module: torch is imported only when :func:`load_or_measure` checks
for CUDA or :meth:`Provenance.of_this_run` reads the device.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..core.errors import MemlibError

__all__ = ["DATE_FORMAT", "RESULTS_DIR", "Provenance", "Recorded", "load_or_measure", "load_recorded",
           "normalise_record", "save_recorded"]

REPO = Path(__file__).resolve().parents[2]
#: Where the recorded GPU results live: ``labs/results/`` of the repository.
RESULTS_DIR = REPO / "labs" / "results"
#: The one date format of a provenance record: UTC, ISO 8601, to the second.
DATE_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}:\d{2}Z)?")
# top-level keys of records written before the provenance record, and the field each one meant
_LEGACY_KEYS = {"device": "device", "device_name": "device", "cuda_device_name": "device", "torch": "torch",
                "cuda": "cuda", "date": "date", "date_utc": "date"}
_UNKNOWN = "unknown (recorded before provenance records)"


@dataclass(frozen=True)
class Provenance:
    """Where and when a GPU result was measured: written into every JSON file under ``labs/results/``.

    Introduced in Chapter 1's lab.

    Attributes:
        device: ``torch.cuda.get_device_name()``, e.g. ``"NVIDIA H100 80GB HBM3"``.
        torch: ``torch.__version__``.
        cuda: ``torch.version.cuda`` (None for a CPU-only torch).
        date: UTC date-time in ISO 8601 (:data:`DATE_FORMAT`); a date alone for a converted legacy record.
        command: what produced the file (``python labs/gpu_suite.py --only inference``, a notebook's path).
        memlib: ``memlib.__version__``.
        git_commit: the repository's ``HEAD`` (12 hex digits), None where git is not available.
    """

    device: str
    torch: str
    cuda: str | None
    date: str
    command: str
    memlib: str
    git_commit: str | None

    def __post_init__(self) -> None:
        if not _ISO_DATE.fullmatch(self.date):
            raise MemlibError(f"provenance date {self.date!r} is not UTC ISO 8601; expected YYYY-MM-DDTHH:MM:SSZ")

    @classmethod
    def of_this_run(cls, command: str) -> Provenance:
        """The record of a measurement made now on CUDA device 0 (imports torch; needs a CUDA GPU)."""
        import torch

        from .. import __version__

        return cls(device=torch.cuda.get_device_name(0), torch=torch.__version__, cuda=torch.version.cuda,
                   date=datetime.now(timezone.utc).strftime(DATE_FORMAT), command=command, memlib=__version__,
                   git_commit=_git_commit())

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Provenance:
        """Read the ``"provenance"`` object of a results file; the keys must be exactly the fields."""
        names = [f.name for f in fields(cls)]
        if not isinstance(raw, dict) or sorted(raw) != sorted(names):
            got = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
            raise MemlibError(f"bad provenance record {got!r}; expected the keys: {', '.join(names)}")
        return cls(**raw)

    def as_dict(self) -> dict[str, Any]:
        """The JSON object stored under ``"provenance"``."""
        return asdict(self)

    def describe(self) -> str:
        """One phrase naming the device, the versions and the date: ``NVIDIA H100 (torch 2.13.0, 2026-12-01…)``."""
        cuda = f", CUDA {self.cuda}" if self.cuda else ""
        return f"{self.device} (torch {self.torch}{cuda}, {self.date})"


@dataclass(frozen=True)
class Recorded:
    """A GPU result with its provenance, measured in this run or loaded from ``labs/results/``.

    Introduced in Chapter 1's lab. ``recorded["rows"]`` reads the data directly.

    Attributes:
        name: the file's stem under ``labs/results/``.
        data: the measured values, as stored in JSON (without the provenance key).
        provenance: where and when they were measured.
        measured_now: True when this run measured them (on a CUDA GPU), False when they were loaded.
        path: the JSON file.
    """

    name: str
    data: dict[str, Any]
    provenance: Provenance
    measured_now: bool
    path: Path

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @property
    def source(self) -> str:
        """The one line a GPU cell prints: measured now, or recorded (device, versions, date) and not measured."""
        where = _display(self.path)
        if self.measured_now:
            return f"measured now on {self.provenance.device}; saved to {where}"
        return f"recorded on {self.provenance.describe()} in {where}, not measured in this run"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None


def _display(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


def _path(name: str, results_dir: str | Path | None) -> Path:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) or name.endswith(".json"):
        raise MemlibError(f"bad results name {name!r}; expected a file stem such as 'inference_serving'")
    return Path(RESULTS_DIR if results_dir is None else results_dir) / f"{name}.json"


def normalise_record(raw: dict[str, Any]) -> tuple[dict[str, Any], Provenance]:
    """Split a results file's JSON object into the measured data and its provenance.

    A file with a ``"provenance"`` key is read as is. An older file keeps its provenance at the top level
    (``device``, ``device_name`` or ``cuda_device_name``; ``torch``; ``cuda``; ``date`` or ``date_utc``): those
    keys move into the record, an ISO date-time with an offset becomes ``…Z``, a date alone stays a date, and
    ``command``/``memlib`` say ``unknown``. Every other key is returned unchanged.

    Raises:
        MemlibError: not a JSON object, or neither a provenance record nor a device key.
    """
    if not isinstance(raw, dict):
        raise MemlibError(f"a results file holds a JSON object, got {type(raw).__name__}")
    data = dict(raw)
    if "provenance" in data:
        return data, Provenance.from_dict(data.pop("provenance"))
    legacy = {key: data.pop(key) for key in list(data) if key in _LEGACY_KEYS}
    found = {_LEGACY_KEYS[key]: value for key, value in legacy.items()}
    if "device" not in found:
        raise MemlibError(f"results record without provenance; expected a 'provenance' key or one of: "
                          f"{', '.join(_LEGACY_KEYS)}")
    date = str(found.get("date", "0001-01-01"))
    if not _ISO_DATE.fullmatch(date):
        date = datetime.fromisoformat(date).astimezone(timezone.utc).strftime(DATE_FORMAT)
    return data, Provenance(device=str(found["device"]), torch=str(found.get("torch", "unknown")),
                            cuda=found.get("cuda"), date=date, command=_UNKNOWN, memlib="unknown", git_commit=None)


def save_recorded(name: str, data: dict[str, Any], provenance: Provenance,
                  results_dir: str | Path | None = None) -> Recorded:
    """Write ``data`` with ``provenance`` to ``<results_dir>/<name>.json`` and return it as stored.

    Introduced in Chapter 1's lab. The returned data is what a later run loads (JSON round trip: tuples
    become lists, keys strings), so a measured and a recorded run print the same thing. Top-level keys that
    restate the provenance (``device``, ``device_name``, ``cuda_device_name``, ``torch``, ``cuda``, ``date``,
    ``date_utc``: some measurement functions return them) are not stored twice: the record holds them.

    Raises:
        MemlibError: a bad name, data that is not a dict, or data that already holds a ``"provenance"`` key.
    """
    path = _path(name, results_dir)
    if not isinstance(data, dict) or "provenance" in data:
        raise MemlibError(f"results {name!r}: expected a dict of measured values without a 'provenance' key")
    kept = {key: value for key, value in data.items() if key not in _LEGACY_KEYS}
    text = json.dumps({"provenance": provenance.as_dict(), **kept}, indent=1, ensure_ascii=False, default=str)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")
    stored, _ = normalise_record(json.loads(text))
    return Recorded(name, stored, provenance, measured_now=True, path=path)


def load_recorded(name: str, results_dir: str | Path | None = None) -> Recorded | None:
    """The recorded result ``<results_dir>/<name>.json``, or None when there is no such file."""
    path = _path(name, results_dir)
    if not path.exists():
        return None
    data, provenance = normalise_record(json.loads(path.read_text(encoding="utf-8")))
    return Recorded(name, data, provenance, measured_now=False, path=path)


def load_or_measure(name: str, measure_fn: Callable[[], dict[str, Any]], *, command: str | None = None,
                    available: bool | None = None, needs: str = "a CUDA GPU",
                    results_dir: str | Path | None = None,
                    report: Callable[[str], object] | None = print) -> Recorded | None:
    """Measure on the GPU and record, else load the recorded result, else say that none is recorded.

    Introduced in Chapter 1's lab; every GPU cell of the book and ``labs/gpu_suite.py`` call it. With a GPU
    (``available``; by default ``torch.cuda.is_available()``) it runs ``measure_fn`` and saves its dict with a
    :class:`Provenance` under ``labs/results/<name>.json``. Without one it loads that file, if present. It
    reports one line either way (:attr:`Recorded.source`, or that nothing is recorded).

    Args:
        name: the file's stem under ``labs/results/`` (``"inference_serving"``).
        measure_fn: takes no argument, measures, returns a JSON-ready dict (no ``"provenance"`` key).
        command: what produced the record (the notebook's path, the suite's command line); by default
            this process's command line.
        available: whether to measure; None asks ``torch.cuda.is_available()``.
        needs: what measuring needs, for the line said when nothing is recorded (``"2 or more CUDA GPUs"``).
        results_dir: another folder than ``labs/results/`` (tests).
        report: called with the one line (default ``print``); None says nothing.

    Returns:
        The measured or recorded result, or None when there is no GPU and no recorded file.
    """
    path = _path(name, results_dir)
    if available is None:
        import torch

        available = bool(torch.cuda.is_available())
    if available:
        provenance = Provenance.of_this_run(command or shlex.join(["python", *sys.argv]))
        recorded: Recorded | None = save_recorded(name, measure_fn(), provenance, results_dir)
    else:
        recorded = load_recorded(name, results_dir)
    if report is not None:
        report(recorded.source if recorded is not None else
               f"not recorded: no GPU run is recorded yet ({_display(path)} is missing), and measuring needs {needs}")
    return recorded
