import pytest
import torch

DEVICE = "max_device"


def test_manual_seed_reproducible():
    torch.max_device.manual_seed(123)
    a = torch.randn(50, device=DEVICE)
    b = torch.rand(50, device=DEVICE)
    torch.max_device.manual_seed(123)
    torch.testing.assert_close(torch.randn(50, device=DEVICE).cpu(), a.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(torch.rand(50, device=DEVICE).cpu(), b.cpu(), rtol=0, atol=0)
    assert torch.max_device.initial_seed() == 123
    assert not torch.equal(a.cpu(), torch.randn(50, device=DEVICE).cpu())


def test_manual_seed_all_and_torch_manual_seed():
    torch.max_device.manual_seed_all(5)
    a = torch.randn(10, device=DEVICE)
    torch.manual_seed(5)
    b = torch.randn(10, device=DEVICE)
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)


def test_device_stream_matches_cpu_with_same_seed():
    # the device generator wraps a CPU engine: same seed, same numbers
    torch.max_device.manual_seed(42)
    d = torch.randn(20, device=DEVICE)
    cpu = torch.randn(20, generator=torch.Generator().manual_seed(42))
    torch.testing.assert_close(d.cpu(), cpu, rtol=0, atol=0)


def test_in_place_random_ops_use_device_seed():
    x = torch.empty(100, device=DEVICE)
    for fill in (lambda t: t.normal_(), lambda t: t.uniform_(-1, 1), lambda t: t.bernoulli_(0.3),
                 lambda t: t.random_(0, 10), lambda t: t.exponential_()):
        torch.max_device.manual_seed(9)
        first = fill(x).cpu().clone()
        torch.max_device.manual_seed(9)
        torch.testing.assert_close(fill(x).cpu(), first, rtol=0, atol=0)


def test_explicit_generator():
    g = torch.Generator(device=DEVICE)
    assert g.device == torch.device("max_device:0")
    g.manual_seed(77)
    a = torch.randn(30, generator=g, device=DEVICE)
    assert a.device.type == DEVICE
    g.manual_seed(77)
    b = torch.randn(30, generator=g, device=DEVICE)
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)
    assert g.initial_seed() == 77
    # the explicit generator is independent of the default one
    g.manual_seed(77)
    torch.max_device.manual_seed(1)
    torch.randn(30, device=DEVICE)
    c = torch.randn(30, generator=g, device=DEVICE)
    torch.testing.assert_close(c.cpu(), a.cpu(), rtol=0, atol=0)
    x = torch.empty(30, device=DEVICE)
    g.manual_seed(3)
    first = x.normal_(generator=g).cpu().clone()
    g.manual_seed(3)
    torch.testing.assert_close(x.normal_(generator=g).cpu(), first, rtol=0, atol=0)
    g.manual_seed(3)
    p = torch.randperm(20, generator=g, device=DEVICE)
    assert sorted(p.cpu().tolist()) == list(range(20))


def test_generator_state_round_trip():
    g = torch.Generator(device=DEVICE).manual_seed(10)
    torch.randn(5, generator=g, device=DEVICE)
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = torch.randn(5, generator=g, device=DEVICE)
    g.set_state(state)
    b = torch.randn(5, generator=g, device=DEVICE)
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)
    clone = g.clone_state() if hasattr(g, "clone_state") else None
    if clone is not None:
        assert clone.device == g.device


def test_rng_state_round_trip():
    torch.max_device.manual_seed(0)
    torch.randn(3, device=DEVICE)
    state = torch.max_device.get_rng_state()
    assert state.dtype == torch.uint8
    a = torch.randn(8, device=DEVICE)
    torch.max_device.set_rng_state(state)
    b = torch.randn(8, device=DEVICE)
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)


def test_fork_rng_restores_device_state():
    torch.max_device.manual_seed(4)
    with torch.random.fork_rng(device_type=DEVICE):
        torch.randn(100, device=DEVICE)
    a = torch.randn(5, device=DEVICE)
    torch.max_device.manual_seed(4)
    b = torch.randn(5, device=DEVICE)
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)


def test_default_generator_object():
    g = torch.max_device.default_generator
    assert g.device.type == DEVICE
    g.manual_seed(8)
    assert torch.max_device.initial_seed() == 8
    torch.max_device.seed()
    assert isinstance(torch.max_device.initial_seed(), int)


def test_cpu_generator_refused_for_device_op():
    with pytest.raises(RuntimeError, match="generator"):
        torch.randn(3, generator=torch.Generator(), device=DEVICE)
