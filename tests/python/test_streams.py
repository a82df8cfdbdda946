"""Streams and events on max_device, as OpenReg's stream and event tests
check them. Work is synchronous on host memory: every stream is idle and
every recorded event complete, but ids, priorities, the current stream and
event timings are real (host steady clock)."""

import time

import pytest
import torch

import max_device  # noqa: F401

DEVICE = "max_device"


def test_stream_create_and_identity():
    s = torch.Stream(device=DEVICE)
    assert s.device == torch.device("max_device:0") and s.device_index == 0
    again = torch.Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)
    assert again == s
    other = torch.Stream(device=DEVICE)
    assert other.stream_id != s.stream_id
    assert "device_type=max_device, device_index=0" in repr(s)


def test_default_and_current_stream():
    default = torch.max_device.default_stream()
    assert default.stream_id == 0
    assert torch.accelerator.current_stream() == default
    assert torch.max_device.current_stream() == default


def test_stream_context_and_set_stream():
    s1, s2 = torch.Stream(device=DEVICE), torch.Stream(device=DEVICE)
    with s1:
        assert torch.accelerator.current_stream() == s1
        with torch.max_device.stream(s2):
            assert torch.max_device.current_stream() == s2
        assert torch.accelerator.current_stream() == s1
    assert torch.accelerator.current_stream().stream_id == 0
    torch.accelerator.set_stream(s2)
    try:
        assert torch.accelerator.current_stream() == s2
        assert torch.max_device.get_raw_stream(0) == s2.stream_id
    finally:
        torch.accelerator.set_stream(torch.max_device.default_stream())


def test_current_stream_is_per_thread():
    import threading

    seen = []
    s = torch.Stream(device=DEVICE)
    with s:
        worker = threading.Thread(target=lambda: seen.append(torch.accelerator.current_stream().stream_id))
        worker.start()
        worker.join()
    assert seen == [0]


def test_priorities_are_encoded_in_the_stream():
    lowest, highest = torch.max_device.Stream.priority_range()
    assert (lowest, highest) == (0, -1)
    assert torch.max_device.Stream(priority=-1).priority == -1
    assert torch.max_device.Stream().priority == 0
    # Out of range clamps, as on CUDA
    assert torch.max_device.Stream(priority=-10).priority == -1
    assert torch.max_device.Stream(priority=5).priority == 0
    high = torch.Stream(device=DEVICE, priority=-1)
    assert torch.max_device.Stream(stream_id=high.stream_id, device_index=0,
                                   device_type=high.device_type).priority == -1


def test_stream_query_synchronize_wait():
    s1, s2 = torch.Stream(device=DEVICE), torch.Stream(device=DEVICE)
    assert s1.query()
    s2.wait_stream(s1)
    event = s1.record_event()
    s2.wait_event(event)
    s2.synchronize()
    assert event.query() and s2.query()


def test_event_ids():
    event = torch.Event(device=DEVICE)
    assert event.event_id == 0 and event.query()
    s = torch.Stream(device=DEVICE)
    e1, e2 = s.record_event(), s.record_event()
    assert e1.event_id != 0 and e2.event_id != 0 and e1.event_id != e2.event_id
    assert e1.device == torch.device("max_device:0")


def test_elapsed_time_is_host_time():
    s = torch.Stream(device=DEVICE)
    start = torch.Event(device=DEVICE, enable_timing=True)
    end = torch.max_device.Event(enable_timing=True)
    start.record(s)
    before = time.monotonic()
    time.sleep(0.02)
    slept_ms = (time.monotonic() - before) * 1000
    end.record(s)
    end.synchronize()
    # At least the sleep: the events are stamped around it on the same clock.
    assert start.elapsed_time(end) >= slept_ms * 0.999
    assert end.elapsed_time(start) < 0


def test_elapsed_time_needs_timing_events():
    s = torch.Stream(device=DEVICE)
    e1, e2 = torch.Event(device=DEVICE), torch.Event(device=DEVICE)
    e1.record(s)
    e2.record(s)
    with pytest.raises(ValueError, match="enable_timing=True"):
        e1.elapsed_time(e2)


def test_event_recorded_on_the_current_stream_and_reused():
    event = torch.Event(device=DEVICE, enable_timing=True)
    event.record()
    first = torch.Event(device=DEVICE, enable_timing=True)
    first.record()
    event.record()  # re-record: a new timestamp
    assert first.elapsed_time(event) >= 0


def test_work_inside_a_stream_context():
    x = torch.randn(30, 30, device=DEVICE)
    with torch.Stream(device=DEVICE):
        z = x @ x
    torch.accelerator.synchronize()
    torch.testing.assert_close(z.cpu(), x.cpu() @ x.cpu())


def test_functions_the_dynamo_device_interface_wraps():
    # torch._dynamo.device_interface.DeviceInterface is built on these (as
    # CudaInterface is on torch.cuda's); torch.compile support comes next.
    from torch._dynamo.device_interface import DeviceInterface

    module = torch.max_device
    for name in ("current_device", "set_device", "device_count", "is_available", "stream", "current_stream",
                 "set_stream", "_set_stream_by_id", "get_raw_stream", "synchronize", "get_device_properties",
                 "is_bf16_supported", "memory_allocated"):
        assert hasattr(DeviceInterface, name) and callable(getattr(module, name)), name
    assert module._exchange_device(0) == 0 and module._maybe_exchange_device(0) == 0
    for cls in ("device", "Event", "Stream"):
        assert hasattr(DeviceInterface, cls) and isinstance(getattr(module, cls), type), cls
    s = torch.max_device.Stream()
    torch.max_device._set_stream_by_id(s.stream_id, s.device_index, s.device_type)
    try:
        assert torch.max_device.get_raw_stream(0) == s.stream_id
    finally:
        torch.max_device.set_stream(torch.max_device.default_stream())
