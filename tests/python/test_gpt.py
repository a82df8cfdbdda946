"""The small GPT of examples/gpt.py trained on max_device matches the same
run on the CPU: with the CPU fallback only, and with the reference plugin
serving its kernels.

Tolerances. With the fallback only, max_device runs the CPU's own kernels
on the same bytes: the run is bit for bit the CPU's. With the plugin,
everything is float32 and the plugin does not sum in the CPU's order (its
mm/bmm/addmm/softmax/sum accumulate in double). Gradients therefore differ by float32 rounding (~1e-7 relative). AdamW
divides each gradient by its own running magnitude, so a rounding
difference in a gradient component close to zero can change that
component's update by a fair part of the learning rate; after TRAIN_STEPS
steps we allow 5% of one step's largest move (observed: ~5e-5). Losses are
~4 and differ by ~1e-6.
"""

import os
import sys

import pytest
import torch

import max_device
from conftest import REPO_ROOT, op_stats

sys.path.insert(0, os.path.join(REPO_ROOT, "examples"))
import gpt  # noqa: E402

DEVICE = "max_device"
TRAIN_STEPS = 8
SEED = 0
LOSS_ATOL = 1e-5
PARAM_ATOL = 0.05 * gpt.LEARNING_RATE

# Ops of the training step that the reference plugin serves: forward
# (linear layers, attention, GELU, softmax, cross entropy, residuals) and
# backward. (AdamW, fused=True, is one _fused_adamw_ call per step, which
# the reference plugin leaves to the CPU.)
PLUGIN_OPS_OF_THE_STEP = (
    "aten::mm.out", "aten::addmm.out", "aten::bmm.out", "aten::gelu.out", "aten::_softmax.out",
    "aten::_softmax_backward_data.out", "aten::_log_softmax.out",
    "aten::_log_softmax_backward_data.out", "aten::add.out", "aten::mul.out",
    "aten::sum.IntList_out",
)


@pytest.fixture(scope="module")
def cpu_run():
    return gpt.train("cpu", steps=TRAIN_STEPS, seed=SEED)


def assert_matches_cpu(run, cpu_run, loss_atol=LOSS_ATOL, param_atol=PARAM_ATOL):
    assert len(run.losses) == TRAIN_STEPS
    torch.testing.assert_close(torch.tensor(run.losses), torch.tensor(cpu_run.losses),
                               rtol=0, atol=loss_atol)
    # a dict comparison also checks the names: the head stayed tied to the embedding
    torch.testing.assert_close(run.parameters, cpu_run.parameters, rtol=0, atol=param_atol)
    assert run.losses[-1] < 0.95 * run.losses[0], f"the loss did not go down: {run.losses}"


def train_with_plugin_and_check(plugin, ops, cpu_run, load_plugin, plugin_file):
    """Trains with `plugin` loaded: matches the CPU, and every call of `ops` reached the plugin."""
    load_plugin(plugin_file(plugin))
    run = gpt.train(DEVICE, steps=TRAIN_STEPS, seed=SEED)
    assert_matches_cpu(run, cpu_run)
    for op in ops:
        calls, declines, fallbacks = op_stats(op)
        assert calls > 0, f"{op} never reached the {plugin} plugin"
        assert (declines, fallbacks) == (0, 0), f"{op}: {declines} declines, {fallbacks} fallbacks"


def test_training_with_reference_plugin_matches_cpu(cpu_run, load_plugin, plugin_file):
    train_with_plugin_and_check("reference", PLUGIN_OPS_OF_THE_STEP, cpu_run, load_plugin, plugin_file)


# With the fast plugin: layer norm, embedding and AdamW too. (It leaves
# GEMMs as small as this model's to the CPU, so those are not listed.)
GEMM_OPS = ("aten::mm.out", "aten::addmm.out", "aten::bmm.out")
FAST_PLUGIN_OPS_OF_THE_STEP = tuple(op for op in PLUGIN_OPS_OF_THE_STEP if op not in GEMM_OPS) + (
    "aten::gelu_backward.grad_input", "aten::native_layer_norm", "aten::native_layer_norm_backward",
    "aten::embedding", "aten::embedding_dense_backward", "aten::_fused_adamw_",
)


def test_training_with_fast_plugin_matches_cpu(cpu_run, load_plugin, plugin_file):
    train_with_plugin_and_check("fast", FAST_PLUGIN_OPS_OF_THE_STEP, cpu_run, load_plugin, plugin_file)


def test_training_on_fallback_only_matches_cpu(cpu_run):
    run = gpt.train(DEVICE, steps=TRAIN_STEPS, seed=SEED)
    assert_matches_cpu(run, cpu_run, loss_atol=0, param_atol=0)
    counts = max_device.fallback_counts()
    missing = [op for op in PLUGIN_OPS_OF_THE_STEP if not counts.get(op)]
    assert not missing, f"ops of the step that did not run on the fallback: {missing}"


def test_model_built_on_device_has_the_cpu_weights():
    on_device = gpt.make_model(gpt.GPTConfig(), SEED, DEVICE)
    on_cpu = gpt.make_model(gpt.GPTConfig(), SEED)
    assert on_device.head.weight is on_device.token_embedding.weight
    assert all(p.device.type == DEVICE for p in on_device.parameters())
    torch.testing.assert_close({k: v.cpu() for k, v in on_device.state_dict().items()},
                               on_cpu.state_dict(), rtol=0, atol=0)


def test_checkpointed_training_matches_cpu(cpu_run):
    # Activation checkpointing recomputes each block in backward: the same
    # CPU kernels on the same bytes, so the run is still the CPU's bit for bit.
    run = gpt.train(DEVICE, steps=TRAIN_STEPS, seed=SEED, checkpoint_blocks=True)
    assert_matches_cpu(run, cpu_run, loss_atol=0, param_atol=0)


def test_autocast_training_follows_the_float32_run(cpu_run):
    # bfloat16 matmuls (8-bit mantissa): losses stay within bfloat16 rounding
    # of the float32 run and go down; the weights stay float32.
    run = gpt.train(DEVICE, steps=TRAIN_STEPS, seed=SEED, autocast_dtype=torch.bfloat16)
    torch.testing.assert_close(torch.tensor(run.losses), torch.tensor(cpu_run.losses), rtol=0, atol=0.05)
    assert run.losses != cpu_run.losses, "autocast changed nothing: the matmuls did not run in bfloat16"
    assert run.losses[-1] < 0.95 * run.losses[0]
    assert all(p.dtype == torch.float32 for p in run.parameters.values())
