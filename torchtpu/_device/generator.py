"""Random streams of user-created generators (``torch.Generator(device="tpu")``)."""

from __future__ import annotations

from torchtpu._device import state


def state_of(gen, index):
    """The :class:`~torchtpu._device.state.RNGState` standing for generator ``gen``.

    PyTorch cannot create a generator for a Python backend, so a ``tpu`` random op given a
    CPU ``torch.Generator`` draws from a stream seeded by that generator's
    ``initial_seed()`` and advanced per call (kept beside the generator object).
    """
    st = getattr(gen, "_torchtpu_state", None)
    seed = gen.initial_seed()
    if st is None or st.seed != seed:
        st = state.RNGState(seed)
        try:
            gen._torchtpu_state = st
        except AttributeError:
            _STATES[id(gen)] = st
    return st


_STATES: dict = {}
