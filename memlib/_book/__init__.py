"""Book helpers: code one chapter or lab uses, outside the public API.

One module per chapter or lab, named after it (``ch06_zero_fsdp`` serves ``chapters/06_zero_fsdp.ipynb``). The
notebooks, the tests and the lab scripts import these modules; memlib's public layers (core, measure, viz,
drills, the CLI) never do (tests/test_layers.py); a chapter's module may import any public layer (and its own
chapter's other modules). Names here may change with the chapter that uses them.
"""
