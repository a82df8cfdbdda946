"""Where a backward pass on max_device runs: on the thread that calls
backward(), as the CPU's does (max_device's kernels run on the host's
cores; PyTorch's per-device autograd thread would only add a hand-off).
`import max_device` turns autograd's multithreading off on the importing
thread; PyTorch's own switch turns it back on, per thread."""

import concurrent.futures
import threading

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from conftest import run_python

DEVICE = "max_device"


class RecordThread(torch.autograd.Function):
    """Identity whose backward notes the thread that ran it."""

    threads = []

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        RecordThread.threads.append(threading.current_thread().ident)
        return grad


def backward_threads(device):
    """The threads that ran the backward nodes of a small graph on `device`,
    and the input's gradient."""
    RecordThread.threads = []
    x = torch.arange(6.0, device=device).requires_grad_()
    (RecordThread.apply(x * x).relu() @ torch.ones(6, device=device)).backward()
    return set(RecordThread.threads), x.grad.cpu()


def test_backward_runs_on_the_calling_thread_like_the_cpus():
    assert torch.autograd.is_multithreading_enabled() is False
    cpu_threads, cpu_grad = backward_threads("cpu")
    device_threads, device_grad = backward_threads(DEVICE)
    assert cpu_threads == device_threads == {threading.current_thread().ident}
    assert torch.equal(device_grad, cpu_grad)


def test_pytorchs_switch_sends_it_to_the_autograd_device_thread_again():
    with torch.autograd.set_multithreading_enabled(True):
        device_threads, device_grad = backward_threads(DEVICE)
    assert len(device_threads) == 1 and threading.current_thread().ident not in device_threads
    assert torch.autograd.is_multithreading_enabled() is False  # the context restored max_device's setting
    assert torch.equal(device_grad, backward_threads("cpu")[1])


def test_another_thread_keeps_pytorchs_default_and_computes_the_same():
    """The setting is PyTorch's and per thread: a thread that did not import
    max_device hands its backward to the device thread, with equal results."""
    def in_thread():
        return torch.autograd.is_multithreading_enabled(), threading.current_thread().ident, *backward_threads(DEVICE)

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        enabled, ident, threads, grad = pool.submit(in_thread).result()
    assert enabled is True
    assert ident not in threads
    assert torch.equal(grad, backward_threads("cpu")[1])


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpointed_backward_on_the_calling_thread_matches_the_cpu(use_reentrant):
    """A reentrant checkpoint runs a nested backward inside the outer one:
    on the calling thread as on the CPU."""
    layer_cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))
    layer_device = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8)).to(DEVICE)
    layer_device.load_state_dict(layer_cpu.state_dict())
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    for layer, inputs in ((layer_cpu, x.clone()), (layer_device, x.to(DEVICE))):
        inputs.requires_grad_()
        checkpoint(layer, inputs, use_reentrant=use_reentrant).square().sum().backward()
    for p_cpu, p_device in zip(layer_cpu.parameters(), layer_device.parameters()):
        torch.testing.assert_close(p_device.grad.cpu(), p_cpu.grad, rtol=0, atol=0)


def test_a_fresh_process_trains_on_the_importing_thread_and_exits_cleanly():
    done = run_python("""
import threading, torch, max_device
seen = []
x = torch.randn(32, 32, device="max_device", requires_grad=True)
y = (x @ x).relu()
y.register_hook(lambda g: seen.append(threading.current_thread().ident))
y.sum().backward()
assert seen == [threading.current_thread().ident], seen
print("ok")
""")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
