"""Several tpu devices in one process (the CPU platform split with XLA_FLAGS)."""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(r"""
    import torch
    assert torch.tpu.device_count() == 2, torch.tpu.device_count()
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    x1 = a.to("tpu:1")
    assert x1.device == torch.device("tpu", 1)
    y = (x1 * 2 + 1).t()
    assert y.device.index == 1 and y.stride() == (1, 3)
    assert torch.equal(y.cpu(), (a * 2 + 1).t())
    x0 = x1.to("tpu:0")
    assert x0.device.index == 0 and torch.equal(x0.cpu(), a)
    try:
        x0 + x1
        raise SystemExit("mixing tpu:0 and tpu:1 must raise")
    except RuntimeError as e:
        assert "tpu:0 and tpu:1" in str(e), e
    with torch.tpu.device(1):
        assert torch.zeros(2, device="tpu").device.index == 1
    assert torch.zeros(2, device="tpu").device.index == 0
    torch.tpu.set_device(1)
    assert torch.tpu.current_device() == 1 and torch.randn(2, device="tpu").device.index == 1
    torch.tpu.set_device(0)
    x1[0].add_(10)
    a[0].add_(10)
    assert torch.equal(x1.cpu(), a)
    z = torch.empty(2, 3, device="tpu:1").copy_(x0)
    assert z.device.index == 1 and torch.equal(z.cpu(), x0.cpu())
    # autograd and an optimizer step on tpu:1 (backward runs on the caller's thread)
    w = torch.randn(3, 3, requires_grad=True)
    w1 = w.detach().to("tpu:1").requires_grad_()
    xin = torch.randn(4, 3)
    (xin @ w).tanh().sum().backward()
    (xin.to("tpu:1") @ w1).tanh().sum().backward()
    assert w1.grad.device.index == 1
    assert torch.allclose(w1.grad.cpu(), w.grad, atol=1e-6)
    lin = torch.nn.Linear(3, 2).to("tpu:1")
    opt = torch.optim.AdamW(lin.parameters())
    lin(xin.to("tpu:1")).sum().backward()
    opt.step()
    assert lin.weight.device.index == 1
    # PyTorch's C++ device guard and torch.tpu agree on the current device (one index)
    torch.tpu.set_device(1)
    assert torch.accelerator.current_device_index() == 1
    torch.accelerator.set_device_index(0)
    assert torch.tpu.current_device() == 0
    with torch.tpu.device(1):
        assert torch.accelerator.current_device_index() == 1
    assert torch.accelerator.current_device_index() == 0
    # during backward, hooks of a tpu:1 graph see tpu:1 as current (as CUDA's do)
    seen = []
    y = lin(xin.to("tpu:1")).sum()
    y.register_hook(lambda g: seen.append(torch.tpu.current_device()))
    y.backward()
    assert seen == [1] and torch.tpu.current_device() == 0, seen
    print("OK")
""")


def test_two_devices():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr


def test_set_device_first_then_tpu_without_index():
    # torch.tpu.set_device(1) before any tpu op (what init_process_group does for
    # LOCAL_RANK=1): "tpu" without an index then means tpu:1, as cuda after
    # torch.cuda.set_device(1)
    script = textwrap.dedent(r"""
        import torch
        torch.tpu.set_device(1)
        assert torch.accelerator.current_device_index() == 1
        x = torch.arange(3.0).to("tpu")
        assert x.device == torch.device("tpu", 1), x.device
        print("OK")
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr
