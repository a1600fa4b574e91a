"""Process-wide device state: the current ``tpu`` index and the random number streams.

RNG: each ``tpu:N`` has a default generator state, a JAX PRNG key plus the seed it came
from.  Random ops split a fresh key from it (so a seeded program replays the same
streams).  ``torch.manual_seed(s)`` seeds every tpu device with ``s`` through
``torch.tpu.manual_seed_all``, as it does for CUDA.  The streams are XLA's
``RngBitGenerator`` keyed by a hash of (seed, offset), not PyTorch's CPU Mersenne-Twister:
same seed, same tpu numbers (on one platform and JAX version); not the CPU's numbers.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

_lock = threading.Lock()

# The current ``tpu`` index.  Until the C++ helper is loaded (torchtpu/_tensor/native.py)
# it lives in ``_current``; once loaded, its C++ device guard holds it (so that PyTorch's
# C++ DeviceGuard, e.g. in the autograd engine, and torch.tpu.current_device agree) and
# ``_native`` is that module.  Read it as ``state.current_device``; write it with
# :func:`set_current_device`.
_current = 0
_native = None
# installs the C++ device guard (``torchtpu._tensor.native.install_device_guard``, handed
# in by ``torchtpu._device.register``: this module stays below the C++ helper's)
_guard_installer = None


def set_guard_installer(fn) -> None:
    """``fn()``: installs the C++ device guard; called the first time a device other than
    ``tpu:0`` is made current."""
    global _guard_installer
    _guard_installer = fn


def get_current_device() -> int:
    """The current ``tpu`` device index (``torch.tpu.current_device``)."""
    return _current if _native is None else _native.current_device()


def to_index(device) -> int:
    """The ``tpu`` index that ``device`` names (the argument of ``torch.tpu`` functions):
    ``None`` and ``"tpu"`` mean the current device; an int, ``"tpu:N"`` or a
    ``torch.device``.

    Raises:
        ValueError: a device of another type.
        TypeError: anything else.
    """
    if device is None:
        return get_current_device()
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {device}")
        return get_current_device() if device.index is None else device.index
    raise TypeError(f"invalid device {device!r}")


def set_current_device(index: int) -> None:
    """Make ``tpu:index`` current (the caller checked the index).

    A device other than ``tpu:0`` installs the C++ device guard first
    (``torchtpu._tensor.native``): PyTorch's Python backend API resolves ``"tpu"``
    without an index (``x.to("tpu")``, ``torch.accelerator.current_device_index()``)
    through its own guard, which knows only index 0."""
    global _current
    _current = int(index)
    if _native is None and _current != 0 and _guard_installer is not None:
        _guard_installer()  # hands _current to the C++ guard
    if _native is not None:
        _native.set_current_device(_current)


def __getattr__(name):
    if name == "current_device":  # one source of truth, see _current above
        return get_current_device()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class RNGState:
    """Random stream of one device: ``seed`` and ``offset`` (number of keys drawn).

    Keys are derived on the host as a hash of (seed, offset); the state is therefore two
    integers, which is what ``get_rng_state`` returns (as a uint8 tensor of 16 bytes).
    """

    __slots__ = ("seed", "offset")

    def __init__(self, seed: int = 67280421310721):
        self.seed = int(seed)
        self.offset = 0

    def next_key_data(self) -> np.ndarray:
        """uint32[4]: the key of the next random op, a 128-bit hash of (seed, offset).

        Computed on the host (SplitMix64 finalizers), so drawing a key never syncs and
        costs no device work; the op's executable uses it as the state of XLA's
        ``RngBitGenerator`` (JAX's ``rbg`` key, see ``ops.random.prng_key``).  Distinct
        (seed, offset) pairs give unrelated 128-bit keys, hence independent streams.
        """
        with _lock:
            off = self.offset
            self.offset += 1
        return _mix_key(self.seed & _M64, off & _M64)
    def get_state(self) -> bytes:
        return np.array([self.seed, self.offset], dtype=np.int64).tobytes()

    def set_state(self, raw: bytes):
        seed, offset = np.frombuffer(raw, dtype=np.int64)
        self.seed, self.offset = int(seed), int(offset)


_M64 = 0xFFFFFFFFFFFFFFFF


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _mix_key(seed: int, off: int) -> np.ndarray:
    """uint32[4] key words: two chained SplitMix64 hashes of ``seed`` and ``off``."""
    a = _splitmix64(seed ^ _splitmix64(off))
    b = _splitmix64(a ^ off ^ 0x5851F42D4C957F2D)
    return np.array([a & 0xFFFFFFFF, a >> 32, b & 0xFFFFFFFF, b >> 32], dtype=np.uint32)


_rng: dict[int, RNGState] = {}


def rng(index: int) -> RNGState:
    st = _rng.get(index)
    if st is None:
        st = _rng[index] = RNGState()
    return st
