#!/usr/bin/env bash
# GPU check of the XLA path on a lent accelerator machine (never part of CI).
# Runs with that machine's own python3 (its torch/jax), torchtpu from this checkout.
# Usage (on the device machine, repo root):  bash tools/device_check.sh  [writes $OUT/*]
set -u
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TORCHTPU_PLATFORM=gpu
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.5
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
python3 - <<'PY' 2>&1 | tee "$OUT/versions.txt"
import sys, torch, jax
print("python", sys.version.split()[0], "torch", torch.__version__, "jax", jax.__version__)
print("jax devices", jax.devices())
PY
echo "== CPU eager bench, pinned to 2 cores (the CI machine's size); CUTS=\"1 0\" also runs without segment cuts"
for cut in ${CUTS:-1}; do
  TORCHTPU_PLATFORM=cpu TORCHTPU_DEFER_CUT_AT_BACKWARD=$cut timeout 150 taskset -c 0,1 \
    python3 -m torchtpu.bench eager --steps 15 --warmup 3 --workloads llama,mlp,cnn \
    --modes strict,defer_and_fuse,debug --json "$OUT/eager_cpu_cut$cut.json" 2>&1 \
    | grep -v "it/s\|run/s" | tail -16 | tee "$OUT/eager_cpu_cut$cut.txt"
done
echo "== smoke"
timeout 90 python3 - <<'PY' 2>&1 | tee "$OUT/smoke.txt"
import time, torch, torchtpu
print("accelerator", torch.accelerator.current_accelerator(), torch.tpu.device_count(),
      torch.tpu.get_device_name())
a, b = torch.randn(512, 512), torch.randn(512, 512)
x, y = a.to("tpu"), b.to("tpu")
print("matmul f32 max abs diff vs CPU", (x @ y).cpu().sub(a @ b).abs().max().item())
print("int64 kept", (torch.tensor([2**40 + 1], device="tpu") * 3).item() == 3 * (2**40 + 1))
print("float64 add", (torch.tensor([1 + 1e-12], dtype=torch.float64, device="tpu") - 1).item())
m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
mt = __import__("copy").deepcopy(m).to("tpu")
inp = torch.randn(16, 64)
l1 = m(inp).square().mean(); l1.backward()
l2 = mt(inp.to("tpu")).square().mean(); l2.backward()
print("loss diff", abs(l1.item() - l2.item()), "grad diff",
      (m[0].weight.grad - mt[0].weight.grad.cpu()).abs().max().item())
print(torchtpu.metrics()["compiles"], "compiles")
PY
echo "== tests (semantics, eager modes)"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_semantics.py tests/test_eager_modes.py \
  -k "(strict or not semantics) and not autoload and not safetensors and not environment" 2>&1 \
  | tail -15 | tee "$OUT/tests.txt"
echo "== overhead bench"
timeout 60 python3 -m torchtpu.bench overhead --json "$OUT/overhead.json" 2>&1 | tail -8
echo "== eager bench"
timeout 150 python3 -m torchtpu.bench eager --steps 10 --warmup 3 --workloads mlp,llama,cnn \
  --json "$OUT/eager.json" 2>&1 | grep -v "it/s\|run/s" | tail -16 | tee "$OUT/eager.txt"
echo "== matmul throughput bf16 4096^3"
timeout 60 python3 - <<'PY' 2>&1 | tee "$OUT/matmul.txt"
import time, torch, torchtpu, jax, jax.numpy as jnp
n = 4096
def rate(f, sync, reps=20):
    f(); sync()
    t0 = time.perf_counter()
    for _ in range(reps): r = f()
    sync(); dt = (time.perf_counter() - t0) / reps
    return 2 * n**3 / dt / 1e12
x = torch.randn(n, n, dtype=torch.bfloat16, device="tpu")
print("torchtpu bf16 TFLOP/s", round(rate(lambda: x @ x, torch.tpu.synchronize), 1))
ja = jnp.asarray(jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16))
mm = jax.jit(lambda a: a @ a)
holder = {}
def jf(): holder["r"] = mm(ja)
print("jax bf16 TFLOP/s", round(rate(jf, lambda: holder["r"].block_until_ready()), 1))
if torch.cuda.is_available():
    c = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    print("torch cuda bf16 TFLOP/s", round(rate(lambda: c @ c, torch.cuda.synchronize), 1))
PY
