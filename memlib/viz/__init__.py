"""memlib.viz: drawing only: matplotlib figures, ipywidgets and the HTML/SVG of the live calculators.

Imports :mod:`memlib.core` only (never torch or :mod:`memlib.measure`). Dependency direction inside
(``tests/test_import_cycles.py``): ``html_tables``, ``plots``, ``plots_inference``, ``plots_profiling`` →
``plots_plan``, ``live``, ``widgets_inference`` → ``widgets`` → ``widgets_plan``.
"""
