"""torch.accelerator on max_device: the device, its memory statistics
(the allocator is a c10::DeviceAllocator) and capabilities, as OpenReg's
memory and device tests check them."""

import torch

import max_device  # noqa: F401

DEVICE = "max_device"
NBYTES = 1 << 20


def test_current_accelerator_is_max_device():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device(DEVICE)
    assert torch.accelerator.device_count() == torch.max_device.device_count()
    assert torch.accelerator.current_device_index() == 0
    with torch.accelerator.device_index(0):
        assert torch.accelerator.current_device_index() == 0


def test_memory_allocated_follows_tensors():
    before = torch.accelerator.memory_allocated()
    t = torch.empty(NBYTES, dtype=torch.uint8, device=DEVICE)
    assert torch.accelerator.memory_allocated() == before + NBYTES
    assert torch.max_device.memory_allocated() == before + NBYTES
    del t
    assert torch.accelerator.memory_allocated() == before


def test_peak_and_its_reset():
    torch.accelerator.reset_peak_memory_stats()
    base = torch.accelerator.memory_allocated()
    t = torch.empty(NBYTES, dtype=torch.uint8, device=DEVICE)
    del t
    assert torch.accelerator.max_memory_allocated() >= base + NBYTES
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.accelerator.memory_allocated()


def test_memory_stats_counts_allocations():
    torch.accelerator.reset_accumulated_memory_stats()
    tensors = [torch.empty(64, device=DEVICE) for _ in range(3)]
    stats = torch.accelerator.memory_stats()
    assert stats["allocation.all.allocated"] >= 3
    assert stats["allocated_bytes.all.allocated"] >= 3 * 64 * 4
    del tensors
    stats = torch.accelerator.memory_stats()
    assert stats["allocation.all.freed"] >= 3
    torch.accelerator.reset_accumulated_memory_stats()
    assert torch.accelerator.memory_stats()["allocation.all.allocated"] == 0


def test_nothing_is_cached():
    # Documented difference from CUDA: no caching allocator, so reserved
    # equals allocated and empty_cache() has nothing to return.
    t = torch.empty(NBYTES, dtype=torch.uint8, device=DEVICE)
    assert torch.accelerator.memory_reserved() == torch.accelerator.memory_allocated()
    del t
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_reserved() == torch.accelerator.memory_allocated()


def test_memory_info_is_host_ram():
    free, total = torch.accelerator.get_memory_info()
    assert 0 < free <= total
    with open("/proc/meminfo") as f:
        total_kb = int(f.readline().split()[1])
    assert total == total_kb * 1024


def test_device_capability_lists_dtypes():
    supported = torch.accelerator.get_device_capability()["supported_dtypes"]
    assert {torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool} <= supported
    assert torch.quint8 not in supported


def test_synchronize():
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(0)
