"""memlib.measure: the tracer and every PyTorch-based measurement (CPU traces, CUDA readings, distributed runs).

Imports :mod:`memlib.core`, never :mod:`memlib.viz` or :mod:`memlib.drills`; torch is imported lazily. Dependency
direction inside (a module imports only those before it; ``tests/test_import_cycles.py``): ``deps``, ``procs``,
``results`` → ``tracker``, ``hf_config`` (configs and the model built from them), ``autocast``, ``flash``,
``offload``, ``parallel_counters`` → ``recipes`` (each framework's traced step) → ``trace`` → ``checkpointing``,
``profiling``, ``quant``, ``distributed`` → ``parallel``.
"""
import logging as _logging

# torchao (a requirement since Chapter 17) is imported by transformers when a model is built; its import logs that
# its CUDA-only libraries do not load on a CPU machine, and torch's pytree logs a deprecation note for its enums.
# Neither concerns a measurement, and stderr lines would change every notebook's stored outputs.
for _name in ("torchao", "torch.utils._pytree"):
    _logging.getLogger(_name).setLevel(_logging.ERROR)
