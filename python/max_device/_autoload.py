"""The ``torch.backends`` entry point of the installed package (PyTorch's
device backend autoload): ``import torch`` imports max_device, which
registers the device; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns it off.

A module of its own, not a function of ``max_device/__init__.py``: when
``import max_device`` comes first, its ``import torch`` runs the autoload
while max_device is still half-initialized and has no attributes yet; this
submodule can still be imported then."""


def load() -> None:
    """Importing this module imported max_device; nothing more to do."""
