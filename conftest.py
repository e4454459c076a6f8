"""pytest setup for the whole repository: tests run on the CPU only; nbval honours a trailing `;` as Jupyter does."""
from __future__ import annotations

import os

from nbval.kernel import RunningKernel

# The tests (and the notebook kernels nbval starts, which inherit this environment) never see a GPU: on a CUDA
# machine they run the same CPU paths as CI, measure nothing on the device and write nothing into labs/results/.
# GPU measurements are made by `python labs/gpu_suite.py`, never by pytest.
os.environ["CUDA_VISIBLE_DEVICES"] = ""


def _execute_cell_input(self: RunningKernel, cell_input: str, allow_stdin: bool | None = None) -> str:
    # nbval 0.11 runs cells with store_history=False; IPython then checks the *previous* history entry for a
    # trailing ';' and shows the value anyway (nbval#194, ipython#14162). With history on, `fig;` and
    # `ax.legend(...);` are silent under nbval exactly as in Jupyter, so stored outputs match.
    return self.kc.execute(cell_input, store_history=True, allow_stdin=allow_stdin, stop_on_error=False)


RunningKernel.execute_cell_input = _execute_cell_input
