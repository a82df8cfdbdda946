"""torch.save / torch.load of max_device tensors, storages, state dicts and
backend metadata, as OpenReg's serialization tests check them."""

import io

import pytest
import torch

import max_device  # noqa: F401

DEVICE = "max_device"


def round_trip(obj, **load_kwargs):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_kwargs)


def test_device_tensor_loads_back_on_the_device():
    x = torch.randn(3, 4, device=DEVICE)
    y = round_trip(x)
    assert y.device == torch.device("max_device:0")
    torch.testing.assert_close(y.cpu(), x.cpu())


def test_views_keep_sharing_their_storage():
    base = torch.arange(12.0, device=DEVICE)
    loaded = round_trip({"base": base, "view": base[2:8].view(2, 3)})
    loaded["view"].zero_()
    assert loaded["base"][2:8].sum().item() == 0
    assert loaded["view"].device.type == DEVICE


def test_map_location_cpu_and_device():
    x = torch.randn(5, device=DEVICE)
    on_cpu = round_trip(x, map_location="cpu")
    assert on_cpu.is_cpu
    torch.testing.assert_close(on_cpu, x.cpu())
    c = torch.randn(5)
    on_device = round_trip(c, map_location=DEVICE)
    assert on_device.device.type == DEVICE
    torch.testing.assert_close(on_device.cpu(), c)


def test_checkpoint_naming_a_missing_device_is_refused():
    x = torch.randn(2, device=DEVICE)
    with pytest.raises(RuntimeError, match="device_count"):
        round_trip(x, map_location=f"max_device:{torch.max_device.device_count()}")


def test_storage_location_tag_and_restore():
    storage = torch.UntypedStorage(4, device=torch.device(DEVICE))
    assert torch.serialization.location_tag(storage) == "max_device:0"
    restored = torch.serialization.default_restore_location(torch.empty(4, 4).untyped_storage(), "max_device:0")
    assert restored.is_max_device


def test_storage_to_device_and_back():
    storage = torch.arange(6, dtype=torch.uint8).untyped_storage()
    on_device = storage.to(device=DEVICE)
    assert on_device.device.type == DEVICE
    assert on_device.cpu().tolist() == list(range(6))


def test_module_state_dict_round_trips():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).to(DEVICE)
    state = round_trip(model.state_dict())
    assert all(t.device.type == DEVICE for t in state.values())
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).to(DEVICE)
    fresh.load_state_dict(state)
    x = torch.randn(5, 4, device=DEVICE)
    torch.testing.assert_close(fresh(x).cpu(), model(x).cpu())


def test_weights_only_load():
    x = torch.randn(3, device=DEVICE)
    y = round_trip({"x": x}, weights_only=True)["x"]
    assert y.device.type == DEVICE
    torch.testing.assert_close(y.cpu(), x.cpu())


# Backend metadata (item 10): OpenReg's BackendMeta round trip.

METADATA = {"version_number": True, "format_number": False}


def test_backend_metadata_set_and_get():
    t = torch.empty(3, 3, device=DEVICE)
    assert torch._utils.get_tensor_metadata(t) == {}
    torch._utils.set_tensor_metadata(t, METADATA)
    assert torch._utils.get_tensor_metadata(t) == METADATA
    assert torch._utils.get_tensor_metadata(torch.empty(3, device=DEVICE)) == {}


def test_backend_metadata_survives_save_and_load():
    t = torch.randn(2, 2, device=DEVICE)
    torch._utils.set_tensor_metadata(t, METADATA)
    assert torch._utils.get_tensor_metadata(round_trip(t)) == METADATA
    assert torch._utils.get_tensor_metadata(round_trip(t, map_location="cpu")) == {}
