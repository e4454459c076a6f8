"""pytest setup for the whole repository: make nbval honour a trailing `;` the way Jupyter does."""
from __future__ import annotations

from nbval.kernel import RunningKernel


def _execute_cell_input(self: RunningKernel, cell_input: str, allow_stdin: bool | None = None) -> str:
    # nbval 0.11 runs cells with store_history=False; IPython then checks the *previous* history entry for a
    # trailing ';' and shows the value anyway (nbval#194, ipython#14162). With history on, `fig;` and
    # `ax.legend(...);` are silent under nbval exactly as in Jupyter, so stored outputs match.
    return self.kc.execute(cell_input, store_history=True, allow_stdin=allow_stdin, stop_on_error=False)


RunningKernel.execute_cell_input = _execute_cell_input
