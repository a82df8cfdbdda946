"""torch.distributed on max_device: every collective through Gloo on the
device's own memory, DDP and FSDP2 training that matches one process, the
same plugins on every rank (check_consistent, reload_all), and ranks that
die or hang.

Each run starts real processes, one per rank (this file's `rank_main`, with
RANK/WORLD_SIZE as torchrun sets them; a file store, Gloo on loopback), and
one test starts examples/train_distributed.py under `torchrun --standalone`.
A rank runs a scenario and writes what it saw to a JSON file; the tests
check those files. Three runs, to keep process starts few (each imports
torch): 2 ranks (the collectives under the three ways to name the backend,
DDP, FSDP2, the plugin checks) and 4 ranks (the collectives, DDP, FSDP2),
each a module fixture read by several tests, and 3 ranks (one dies, one
hangs).

Tolerances: a data-parallel step computes the combined batch's mean loss and
gradient as a sum of per-rank parts, in another order than one process
does, so float32 rounding differs (~1e-7 relative in the gradients).
Observed: losses equal to within 1e-6 over TRAIN_STEPS steps, DDP and FSDP2,
2 and 4 ranks; we allow LOSS_ATOL.
"""

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import max_device
import max_device.distributed as md
from conftest import PYTHON_DIR, REPO_ROOT, build_paths

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(REPO_ROOT, "examples"))
import gpt  # noqa: E402

DEVICE = "max_device"
TRAIN_STEPS = 6
BATCH_PER_RANK = 2
LOSS_ATOL = 1e-5
# Process group timeouts: how long a rank waits for the others. Long for
# starting up; short in the failure scenarios, for a rank that died or hangs.
GROUP_TIMEOUT_S = 120
SHORT_TIMEOUT_S = 4
LOST_RANKS = {"dies": 1, "hangs": 2}
# Bound on one multi-process run: a run that takes longer hung.
RUN_DEADLINE_S = 150
INIT_STYLES = ("gloo", "cpu:gloo,max_device:gloo", "default")


# --- The ranks ----------------------------------------------------------------
# Runs in the rank processes: scenario functions take (rank, world, arguments)
# and return a JSON-able dict. A check that raises is recorded as its error.

def rank_main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    scenario = globals()["scenario_" + os.environ["TEST_SCENARIO"]]
    arguments = json.loads(os.environ["TEST_ARGUMENTS"])
    torch.max_device.set_device(rank % torch.max_device.device_count())
    result = scenario(rank, world, arguments)
    with open(os.path.join(arguments["results"], f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


_groups_made = iter(range(1 << 30))


def init_group(arguments, style="gloo"):
    store = os.path.join(arguments["results"], f"store{next(_groups_made)}")  # a fresh one each time
    kwargs = dict(init_method="file://" + store, rank=int(os.environ["RANK"]),
                  world_size=int(os.environ["WORLD_SIZE"]), timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    if style == "default":
        dist.init_process_group(**kwargs)  # max_device's default backend
    else:
        dist.init_process_group(style, **kwargs)


def record(checks, name, fn):
    try:
        fn()
        checks[name] = "ok"
    except Exception:  # noqa: BLE001 - reported to the test
        checks[name] = traceback.format_exc()


def collective_checks(rank, world):
    """Every collective on max_device tensors, checked against what each
    rank can compute itself."""
    from torch.distributed import ReduceOp
    device = torch.device(DEVICE, torch.max_device.current_device())
    checks = {}

    def value(r, n=4, dtype=torch.float32):  # rank r's contribution
        return (torch.arange(n, dtype=dtype) + 1) * (r + 1)

    def every(n=4, dtype=torch.float32):
        return [value(r, n, dtype) for r in range(world)]

    def expect(t, reference):
        assert t.device == device, f"{t.device} != {device}"
        torch.testing.assert_close(t.cpu(), reference)

    def all_reduce_ops():
        reductions = {ReduceOp.SUM: lambda xs: sum(xs), ReduceOp.PRODUCT: lambda xs: torch.stack(xs).prod(0),
                      ReduceOp.MIN: lambda xs: torch.stack(xs).min(0).values,
                      ReduceOp.MAX: lambda xs: torch.stack(xs).max(0).values,
                      ReduceOp.AVG: lambda xs: sum(xs) / len(xs)}
        for op, reduce in reductions.items():
            t = value(rank).to(device)
            dist.all_reduce(t, op=op)
            expect(t, reduce(every()))
        bitwise = {ReduceOp.BAND: torch.bitwise_and, ReduceOp.BOR: torch.bitwise_or,
                   ReduceOp.BXOR: torch.bitwise_xor}
        for op, combine in bitwise.items():
            t = value(rank, dtype=torch.int64).to(device)
            dist.all_reduce(t, op=op)
            reference = every(dtype=torch.int64)
            for other in reference[1:]:
                reference[0] = combine(reference[0], other)
            expect(t, reference[0])

    def zero_copy():
        t = value(rank, n=1 << 16).to(device)
        pointer, before = t.data_ptr(), torch.max_device.memory_stats()
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        assert t.data_ptr() == pointer
        assert torch.max_device.memory_stats()["allocations"] == before["allocations"], "the collective allocated"
        assert work.result()[0].data_ptr() == pointer and work.result()[0].device == device
        expect(t, sum(every(n=1 << 16)))

    def broadcast():
        t = value(rank).to(device)
        dist.broadcast(t, src=world - 1)
        expect(t, value(world - 1))

    def all_gather():
        out = [torch.empty(4, device=device) for _ in range(world)]
        dist.all_gather(out, value(rank).to(device))
        for t, reference in zip(out, every()):
            expect(t, reference)
        flat = torch.empty(4 * world, device=device)
        dist.all_gather_into_tensor(flat, value(rank).to(device))
        expect(flat, torch.cat(every()))

    def reduce_scatter():
        out = torch.empty(2, device=device)
        dist.reduce_scatter_tensor(out, value(rank, n=2 * world).to(device))
        expect(out, sum(every(n=2 * world))[2 * rank:2 * rank + 2])
        out = torch.empty(2, device=device)
        dist.reduce_scatter(out, list(value(rank, n=2 * world).to(device).chunk(world)))
        expect(out, sum(every(n=2 * world))[2 * rank:2 * rank + 2])

    def all_to_all():
        sent = value(rank, n=world).to(device)  # element j goes to rank j
        received = torch.empty(world, device=device)
        dist.all_to_all_single(received, sent)
        expect(received, torch.stack([value(r, n=world)[rank] for r in range(world)]))
        outs = [torch.empty(1, device=device) for _ in range(world)]
        dist.all_to_all(outs, list(sent.chunk(world)))
        expect(torch.cat(outs), torch.stack([value(r, n=world)[rank] for r in range(world)]))

    def send_recv():
        received = torch.empty(4, device=device)
        works = [dist.isend(value(rank).to(device), (rank + 1) % world),
                 dist.irecv(received, (rank - 1) % world)]
        for work in works:
            work.wait()
        expect(received, value((rank - 1) % world))
        if rank == 0:
            dist.send(value(rank).to(device), 1)
        elif rank == 1:
            dist.recv(received, 0)
            expect(received, value(0))

    def async_forms():
        t = value(rank).to(device)
        future = dist.all_reduce(t, async_op=True).get_future()
        result = future.wait()[0]
        assert result.device == device and result.data_ptr() == t.data_ptr()
        out = [torch.empty(4, device=device) for _ in range(world)]
        dist.all_gather(out, value(rank).to(device), async_op=True).wait()
        for t, reference in zip(out, every()):
            expect(t, reference)
        t = value(rank).to(device)
        dist.broadcast(t, src=0, async_op=True).wait()
        expect(t, value(0))
        dist.barrier(async_op=True).wait()

    def functional():  # torch.compile's collectives (and DTensor's)
        import torch.distributed._functional_collectives as funcol
        expect(funcol.all_reduce(value(rank).to(device), "sum", dist.group.WORLD), sum(every()))
        expect(funcol.all_gather_tensor(value(rank).to(device), 0, dist.group.WORLD), torch.cat(every()))

    def under_inference_mode():
        with torch.inference_mode():
            t = value(rank).to(device)
            dist.all_reduce(t)
        expect(t, sum(every()))

    def mixed_devices_refused():
        cpu_out = [torch.full((4,), -1.0) for _ in range(world)]
        try:
            dist.all_gather(cpu_out, value(rank).to(device))
        except ValueError as e:
            assert "c10d::allgather_" in str(e) and str(device) in str(e) and "cpu" in str(e), str(e)
        else:
            raise AssertionError("a collective on max_device and CPU tensors was accepted")
        assert all((t == -1).all() for t in cpu_out), "the refused collective wrote its outputs"
        t = value(rank).to(device)
        dist.all_reduce(t)  # the group still works
        expect(t, sum(every()))

    for name, fn in [("all_reduce every op", all_reduce_ops), ("zero copy", zero_copy), ("broadcast", broadcast),
                     ("all_gather", all_gather), ("reduce_scatter", reduce_scatter), ("all_to_all", all_to_all),
                     ("send/recv", send_recv), ("async", async_forms), ("functional", functional),
                     ("inference mode", under_inference_mode),
                     ("barrier", dist.barrier), ("mixed devices refused", mixed_devices_refused)]:
        record(checks, name, fn)
    return checks


def train_checks(mode):
    import train_distributed
    losses, model = train_distributed.train(mode, TRAIN_STEPS, BATCH_PER_RANK)
    # FSDP2's parameters are DTensors: their shard is the rank's.
    devices = {str(getattr(p, "_local_tensor", p).device) for p in model.parameters()}
    return {"losses": losses, "devices": sorted(devices)}


def scenario_training(rank, world, arguments):
    """The collectives under each way to name the backend, DDP and FSDP2
    training, then (if given plugin files) the plugin checks."""
    result = {"device": str(torch.device(DEVICE, torch.max_device.current_device())), "seconds": {}}
    for style in arguments["styles"]:
        started = time.monotonic()
        init_group(arguments, style)
        result[style] = collective_checks(rank, world)
        dist.destroy_process_group()
        result["seconds"][style] = time.monotonic() - started
    init_group(arguments)
    for mode in ("ddp", "fsdp"):
        started = time.monotonic()
        try:
            result[mode] = train_checks(mode)
        except Exception:  # noqa: BLE001
            result[mode] = {"error": traceback.format_exc()}
        result["seconds"][mode] = time.monotonic() - started
    if "files" in arguments:
        started = time.monotonic()
        result["plugins"] = plugin_checks(rank, arguments["files"])
        result["seconds"]["plugins"] = time.monotonic() - started
    dist.destroy_process_group()
    return result


def plugin_checks(rank, files):
    """check_consistent and reload_all: a consistent set, a rank with an
    extra plugin, a reload everywhere, and one that a rank refuses."""
    checks = {}

    def consistent():
        max_device.load_plugin(files["reference"])
        found = md.check_consistent()
        assert found == {"reference": ("1.0.0", max_device.get_plugin("reference").sha256)}, found

    def extra_plugin_named():
        if rank == 1:
            max_device.load_plugin(files["good"])
        try:
            md.check_consistent()
        except max_device.InconsistentPluginsError as e:
            assert e.ranks == [1] and list(e.differences) == ["good"], (e.ranks, e.differences)
            assert "plugin 'good'" in str(e) and "rank 1: 1.0.0" in str(e) and "rank 0: not loaded" in str(e), str(e)
        else:
            raise AssertionError("check_consistent accepted differing plugins")
        finally:
            if rank == 1:
                max_device.unload_plugin("good")
        md.check_consistent()

    def reload_everywhere():
        plugin = md.reload_all("reference", files["reference_v2"])
        assert plugin.version == "2.0.0" and plugin.generation == 2
        assert md.check_consistent()["reference"][0] == "2.0.0"

    def refused_everywhere():
        plugin = max_device.load_plugin(files["good"], name="kernels")
        before = (plugin.generation, plugin.sha256)
        # Rank 1's new build crashes as it loads: its pre-flight (a fork
        # that opens the build first) refuses it.
        path = files["abort_in_constructor"] if rank == 1 else files["good_copy"]
        try:
            md.reload_all("kernels", path, preflight=True)
        except max_device.DistributedReloadError as e:
            assert list(e.refusals) == [1] and "ValidationError" in e.refusals[1], e.refusals
            assert "rank 1 refused" in str(e) and "SIGABRT" in str(e), str(e)
        else:
            raise AssertionError("reload_all published although rank 1 refused")
        assert (plugin.generation, plugin.sha256) == before, "a rank published"
        assert torch.neg(torch.ones(2, device=DEVICE)).tolist() == [-1.0, -1.0]
        md.check_consistent()

    for name, fn in [("consistent", consistent), ("extra plugin named", extra_plugin_named),
                     ("reload everywhere", reload_everywhere), ("refused everywhere", refused_everywhere)]:
        record(checks, name, fn)
    return checks


def scenario_lost_ranks(rank, world, arguments):
    """Rank 1 dies (SIGKILL) and rank 2 hangs, each after a first collective
    with rank 0 in a group of two; rank 0 reports each in a collective on
    that group, and both in reload_all."""
    init_group(arguments)
    # The short timeout only once every rank is up (a loaded machine starts
    # processes seconds apart).
    short = timedelta(seconds=SHORT_TIMEOUT_S)
    pairs = {"dies": dist.new_group([0, 1], timeout=short), "hangs": dist.new_group([0, 2], timeout=short)}
    max_device.load_plugin(arguments["files"]["reference"])
    t = torch.ones(1 << 10, device=DEVICE)
    for how, group in pairs.items():
        if rank in (0, LOST_RANKS[how]):
            dist.all_reduce(t, group=group)
    if rank == LOST_RANKS["dies"]:
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == LOST_RANKS["hangs"]:
        time.sleep(10 * RUN_DEADLINE_S)  # until the test kills it
    result = {}
    for how, group in pairs.items():
        started = time.monotonic()
        try:
            dist.all_reduce(t, group=group)
            result[how] = "returned"
        except Exception as e:  # noqa: BLE001
            result[how] = f"{type(e).__name__}: {e}"
        result[how + " seconds"] = time.monotonic() - started
    try:
        md.reload_all("reference", arguments["files"]["reference_v2"], timeout=short)
        result["reload_all"] = "returned"
    except max_device.DistributedReloadError as e:
        result["reload_all"] = {str(r): reason for r, reason in e.refusals.items()}
    result["version"] = max_device.get_plugin("reference").version
    # No destroy_process_group: it would wait for the lost ranks.
    return result


# --- The tests ------------------------------------------------------------------

def start_ranks(world, scenario, arguments, results):
    env = dict(os.environ, WORLD_SIZE=str(world), MAX_DEVICE_COUNT=str(world), TEST_SCENARIO=scenario,
               TEST_ARGUMENTS=json.dumps(dict(arguments, results=str(results))), GLOO_SOCKET_IFNAME="lo",
               PYTHONPATH=os.pathsep.join([PYTHON_DIR, TESTS_DIR, os.path.join(REPO_ROOT, "examples")]))
    for name in ("MAX_DEVICE_FALLBACK", "MAX_DEVICE_LOG_LEVEL"):
        env.pop(name, None)
    code = "from test_distributed import rank_main; rank_main()"
    return [subprocess.Popen([sys.executable, "-c", code], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for r in range(world)]


def run_ranks(world, scenario, arguments, results, lost=()):
    """Run `scenario` on `world` ranks; returns each rank's result (None
    for a rank that wrote none). The ranks in `lost` must end by SIGKILL:
    by their own hand, or ours once the others finished (a rank that
    hangs). A run past RUN_DEADLINE_S fails the test."""
    results.mkdir(exist_ok=True)
    ranks = start_ranks(world, scenario, arguments, results)
    deadline = time.monotonic() + RUN_DEADLINE_S
    outputs = {}
    try:
        for r, process in enumerate(ranks):
            if r not in lost:
                outputs[r] = process.communicate(timeout=max(1, deadline - time.monotonic()))[0]
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
    for r, process in enumerate(ranks):
        outputs.setdefault(r, process.communicate()[0])
        expected = -signal.SIGKILL if r in lost else 0
        assert process.returncode == expected, f"rank {r} exited with {process.returncode}:\n{outputs[r][-4000:]}"
    found = []
    for r in range(world):
        path = results / f"rank{r}.json"
        found.append(json.loads(path.read_text()) if path.exists() else None)
    return found


def assert_checks_pass(per_rank, key=None):
    for rank, result in enumerate(per_rank):
        checks = result if key is None else result[key]
        failed = {name: outcome for name, outcome in checks.items() if outcome != "ok"}
        assert not failed, f"rank {rank}: " + "\n".join(f"{n}:\n{o}" for n, o in failed.items())


def built_files():
    paths = build_paths()
    if paths is None:
        pytest.skip("no build (run `make build`, or set MAXDEV_BUILD_DIR)")
    return {"reference": os.path.join(paths["plugins"], "libreference.so"),
            "reference_v2": os.path.join(paths["plugins"], "libreference_v2.so"),
            **{name: os.path.join(paths["fixtures"], f"{name}.so")
               for name in ("good", "good_copy", "abort_in_constructor")}}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """All three ways to name the backend, training, the plugin checks."""
    arguments = {"styles": INIT_STYLES, "files": built_files()}
    return 2, INIT_STYLES, run_ranks(2, "training", arguments, tmp_path_factory.mktemp("two_ranks"))


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """Gloo by name, training."""
    styles = ("gloo",)
    return 4, styles, run_ranks(4, "training", {"styles": styles}, tmp_path_factory.mktemp("four_ranks"))


@pytest.fixture(params=["two_ranks", "four_ranks"])
def training_run(request):
    return request.getfixturevalue(request.param)


def test_every_collective_runs_on_max_device_tensors(training_run):
    world, styles, per_rank = training_run
    for style in styles:
        assert_checks_pass(per_rank, style)


def test_each_rank_trains_on_its_own_device(training_run):
    world, _, per_rank = training_run
    for rank, result in enumerate(per_rank):
        assert result["device"] == f"{DEVICE}:{rank}"
        for mode in ("ddp", "fsdp"):
            assert result[mode].get("devices") == [f"{DEVICE}:{rank}"], result[mode]


@pytest.fixture(scope="module")
def one_process_losses():
    """The combined batch (BATCH_PER_RANK x world) in one process, by world size."""
    def losses(world):
        run = gpt.train(DEVICE, steps=TRAIN_STEPS, batch_size=BATCH_PER_RANK * world)
        return torch.tensor(run.losses, dtype=torch.float64)
    return losses


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_data_parallel_training_matches_one_process(training_run, one_process_losses, mode):
    world, _, per_rank = training_run
    reference = one_process_losses(world)
    for rank, result in enumerate(per_rank):
        assert "error" not in result[mode], f"rank {rank}:\n{result[mode]['error']}"
        torch.testing.assert_close(torch.tensor(result[mode]["losses"], dtype=torch.float64), reference,
                                   rtol=0, atol=LOSS_ATOL)
    assert reference[-1] < 0.95 * reference[0], f"the loss did not go down: {reference.tolist()}"


def test_torchrun_trains_with_ddp(tmp_path):
    """The README's command: torchrun --standalone, 2 ranks, DDP."""
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, MAX_DEVICE_COUNT="2", GLOO_SOCKET_IFNAME="lo")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    run = subprocess.run([*torchrun, os.path.join(REPO_ROOT, "examples", "train_distributed.py"), "--mode", "ddp",
                          "--steps", str(TRAIN_STEPS), "--batch-size", str(BATCH_PER_RANK)],
                         env=env, capture_output=True, text=True, timeout=RUN_DEADLINE_S, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    losses = [float(line.split()[-1]) for line in run.stdout.splitlines() if line.startswith("step")]
    reference = gpt.train(DEVICE, steps=TRAIN_STEPS, batch_size=BATCH_PER_RANK * 2).losses
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference), rtol=0, atol=LOSS_ATOL)


def test_plugins_are_checked_and_reloaded_on_every_rank_or_none(two_ranks):
    assert_checks_pass(two_ranks[2], "plugins")


def test_a_lost_rank_is_reported_by_the_others(tmp_path):
    world = 3
    survivor, = run_ranks(world, "lost_ranks", {"files": built_files()}, tmp_path / "results",
                          lost=set(LOST_RANKS.values()))[:1]
    for how, lost in LOST_RANKS.items():
        # Gloo's own error: "Connection closed/reset by peer" at once for a
        # rank that died, "Timed out waiting" after the group's timeout for
        # one that hangs.
        assert survivor[how].startswith(("DistBackendError", "RuntimeError")), survivor[how]
        assert ("by peer" if how == "dies" else "Timed out") in survivor[how], survivor[how]
        assert "did not answer" in survivor["reload_all"][str(lost)], survivor["reload_all"]
    assert sorted(survivor["reload_all"]) == ["1", "2"]
    assert survivor["version"] == "1.0.0"
