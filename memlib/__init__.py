"""memlib: GPU memory estimates (pure Python) and measurements (PyTorch) for The GPU Memory Book.

Dependency direction: ``core`` ← ``measure``, ``viz`` ← ``drills`` ← ``cli``; ``_book`` (one chapter's code) may
import them all and nothing imports it (tests/test_layers.py); no package has an import cycle
(tests/test_import_cycles.py). Each package's ``__init__`` gives the order inside it.
"""
from __future__ import annotations

import logging as _logging

# torchao (a requirement since Chapter 17) is imported by transformers when a model is built; its import logs that
# its CUDA-only libraries do not load on a CPU machine, and torch's pytree logs a deprecation note for its enums.
# Neither concerns a measurement, and stderr lines would change every notebook's stored outputs. Set here, at the
# first import of memlib, so a notebook that builds a model after `import memlib` prints nothing.
for _name in ("torchao", "torch.utils._pytree"):
    _logging.getLogger(_name).setLevel(_logging.ERROR)

from .core.categories import MemCategory
from .core.configs import ModelConfig, load_config, shipped_models
from .core.dtypes import GB, GiB, dtype_bytes, format_bytes, parse_size
from .core.errors import MemlibError
from .core.params import ParamCount, count_params
from .core.serve import ServeFit, serve

__all__ = [
    "GB",
    "GiB",
    "MemCategory",
    "MemlibError",
    "ModelConfig",
    "ParamCount",
    "ServeFit",
    "count_params",
    "dtype_bytes",
    "format_bytes",
    "load_config",
    "parse_size",
    "serve",
    "shipped_models",
]
__version__ = "0.1.0"
