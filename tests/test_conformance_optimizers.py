"""``python -m torchtpu.conformance optimizers`` (:mod:`torchtpu.conformance.optimizers`):
every optimizer of PyTorch's ``optim_db`` on tpu against CPU.

Fast: every optimizer once (first option set; the default/for-loop, foreach and fused
implementations where CPU has them; float32; 3 steps), two LR schedulers and a
state_dict round trip each way, all compared value by value with CPU, and the judge's
own checks.  ``TORCHTPU_FULL_TESTS=1``: the whole sweep (every option set and variant,
float64 too, every scheduler and round trip; a few minutes).
"""


import _budget
import pytest
import torch
from torch.testing._internal.common_optimizers import optim_db

from torchtpu.conformance import optimizers as O

FULL = _budget.FULL
NAMES = [o.optim_cls.__name__ for o in optim_db]
FAST_VARIANTS = ("default", "for-loop", "foreach", "fused")

# Full sweep, accepted deviations (each can still fail the test):
# * float32 LBFGS cases may differ from CPU beyond the float64 arbiter's bound (2x CPU
#   float32's own distance from float64) by rounding alone (2026-12-06, strict:
#   ``non-default lr``, ``Tensor lr``; defer_and_fuse also the tpu->cpu round trip):
#   LBFGS's curvature pairs (1 / y.s, y a difference of nearly equal gradients) amplify
#   ulp-level differences of the gradients ~10x per inner iteration.  Accepted only while
#   every float64 LBFGS case matches CPU.
# * DEFER_AND_FUSE: ASGD foreach float64 parameters ~1e-10 (relative ~5e-9) off CPU: its
#   float32 ``eta = lr / ((1 + lambd * lr * step) ** alpha)`` (``step`` a float32 tpu
#   tensor) runs as one fused XLA computation, which rounds it 1 float32 ulp differently
#   (0.01 / ((1 + 1e-6 * s) ** 0.75) at s = 2: 0.009999984875 vs CPU's op-by-op
#   0.009999983944; each op alone matches), and the float64 update multiplies by it.
#   Accepted only in that mode, for float64 ASGD, within float32 rounding (max rel < 1e-7).


def _accepted(r, recs, mode):
    if r["status"] != "mismatch":
        return False
    if r["optimizer"] == "LBFGS" and r["dtype"] == "float32":
        f64 = [x for x in recs if x["optimizer"] == "LBFGS" and x["dtype"] == "float64"]
        return bool(f64) and all(x["status"] in O.PASSING for x in f64)
    return (mode == "defer_and_fuse" and r["optimizer"] == "ASGD" and r["dtype"] == "float64"
            and r["max_rel"] < 1e-7)


def _info(name):
    return next(o for o in optim_db if o.optim_cls.__name__ == name)


def _explain(recs):
    return "\n".join(f"{r['optimizer']} {r['variant']} {r['dtype']} {r['desc']}: {r['status']} "
                     f"{r.get('where')} {r.get('detail') or r.get('reason')}" for r in recs)


@pytest.mark.parametrize("name", _budget.every(NAMES, 2))  # (all: TORCHTPU_FULL_TESTS=1)
def test_optimizer_matches_cpu(name):
    oi = _info(name)
    if oi.only_supports_sparse_grads:
        recs = O.run_optimizer(oi, steps=3)
        assert [r["status"] for r in recs] == ["skip"]
        pytest.skip(f"{name} takes sparse gradients only")
    variants = [v for v in O.variants(oi) if v in FAST_VARIANTS]
    recs = O.run_optimizer(oi, steps=3, variant_names=variants, dtypes=["float32"], option_sets=1)
    assert [r["variant"] for r in recs] == variants
    bad = [r for r in recs if r["status"] not in O.PASSING]
    assert not bad, _explain(bad)
    if name in ("SGD", "Adagrad", "Adam", "AdamW"):
        assert "fused" in variants  # CPU has fused kernels for these


def test_variants_follow_the_optimizer_info():
    assert O.variants(_info("SGD")) == ["for-loop", "foreach", "fused"]
    assert O.variants(_info("Adam")) == ["for-loop", "foreach", "fused", "capturable",
                                         "foreach+capturable"]
    assert O.variants(_info("LBFGS")) == ["default"]
    assert O.variants(_info("Adam"), quick=True) == ["for-loop"]


def test_capturable_adam_matches_cpu():
    recs = O.run_optimizer(_info("Adam"), steps=3, variant_names=["capturable"],
                           dtypes=["float32"], option_sets=1)
    assert [r["status"] for r in recs] == ["pass"], _explain(recs)


@pytest.mark.parametrize("sched,opt", [("OneCycleLR", "SGD"), ("ReduceLROnPlateau", "AdamW")])
def test_lr_scheduler_matches_cpu(sched, opt):
    rec = O.run_scheduler(sched, opt)
    assert rec["status"] in O.PASSING, _explain([rec])
    # the schedule did change the learning rate during the run (on CPU and, equal, on tpu)
    cls, kw = O.SCHED_OPTIMIZERS[opt]
    tr = O.trajectory(getattr(torch.optim, cls), kw, "cpu", torch.float32, O.initial_weights(),
                      O.make_data(O.SCHED_STEPS, seed=1), sched=O._schedulers()[sched])
    assert len({float(s["group0.lr"]) for s in tr}) > 1


@pytest.mark.parametrize("direction", ["tpu->cpu", "cpu->tpu"])
def test_state_dict_round_trip(direction):
    rec = O.run_round_trip("AdamW", {"weight_decay": 0.1, "amsgrad": True}, "foreach", direction)
    assert rec["status"] in O.PASSING, _explain([rec])


def test_judge_flags_a_wrong_state_value():
    w, data = O.initial_weights(), O.make_data(3)
    cls = torch.optim.Adam

    def cpu(dt):
        return O.trajectory(cls, {}, "cpu", dt, w, data)

    ref = cpu(torch.float32)
    same = [{k: v.clone() for k, v in s.items()} for s in ref]
    assert O.judge(ref, same, "float32", lambda: cpu(torch.float64))["status"] == "pass"
    # one ulp on one state value: within tolerance
    ulp = [{k: v.clone() for k, v in s.items()} for s in ref]
    ulp[1]["state fc1.weight.exp_avg_sq"] = O._bump(ulp[1]["state fc1.weight.exp_avg_sq"])
    assert O.judge(ref, ulp, "float32", lambda: cpu(torch.float64))["status"] == "pass"
    # 0.1% off on one element of one state value at step 2: a mismatch, named
    bad = [{k: v.clone() for k, v in s.items()} for s in ref]
    t = bad[1]["state fc2.weight.exp_avg"].view(-1)
    t[t.abs().argmax()] *= 1.001
    res = O.judge(ref, bad, "float32", lambda: cpu(torch.float64),
                  lambda: [O.trajectory(cls, {}, "cpu", torch.float32, w, data, perturb=1)])
    assert res["status"] == "mismatch" and res["where"] == "step 2: state fc2.weight.exp_avg", res
    # a state value missing on one side
    missing = [{k: v for k, v in s.items() if k != "state scale.step"} for s in ref]
    assert O.judge(ref, missing, "float32")["status"] == "mismatch"


def test_cpu_error_is_compared_with_tpu_error():
    # Adam rejects a tensor lr with foreach=True and capturable=False: on CPU and tpu
    # alike, so nothing to compare (skip), not an error
    def run(dev, dt=torch.float32):
        return O.trajectory(torch.optim.Adam, {"lr": torch.tensor(0.01), "foreach": True}, dev,
                            dt, O.initial_weights(), O.make_data(1))

    rec = O.compare_case(lambda dt: run("cpu", dt), lambda: run("tpu"), "float32")
    assert rec["status"] == "skip" and "both raise ValueError" in rec["reason"], rec
    rec = O.compare_case(lambda dt: run("cpu", dt), lambda: O.trajectory(
        torch.optim.Adam, {}, "tpu", torch.float32, O.initial_weights(), O.make_data(1)), "float32")
    assert rec["status"] == "mismatch" and "tpu does not" in rec["reason"], rec


def test_report(tmp_path):
    recs = [{"kind": "optimizer", "optimizer": "SGD", "variant": "fused", "dtype": "float32",
             "desc": "default", "status": "unsupported", "missing_op": "aten._fused_sgd_.default",
             "reason": "NotImplementedError: ..."},
            {"kind": "optimizer", "optimizer": "Adam", "variant": "foreach", "dtype": "float32",
             "desc": "amsgrad", "status": "pass", "max_abs": 1e-7, "max_rel": 1e-7,
             "where": "step 1: loss"}]
    md = O.summarize(recs, {"command": "x"})
    assert "| unsupported | 1 |" in md and "| pass | 1 |" in md
    assert "* **unsupported** SGD fused float32 `default` (no kwargs): aten._fused_sgd_.default" in md
    assert "| Adam | foreach | float32 | amsgrad | pass |" in md
    out, js = tmp_path / "o.md", tmp_path / "o.json"
    assert O.main(["--quick", "--filter", "^Rprop$", "--jobs", "0", "--out", str(out),
                   "--json", str(js)]) == 0
    text = out.read_text()
    assert "| Rprop | for-loop | float32 | default | pass |" in text, text
    import json

    res = json.loads(js.read_text())["results"]
    assert {(r["optimizer"], r["variant"], r["dtype"]) for r in res} == {
        ("Rprop", "for-loop", "float32"), ("Rprop", "for-loop", "float64"),
        ("Rprop", "default tpu->cpu", "float32"), ("Rprop", "default cpu->tpu", "float32")}


@pytest.mark.skipif(not FULL, reason="long: TORCHTPU_FULL_TESTS=1 (make test-full)")
def test_full_sweep():
    from torchtpu.eager import modes

    mode = modes.get_eager_mode().value
    recs = O.sweep(jobs=0)
    bad = [r for r in recs if r["status"] not in O.PASSING + ("skip",)
           and not _accepted(r, recs, mode)]
    assert not bad, _explain(bad)
    assert sum(r["optimizer"] == "LBFGS" and r["status"] == "mismatch" for r in recs) <= 4
    skips = [r for r in recs if r["status"] == "skip"]
    assert [r["optimizer"] for r in skips] == ["SparseAdam"], _explain(skips)
    assert len(recs) > 450
