"""``torch.Generator(device="tpu")``.

PyTorch's Python backend API cannot create a C++ generator for PrivateUse1, so
``torch.Generator`` is replaced by a subclass (:class:`Generator`) whose tpu instances
are backed by a CPU generator and report ``device == tpu``.  A tpu random op given such
a generator draws one 63-bit seed from it (advancing it, so ``manual_seed`` /
``get_state`` / ``set_state`` replay streams exactly) and runs with a fresh stream
seeded by it.

Offsets (``get_offset`` / ``set_offset``, which CUDA's Philox generators have and CPU
generators refuse): a tpu generator's offset is 4 times the draws since its seed was
set, and ``g.set_offset(k)`` for an earlier offset puts back the state it had then, as
vLLM does (``set_offset(get_offset() - 4)``) for a request whose sampled token it
discards.  A draw records the generator's state before and after it (keyed by the state
after, since a random op sees the C++ generator through another Python object), for the
last :data:`REWIND` draws of the process; ``set_offset`` to an offset ahead, or further
back than that, raises ``RuntimeError``.
"""

from __future__ import annotations

import collections
import hashlib

import torch

from torchtpu._device import state

_Base = torch._C.Generator


class Generator(_Base):
    """``torch.Generator`` that also accepts ``device="tpu"`` / ``"tpu:N"``."""

    def __new__(cls, device="cpu"):
        d = torch.device(device)
        if d.type == "tpu":
            g = _Base.__new__(cls, "cpu")
            g._tpu_device = torch.device("tpu", state.current_device if d.index is None else d.index)
            return g
        return _Base.__new__(cls, device)

    def __init__(self, device="cpu"):
        pass

    @property
    def device(self) -> torch.device:
        dev = getattr(self, "_tpu_device", None)
        return dev if dev is not None else _Base.device.__get__(self)

    def get_offset(self) -> int:
        """4 x the draws since this tpu generator's seed (or state) was set (module
        docstring); a CPU generator raises as PyTorch's does."""
        if getattr(self, "_tpu_device", None) is None:
            return _Base.get_offset(self)
        rec = _DRAWS.get(_digest(self.get_state()))
        return rec[1] if rec is not None else 0

    def set_offset(self, offset: int):
        """Put this tpu generator back to the state it had at an earlier ``offset``
        (:meth:`get_offset`); the current offset is a no-op.  Raises ``RuntimeError`` for
        an offset ahead of it or beyond the recorded draws (and, for a CPU generator, as
        PyTorch does)."""
        if getattr(self, "_tpu_device", None) is None:
            return _Base.set_offset(self, offset)
        st = self.get_state()
        cur = self.get_offset()
        while True:
            rec = _DRAWS.get(_digest(st))
            at = rec[1] if rec is not None else 0
            if at == offset:
                _Base.set_state(self, st)
                return self
            if rec is None or at < offset:
                raise RuntimeError(
                    f"Generator.set_offset({offset}) on {self.device}: a tpu generator can "
                    f"only go back to an offset of one of its recorded draws (current "
                    f"offset {cur}; offsets advance by 4 per draw)")
            st = rec[0]

    def __reduce__(self):
        return (_restore, (str(self.device), self.get_state()))


def _restore(device, st):
    g = Generator(device)
    g.set_state(st)
    return g


# the last generator a seed was drawn from and its state before the draw (one slot: a
# draw is undone right after it, by a shape bucket that runs the op again: undo_draw)
_LAST: list = [None, None]


# the draws set_offset can go back over: digest of a generator's state after a draw ->
# (its state before, its offset after); the last REWIND draws of the process
_DRAWS: collections.OrderedDict = collections.OrderedDict()
REWIND = 1024


def _digest(st: torch.Tensor) -> bytes:
    return hashlib.blake2b(st.numpy().tobytes(), digest_size=16).digest()


def state_of(gen, index) -> state.RNGState:
    """A fresh :class:`~torchtpu._device.state.RNGState` seeded from generator ``gen``
    (one seed drawn from it; :func:`undo_draw` puts it back; the draw is recorded for
    ``Generator.set_offset``)."""
    before = gen.get_state()
    _LAST[0], _LAST[1] = gen, before
    seed = int(torch.empty((), dtype=torch.int64).random_(generator=gen))
    prev = _DRAWS.get(_digest(before))
    key = _digest(gen.get_state())
    _DRAWS[key] = (before, (prev[1] if prev is not None else 0) + 4)
    _DRAWS.move_to_end(key)
    while len(_DRAWS) > REWIND:
        _DRAWS.popitem(last=False)
    return state.RNGState(seed)


def undo_draw(gen) -> None:
    """Put generator ``gen`` back as it was before the last :func:`state_of` drew from
    it, so that the op run again (padded to a shape bucket) draws the seed the exact
    call drew.  Raises ``RuntimeError`` if the last draw was from another generator."""
    if _LAST[0] is not gen:
        raise RuntimeError("torchtpu internal error: no draw of this generator to undo")
    gen.set_state(_LAST[1])
    _LAST[0] = _LAST[1] = None


def install() -> None:
    """Make ``torch.Generator`` the tpu-aware subclass (idempotent)."""
    if torch.Generator is not Generator:
        torch.Generator = Generator
