"""Lightning picks ``tpu`` with no code change: ``Trainer(accelerator="auto")`` and
``accelerator="tpu"`` train on tpu without torch_xla, and Fabric's ``setup(model,
optimizer)`` trains as on the CPU (torchtpu.integrations.lightning)."""

import pytest
import torch
from torch import nn

L = pytest.importorskip("lightning")
from lightning.fabric.utilities.exceptions import MisconfigurationException  # noqa: E402


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).float(), y)
        self.losses.append(loss.detach())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(24, 4, generator=g)
    y = x.sum(1, keepdim=True).sin()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def _fit(accelerator, **kw):
    torch.manual_seed(0)
    model = Regressor()
    trainer = L.Trainer(accelerator=accelerator, max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, **kw)
    devices = []
    model.on_train_batch_start = lambda batch, i: devices.append(
        (batch[0].device, next(model.parameters()).device))
    trainer.fit(model, _loader())
    return trainer, devices, [v.item() for v in model.losses]


@pytest.mark.parametrize("accelerator", ["auto", "tpu"])
def test_trainer_trains_on_tpu_like_cpu(accelerator):
    trainer, devices, tpu = _fit(accelerator)
    assert trainer.accelerator.name() == "tpu"
    assert trainer.strategy.root_device == torch.device("tpu", 0)
    assert set(devices) == {(torch.device("tpu", 0), torch.device("tpu", 0))}
    cpu_trainer, cpu_devices, cpu = _fit("cpu")  # accelerator="cpu" keeps its meaning
    assert cpu_trainer.strategy.root_device.type == "cpu"
    assert {d.type for pair in cpu_devices for d in pair} == {"cpu"}
    assert len(tpu) == 3
    torch.testing.assert_close(tpu, cpu, rtol=1e-5, atol=1e-6)


def test_trainer_bf16_mixed_like_cpu():
    trainer, _, tpu = _fit("auto", precision="bf16-mixed")
    assert trainer.precision_plugin.device == "tpu"
    _, _, cpu = _fit("cpu", precision="bf16-mixed")
    torch.testing.assert_close(tpu, cpu, rtol=2e-2, atol=2e-2)


def _fabric_losses(accelerator, precision="32-true"):
    fabric = L.Fabric(accelerator=accelerator, devices=1, precision=precision)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = fabric.setup(model, opt)
    loader = fabric.setup_dataloaders(_loader())
    losses = []
    for x, y in loader:
        assert x.device == fabric.device
        loss = nn.functional.mse_loss(model(x).float(), y)
        fabric.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    params = [p for g in opt.param_groups for p in g["params"]]
    assert all(p.device == fabric.device for p in params)
    assert all(p.device == fabric.device for s in opt.state.values() for p in s.values()
               if isinstance(p, torch.Tensor) and p.dim())
    return fabric.device, losses


def test_fabric_setup_model_optimizer_trains_like_cpu():
    dev, tpu = _fabric_losses("auto")
    assert dev == torch.device("tpu", 0)
    _, cpu = _fabric_losses("cpu")
    torch.testing.assert_close(tpu, cpu, rtol=1e-5, atol=1e-6)
    dev, tpu = _fabric_losses("tpu", "bf16-mixed")
    assert dev == torch.device("tpu", 0)
    _, cpu = _fabric_losses("cpu", "bf16-mixed")
    torch.testing.assert_close(tpu, cpu, rtol=2e-2, atol=2e-2)


def test_devices_beyond_the_machine_raise_like_cuda():
    n = torch.tpu.device_count()
    with pytest.raises(MisconfigurationException, match=r"You requested tpu: \[.*\]"):
        L.Trainer(accelerator="tpu", devices=[n], logger=False)
    with pytest.raises(MisconfigurationException, match="But your machine only has"):
        L.Fabric(accelerator="tpu", devices=n + 1)


def test_trainer_reports_the_tpu_device(caplog):
    with caplog.at_level("INFO"):
        L.Trainer(accelerator="auto", logger=False)
    assert "TPU available: True (torchtpu" in caplog.text
    assert "using: 1 tpu device" in caplog.text
    assert "0 TPU cores" not in caplog.text


def test_pytorch_lightning_package_too():
    pl = pytest.importorskip("pytorch_lightning")
    trainer = pl.Trainer(accelerator="auto", logger=False, enable_checkpointing=False)
    assert trainer.strategy.root_device == torch.device("tpu", 0)
    assert isinstance(trainer.accelerator, pl.accelerators.Accelerator)
    from lightning_fabric.utilities.exceptions import MisconfigurationException as PlError

    with pytest.raises(PlError, match="But your machine only has"):
        pl.Trainer(accelerator="tpu", devices=torch.tpu.device_count() + 1, logger=False)


# ------------------------------------------------------------ patch guards


def test_patches_still_needed_and_in_place():
    """Fails when Lightning changes underneath torchtpu.integrations.lightning: the patched
    connector methods moved, or Lightning learned to pick a tpu without torch_xla (drop the
    patch)."""
    from lightning.fabric.accelerators import ACCELERATOR_REGISTRY
    from lightning.fabric.accelerators.xla import XLAAccelerator
    from lightning.fabric.connector import _Connector
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

    from torchtpu import integrations
    from torchtpu.integrations.lightning import _classes

    st = integrations.status()
    for name in ("lightning.fabric.connector", "lightning.pytorch.trainer.setup",
                 "lightning.pytorch.trainer.connectors.accelerator_connector"):
        assert st[name] == "ok", (name, st[name])
    assert not XLAAccelerator.is_available()
    assert AcceleratorRegistry["tpu"]["accelerator"] is _classes["lightning.pytorch"]
    assert ACCELERATOR_REGISTRY["tpu"]["accelerator"] is _classes["lightning.fabric"]
    for conn in (_Connector, _AcceleratorConnector):
        for name in ("_choose_auto_accelerator", "_choose_strategy", "_check_and_init_precision"):
            assert getattr(conn, name)._torchtpu, (conn, name)
        assert conn._choose_auto_accelerator.__wrapped__() == "cpu"  # Lightning alone: CPU

    from lightning.pytorch.trainer import setup

    assert setup._log_device_info._torchtpu

    trainer = L.Trainer(accelerator="tpu", precision="bf16-mixed", logger=False)
    conn = trainer._accelerator_connector
    # Lightning alone: the name "tpu" means torch_xla's strategy, mixed precision means CUDA
    with pytest.raises(ModuleNotFoundError, match="torch_xla"):
        _AcceleratorConnector._choose_strategy.__wrapped__(conn)
    assert _AcceleratorConnector._check_and_init_precision.__wrapped__(conn).device == "cuda"
