"""DataLoader(num_workers>0) in a tpu training loop after the tpu runtime started: the
same batches as on the CPU, no fork warning, and a clear error (not a hang) when a forked
worker touches the tpu device (torchtpu.integrations.torch_data)."""

import warnings

import pytest
import torch


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.tensor([float(i), float(i * i)]), i


class MovesToTpu(Squares):
    def __getitem__(self, i):
        return torch.randn(5).to("tpu"), i


def test_workers_after_jax_start_quiet_and_match_cpu():
    w = torch.nn.Linear(2, 1)
    w_tpu = torch.nn.Linear(2, 1).to("tpu")
    w_tpu.load_state_dict(w.state_dict())
    torch.ones(2, device="tpu").sum().item()  # the tpu runtime (JAX) has started
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = torch.utils.data.DataLoader(Squares(), batch_size=3, num_workers=2)
        got = [(w_tpu(x.to("tpu")).cpu(), y) for x, y in loader]
    exp = [(w(x), y) for x, y in torch.utils.data.DataLoader(Squares(), batch_size=3)]
    fork_warnings = [c for c in caught if "fork" in str(c.message)]
    assert not fork_warnings, [str(c.message) for c in fork_warnings]
    assert len(got) == len(exp) == 4
    for (a, ya), (b, yb) in zip(got, exp):
        torch.testing.assert_close(a, b)
        assert torch.equal(ya, yb)


def test_forked_worker_using_tpu_raises_instead_of_hanging():
    torch.ones(2, device="tpu").sum().item()
    loader = torch.utils.data.DataLoader(MovesToTpu(), batch_size=2, num_workers=1, timeout=120)
    with pytest.raises(RuntimeError, match="forked after the tpu runtime started"):
        next(iter(loader))
    assert torch.tpu._is_in_bad_fork() is False  # the main process is unaffected
    assert (torch.ones(2, device="tpu") * 2).sum().item() == 4.0


def test_patch_in_place():
    """Fails if PyTorch's DataLoader internals change underneath the integration."""
    from torch.utils.data import dataloader

    from torchtpu import integrations

    assert integrations.status()["torch.utils.data.dataloader"] == "ok"
    init = dataloader._MultiProcessingDataLoaderIter.__init__
    assert init._torchtpu
    assert init.__wrapped__.__code__.co_varnames[:2] == ("self", "loader")
