"""pytest setup for the whole repository: tests run on the CPU only; nbval honours a trailing `;` as Jupyter does."""
from __future__ import annotations

import os

from nbval.kernel import RunningKernel

# The tests (and the notebook kernels nbval starts, which inherit this environment) never see a GPU: on a CUDA
# machine they run the same CPU paths as CI, measure nothing on the device and write nothing into labs/results/.
# GPU measurements are made by `python labs/gpu_suite.py`, never by pytest.
os.environ["CUDA_VISIBLE_DEVICES"] = ""

# The portable-kernel run (ATEN_CPU_CAPABILITY=default, as CI and README do) on a CPU with AMX (Sapphire Rapids and
# later): torch 2.13's bf16 scaled_dot_product_attention asks oneDNN whether its brgemm wants packed (VNNI) weights,
# oneDNN answers for AMX, and ATen's default-capability build of pack_vnni2 then raises "pack_vnni2 is only
# supported when avx512 is supported". Capping oneDNN at AVX2 as well keeps both libraries on portable paths.
if os.environ.get("ATEN_CPU_CAPABILITY") == "default":
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")


def _execute_cell_input(self: RunningKernel, cell_input: str, allow_stdin: bool | None = None) -> str:
    # nbval 0.11 runs cells with store_history=False; IPython then checks the *previous* history entry for a
    # trailing ';' and shows the value anyway (nbval#194, ipython#14162). With history on, `fig;` and
    # `ax.legend(...);` are silent under nbval exactly as in Jupyter, so stored outputs match.
    return self.kc.execute(cell_input, store_history=True, allow_stdin=allow_stdin, stop_on_error=False)


RunningKernel.execute_cell_input = _execute_cell_input


# --- The time budget (issue 30) -------------------------------------------------------------------------------------
# `pytest` runs on every core (pytest.ini: -n auto --dist loadfile; a notebook's cells share one kernel, so a file
# is never split across workers). The heaviest files go first, so that no long file starts last and runs alone:
# mypy (it analyses torch and transformers on a fresh clone), then the notebooks, then the unit-test files.
# At the end the slowest ten files are printed, and each notebook over its budget is named (a budget, not a
# test: timings depend on the machine, so nothing fails on them; CI prints them for the reviewer).
NOTEBOOK_BUDGET_S = 60.0
_FIRST = ("tests/test_typing.py",)
_seconds_by_file: dict[str, float] = {}


def _rank(path: str) -> int:
    return 0 if path in _FIRST else 1 if path.endswith(".ipynb") else 2


def pytest_collection_modifyitems(items: list) -> None:
    items.sort(key=lambda item: _rank(item.nodeid.split("::")[0]))  # stable: the order within a file is kept


def pytest_runtest_logreport(report) -> None:  # noqa: ANN001 (pytest's TestReport)
    path = report.nodeid.split("::")[0]
    _seconds_by_file[path] = _seconds_by_file.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
    if not _seconds_by_file:
        return
    tr = terminalreporter
    tr.section("slowest files (setup + call + teardown, seconds)")
    for path, seconds in sorted(_seconds_by_file.items(), key=lambda kv: -kv[1])[:10]:
        over = f"  over the {NOTEBOOK_BUDGET_S:.0f} s notebook budget" if (
            path.endswith(".ipynb") and seconds > NOTEBOOK_BUDGET_S) else ""
        tr.write_line(f"{seconds:8.1f}  {path}{over}")
    over = [p for p, s in _seconds_by_file.items() if p.endswith(".ipynb") and s > NOTEBOOK_BUDGET_S]
    tr.write_line(f"notebooks over the {NOTEBOOK_BUDGET_S:.0f} s budget: {len(over)}")
