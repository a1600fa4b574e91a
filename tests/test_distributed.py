"""torch.distributed on tpu tensors (the ``tpu_dist`` backend), 2 ranks on the CPU platform.

The ranks are spawned once per module (``tests/_dist_worker.py``); each check there runs a
collective on tpu tensors and the same collective on cpu tensors with gloo in the same
process, and reports ``ok`` or the failure.  Each test below asserts its checks on both
ranks.
"""

import json
import os
import socket
import subprocess
import sys

import _budget
import pytest

WORLD = 2
HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(worker, world, out, timeout=300):
    """Run ``python tests/<worker> RANK WORLD PORT OUT`` for every rank on the CPU platform
    and return each rank's ``{check: "ok" | error}`` (``OUT/rank{RANK}.json``)."""
    port = str(_free_port())
    env = dict(os.environ, TORCHTPU_PLATFORM="cpu")
    procs = [
        subprocess.Popen([sys.executable, os.path.join(HERE, worker), str(r),
                          str(world), port, str(out)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("distributed worker timed out:\n" + "\n".join(logs))
    res = []
    for r in range(world):
        path = out / f"rank{r}.json"
        if not path.exists():
            pytest.fail(f"rank {r} wrote no results:\n{logs[r][-5000:]}")
        res.append(json.loads(path.read_text()))
    return res


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return spawn_ranks("_dist_worker.py", WORLD, tmp_path_factory.mktemp("dist"))


def _assert(ranks, prefix):
    names = [n for n in ranks[0] if n == prefix or n.startswith(prefix + "[")]
    assert names, f"no check named {prefix}"
    bad = {f"rank {r} {n}": res.get(n, "missing") for r, res in enumerate(ranks)
           for n in names if res.get(n) != "ok"}
    assert not bad, "\n".join(f"{k}:\n{v}" for k, v in bad.items())


def test_register_is_cheap_and_default_for_tpu():
    # import torch autoloads torchtpu: tpu_dist is registered, JAX not imported
    code = ("import sys, torch, torch.distributed as dist; "
            "print(dist.Backend.default_device_backend_map['tpu'], "
            "dist.Backend.default_device_backend_map['cpu'], "
            "dist.Backend.backend_capability['tpu_dist'], 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["tpu_dist", "gloo", "['tpu']", "False"], out.stderr


def test_init_process_group_without_backend(ranks):
    _assert(ranks, "backend")


@pytest.mark.parametrize("name", [
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
    "reduce_scatter_tensor", "reduce_scatter", "all_reduce_view", "all_reduce_async", "barrier",
])
def test_collectives_match_gloo_on_cpu(ranks, name):
    _assert(ranks, name)


def test_send_recv_and_object_collectives_through_gloo(ranks):
    _assert(ranks, "send_recv")
    _assert(ranks, "batch_isend_irecv")
    _assert(ranks, "all_to_all_single")
    _assert(ranks, "all_gather_object")
    _assert(ranks, "broadcast_object_list")


def test_functional_collectives_eager(ranks):
    # torch.distributed._functional_collectives (DTensor's and FSDP2's path), eagerly
    _assert(ranks, "functional_collectives")


def test_metrics_count_the_path_of_each_call(ranks):
    _assert(ranks, "metrics")


def test_shape_mismatch_names_collective_shapes_and_ranks(ranks):
    _assert(ranks, "shape_mismatch")


def test_mismatch_of_signatures_each_rank_ran_before(ranks):
    # the check is in the collective's XLA program: it must catch shapes every rank
    # has compiled before, and different collectives, and leave the group usable
    _assert(ranks, "shape_mismatch_seen_before")
    _assert(ranks, "collective_mismatch")


def test_mismatch_with_async_op_raises_at_wait_or_next_sync(ranks):
    _assert(ranks, "shape_mismatch_async")


def test_new_group_subgroups(ranks):
    _assert(ranks, "new_group")


def test_destroy_then_init_again(ranks):
    _assert(ranks, "reinit")


def test_ddp_matches_single_process_training(ranks):
    _assert(ranks, "ddp")


def test_collectives_in_defer_and_fuse_with_rank_divergent_code(ranks):
    # only rank 0 reads a tensor between two collectives: the ranks cut their segments
    # at different places, and neither hangs
    _assert(ranks, "defer_and_fuse")


def test_ddp_in_defer_and_fuse(ranks):
    _assert(ranks, "ddp_defer_and_fuse")


_KILLED_RANK = r"""
import datetime, os, sys, time, torch, torch.distributed as dist
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("tpu_dist", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=2, timeout=datetime.timedelta(seconds=10))
x = torch.ones(3, device="tpu")
dist.all_reduce(x)
if rank == 1:
    os._exit(1)  # dies without a word
time.sleep(1)
t = time.time()
try:
    dist.all_reduce(x)
    print("NO ERROR", flush=True)
except RuntimeError as e:
    print(f"ERROR after {time.time() - t:.1f} s: {str(e)[:200]}", flush=True)
"""


def _two_ranks(script):
    """Ranks 0 and 1 of ``script`` (``python -c script RANK PORT``) on the CPU platform,
    started on a free port; their output piped (stderr into stdout)."""
    port = str(_free_port())
    env = dict(os.environ, TORCHTPU_PLATFORM="cpu")
    return [subprocess.Popen([sys.executable, "-c", script, str(r), port], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for r in range(2)]


def test_killed_rank_raises_within_timeout():
    # the survivor's next collective raises (never hangs), and the survivor's process
    # ends soon after (JAX's coordination service ends it once the heartbeat times out)
    procs = _two_ranks(_KILLED_RANK)
    try:
        out0 = procs[0].communicate(timeout=60)[0]  # JAX default heartbeat: ~105 s
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("the surviving rank hung or outlived the group timeout by far")
    procs[1].wait(timeout=30)
    lines = [ln for ln in out0.splitlines() if ln.startswith(("ERROR after", "NO ERROR"))]
    assert lines and lines[0].startswith("ERROR after"), out0[-3000:]
    assert float(lines[0].split()[2]) < 10, lines[0]


_EARLY_EXIT = r"""
import datetime, sys, time, torch, torch.distributed as dist
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("tpu_dist", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=2, timeout=datetime.timedelta(seconds=10))
x = torch.ones(3, device="tpu")
dist.all_reduce(x)
if rank == 0:
    time.sleep(16)  # still working, longer than the timeout, after rank 1 has finished
    print("rank 0 result", x.sum().item(), flush=True)
dist.destroy_process_group()
"""


def test_rank_that_finishes_early_does_not_abort_the_others():
    # rank 1 ends its program while rank 0 still works: at exit JAX's shutdown barrier
    # waits for rank 0 (it used to time out after the group's timeout and abort both)
    procs = _two_ranks(_EARLY_EXIT)
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("a rank hung at exit")
    assert "rank 0 result 6.0" in outs[0], outs[0][-3000:]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]


def test_tpu_tensor_before_init_process_group_raises(tmp_path):
    # the JAX runtime holding that tensor cannot join a multi-process one
    code = ("import torch, torch.distributed as dist\n"
            "x = torch.ones(2, device='tpu')\n"
            "try:\n"
            f"    dist.init_process_group(init_method='file://{tmp_path}/store', rank=0,\n"
            "                            world_size=2)\n"
            "except RuntimeError as e:\n"
            "    print('RuntimeError:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, TORCHTPU_PLATFORM="cpu"))
    assert "RuntimeError: tpu_dist: tpu tensors were created in this process before " \
           "init_process_group" in out.stdout, out.stdout + out.stderr[-3000:]


@_budget.full_only  # (test_destroy_then_init_again re-initializes by default; CI's budget)
def test_ten_init_destroy_cycles_then_sigterm_ends_each_rank(tmp_path):
    """Ten ``init_process_group`` / ``destroy_process_group`` cycles in the same two
    processes (``env://``, one port), each with tpu and CPU all_reduces and a DDP step:
    the second or third re-initialisation used to hang or fail ("Gloo connectFullMesh
    failed", a store key of another backend) when a rank read the previous group's keys.
    Then SIGTERM must end a rank (JAX's preemption service caught it and the process
    went on)."""
    import signal
    import time

    port = str(_free_port())
    env = dict(os.environ, TORCHTPU_PLATFORM="cpu")
    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "_dist_reinit_worker.py"),
                               str(r), "2", port, "10", str(tmp_path)], env=env,
                              stdout=open(logs[r], "w"), stderr=subprocess.STDOUT)
             for r in range(2)]
    try:
        deadline = time.monotonic() + 240
        while not all("ready" in log.read_text() for log in logs):
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                pytest.fail("re-initialisation cycles failed or hung:\n"
                            + "\n".join(log.read_text()[-3000:] for log in logs))
            time.sleep(0.5)
        for log in logs:
            out = log.read_text()
            assert all(f"cycle {c} ok" in out for c in range(10)), out[-3000:]
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pytest.fail("a rank went on after SIGTERM")
            assert p.returncode == -signal.SIGTERM, p.returncode
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
