"""memlib.measure.results: one provenance record, and load_or_measure's three cases (measure, load, say so)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlib import MemlibError
from memlib.measure import results
from memlib.measure.results import Provenance, load_or_measure, load_recorded, normalise_record, save_recorded

H100 = Provenance(device="NVIDIA H100 80GB HBM3", torch="2.13.0+cu128", cuda="12.8", date="2026-12-01T21:33:25Z",
                  command="python labs/gpu_suite.py --only inference", memlib="0.1.0", git_commit="f8deb38a1c2e")


@pytest.fixture
def on_h100(monkeypatch: pytest.MonkeyPatch) -> None:
    """Provenance.of_this_run as on an H100 (no GPU here to ask)."""
    monkeypatch.setattr(Provenance, "of_this_run",
                        classmethod(lambda cls, command: H100.__class__(**{**H100.as_dict(), "command": command})))


def test_nothing_recorded_without_a_gpu_says_so_and_returns_none(tmp_path: Path) -> None:
    lines: list[str] = []
    calls: list[int] = []
    got = load_or_measure("absent", lambda: calls.append(1) or {}, available=False, results_dir=tmp_path,
                          report=lines.append)
    assert got is None and calls == []
    assert len(lines) == 1 and lines[0].startswith("not recorded") and "absent.json is missing" in lines[0]
    assert "a CUDA GPU" in lines[0]


def test_measure_with_a_gpu_records_then_a_run_without_one_loads_it(tmp_path: Path, on_h100: None) -> None:
    lines: list[str] = []
    measured = load_or_measure("serving", lambda: {"rows": [{"kv": 123, "shape": (2, 3)}]}, command="nb.ipynb",
                               available=True, results_dir=tmp_path, report=lines.append)
    assert measured is not None and measured.measured_now
    assert measured["rows"] == [{"kv": 123, "shape": [2, 3]}]  # as stored: the JSON round trip
    stored = json.loads((tmp_path / "serving.json").read_text())
    assert stored["provenance"] == {**H100.as_dict(), "command": "nb.ipynb"} and stored["rows"] == measured["rows"]
    assert lines == [f"measured now on NVIDIA H100 80GB HBM3; saved to {tmp_path / 'serving.json'}"]

    def not_called() -> dict[str, Any]:
        raise AssertionError("measured without a GPU")

    loaded = load_or_measure("serving", not_called, available=False, results_dir=tmp_path, report=lines.append)
    assert loaded is not None and not loaded.measured_now
    assert loaded.data == measured.data and loaded.provenance == measured.provenance
    assert lines[1] == (f"recorded on NVIDIA H100 80GB HBM3 (torch 2.13.0+cu128, CUDA 12.8, 2026-12-01T21:33:25Z)"
                        f" in {tmp_path / 'serving.json'}, not measured in this run")


def test_the_source_line_names_the_file_relative_to_the_repository(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results, "REPO", tmp_path)
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path / "labs" / "results")
    recorded = save_recorded("x", {"a": 1}, H100)
    assert recorded.path == tmp_path / "labs" / "results" / "x.json"
    assert recorded.source == "measured now on NVIDIA H100 80GB HBM3; saved to labs/results/x.json"
    assert load_recorded("x") is not None


@pytest.mark.parametrize("device_key", ["device", "device_name", "cuda_device_name"])
@pytest.mark.parametrize(("date_key", "date", "iso"), [("date", "2026-11-30", "2026-11-30"),
                                                       ("date_utc", "2026-11-30T08:01:02Z", "2026-11-30T08:01:02Z"),
                                                       ("date", "2026-11-30T09:01:02+01:00", "2026-11-30T08:01:02Z")])
def test_legacy_records_are_normalised_and_keep_every_measured_value(device_key: str, date_key: str, date: str,
                                                                     iso: str) -> None:
    raw = {device_key: "NVIDIA A100-SXM4-80GB", "torch": "2.5.1", date_key: date, "rows": [{"peak": 1.5}], "n": 3}
    data, provenance = normalise_record(raw)
    assert data == {"rows": [{"peak": 1.5}], "n": 3}
    assert (provenance.device, provenance.torch, provenance.date) == ("NVIDIA A100-SXM4-80GB", "2.5.1", iso)
    assert provenance.cuda is None and provenance.command.startswith("unknown")


def test_bad_input_raises_one_line_memlib_errors(tmp_path: Path) -> None:
    with pytest.raises(MemlibError, match="bad results name '../x'"):
        load_recorded("../x", tmp_path)
    with pytest.raises(MemlibError, match="without a 'provenance' key"):
        save_recorded("x", {"provenance": 1}, H100, tmp_path)
    with pytest.raises(MemlibError, match="not UTC ISO 8601"):
        Provenance(**{**H100.as_dict(), "date": "01/12/2026"})
    with pytest.raises(MemlibError, match="expected the keys: device, torch"):
        Provenance.from_dict({"device": "x"})
    with pytest.raises(MemlibError, match="without provenance"):
        normalise_record({"rows": []})


def test_keys_that_restate_the_provenance_are_stored_once(tmp_path: Path) -> None:
    measured = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.13.0", "date_utc": "2026-12-01T21:33:25Z",
                "rows": [1, 2], "nested": {"device_name": "kept"}}
    saved = save_recorded("x", measured, H100, tmp_path)
    stored = json.loads((tmp_path / "x.json").read_text())
    assert saved.data == {"rows": [1, 2], "nested": {"device_name": "kept"}}
    assert set(stored) == {"provenance", "rows", "nested"}


LEGACY = {"provenance", "device", "device_name", "cuda_device_name", "torch", "cuda", "date", "date_utc"}
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5)
                           | st.floats(allow_nan=False, allow_infinity=False),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                       max_size=3), max_leaves=10)


@settings(max_examples=40, deadline=None)
@given(data=st.dictionaries(st.text(min_size=1, max_size=6).filter(lambda k: k not in LEGACY), json_values,
                            max_size=4))
def test_save_then_load_gives_back_every_value(tmp_path_factory: pytest.TempPathFactory,
                                               data: dict[str, Any]) -> None:
    folder = tmp_path_factory.mktemp("r")
    saved = save_recorded("r", data, H100, folder)
    loaded = load_recorded("r", folder)
    assert loaded is not None and saved.data == loaded.data == data and loaded.provenance == H100


def test_the_gpu_recorders_refuse_without_a_gpu_and_write_nothing(tmp_path: Path) -> None:
    from memlib.measure.offload import run_gpu_suite
    from memlib.measure.quant import gpu_paged_adamw_run

    with pytest.raises(MemlibError, match="needs a CUDA GPU"):
        run_gpu_suite(tmp_path / "07_offload.json")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        gpu_paged_adamw_run(tmp_path / "09_paged_adamw.json")
    assert list(tmp_path.iterdir()) == []
