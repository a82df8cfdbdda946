import gc
import threading

import torch

DEVICE = "max_device"
MB = 1 << 20


def allocated():
    return torch.max_device.memory_allocated()


def test_memory_grows_and_shrinks():
    gc.collect()
    base = allocated()
    t = torch.empty(4 * MB, dtype=torch.uint8, device=DEVICE)
    assert allocated() - base == 4 * MB
    u = torch.empty(MB, dtype=torch.float32, device=DEVICE)
    assert allocated() - base == 8 * MB
    del t
    assert allocated() - base == 4 * MB
    del u
    assert allocated() == base


def test_every_allocation_is_64_byte_aligned():
    # Kernels may use aligned vector loads on a fresh tensor's first byte,
    # whatever the size (glibc's malloc alone gives 16), on any thread.
    def allocate(sizes, out):
        out += [torch.empty(n, dtype=torch.uint8, device=DEVICE) for n in sizes]

    sizes = [1, 15, 16, 17, 48, 63, 64, 65, 100, 255, 4096, 65536, 200_000, 3 * MB + 7]
    kept = []
    for _ in range(3):  # reused blocks as well as fresh ones
        allocate(sizes, kept)
        del kept[: len(sizes) // 2]
    worker = threading.Thread(target=allocate, args=(sizes, kept))
    worker.start()
    worker.join()
    assert len(kept) > len(sizes)
    for t in kept:
        assert t.data_ptr() % 64 == 0, (t.numel(), hex(t.data_ptr()))
        t.fill_(7)  # the whole block is writable
        assert int(t[-1]) == 7


def test_views_do_not_allocate():
    base_t = torch.zeros(MB, dtype=torch.uint8).to(DEVICE)
    before = allocated()
    v = base_t[10:].view(-1)[::2]
    assert allocated() == before
    del base_t
    assert allocated() == before  # the view keeps the storage alive
    del v
    assert allocated() == before - MB


def test_fallback_outputs_are_counted():
    x = torch.ones(MB // 4).to(DEVICE)  # 1 MiB of float32
    before = allocated()
    y = x + x  # structured: output allocated on the device
    z = torch.index_select(x, 0, torch.arange(MB // 4).to(DEVICE))  # adopted CPU buffer
    assert allocated() - before == 2 * MB  # 1 MiB each; the temporary index is gone
    del y, z
    # the int64 index tensor is freed with the expression
    assert allocated() == before


def test_peak_and_reset():
    torch.max_device.reset_peak_memory_stats()
    start = allocated()
    assert torch.max_device.max_memory_allocated() == start
    t = torch.empty(2 * MB, dtype=torch.uint8, device=DEVICE)
    del t
    assert torch.max_device.max_memory_allocated() >= start + 2 * MB
    assert allocated() == start
    torch.max_device.reset_peak_memory_stats()
    assert torch.max_device.max_memory_allocated() == start


def test_memory_stats_fields():
    stats = torch.max_device.memory_stats()
    assert set(stats) >= {"allocated_bytes", "peak_allocated_bytes", "allocations", "frees"}
    n = stats["allocations"]
    t = torch.empty(16, device=DEVICE)
    del t
    stats = torch.max_device.memory_stats()
    assert stats["allocations"] == n + 1
    assert stats["allocations"] - stats["frees"] >= 0
    assert torch.max_device.memory_allocated(0) == stats["allocated_bytes"]


def test_resize_accounted():
    t = torch.empty(0, device=DEVICE)
    before = allocated()
    t.resize_(MB)
    assert allocated() - before == 4 * MB
    t.untyped_storage().resize_(0)
    assert allocated() == before
