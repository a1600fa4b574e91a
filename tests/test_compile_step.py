"""Whole training steps under ``torch.compile(backend="tpu")`` against the same steps on
CPU (eager), in the usual forms: ``torch.compile(train_step)`` with ``zero_grad``,
forward, loss, ``backward()`` and ``opt.step()`` inside; ``torch.compile(model)`` with an
eager optimizer; gradient accumulation; autocast + ``GradScaler``; ``clip_grad_norm_``;
an LR scheduler stepping every iteration.  Losses, parameters and optimizer state are
compared after every step; the programs launched per step are counted
(``compile.graph``'s stitching: the step's graphs run as one program)."""

import copy

import pytest
import torch
import torch.nn as nn

import torchtpu


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _close(a, b, tol=1e-5):
    torch.testing.assert_close(a.detach().cpu().float(), b.detach().float(), rtol=tol, atol=tol)


def _models():
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5))
    return cpu, copy.deepcopy(cpu).to("tpu")


def _batches(n, batch=8):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 12, generator=g), torch.randint(0, 5, (batch,), generator=g))
            for _ in range(n)]


def _launches(m) -> int:
    """XLA programs launched (STRICT): per-op executables (ops not recorded into a
    stitched segment), segments run, and graphs launched on their own."""
    return (m["lowered_ops"] - m["stitched_ops"] + m["segments_run"]
            + m["compile"]["graph_launches"])


def _same_state(opt_t, opt_c, model_t, model_c, tol=1e-5):
    for p, q in zip(model_t.parameters(), model_c.parameters()):
        _close(p, q, tol)
        for k, v in opt_c.state[q].items():
            w = opt_t.state[p][k]
            if isinstance(v, torch.Tensor):
                _close(w, v, tol)
            else:
                assert w == v, k


def _train_step(model, opt, clip=None):
    def train_step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        return loss.detach()

    return train_step


@pytest.mark.parametrize("form", ["plain", "clip", "scheduler"])
def test_compiled_train_step_matches_cpu_and_runs_one_program_per_step(form):
    cpu, tpu = _models()
    # scheduler: PyTorch's recipe for a compiled step whose learning rate changes every
    # iteration -- the rate a CPU tensor (a float would be a guarded constant: one
    # recompile per value), the scheduler stepped outside the compiled function
    lr = torch.tensor(1e-2) if form == "scheduler" else 1e-2
    opts = [torch.optim.AdamW(m.parameters(), lr=lr) for m in (cpu, tpu)]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + s)) if form ==
              "scheduler" else None for o in opts]
    clip = 0.5 if form == "clip" else None
    step_c = _train_step(cpu, opts[0], clip)
    step_t = torch.compile(_train_step(tpu, opts[1], clip), backend="tpu")
    data = _batches(6)
    for i, (x, y) in enumerate(data):
        if i == 3:  # steady state: every program compiled, every guard settled
            torch.tpu.synchronize()
            torchtpu.reset_metrics()
        ref = step_c(x, y)
        loss = step_t(x.to("tpu"), y.to("tpu"))
        for s in scheds:
            if s is not None:
                s.step()
        _close(loss, ref)
        _same_state(opts[1], opts[0], tpu, cpu)
    if scheds[0] is not None:
        assert scheds[1].get_last_lr() == scheds[0].get_last_lr()
    m = torchtpu.metrics()
    assert m["compile"]["recompiles"] == 0 and m["compiles"] == 0, m["compile"]
    if form != "scheduler":  # (the scheduler's eager steps write the CPU lr tensor only)
        # forward, loss seed, backward and the AdamW update: one program per step (each
        # step's read of the loss above runs it)
        assert _launches(m) == 3, m
        assert m["compile"]["stitched_calls"] >= 3 * 3 and m["segments_run"] == 3, m


def test_compiled_model_with_an_eager_optimizer_matches_cpu():
    cpu, tpu = _models()
    opt_c = torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9)
    opt_t = torch.optim.SGD(tpu.parameters(), lr=0.1, momentum=0.9)
    fwd = torch.compile(tpu, backend="tpu")
    for x, y in _batches(4):
        for model, opt, f, xx, yy in ((cpu, opt_c, cpu, x, y),
                                      (tpu, opt_t, fwd, x.to("tpu"), y.to("tpu"))):
            loss = nn.functional.cross_entropy(f(xx), yy)
            loss.backward()
            opt.step()
            opt.zero_grad()
        _same_state(opt_t, opt_c, tpu, cpu)


def test_gradient_accumulation_matches_cpu():
    cpu, tpu = _models()
    opt_c = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    opt_t = torch.optim.AdamW(tpu.parameters(), lr=1e-2)
    fwd = torch.compile(lambda x, y: nn.functional.cross_entropy(tpu(x), y) / 2,
                        backend="tpu")
    opt_step = torch.compile(opt_t.step, backend="tpu")
    data = _batches(8, batch=4)
    for k in range(0, 8, 2):
        for x, y in data[k:k + 2]:  # two micro-batches per update
            (nn.functional.cross_entropy(cpu(x), y) / 2).backward()
            fwd(x.to("tpu"), y.to("tpu")).backward()
        for p, q in zip(tpu.parameters(), cpu.parameters()):
            _close(p.grad, q.grad)
        opt_c.step()
        opt_t.step() if k == 0 else opt_step()
        opt_c.zero_grad()
        opt_t.zero_grad()
        _same_state(opt_t, opt_c, tpu, cpu)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_and_grad_scaler_match_cpu(dtype):
    cpu, tpu = _models()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (cpu, tpu)]
    scalers = [torch.amp.GradScaler(dev, init_scale=2.0 ** 8) for dev in ("cpu", "tpu")]

    def make(model, opt, scaler, dev):
        def step(x, y):
            with torch.autocast(dev, dtype=dtype):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            return loss.detach()

        return step

    step_c = make(cpu, opts[0], scalers[0], "cpu")
    fwd = torch.compile(tpu, backend="tpu")
    step_t = make(fwd, opts[1], scalers[1], "tpu")
    for x, y in _batches(4):
        _close(step_t(x.to("tpu"), y.to("tpu")), step_c(x, y), 1e-2)
        assert scalers[1].get_scale() == scalers[0].get_scale()
        for p, q in zip(tpu.parameters(), cpu.parameters()):
            _close(p, q, 1e-2)
