"""memlib: GPU memory estimates (pure Python) and measurements (PyTorch) for The GPU Memory Book.

Dependency direction: ``core`` ← ``measure``, ``viz`` ← ``drills`` ← ``cli``; ``_book`` (one chapter's code) may
import them all and nothing imports it (tests/test_layers.py); no package has an import cycle
(tests/test_import_cycles.py). Each package's ``__init__`` gives the order inside it.
"""
from __future__ import annotations

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
