"""memlib.core: pure Python estimators (configs, units, hardware, params, training/inference/serving memory, planner); imports no torch.

Dependency direction (a module imports only modules listed before it; ``tests/test_import_cycles.py`` fails on
any cycle):

1. facts: ``errors``, ``categories``, ``search``, ``dtypes``, ``configs``, ``terms`` (the value types),
   ``choices`` (every choice list), ``hardware``, ``formats``, and the small pure models ``checkpointing``,
   ``flash``, ``quant``, ``scaler``, ``profiling``, ``tracing``, ``zero``;
2. the model's terms: ``attention_terms`` → ``families_dense`` → ``families_moe`` → ``params`` → ``lora``,
   ``activations`` (torch.autocast's terms too), ``flops``; ``setup`` (validated settings);
   ``serving_terms`` (KV cache, tensor-parallel degrees, the reserve);
3. training: ``autocast`` (its backward moments) and ``frameworks/`` (``base`` ← one module per framework ←
   the registry) → ``states`` (model states composed from the framework objects) → ``parallel`` →
   ``estimate``;
4. serving and planning: ``serve`` → ``inference``; ``offload``; ``plan``.
"""
