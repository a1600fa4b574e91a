"""``torch.tpu.Event.query`` / ``Stream.query`` report whether the recorded work has run
(the readiness of the last dispatched executable's arrays), without blocking."""

import pytest
import torch

from torchtpu.eager import inflight


class FakeArray:
    """Stands for a result array of dispatched work whose readiness the test controls."""

    def __init__(self, ready=False, deleted=False):
        self.ready = ready
        self.deleted = deleted

    def is_ready(self):
        assert not self.deleted, "is_ready() of a deleted array"
        return self.ready

    def is_deleted(self):
        return self.deleted


@pytest.fixture
def fake_work(monkeypatch):
    """The most recently dispatched work is a FakeArray, not ready yet."""
    torch.tpu.synchronize()  # nothing pending (DEFER_AND_FUSE) to replace it at record()
    work = FakeArray()
    monkeypatch.setattr(inflight, "LAST_OUTPUTS", (work,))
    return work


def test_event_and_stream_query_follow_the_work(fake_work):
    ev = torch.tpu.Event()
    assert ev.query()  # never recorded: nothing to wait for, as CUDA's
    ev.record()
    stream = torch.tpu.current_stream()
    assert not ev.query() and not stream.query()
    assert not ev.query()  # asking does not wait or change anything
    fake_work.ready = True
    assert ev.query() and stream.query()


def test_event_query_after_later_work(monkeypatch, fake_work):
    ev = torch.tpu.Event()
    ev.record()
    later = FakeArray()
    monkeypatch.setattr(inflight, "LAST_OUTPUTS", (later,))
    fake_work.ready = True
    assert ev.query()  # the recorded work is done; the later one is not
    assert not torch.tpu.current_stream().query()


def test_event_query_when_its_arrays_are_gone(fake_work):
    """A recorded array donated to a later op (deleted) or freed cannot be asked: the
    latest dispatched work, which runs after it, is asked instead."""
    ev = torch.tpu.Event()
    ev.record()
    later = FakeArray()
    inflight.dispatched((later,))  # (the fixture's monkeypatch restores the original)
    fake_work.deleted = True
    assert not ev.query()
    later.ready = True
    assert ev.query()

    ev2 = torch.tpu.Event()
    inflight.dispatched((FakeArray(),))
    ev2.record()
    inflight.dispatched((FakeArray(),))  # the recorded array is freed: held weakly
    assert not ev2.query()
    inflight.last_outputs()[0].ready = True
    assert ev2.query()


def test_event_does_not_keep_arrays_alive(fake_work):
    import gc
    import weakref

    ev = torch.tpu.Event()
    inflight.dispatched((FakeArray(),))
    r = weakref.ref(inflight.last_outputs()[0])
    ev.record()
    inflight.clear_last()
    gc.collect()
    assert r() is None and ev.query()  # no work left at all: done


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_query_is_false_while_real_work_runs(mode):
    """Real work: a chain of 2048x2048 matmuls (seconds on a CPU, tens of ms on an
    accelerator) is not done right after it is dispatched; it is after synchronize()."""
    with torch.tpu.set_eager_mode(mode):
        a = torch.randn(2048, 2048).to("tpu")
        torch.tpu.synchronize()
        y = a
        for _ in range(6):
            y = y @ a
        ev = torch.tpu.Event()
        ev.record()
        stream = torch.tpu.current_stream()
        assert not ev.query() and not stream.query()
        ev.synchronize()
        assert ev.query() and stream.query()
        assert torch.isfinite(y[0, :4]).all()
