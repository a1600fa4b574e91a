"""A process's first torch.compile on tpu does not import Inductor's code generator.

AOTAutograd's partitioner CSE pass and Dynamo's optimizer support (its CUDA graph check)
import Inductor's pattern matcher / CUDA graph trees, and with them all of Inductor's
lowerings: about a second of the first compiled step.  ``compile.backend`` turns the
partitioner's CSE off (XLA eliminates common subexpressions) and ``compile.routing``
answers Dynamo's CUDA graph question for non-CUDA tensors without the import.
"""

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent("""
    import sys, torch, torch.nn as nn
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    tpu = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    tpu.load_state_dict(cpu.state_dict())
    tpu = tpu.to("tpu")
    x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
    outs = []
    for m, dev, backend in ((cpu, "cpu", None), (tpu, "tpu", "tpu")):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        fwd = m if backend is None else torch.compile(m, backend=backend)
        step = opt.step if backend is None else torch.compile(opt.step, backend=backend)
        for _ in range(2):
            loss = nn.functional.cross_entropy(fwd(x.to(dev)), y.to(dev))
            loss.backward()
            step()
            opt.zero_grad()
        outs.append([p.detach().cpu() for p in m.parameters()] + [loss.detach().cpu()])
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    bad = sorted(n for n in ("torch._inductor.lowering", "torch._inductor.select_algorithm",
                             "torch._inductor.compile_fx") if n in sys.modules)
    print("INDUCTOR_IMPORTS", bad)
""")


def test_first_compiled_training_step_imports_no_inductor_lowerings():
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "INDUCTOR_IMPORTS []" in proc.stdout, proc.stdout[-2000:]
