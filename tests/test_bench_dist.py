"""Smoke test of ``python -m torchtpu.bench dist`` (not a timing test): one tiny run at
1 and 2 processes has the documented structure, and its training columns train the same
MLP the same way: every rank trains on the same batch, so the last step's loss under
``tpu_dist`` DDP and FSDP2, at 1 and at 2 processes, equals the loss of PyTorch's own DDP
on cpu tensors with gloo (``ddp_cpu``)."""

import json

import _budget
import pytest

from torchtpu.bench import dist as bench

# two 2-process runs of the benchmark (~40 s on CI's 2 cores): `make test-full`
# (TORCHTPU_FULL_TESTS=1); the default run checks the same collectives and DDP/FSDP2
# steps against gloo in tests/test_distributed*.py
pytestmark = pytest.mark.skipif(not _budget.FULL,
                                reason="long: TORCHTPU_FULL_TESTS=1 (make test-full)")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-dist") / "out.json"
    assert bench.main(["--world", "2", "--sizes", "4K", "--iters", "1", "--steps", "2",
                       "--warmup", "1", "--train", "ddp,fsdp2,ddp_cpu",
                       "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_collective_rows_have_each_backend(run):
    coll = run["worlds"]["2"]["collectives"]
    assert set(coll) == set(bench.COLLECTIVES)
    for name in bench.COLLECTIVES:
        r = coll[name][str(4 * 1024)]
        for backend in ("tpu_dist", "tpu_dist_nocheck", "gloo"):
            assert r[backend] > 0, (name, backend)
            assert r["busbw_GBps"][backend] > 0, (name, backend)


def test_training_columns_match_cpu_ddp(run):
    ref = run["worlds"]["1"]["train_last_loss"]["ddp_cpu"]
    for world in ("1", "2"):
        w = run["worlds"][world]
        for kind in ("ddp", "fsdp2", "ddp_cpu"):
            assert w["train"][kind] > 0
            assert w["train_last_loss"][kind] == pytest.approx(ref, rel=1e-4), (world, kind)
            assert w["train_summary"][kind]["efficiency"] > 0
