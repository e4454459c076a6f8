"""memlib.measure: the tracer and every PyTorch-based measurement (CPU traces, CUDA readings, distributed runs).

Imports :mod:`memlib.core`, never :mod:`memlib.viz` or :mod:`memlib.drills`; torch is imported lazily. Dependency
direction inside (a module imports only those before it; ``tests/test_import_cycles.py``): ``deps``, ``procs``,
``results`` → ``tracker``, ``hf_config`` (configs and the model built from them), ``autocast``, ``flash``,
``offload``, ``parallel_counters`` → ``recipes`` (each framework's traced step) → ``trace`` → ``checkpointing``,
``profiling``, ``quant``, ``distributed`` → ``parallel``.
"""
