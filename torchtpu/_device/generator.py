"""``torch.Generator(device="tpu")``.

PyTorch's Python backend API cannot create a C++ generator for PrivateUse1, so
``torch.Generator`` is replaced by a subclass (:class:`Generator`) whose tpu instances
are backed by a CPU generator and report ``device == tpu``.  A tpu random op given such
a generator draws one 63-bit seed from it (advancing it, so ``manual_seed`` /
``get_state`` / ``set_state`` replay streams exactly) and runs with a fresh stream
seeded by it.
"""

from __future__ import annotations

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

    def __reduce__(self):
        return (_restore, (str(self.device), self.get_state()))


def _restore(device, st):
    g = Generator(device)
    g.set_state(st)
    return g


# the last generator a seed was drawn from and its state before the draw (one slot: a
# draw is undone right after it, by a shape bucket that runs the op again: undo_draw)
_LAST: list = [None, None]


def state_of(gen, index) -> state.RNGState:
    """A fresh :class:`~torchtpu._device.state.RNGState` seeded from generator ``gen``
    (one seed drawn from it; :func:`undo_draw` puts it back)."""
    _LAST[0], _LAST[1] = gen, gen.get_state()
    seed = int(torch.empty((), dtype=torch.int64).random_(generator=gen))
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
