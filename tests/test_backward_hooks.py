"""Exceptions raised during ``backward()`` reach the caller, as on CPU, in every eager mode.

With PyTorch's Python device guard an exception from a tensor or module hook aborted the
whole process, so each case runs in a subprocess: a regression shows as a failed test,
not a dead pytest.  The subprocess runs the same user code on CPU and on tpu and prints
what the caller saw (exception type and message), then a second, clean backward's grads.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

# eager_mode tests run in DEFER_AND_FUSE too in the default run (tests/conftest.py)
DEFER_BY_DEFAULT = True

SCRIPT = textwrap.dedent(r"""
    import json, sys
    import torch

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            raise RuntimeError("boom from Function.backward")

    def run(case, device):
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 3).to(device)
        x = torch.randn(2, 4).to(device).requires_grad_()
        caught = None
        try:
            if case == "tensor_hook":
                y = lin(x) * 2
                def hook(g):
                    raise ValueError("boom from a tensor hook")
                h = y.register_hook(hook)
                y.sum().backward()
            elif case == "tensor_hook_cpu_loss":  # the graph's root is on the CPU
                y = lin(x) * 2
                def hook(g):
                    raise ValueError("boom from a tensor hook, loss on the CPU")
                h = y.register_hook(hook)
                (y.cpu() * 3).sum().backward()
            elif case == "module_hook":
                def hook(mod, gin, gout):
                    raise KeyError("boom from a module hook")
                h = lin.register_full_backward_hook(hook)
                lin(x).sum().backward()
            elif case == "function_backward":
                Boom.apply(lin(x)).sum().backward()
        except Exception as e:  # what the caller sees
            caught = [type(e).__name__, str(e)]
        if case != "function_backward":
            h.remove()
        lin.zero_grad(); x.grad = None
        (lin(x).tanh() * 3).sum().backward()  # the process goes on: a clean backward
        grads = [t.grad.cpu().tolist() for t in (x, lin.weight, lin.bias)]
        return {"caught": caught, "grads": grads}

    for case in sys.argv[1:]:
        print("RESULT " + json.dumps({"case": case, "cpu": run(case, "cpu"), "tpu": run(case, "tpu")}), flush=True)
""")


# the CPU-loss case first: there the first backward over tpu nodes has a CPU root
CASES = ["tensor_hook_cpu_loss", "tensor_hook", "module_hook", "function_backward"]


def test_exception_in_backward_reaches_caller(eager_mode):
    # one process per mode runs every case in turn (each case also after the others)
    env = dict(os.environ, TORCHTPU_EAGER_MODE=eager_mode)
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, *CASES], capture_output=True, text=True, env=env,
        timeout=600,
    )
    done = [json.loads(ln[len("RESULT "):]) for ln in p.stdout.splitlines()
            if ln.startswith("RESULT ")]
    assert p.returncode == 0, (
        f"process died (rc={p.returncode}) after {[r['case'] for r in done]}:\n"
        f"{p.stderr[-3000:]}"
    )
    assert [r["case"] for r in done] == CASES
    for r in done:
        cpu, tpu = r["cpu"], r["tpu"]
        assert cpu["caught"] is not None, r["case"]  # the CPU run raised
        assert tpu["caught"] == cpu["caught"], r["case"]  # same type and message
        for g_tpu, g_cpu in zip(tpu["grads"], cpu["grads"]):
            torch.testing.assert_close(torch.tensor(g_tpu), torch.tensor(g_cpu))
