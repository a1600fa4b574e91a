"""JAX interop: ``torchtpu.jax_op`` (JAX and Pallas functions as PyTorch ops) and
``torchtpu.to_jax`` / ``torchtpu.from_jax``, each checked against CPU PyTorch."""

import importlib.util
import itertools
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torchtpu

ROOT = pathlib.Path(__file__).resolve().parents[1]
_names = itertools.count()


def _name(base):
    """A fresh operator name (operators live for the whole process)."""
    return f"jaxop_tests::{base}_{next(_names)}"


def rmsnorm_jax(x, w, *, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rmsnorm_torch(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


RMSNORM = torchtpu.jax_op(_name("rmsnorm"), rmsnorm_jax, static_argnames=("eps",))


# ------------------------------------------------------------------- jax_op


def test_public_names():
    assert torch.tpu.jax_op is torchtpu.jax_op
    assert torch.tpu.to_jax is torchtpu.to_jax and torch.tpu.from_jax is torchtpu.from_jax
    assert {"jax_op", "to_jax", "from_jax"} <= set(torchtpu.__all__)


def test_forward_matches_cpu(eager_mode):
    x, w = torch.randn(4, 16), torch.randn(16)
    y = RMSNORM(x.to("tpu"), w.to("tpu"), eps=1e-5)
    assert y.device.type == "tpu" and y.shape == (4, 16) and y.dtype == torch.float32
    torch.testing.assert_close(y.cpu(), rmsnorm_torch(x, w, 1e-5), rtol=1e-5, atol=1e-6)
    # a view input (read through its view inside the op) and another static value
    xt = x.t().contiguous().to("tpu").t()
    torch.testing.assert_close(RMSNORM(xt, w.to("tpu"), eps=0.5).cpu(),
                               rmsnorm_torch(x, w, 0.5), rtol=1e-5, atol=1e-6)
    # the operator itself is reachable through torch.ops
    out = RMSNORM.op(x.to("tpu"), w.to("tpu"), "[('eps', 1e-05)]")
    assert isinstance(out, list) and len(out) == 1
    torch.testing.assert_close(out[0].cpu(), rmsnorm_torch(x, w, 1e-5), rtol=1e-5, atol=1e-6)


def test_gradcheck_float64(eager_mode):
    x = torch.randn(2, 5, dtype=torch.float64, device="tpu", requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, device="tpu", requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: RMSNORM(a, b, eps=1e-3), (x, w),
                                    fast_mode=True)
    # and the gradient equals CPU autograd's
    xc, wc = x.detach().cpu().requires_grad_(), w.detach().cpu().requires_grad_()
    (rmsnorm_torch(xc, wc, 1e-3) * torch.arange(5.0, dtype=torch.float64)).sum().backward()
    (RMSNORM(x, w, eps=1e-3) * torch.arange(5.0, dtype=torch.float64, device="tpu")).sum() \
        .backward()
    torch.testing.assert_close(x.grad.cpu(), xc.grad)
    torch.testing.assert_close(w.grad.cpu(), wc.grad)


def test_double_backward():
    x = torch.randn(2, 2, dtype=torch.float64, device="tpu", requires_grad=True)
    w = torch.randn(2, dtype=torch.float64, device="tpu", requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda a, b: RMSNORM(a, b, eps=1e-3), (x, w),
                                        fast_mode=True)


def test_defer_and_fuse_records_into_the_segment():
    x = torch.randn(4, 8)
    with torch.tpu.set_eager_mode("defer_and_fuse"):
        xt, wt = x.to("tpu"), torch.ones(8, device="tpu")
        torch.tpu.synchronize()
        from torchtpu.eager import defer

        before = dict(torchtpu.metrics()["host_syncs"])
        y = (RMSNORM(xt.sin(), wt, eps=1e-6) * 2).cos()
        assert defer.pending_ops() == 4  # sin, the jax_op, mul, cos: pending, no sync
        assert dict(torchtpu.metrics()["host_syncs"]) == before
        got = y.cpu()
    torch.testing.assert_close(got, (rmsnorm_torch(x.sin(), torch.ones(8), 1e-6) * 2).cos(),
                               rtol=1e-5, atol=1e-6)


def test_custom_vjp_is_used(eager_mode):
    # straight-through rounding: forward rounds, the custom backward passes the gradient
    @jax.custom_vjp
    def ste_round(x):
        return jnp.round(x)

    ste_round.defvjp(lambda x: (jnp.round(x), None), lambda _, g: (g,))
    op = torchtpu.jax_op(_name("ste_round"), ste_round)
    x = torch.randn(6, dtype=torch.float64) * 3
    xt = x.to("tpu").requires_grad_()
    y = op(xt)
    (y * y).sum().backward()
    xc = x.clone().requires_grad_()
    yc = xc + (xc.round() - xc).detach()  # PyTorch's straight-through estimator
    (yc * yc).sum().backward()
    torch.testing.assert_close(y.detach().cpu(), yc.detach())
    torch.testing.assert_close(xt.grad.cpu(), xc.grad)


def test_outputs_structure_and_dtypes(eager_mode):
    def f(x, idx, mask=None):
        return {"scaled": x * 2, "picked": jnp.take(x, idx), "count": idx.sum(),
                "pos": x > 0}

    op = torchtpu.jax_op(_name("multi"), f)
    for dt in (torch.float32, torch.float64, torch.bfloat16):
        x = torch.randn(5).to(dt)
        idx = torch.tensor([4, 0, 2])
        out = op(x.to("tpu"), idx.to("tpu"))
        assert set(out) == {"scaled", "picked", "count", "pos"}
        assert out["scaled"].dtype == dt and out["count"].dtype == torch.int64
        assert out["pos"].dtype == torch.bool and out["picked"].dtype == dt
        torch.testing.assert_close(out["scaled"].cpu(), x * 2)
        torch.testing.assert_close(out["picked"].cpu(), x[idx])
        assert out["count"].item() == 6
        assert torch.equal(out["pos"].cpu(), x > 0)

    # tuple results come back as a tuple; *args functions take any number of tensors
    @torchtpu.jax_op(_name("sum_all"))
    def sum_all(*xs):
        return sum(xs[1:], xs[0]), jnp.stack(xs).max(0)

    a, b, c = torch.randn(3), torch.randn(3), torch.randn(3)
    s, m = sum_all(a.to("tpu"), b.to("tpu"), c.to("tpu"))
    torch.testing.assert_close(s.cpu(), a + b + c)
    torch.testing.assert_close(m.cpu(), torch.stack([a, b, c]).max(0).values)


def test_integer_inputs_get_no_gradient():
    op = torchtpu.jax_op(_name("gather"), lambda x, i: jnp.take(x, i) ** 2)
    x = torch.randn(5, dtype=torch.float64)
    i = torch.tensor([1, 1, 3])
    xt = x.to("tpu").requires_grad_()
    op(xt, i.to("tpu")).sum().backward()
    xc = x.clone().requires_grad_()
    (xc[i] ** 2).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad)
    # an integer output beside a floating one: no gradient, and none needed from it
    op2 = torchtpu.jax_op(_name("scaled_argmax"), lambda x: (x * 3, jnp.argmax(x)))
    xt.grad = None
    y, k = op2(xt)
    assert not k.requires_grad and k.dtype == torch.int64 and k.item() == int(x.argmax())
    y.sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), torch.full((5,), 3.0, dtype=torch.float64))


def test_torch_compile_one_node_no_graph_break():
    x, w = torch.randn(4, 8), torch.randn(8)

    def f(x, w):
        return RMSNORM(x.sin(), w, eps=1e-6).cos() * 2

    xt, wt = x.to("tpu"), w.to("tpu").requires_grad_()
    explain = torch._dynamo.explain(f)(xt, wt)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    targets = [n.target for n in explain.graphs[0].graph.nodes if n.op == "call_function"]
    assert RMSNORM.op in targets

    cf = torch.compile(f, backend="tpu", fullgraph=True)
    y = cf(xt, wt)
    y.sum().backward()
    wc = w.clone().requires_grad_()
    yc = (rmsnorm_torch(x.sin(), wc, 1e-6)).cos() * 2
    yc.sum().backward()
    torch.testing.assert_close(y.detach().cpu(), yc.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(wt.grad.cpu(), wc.grad, rtol=1e-5, atol=1e-5)


def test_cpu_tensors_raise_naming_the_op():
    with pytest.raises(RuntimeError, match=RMSNORM.name + ".*cpu tensors.*allow_cpu=True"):
        RMSNORM(torch.randn(2, 3), torch.randn(3), eps=1e-6)


def test_allow_cpu_runs_on_jax_cpu_device():
    op = torchtpu.jax_op(_name("rms_cpu"), rmsnorm_jax, static_argnames=("eps",),
                         allow_cpu=True)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    y = op(x, w, eps=1e-6)
    assert y.device.type == "cpu"
    torch.testing.assert_close(y, rmsnorm_torch(x, w, 1e-6))
    assert torch.autograd.gradcheck(lambda a, b: op(a, b, eps=1e-6), (x, w))


def test_mixed_devices_raise_as_pytorch():
    with pytest.raises(RuntimeError, match="same device"):
        RMSNORM(torch.randn(2, 3, device="tpu"), torch.randn(3), eps=1e-6)


def test_bad_definitions():
    with pytest.raises(ValueError, match="namespace::opname"):
        torchtpu.jax_op("noname", jnp.sin)
    with pytest.raises(RuntimeError, match="already defined"):
        torchtpu.jax_op(RMSNORM.name, rmsnorm_jax, static_argnames=("eps",))
    with pytest.raises(TypeError, match="static_argnames"):
        torchtpu.jax_op(_name("kwonly"), rmsnorm_jax)  # eps: keyword-only, not static
    with pytest.raises(TypeError, match="not hashable"):
        RMSNORM(torch.ones(2, device="tpu"), torch.ones(2, device="tpu"), eps=[1e-6])


# ------------------------------------------------------------------- Pallas examples


def _example(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_pallas_rmsnorm_example():
    mod = _example("pallas_rmsnorm")
    assert mod.interpret_mode()  # the CPU platform: Pallas interpret mode
    assert mod.main(steps=1) == 0
    # the Pallas op inside a compiled graph (one node, no graph break) and DEFER_AND_FUSE
    norm = mod.PallasRMSNorm(16).to("tpu")
    x = torch.randn(8, 16)
    ref = torch.nn.RMSNorm(16, eps=1e-6)(x)
    y = torch.compile(norm, backend="tpu", fullgraph=True)(x.to("tpu"))
    torch.testing.assert_close(y.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    with torch.tpu.set_eager_mode("defer_and_fuse"):
        y = norm(x.to("tpu"))
        torch.testing.assert_close(y.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)


def test_pallas_cross_entropy_example():
    mod = _example("pallas_cross_entropy")
    assert mod.main(steps=1) == 0


# ------------------------------------------------------------ to_jax / from_jax

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
          torch.int32, torch.int8, torch.uint8, torch.bool, torch.complex64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_dtypes(dtype):
    c = (torch.randn(3, 4) * 5).to(dtype)
    t = c.to("tpu")
    a = torchtpu.to_jax(t)
    assert isinstance(a, jax.Array) and a.shape == (3, 4)
    assert torchtpu.from_jax(a).dtype == dtype  # int64/float64 not narrowed
    back = torchtpu.from_jax(a)
    assert back.device == torch.device("tpu", 0) and torch.equal(back.cpu(), c)
    assert torchtpu.from_jax(a) is not t and torchtpu.to_jax(back) is a  # zero copy both ways


def test_from_jax_arrays_made_by_jax():
    a = jnp.arange(6, dtype=jnp.int64).reshape(2, 3)
    t = torchtpu.from_jax(a)
    assert t.dtype == torch.int64 and t.shape == (2, 3) and t.is_contiguous()
    assert torch.equal(t.cpu(), torch.arange(6).reshape(2, 3))
    assert torchtpu.to_jax(t) is a
    assert torch.equal(torchtpu.from_jax(np.array([True, False])).cpu(),
                       torch.tensor([True, False]))


def test_views_are_copied_with_their_values():
    c = torch.randn(4, 6)
    t = c.to("tpu")
    whole = torchtpu.to_jax(t)
    for view, ref in ((t.t(), c.t()), (t[1:3, 2:], c[1:3, 2:]), (t[2], c[2]),
                      (t.view(24), c.view(24)), (t[:, ::2], c[:, ::2])):
        a = torchtpu.to_jax(view)
        assert a is not whole and a.shape == tuple(ref.shape)
        np.testing.assert_array_equal(np.asarray(a), ref.numpy())


def test_to_jax_snapshot_not_updated_by_later_writes(eager_mode):
    c = torch.arange(6.0)
    t = c.to("tpu")
    a = torchtpu.to_jax(t)
    t.add_(10)  # replaces the storage's array; `a` keeps the values it had
    t[:2].fill_(-1)  # a write through a view: the same
    expect = c + 10
    expect[:2] = -1
    assert torch.equal(t.cpu(), expect)
    np.testing.assert_array_equal(np.asarray(a), c.numpy())
    # a result not computed yet (DEFER_AND_FUSE) is computed first
    np.testing.assert_array_equal(np.asarray(torchtpu.to_jax(t * 2)), (expect * 2).numpy())


def test_from_jax_array_not_changed_by_tensor_writes(eager_mode):
    a = jnp.arange(4, dtype=jnp.float32)
    t = torchtpu.from_jax(a)
    t.mul_(3)
    t[0] = 7
    assert torch.equal(t.cpu(), torch.tensor([7.0, 3, 6, 9]))
    np.testing.assert_array_equal(np.asarray(a), [0, 1, 2, 3])


def test_interop_errors():
    with pytest.raises(RuntimeError, match="tpu tensor"):
        torchtpu.to_jax(torch.ones(2))
    with pytest.raises(TypeError, match="tracer"):
        jax.jit(lambda x: torchtpu.from_jax(x))(jnp.ones(2))


def test_jax_op_overhead_measure_smoke():
    from torchtpu.bench.jax_op_overhead import measure

    r = measure(modes=("strict",), iters=5, reps=1)
    assert set(r["strict"]) == {"lowered_us", "jax_op_us", "ratio"}


DEVICE_INDEX_SCRIPT = textwrap.dedent(r"""
    import jax, jax.numpy as jnp, torch, torchtpu
    assert torch.tpu.device_count() == 2
    a = jax.device_put(jnp.arange(4, dtype=jnp.int64), jax.devices()[1])
    t = torchtpu.from_jax(a)
    assert t.device == torch.device("tpu", 1) and t.dtype == torch.int64, t
    assert torchtpu.to_jax(t) is a
    t2 = torchtpu.from_jax(a, device="tpu:0")  # another index: a copy there
    assert t2.device == torch.device("tpu", 0) and torch.equal(t2.cpu(), t.cpu())
    x = torch.randn(3, 4, dtype=torch.float64)
    x1 = x.to("tpu:1")
    assert list(torchtpu.to_jax(x1).devices()) == [jax.devices()[1]]
    op = torchtpu.jax_op("dev_tests::double", lambda v: v * 2)
    y = op(x1)
    assert y.device == torch.device("tpu", 1) and torch.equal(y.cpu(), x * 2)
    print("OK")
""")


def test_device_index():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", DEVICE_INDEX_SCRIPT], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr


def test_complex_backward_refused_not_wrong():
    op = torchtpu.jax_op(_name("cmul"), lambda z, x: (z * x, jnp.abs(z) * x))
    z = torch.randn(3, dtype=torch.complex128, device="tpu")
    x = torch.randn(3, dtype=torch.float64, device="tpu", requires_grad=True)
    prod, mag = op(z, x)
    # a real output of a complex (non-differentiated) input: the gradient is right
    mag.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), z.abs().cpu())
    with pytest.raises(NotImplementedError, match="complex output"):
        op(z, x)[0].abs().sum().backward()


def test_static_arguments_by_position_and_keyword():
    def axpy(x, y, a, mode="add"):
        return a * x + y if mode == "add" else a * x - y

    op = torchtpu.jax_op(_name("axpy"), axpy, static_argnames=("a", "mode"))
    x, y = torch.randn(3), torch.randn(3)
    xt, yt = x.to("tpu"), y.to("tpu")
    torch.testing.assert_close(op(xt, yt, 2.0).cpu(), 2.0 * x + y)
    torch.testing.assert_close(op(xt, yt, 3.0, "sub").cpu(), 3.0 * x - y)
    torch.testing.assert_close(op(xt, y=yt, a=0.5).cpu(), 0.5 * x + y)
    with pytest.raises(TypeError, match="positional arguments"):
        op(xt, yt, 1.0, "add", 5)


def test_mistakes_raise_jax_s_error_not_a_device_error():
    """A wrong shape or a missing static argument on tpu tensors raises the error
    ``jax.eval_shape`` gives (it named cpu tensors before: the executor asked a CPU
    kernel the op does not have)."""
    import jax

    def rmsnorm(x, w, *, eps):
        return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + eps) * w

    op = torchtpu.jax_op("mistakes::rmsnorm", rmsnorm, static_argnames=("eps",))
    x = torch.randn(4, 8, device="tpu")
    with pytest.raises(Exception, match="[Ii]ncompatible shapes") as e:
        op(x, torch.randn(5, device="tpu"), eps=1e-6)
    assert "cpu tensors" not in str(e.value)
    with pytest.raises(TypeError, match="eps") as e:
        op(x, torch.randn(8, device="tpu"))
    assert "cpu tensors" not in str(e.value)


def test_a_python_number_among_the_outputs_raises_a_clear_error():
    """Outputs must be arrays; a Python number gave ``AttributeError: 'int' object has
    no attribute 'dtype'``."""
    op = torchtpu.jax_op("mistakes::with_number", lambda a: (a * 2, 3))
    with pytest.raises(TypeError, match="every output must be a JAX array"):
        op(torch.ones(3, device="tpu"))
