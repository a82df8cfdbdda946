"""Pinned host memory for max_device: tensor.pin_memory() and
DataLoader(pin_memory=True) use max_device's pinned allocator, and
is_pinned() knows its buffers (whole or sliced)."""

import torch
from torch.utils.data import DataLoader, TensorDataset

import max_device  # noqa: F401


def test_pin_memory_and_is_pinned():
    t = torch.randn(10)
    assert not t.is_pinned()
    pinned = t.pin_memory()
    assert pinned.is_pinned() and pinned.is_cpu
    torch.testing.assert_close(pinned, t)
    assert pinned[3:].is_pinned()
    assert not pinned.clone().is_pinned()


def test_rewrapped_pinned_storage_is_pinned():
    pinned = torch.randn(10).pin_memory()
    rewrapped = torch.tensor((), dtype=torch.float32).set_(pinned.untyped_storage()[8:], size=(5,), stride=(1,),
                                                          storage_offset=0)
    assert rewrapped.is_pinned()
    assert rewrapped.data_ptr() != pinned.data_ptr()


def test_pinned_factory_argument():
    assert torch.empty(4, pin_memory=True).is_pinned()


def test_freed_pinned_memory_is_forgotten():
    pinned = torch.empty(1 << 16).pin_memory()
    address = pinned.data_ptr()
    del pinned
    reused = torch.empty(1 << 16)
    if reused.data_ptr() == address:  # the C library handed the block back
        assert not reused.is_pinned()


def test_dataloader_pin_memory():
    data = TensorDataset(torch.arange(8.0).view(4, 2))
    batches = list(DataLoader(data, batch_size=2, pin_memory=True))
    assert len(batches) == 2 and all(b[0].is_pinned() for b in batches)
    assert batches[0][0].to("max_device", non_blocking=True).device.type == "max_device"
