"""Eager executors: strict (asynchronous per-op), debug (synchronous) and DeferAndFuse."""
