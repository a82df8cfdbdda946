"""Several max_device devices (MAX_DEVICE_COUNT, default 2), as OpenReg's
device tests check them: each index is a separate device for PyTorch
(guards, current device per thread, per-device memory statistics, streams
and generators, cross-device errors as on CUDA), all of them host memory."""

import concurrent.futures
import gc
import io
import threading

import pytest
import torch

import max_device
from conftest import run_python

DEVICE = "max_device"


@pytest.fixture(autouse=True)
def back_on_device_zero():
    yield
    torch.max_device.set_device(0)


def test_default_count_is_two():
    assert torch.max_device.device_count() == 2
    assert torch.accelerator.device_count() == 2


def test_set_device_and_current_device():
    torch.max_device.set_device(1)
    assert torch.max_device.current_device() == 1
    assert torch.accelerator.current_device_index() == 1
    assert torch.empty(2, device=DEVICE).device == torch.device("max_device:1")
    torch.max_device.set_device("max_device:0")
    assert torch.ones(2, device=DEVICE).device == torch.device("max_device:0")


def test_device_context_manager_and_guard():
    with torch.max_device.device(1):
        assert torch.randn(3, device=DEVICE).device.index == 1
        with torch.accelerator.device_index(0):
            assert torch.max_device.current_device() == 0
        assert torch.max_device.current_device() == 1
    assert torch.max_device.current_device() == 0


def test_current_device_is_per_thread():
    torch.max_device.set_device(1)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(torch.max_device.current_device()))
    worker.start()
    worker.join()
    assert seen == [0]


def test_tensors_move_between_devices():
    x = torch.arange(6.0).view(2, 3)
    on1 = x.to("max_device:1")
    assert on1.device.index == 1
    on0 = on1.to("max_device:0")
    assert on0.device.index == 0
    torch.testing.assert_close(on0.cpu(), x)
    y = torch.empty(2, 3, device="max_device:0")
    y.copy_(on1)  # cross-device copies are allowed, as on CUDA
    torch.testing.assert_close(y.cpu(), x)


def test_ops_stay_on_their_device():
    a = torch.randn(4, 4, device="max_device:1")
    for result in (a + a, a @ a, a.sum(), torch.relu(a), a.index_select(0, torch.tensor([0, 2], device="max_device:1")),
                   torch.cat([a, a]), a.softmax(-1)):
        assert result.device == torch.device("max_device:1")
    torch.testing.assert_close((a @ a).cpu(), a.cpu() @ a.cpu())


def test_factories_on_a_named_device():
    for t in (torch.zeros(3, device="max_device:1"), torch.full((2,), 7.0, device="max_device:1"),
              torch.arange(5, device="max_device:1"), torch.rand(3, device="max_device:1")):
        assert t.device.index == 1


def test_mixing_devices_is_an_error_as_on_cuda():
    a = torch.ones(3, device="max_device:0")
    b = torch.ones(3, device="max_device:1")
    for fn in (lambda: a + b, lambda: torch.cat([a, b]), lambda: a.index_select(0, b.long()),
               lambda: torch.where(a > 0, a, b)):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            fn()


def test_autograd_on_device_one():
    w = torch.randn(3, 3, device="max_device:1", requires_grad=True)
    (w @ w).sum().backward()
    assert w.grad.device == torch.device("max_device:1")


def test_memory_statistics_per_device():
    # Earlier tests' unreachable device tensors, freed now rather than by a
    # collection in the middle of this test (which made it fail once)
    gc.collect()
    before = [torch.max_device.memory_allocated(i) for i in range(2)]
    t = torch.empty(1 << 20, dtype=torch.uint8, device="max_device:1")
    assert torch.max_device.memory_allocated(1) == before[1] + (1 << 20)
    assert torch.max_device.memory_allocated(0) == before[0]
    assert torch.accelerator.memory_allocated(1) == before[1] + (1 << 20)
    u = t + 0  # a fallback output, adopted on device 1
    assert torch.max_device.memory_allocated(1) == before[1] + 2 * (1 << 20)
    del t, u
    assert [torch.max_device.memory_allocated(i) for i in range(2)] == before


def test_generators_per_device():
    g0, g1 = torch.max_device.default_generators
    assert g0.device == torch.device("max_device:0") and g1.device == torch.device("max_device:1")
    torch.max_device.manual_seed_all(5)
    a1 = torch.rand(4, device="max_device:1").cpu()
    g0.manual_seed(123)  # device 0's generator does not move device 1's
    g1.manual_seed(5)
    torch.testing.assert_close(torch.rand(4, device="max_device:1").cpu(), a1)
    states = torch.max_device.get_rng_state_all()
    assert len(states) == 2
    x = torch.rand(2, device="max_device:1").cpu()
    torch.max_device.set_rng_state_all(states)
    torch.testing.assert_close(torch.rand(2, device="max_device:1").cpu(), x)
    g = torch.Generator(device="max_device:1")
    assert g.device.index == 1
    g.manual_seed(9)
    first = torch.randn(3, device="max_device:1", generator=g).cpu()
    g.manual_seed(9)
    torch.testing.assert_close(torch.randn(3, device="max_device:1", generator=g).cpu(), first)


def test_streams_and_events_per_device():
    s1 = torch.Stream(device="max_device:1")
    assert s1.device_index == 1
    with s1:
        assert torch.accelerator.current_stream(1) == s1
        assert torch.accelerator.current_stream(0).stream_id == 0
    event = s1.record_event()
    assert event.device == torch.device("max_device:1")
    torch.accelerator.synchronize(1)


def test_serialization_keeps_and_maps_devices():
    x = torch.randn(3, device="max_device:1")
    buffer = io.BytesIO()
    torch.save(x, buffer)
    buffer.seek(0)
    assert torch.load(buffer).device == torch.device("max_device:1")
    buffer.seek(0)
    assert torch.load(buffer, map_location="max_device:0").device == torch.device("max_device:0")


def test_module_to_device_one():
    model = torch.nn.Linear(3, 2).to("max_device:1")
    assert all(p.device.index == 1 for p in model.parameters())
    out = model(torch.randn(4, 3, device="max_device:1"))
    out.sum().backward()
    assert model.weight.grad.device.index == 1


def run_in_parallel(code, envs):
    """`code` in one fresh interpreter per environment, all at once."""
    with concurrent.futures.ThreadPoolExecutor(len(envs)) as pool:
        return list(pool.map(lambda env: run_python(code, env=env), envs))


def test_max_device_count_environment():
    code = ("import torch, max_device\n"
            "n = torch.max_device.device_count()\n"
            "t = torch.ones(2, device=f'max_device:{n - 1}')\n"
            "print(n, torch.accelerator.device_count(), t.device)\n")
    counts = (1, 16)
    for count, result in zip(counts, run_in_parallel(code, [{"MAX_DEVICE_COUNT": str(c)} for c in counts])):
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == [str(count), str(count), f"max_device:{count - 1}"]


def test_bad_max_device_count_fails_the_import():
    values = ("0", "17", "two", "-1")
    for result in run_in_parallel("import max_device", [{"MAX_DEVICE_COUNT": v} for v in values]):
        assert result.returncode != 0
        assert "MAX_DEVICE_COUNT must be a whole number from 1 to 16" in result.stderr
