"""A fused RMSNorm written in Pallas, used as a PyTorch op inside an ``nn.Module``.

    python examples/pallas_rmsnorm.py

The forward is one Pallas kernel (``pl.pallas_call``: each program normalizes a block of
rows in one pass); the backward is a ``jax.custom_vjp`` rule in plain JAX.
``torchtpu.jax_op`` makes the pair the PyTorch operator ``examples::rmsnorm`` (autograd
included), which :class:`PallasRMSNorm` calls on ``tpu`` tensors.  The script checks the
forward and the gradients against PyTorch's own ``nn.RMSNorm`` on CPU, then runs a few
SGD steps on both.

Pallas runs compiled on TPU (and GPU); on the CPU platform (this repository's tests) it
runs in Pallas' interpret mode, chosen automatically (``PALLAS_INTERPRET=0/1`` forces it).
"""

import functools
import os
import sys

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl
from torch import nn

import torchtpu


def interpret_mode() -> bool:
    """Pallas interpret mode on the CPU platform (no Pallas compiler there)."""
    env = os.environ.get("PALLAS_INTERPRET")
    if env is not None:
        return env not in ("", "0")
    return jax.devices()[0].platform == "cpu" or \
        os.environ.get("TORCHTPU_PLATFORM", "").lower() == "cpu"


def _block_rows(n: int) -> int:
    # TPU blocks: the second-to-last dimension a multiple of 8, or the whole dimension
    return 8 if n % 8 == 0 else n


def _rmsnorm_kernel(x_ref, w_ref, o_ref, *, eps):
    x = x_ref[...].astype(jnp.float32)
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    y = x * jax.lax.rsqrt(ms + eps) * w_ref[...].astype(jnp.float32)
    o_ref[...] = y.astype(o_ref.dtype)


def _rmsnorm_fwd_pallas(x2, w, eps):
    n, d = x2.shape
    bm = _block_rows(n)
    return pl.pallas_call(
        functools.partial(_rmsnorm_kernel, eps=eps),
        out_shape=jax.ShapeDtypeStruct((n, d), x2.dtype),
        grid=(n // bm,),
        in_specs=[pl.BlockSpec((bm, d), lambda i: (i, 0)),
                  pl.BlockSpec((1, d), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((bm, d), lambda i: (i, 0)),
        interpret=interpret_mode(),
    )(x2, w.reshape(1, d))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _rmsnorm(x2, w, eps):
    return _rmsnorm_fwd_pallas(x2, w, eps)


def _rmsnorm_fwd(x2, w, eps):
    return _rmsnorm_fwd_pallas(x2, w, eps), (x2, w)


def _rmsnorm_bwd(eps, res, g):
    # plain JAX: y = x * r * w with r = rsqrt(mean(x^2) + eps)
    x2, w = res
    x = x2.astype(jnp.float32)
    g = g.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    gw = g * w.astype(jnp.float32)
    dx = r * gw - x * (r ** 3) * jnp.mean(gw * x, axis=-1, keepdims=True)
    dw = jnp.sum(g * x * r, axis=0)
    return dx.astype(x2.dtype), dw.astype(w.dtype)


_rmsnorm.defvjp(_rmsnorm_fwd, _rmsnorm_bwd)


def rmsnorm(x, weight, *, eps):
    """JAX: RMSNorm of ``x`` (..., d) over its last dimension, scaled by ``weight`` (d,)."""
    d = x.shape[-1]
    return _rmsnorm(x.reshape(-1, d), weight, eps).reshape(x.shape)


rmsnorm_op = torchtpu.jax_op("examples::rmsnorm", rmsnorm, static_argnames=("eps",))


class PallasRMSNorm(nn.Module):
    """``nn.RMSNorm(d, eps)`` with the Pallas kernel (tpu tensors)."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return rmsnorm_op(x, self.weight, eps=self.eps)


def main(steps: int = 3) -> int:
    torch.manual_seed(0)
    d = 64
    ref = nn.Sequential(nn.Linear(32, d), nn.RMSNorm(d, eps=1e-6), nn.Linear(d, 8))
    with torch.no_grad():
        ref[1].weight.uniform_(0.5, 1.5)
    model = nn.Sequential(nn.Linear(32, d), PallasRMSNorm(d, eps=1e-6), nn.Linear(d, 8))
    model.load_state_dict(ref.state_dict())
    model.to("tpu")
    x = torch.randn(16, 32)
    out, out_ref = model(x.to("tpu")), ref(x)
    out.square().mean().backward()
    out_ref.square().mean().backward()
    ok = torch.allclose(out.cpu(), out_ref, rtol=1e-4, atol=1e-5)
    print(f"forward  max |tpu - cpu| = {(out.detach().cpu() - out_ref).abs().max().item():.2e}")
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        err = (p.grad.cpu() - q.grad).abs().max().item()
        ok &= torch.allclose(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5)
        print(f"grad {name:10s} max |tpu - cpu| = {err:.2e}")
    opt, opt_ref = torch.optim.SGD(model.parameters(), 0.1), torch.optim.SGD(ref.parameters(), 0.1)
    for step in range(steps):
        for m, o in ((model, opt), (ref, opt_ref)):
            o.zero_grad()
            xin = x.to("tpu") if m is model else x
            loss = m(xin).square().mean()
            loss.backward()
            o.step()
            if m is model:
                lt = loss.item()
            else:
                lc = loss.item()
        ok &= abs(lt - lc) <= 1e-4 * max(1.0, abs(lc))
        print(f"step {step}: loss tpu {lt:.6f} cpu {lc:.6f}")
    print(f"pallas interpret mode: {interpret_mode()}; {'matches CPU' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
