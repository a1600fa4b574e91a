"""Benchmarks that print ratios measured in one run (never timed unit tests).

    python -m torchtpu.bench eager     # training steps in STRICT / DEFER_AND_FUSE / DEBUG
    python -m torchtpu.bench overhead  # per-op dispatch cost vs PyTorch CPU and jax.numpy
"""
