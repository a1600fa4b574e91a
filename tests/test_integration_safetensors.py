"""safetensors with ``device="tpu"`` (torchtpu.integrations.safetensors): the same tensors
as a CPU load, on the tpu device."""

import pytest
import torch

safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, load_model, save_file, save_model  # noqa: E402


@pytest.fixture
def path(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(4, 3, generator=g),
        "b": torch.randn(3, generator=g).to(torch.bfloat16),
        "i": torch.arange(10, dtype=torch.int64).reshape(2, 5),
        "m": torch.tensor([True, False]),
    }
    p = str(tmp_path / "t.safetensors")
    save_file(tensors, p, metadata={"format": "pt"})
    return p


@pytest.mark.parametrize("device", ["tpu", "tpu:0", torch.device("tpu", 0)])
def test_load_file_on_tpu_matches_cpu(path, device):
    ref = load_file(path)  # CPU
    got = load_file(path, device=device)
    assert list(got) == list(ref)
    for k in ref:
        assert got[k].device == torch.device("tpu", 0)
        assert got[k].dtype == ref[k].dtype and got[k].shape == ref[k].shape
        torch.testing.assert_close(got[k].cpu(), ref[k], rtol=0, atol=0)


def test_safe_open_on_tpu_matches_cpu(path):
    with safe_open(path, framework="pt") as f:
        ref_keys, ref_meta = f.keys(), f.metadata()
        ref_w, ref_sl = f.get_tensor("w"), f.get_slice("i")[:, 1:4]
        ref_shape = f.get_slice("i").get_shape()
    with safe_open(path, framework="pt", device="tpu") as f:
        assert f.keys() == ref_keys and f.metadata() == ref_meta
        w = f.get_tensor("w")
        sl = f.get_slice("i")
        assert sl.get_shape() == ref_shape
        part = sl[:, 1:4]
        all_t = f.get_tensors()
    assert w.device.type == part.device.type == "tpu"
    torch.testing.assert_close(w.cpu(), ref_w, rtol=0, atol=0)
    torch.testing.assert_close(part.cpu(), ref_sl, rtol=0, atol=0)
    assert set(all_t) == set(ref_keys) and all(t.device.type == "tpu" for t in all_t.values())


def test_load_model_into_tpu_model(tmp_path):
    torch.manual_seed(0)
    src = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    p = str(tmp_path / "m.safetensors")
    save_model(src, p)
    x = torch.randn(5, 3)
    for device in ("tpu", "cpu"):  # weights loaded to tpu, or to CPU then copied in
        dst = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(),
                                  torch.nn.Linear(4, 2)).to("tpu")
        missing, unexpected = load_model(dst, p, device=device)
        assert not missing and not unexpected
        assert all(q.device.type == "tpu" for q in dst.parameters())
        torch.testing.assert_close(dst(x.to("tpu")).cpu(), src(x))


def test_save_from_tpu_roundtrip(tmp_path):
    t = {"a": torch.arange(6.0).reshape(2, 3).to("tpu")}
    p = str(tmp_path / "s.safetensors")
    save_file(t, p)
    torch.testing.assert_close(load_file(p), {"a": torch.arange(6.0).reshape(2, 3)})


def test_other_devices_get_the_rust_reader(path):
    import safetensors as st

    with safe_open(path, framework="pt", device="cpu") as f:
        assert type(f) is st.safe_open.__wrapped__
    with safe_open(path, framework="numpy") as f:
        assert type(f) is st.safe_open.__wrapped__


def test_patch_is_still_needed_and_in_place():
    """Fails when safetensors changes underneath the integration: its Rust reader starts
    accepting "tpu" (drop the patch) or safetensors.torch stops going through safe_open."""
    import safetensors as st
    import safetensors.torch as stt

    from torchtpu import integrations

    assert integrations.status()["safetensors"] == "ok"
    assert stt.safe_open is st.safe_open and st.safe_open._torchtpu
    with pytest.raises(Exception, match="device tpu is invalid"):
        st.safe_open.__wrapped__(__file__, framework="pt", device="tpu")
