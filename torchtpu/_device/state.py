"""Process-wide device state: the current ``tpu`` index and the random number streams.

RNG: each ``tpu:N`` has a default generator state, a JAX PRNG key plus the seed it came
from.  Random ops split a fresh key from it (so a seeded program replays the same
streams).  ``torch.manual_seed(s)`` seeds every tpu device with ``s`` through
``torch.tpu.manual_seed_all``, as it does for CUDA.  The streams are JAX's (threefry),
not PyTorch's CPU Mersenne-Twister: same seed, same tpu numbers; not the CPU's numbers.
"""

from __future__ import annotations

import threading

import numpy as np

_lock = threading.Lock()

# The current ``tpu`` index.  Until the C++ helper is loaded (torchtpu/_tensor/native.py)
# it lives in ``_current``; once loaded, its C++ device guard holds it (so that PyTorch's
# C++ DeviceGuard, e.g. in the autograd engine, and torch.tpu.current_device agree) and
# ``_native`` is that module.  Read it as ``state.current_device``; write it with
# :func:`set_current_device`.
_current = 0
_native = None


def get_current_device() -> int:
    """The current ``tpu`` device index (``torch.tpu.current_device``)."""
    return _current if _native is None else _native.current_device()


def set_current_device(index: int) -> None:
    """Make ``tpu:index`` current (the caller checked the index)."""
    global _current
    _current = int(index)
    if _native is not None:
        _native.set_current_device(_current)


def __getattr__(name):
    if name == "current_device":  # one source of truth, see _current above
        return get_current_device()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class RNGState:
    """Random stream of one device: ``seed`` and ``offset`` (number of keys drawn).

    Keys are derived as ``fold_in(PRNGKey(seed), offset)``; the state is therefore two
    integers, which is what ``get_rng_state`` returns (as a uint8 tensor of 16 bytes).
    """

    __slots__ = ("seed", "offset")

    def __init__(self, seed: int = 67280421310721):
        self.seed = int(seed)
        self.offset = 0

    def next_key_data(self) -> np.ndarray:
        """uint32[4] (seed lo, seed hi, offset lo, offset hi) for the next random op.

        Computed on the host, so drawing a key never syncs; the op's executable turns it
        into ``fold_in(fold_in(key(seed), offset_lo), offset_hi)`` (see ``ops.random``).
        """
        with _lock:
            off = self.offset
            self.offset += 1
        s = self.seed & 0xFFFFFFFFFFFFFFFF
        return np.array([s & 0xFFFFFFFF, s >> 32, off & 0xFFFFFFFF, off >> 32], dtype=np.uint32)

    def get_state(self) -> bytes:
        return np.array([self.seed, self.offset], dtype=np.int64).tobytes()

    def set_state(self, raw: bytes):
        seed, offset = np.frombuffer(raw, dtype=np.int64)
        self.seed, self.offset = int(seed), int(offset)


_rng: dict[int, RNGState] = {}


def rng(index: int) -> RNGState:
    st = _rng.get(index)
    if st is None:
        st = _rng[index] = RNGState()
    return st
