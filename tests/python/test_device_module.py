import pytest
import torch

import max_device


def test_backend_name_and_module():
    assert torch._C._get_privateuse1_backend_name() == "max_device"
    assert torch.max_device is not None
    assert max_device.DEVICE_NAME == "max_device"


def test_availability_and_count():
    assert torch.max_device.is_available() is True
    assert torch.max_device.device_count() == 2  # MAX_DEVICE_COUNT's default, as OpenReg's
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


# What PyTorch's generic code asks of a device module (item 2 of issue 12).

def test_initialization_functions():
    assert torch.max_device.is_initialized() is True
    torch.max_device.init()
    assert torch.max_device._initialized is True


def test_device_context_manager():
    with torch.max_device.device(0):
        assert torch.max_device.current_device() == 0
    with torch.max_device.device("max_device:0"):
        t = torch.empty(1, device="max_device")
    assert t.device == torch.device("max_device:0")
    with torch.max_device.device(None):
        pass
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.max_device.device(torch.max_device.device_count())


def test_seed_functions_follow_each_other():
    torch.max_device.manual_seed_all(7)
    assert torch.max_device.initial_seed() == 7
    first = torch.rand(4, device="max_device").cpu()
    torch.max_device.manual_seed(7)
    torch.testing.assert_close(torch.rand(4, device="max_device").cpu(), first)
    torch.max_device.seed_all()
    reseeded = torch.max_device.initial_seed()
    torch.max_device.seed()
    assert len({7, reseeded, torch.max_device.initial_seed()}) == 3  # fresh, non-deterministic seeds


def test_rng_state_all_round_trip():
    states = torch.max_device.get_rng_state_all()
    assert len(states) == torch.max_device.device_count()
    a = torch.rand(3, device="max_device").cpu()
    torch.max_device.set_rng_state_all(states)
    torch.testing.assert_close(torch.rand(3, device="max_device").cpu(), a)
    with pytest.raises(ValueError, match="one per device"):
        torch.max_device.set_rng_state_all(states + states)


def test_rng_offsets_are_the_cpu_engines():
    # Documented difference from CUDA: random ops run the CPU kernels, whose
    # mt19937 engine has a state but no Philox offset.
    with pytest.raises(RuntimeError, match="does not use offset"):
        torch.max_device.default_generator.get_offset()


def test_fork_rng_restores_device_state():
    torch.max_device.manual_seed(3)
    with torch.random.fork_rng(device_type="max_device"):
        torch.rand(5, device="max_device")
    after = torch.rand(2, device="max_device").cpu()
    torch.max_device.manual_seed(3)
    torch.testing.assert_close(torch.rand(2, device="max_device").cpu(), after)


def test_fake_tensor_mode_creates_max_device_tensors():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(3, device="max_device")
        result = fake @ torch.empty(3, 2, device="max_device")
    assert isinstance(fake, FakeTensor)
    assert fake.device == torch.device("max_device:0")
    assert result.shape == (2,) and result.device.type == "max_device"


def test_meta_tensors_convert_to_the_device():
    m = torch.empty(2, 3, device="meta")
    t = torch.empty_like(m, device="max_device")
    assert t.device.type == "max_device" and t.shape == (2, 3)


def test_amp_and_capability_functions():
    assert torch.max_device.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    assert torch.max_device.is_bf16_supported()
    supported = torch.max_device.get_device_capability()["supported_dtypes"]
    assert torch.float32 in supported and torch.bfloat16 in supported
    # The dtypes max_device refuses are not claimed
    assert torch.qint8 not in supported and torch.complex32 not in supported
    assert torch.max_device.get_device_properties().total_memory > 0
