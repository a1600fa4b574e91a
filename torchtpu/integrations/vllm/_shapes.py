"""Shape buckets of the vLLM plugin: the sizes a model step and its attention are padded to
(``model_runner``: token counts; ``attention``: requests, query rows, blocks), so that a
new batch composition meets shapes that have run before and compiles nothing."""

from __future__ import annotations

# the least padded token count of a model step
MIN_TOKENS = 16


def bucket(n: int, least: int = 1, most: int | None = None) -> int:
    """The smallest power of two >= ``n`` and >= ``least``, capped at ``most`` (never
    below ``n``)."""
    b = max(least, 1)
    while b < n:
        b *= 2
    if most is not None:
        b = min(b, most)
    return max(b, n)


def padded_tokens(n: int, most: int) -> int:
    """The token count a model step of ``n`` tokens runs at (vLLM's
    ``max_num_batched_tokens`` ``most``): :func:`bucket` from :data:`MIN_TOKENS`."""
    return bucket(n, MIN_TOKENS, most)


def token_buckets(most: int) -> list[int]:
    """Every count :func:`padded_tokens` can return: the powers of two from
    :data:`MIN_TOKENS` below ``most``, then ``most`` (``bucket``'s cap)."""
    out, b = [], MIN_TOKENS
    while b < most:
        out.append(b)
        b *= 2
    return out + [most]
