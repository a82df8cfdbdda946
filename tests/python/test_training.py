import pytest
import torch

DEVICE = "max_device"


def make_mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                               torch.nn.Tanh(), torch.nn.Linear(16, 3))


def train(device, steps=20):
    torch.manual_seed(1234)
    model = make_mlp()
    g = torch.Generator().manual_seed(99)
    data = torch.randn(32, 8, generator=g)
    target = torch.randint(0, 3, (32,), generator=g)
    model.to(device)
    data, target = data.to(device), target.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def test_mlp_sgd_matches_cpu():
    cpu_losses, cpu_params = train("cpu")
    dev_losses, dev_params = train(DEVICE)
    assert len(dev_losses) == 20
    assert dev_losses[-1] < dev_losses[0]
    torch.testing.assert_close(torch.tensor(dev_losses), torch.tensor(cpu_losses), rtol=0, atol=1e-5)
    for d, c in zip(dev_params, cpu_params):
        torch.testing.assert_close(d, c, rtol=0, atol=1e-5)


def test_model_parameters_live_on_device():
    model = make_mlp().to(DEVICE)
    for p in model.parameters():
        assert p.device.type == DEVICE
    out = model(torch.randn(2, 8, device=DEVICE))
    assert out.device.type == DEVICE
    sd = model.state_dict()
    assert all(v.device.type == DEVICE for v in sd.values())
    cpu_model = make_mlp()
    cpu_model.load_state_dict({k: v.cpu() for k, v in sd.items()})


def test_dropout_reproducible_with_device_seed():
    x = torch.ones(1000, device=DEVICE)
    torch.max_device.manual_seed(7)
    a = torch.nn.functional.dropout(x, 0.5, training=True)
    torch.max_device.manual_seed(7)
    b = torch.nn.functional.dropout(x, 0.5, training=True)
    c = torch.nn.functional.dropout(x, 0.5, training=True)
    assert a.device.type == DEVICE
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)
    assert not torch.equal(b.cpu(), c.cpu())
    kept = (a != 0).sum().item()
    assert 350 < kept < 650
    assert set(a.unique().cpu().tolist()) <= {0.0, 2.0}


def test_dropout_reproducible_with_torch_manual_seed():
    # torch.manual_seed seeds every device's default generator, max_device included
    x = torch.ones(1000, device=DEVICE)
    torch.manual_seed(11)
    a = torch.nn.functional.dropout(x, 0.3, training=True)
    torch.manual_seed(11)
    b = torch.nn.functional.dropout(x, 0.3, training=True)
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)
    assert torch.max_device.initial_seed() == 11
