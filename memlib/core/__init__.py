"""memlib.core: pure Python estimators (configs, units, hardware, params, training/inference/serving memory, planner); imports no torch."""
