"""The PyTorch profiler on max_device, as OpenReg's profiler tests use it:
torch.autograd.profiler.profile(use_device="max_device") times every op on
the device through max_device's profiler hooks (host steady clock: kernels
are synchronous), and torch.profiler with the PrivateUse1 activity works."""

import json

import torch
from torch.profiler import ProfilerActivity, profile

import max_device  # noqa: F401

DEVICE = "max_device"


def workload():
    x = torch.randn(64, 64, device=DEVICE, requires_grad=True)
    (x @ x).relu().sum().backward()
    return x


def test_use_device_records_device_time(capfd):
    workload()
    with torch.autograd.profiler.profile(use_device=DEVICE) as prof:
        workload()
    # Was: every op callback threw "PrivateUse1 used in profiler but not enabled"
    assert "not enabled" not in capfd.readouterr().err
    events = {e.key: e for e in prof.key_averages()}
    mm = events["aten::mm"]
    assert mm.count >= 3  # forward and two in backward
    assert mm.cpu_time_total > 0 and mm.device_time_total > 0
    for e in prof.key_averages():
        assert e.cpu_time_total >= 0 and e.device_time_total >= 0, e.key
    assert "MAX_DEVICE" in prof.key_averages().table(sort_by="device_time_total", row_limit=5)


def test_kineto_profiler_with_privateuse1_activity(tmp_path):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        workload()
    names = {e.key for e in prof.key_averages()}
    assert {"aten::mm", "aten::relu"} <= names
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    assert any(e.get("name") == "aten::mm" for e in json.loads(trace.read_text())["traceEvents"])
