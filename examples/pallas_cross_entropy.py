"""A fused softmax-cross-entropy written in Pallas, as a PyTorch loss ``nn.Module``.

    python examples/pallas_cross_entropy.py

One Pallas kernel computes, per block of rows, the log-sum-exp of the logits and the
logit of the target class in a single pass (no softmax matrix is written out); the
backward (``softmax(logits) - one_hot(target)``, scaled by the incoming gradient) is a
``jax.custom_vjp`` rule in plain JAX.  ``torchtpu.jax_op`` makes it the PyTorch operator
``examples::softmax_xent``; :class:`PallasCrossEntropy` averages its per-row losses like
``nn.CrossEntropyLoss()``.  The script checks loss and gradients against
``F.cross_entropy`` on CPU, then trains a small classifier a few steps on both.

Pallas runs compiled on TPU (and GPU); on the CPU platform it runs in Pallas' interpret
mode, chosen automatically (``PALLAS_INTERPRET=0/1`` forces it).
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F
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
    return 8 if n % 8 == 0 else n


def _xent_kernel(x_ref, t_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)  # (bm, V)
    t = t_ref[...]  # (bm, 1) int32
    m = jnp.max(x, axis=-1, keepdims=True)
    lse = m + jnp.log(jnp.sum(jnp.exp(x - m), axis=-1, keepdims=True))
    cols = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    picked = jnp.sum(jnp.where(cols == t, x, 0.0), axis=-1, keepdims=True)
    o_ref[...] = lse - picked


def _xent_pallas(logits, target):
    n, v = logits.shape
    bm = _block_rows(n)
    out = pl.pallas_call(
        _xent_kernel,
        out_shape=jax.ShapeDtypeStruct((n, 1), jnp.float32),
        grid=(n // bm,),
        in_specs=[pl.BlockSpec((bm, v), lambda i: (i, 0)),
                  pl.BlockSpec((bm, 1), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((bm, 1), lambda i: (i, 0)),
        interpret=interpret_mode(),
    )(logits, target.astype(jnp.int32).reshape(n, 1))
    return out.reshape(n).astype(logits.dtype)


@jax.custom_vjp
def softmax_xent(logits, target):
    """JAX: per-row ``-log_softmax(logits)[i, target[i]]`` for logits (N, V) and integer
    targets (N,) in [0, V)."""
    return _xent_pallas(logits, target)


def _fwd(logits, target):
    return _xent_pallas(logits, target), (logits, target)


def _bwd(res, g):
    logits, target = res
    p = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    onehot = jax.nn.one_hot(target, logits.shape[-1], dtype=jnp.float32)
    dlogits = (g.astype(jnp.float32)[:, None] * (p - onehot)).astype(logits.dtype)
    # integer targets have no gradient (JAX's float0 zero cotangent)
    return dlogits, np.zeros(target.shape, dtype=jax.dtypes.float0)


softmax_xent.defvjp(_fwd, _bwd)

softmax_xent_op = torchtpu.jax_op("examples::softmax_xent", softmax_xent)


class PallasCrossEntropy(nn.Module):
    """``nn.CrossEntropyLoss()`` (mean over rows, class-index targets) with the Pallas
    kernel: ``logits`` (N, V) floating, ``target`` (N,) int64 on the same tpu device."""

    def forward(self, logits, target):
        return softmax_xent_op(logits, target).mean()


def main(steps: int = 3) -> int:
    torch.manual_seed(0)
    n, d, v = 16, 32, 128
    net = nn.Sequential(nn.Linear(d, 64), nn.GELU(), nn.Linear(64, v))
    net_tpu = nn.Sequential(nn.Linear(d, 64), nn.GELU(), nn.Linear(64, v))
    net_tpu.load_state_dict(net.state_dict())
    net_tpu.to("tpu")
    loss_fn = PallasCrossEntropy()
    x, y = torch.randn(n, d), torch.randint(0, v, (n,))
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    opt_tpu = torch.optim.SGD(net_tpu.parameters(), lr=0.5)
    ok = True
    for step in range(steps):
        opt.zero_grad()
        opt_tpu.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        loss_tpu = loss_fn(net_tpu(x.to("tpu")), y.to("tpu"))
        loss_tpu.backward()
        gerr = max((p.grad.cpu() - q.grad).abs().max().item()
                   for p, q in zip(net_tpu.parameters(), net.parameters()))
        lt, lc = loss_tpu.item(), loss.item()
        ok &= abs(lt - lc) <= 1e-5 * max(1.0, abs(lc)) and gerr <= 1e-5
        print(f"step {step}: loss tpu {lt:.6f} cpu {lc:.6f}, max grad |tpu - cpu| {gerr:.2e}")
        opt.step()
        opt_tpu.step()
    print(f"pallas interpret mode: {interpret_mode()}; {'matches CPU' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
