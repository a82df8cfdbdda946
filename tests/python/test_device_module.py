import pytest
import torch

import max_device


def test_backend_name_and_module():
    assert torch._C._get_privateuse1_backend_name() == "max_device"
    assert torch.max_device is not None
    assert max_device.DEVICE_NAME == "max_device"


def test_availability_and_count():
    assert torch.max_device.is_available() is True
    assert torch.max_device.device_count() == 1
    assert torch.max_device.current_device() == 0


def test_set_device_and_synchronize():
    torch.max_device.set_device(0)
    torch.max_device.set_device("max_device:0")
    torch.max_device.set_device(torch.device("max_device"))
    torch.max_device.synchronize()
    torch.max_device.synchronize("max_device:0")
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.max_device.set_device(torch.max_device.device_count())
    with pytest.raises(ValueError, match="max_device"):
        torch.max_device.set_device("cpu")


def test_torch_device_object():
    d = torch.device("max_device")
    assert d.type == "max_device"
    assert torch.device("max_device:0").index == 0
    t = torch.empty(2, device=d)
    assert t.device == torch.device("max_device:0")


def test_tensor_methods():
    t = torch.ones(3)
    assert not t.is_max_device
    d = t.max_device()
    assert d.is_max_device
    assert d.device.type == "max_device"
    torch.testing.assert_close(d.cpu(), t)


def test_module_methods():
    m = torch.nn.Linear(3, 2)
    m.max_device()
    assert all(p.device.type == "max_device" for p in m.parameters())


def test_storage_method():
    s = torch.ones(4).untyped_storage()
    ds = s.max_device()
    assert ds.device.type == "max_device"
    assert ds.is_max_device


def test_register_is_idempotent():
    from max_device._device import register_device
    register_device("max_device")
    assert torch._C._get_privateuse1_backend_name() == "max_device"


def test_register_under_other_name_refused():
    from max_device._device import register_device
    with pytest.raises(RuntimeError, match="already registered"):
        register_device("other_device")
