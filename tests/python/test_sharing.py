"""Passing max_device tensors between processes (issue 12 item 14, issue 10
item 6): share_memory_(), torch.multiprocessing queues and DataLoader
workers. A shared max_device storage lives in POSIX shared memory, as a CPU
storage does, so the receiving process maps the same bytes. Every
cross-process step runs with a timeout: a hang fails the test."""

import textwrap

import pytest
import torch
import torch.multiprocessing as mp

import max_device
from conftest import run_python

DEVICE = "max_device"
TIMEOUT_S = 60


def test_share_memory_moves_the_storage_to_shared_memory():
    base = torch.arange(8.0, device=DEVICE)
    view = base[2:6]
    assert not base.is_shared()
    assert view.share_memory_() is view
    assert base.is_shared() and view.is_shared()
    assert base.device.type == DEVICE
    torch.testing.assert_close(base.cpu(), torch.arange(8.0))
    view.fill_(-1)  # views still read and write the one (now shared) buffer
    assert base.cpu().tolist() == [0, 1, -1, -1, -1, -1, 6, 7]
    before = base.data_ptr()
    base.share_memory_()  # already shared: nothing moves
    assert base.data_ptr() == before


def test_shared_storage_cannot_grow():
    # As for a CPU storage in shared memory: other processes map this buffer.
    t = torch.zeros(4, device=DEVICE).share_memory_()
    with pytest.raises(RuntimeError, match="not resizable"):
        t.resize_(1024)
    assert t.is_shared() and t.shape == (4,)


def test_share_memory_keeps_memory_accounting():
    before = torch.max_device.memory_allocated()
    t = torch.empty(1 << 16, dtype=torch.uint8, device=DEVICE)
    t.share_memory_()
    assert torch.max_device.memory_allocated() == before + (1 << 16)
    del t
    assert torch.max_device.memory_allocated() == before


def _child_fills(queue, done, received):
    t = queue.get(timeout=TIMEOUT_S)
    t.add_(1)  # in place, in the child: the parent must see it
    child_made = torch.full((3,), 7.0, device=DEVICE)
    done.put((t.device.type, child_made))
    # As with CPU tensors, the sender stays alive until the receiver has
    # mapped the memory (its file descriptor is handed over by this process).
    received.get(timeout=TIMEOUT_S)


def test_queue_passes_tensors_both_ways_without_copies():
    ctx = mp.get_context("fork")
    queue, done, received = ctx.Queue(), ctx.Queue(), ctx.Queue()
    shared = torch.zeros(4, device=DEVICE)
    child = ctx.Process(target=_child_fills, args=(queue, done, received))
    child.start()
    try:
        queue.put(shared)
        device_type, from_child = done.get(timeout=TIMEOUT_S)
        received.put(True)
    finally:
        child.join(TIMEOUT_S)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert device_type == DEVICE
    assert shared.cpu().tolist() == [1, 1, 1, 1]
    assert from_child.device.type == DEVICE and from_child.cpu().tolist() == [7, 7, 7]


def test_parameters_keep_their_type():
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    p = torch.nn.Parameter(torch.ones(2, device=DEVICE))
    queue.put(p)
    received = queue.get(timeout=TIMEOUT_S)
    assert isinstance(received, torch.nn.Parameter) and received.requires_grad
    assert received.device.type == DEVICE


def test_storages_pass_through_queues():
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    storage = torch.arange(4, dtype=torch.uint8, device="max_device:1").untyped_storage()
    queue.put(storage)
    received = queue.get(timeout=TIMEOUT_S)
    assert received.device == torch.device("max_device:1")
    assert received.data_ptr() == storage.data_ptr()  # the same shared-memory buffer
    assert received.cpu().tolist() == [0, 1, 2, 3]


def test_dataloader_workers_return_device_tensors():
    # Was: the workers' feeder threads failed in _share_fd_ and the main
    # process waited forever. A fresh interpreter, so a hang is a timeout.
    code = textwrap.dedent("""
        import torch, max_device
        from torch.utils.data import DataLoader, Dataset

        class OnDevice(Dataset):
            def __len__(self):
                return 8
            def __getitem__(self, i):
                return torch.full((2,), float(i), device="max_device")

        batches = list(DataLoader(OnDevice(), batch_size=4, num_workers=2, timeout=30))
        assert [b.device.type for b in batches] == ["max_device"] * 2
        print(torch.cat(batches).cpu()[:, 0].tolist())
    """)
    result = run_python(code, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str([float(i) for i in range(8)])
