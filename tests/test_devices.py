"""Every registered model trains a step of a fitting task on every device of the `device`
fixture (cpu, meta, cuda where present): the batch, the loss and every gradient live there.

`meta` computes shapes and devices without values, so a tensor made on the default device
instead of its inputs', or a value read in a loss, fails here without a GPU.
"""

import copy
import dataclasses
import functools

import pytest
import torch

from attnzoo import runs
from attnzoo.models.registry import MODELS
from attnzoo.tasks.base import MissingDataDependency, Task
from attnzoo.tasks.registry import TASKS

# Small values for whichever of these fields a config has (field names, not models or tasks:
# a new model or task is covered without touching this file).
TINY = {
    "task": {
        "n_train": 40,
        "n_valid": 4,
        "n_test": 4,
        "max_len": 5,
        "n_test_per_length": 1,
        "test_lengths": "6",
        "context": 8,
        "n_valid_chars": 200,
        "n_test_chars": 300,
        "n_fid": 4,
    },
    "model": {
        "hidden": 8,
        "embed_dim": 8,
        "attn_hidden": 8,
        "d_model": 16,
        "heads": 2,
        "d_ff": 32,
        "layers_enc": 1,
        "layers_dec": 1,
        "controller_size": 8,
        "memory_rows": 8,
        "memory_cols": 4,
        "layers": 1,
        "z_dim": 8,
        "channels": {int: 8, tuple: "[4,4,4,4]"},  # by the field's type: a width or a stack
    },
    "eval": {"limit": 2, "batch_size": 4},
    "train": {"threads": 1},
}


def tiny_config(model: str, task: str) -> dict:
    config = runs.default_config(model, task)
    unread = runs.unread_keys(model, task)
    sets = [
        f"{section}.{name}={value}"
        for section, values in TINY.items()
        for name, value in values.items()
        if config[section].get(name, None) is not None  # None: a field this model does not read
        and f"{section}.{name}" not in unread  # nor the task
        for value in [value[type(config[section][name])] if isinstance(value, dict) else value]
    ]
    return runs.apply_overrides(config, sets)


@functools.cache
def built(model: str):
    """(task, model on the CPU, names of the parameters a CPU step gives a gradient) for the
    first task in TASKS that fits `model` and whose data packages are installed."""
    for name, spec in TASKS.items():
        if spec.interface != MODELS[model].interface:
            continue
        try:
            task, net = runs.build(tiny_config(model, name))
        except MissingDataDependency:
            continue
        reference = copy.deepcopy(net).train()
        loss, _ = task.loss(reference, task.batch(0, 2, "cpu"))
        loss.backward()
        graded = {n for n, p in reference.named_parameters() if p.grad is not None}
        return task, net, graded
    pytest.skip(f"no task for {model} has its data packages installed")


def on(tensor: torch.Tensor, device: torch.device) -> bool:
    return tensor.device.type == device.type and device.index in (None, tensor.device.index)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_training_step_runs_on_the_device(name, device):
    task, cpu_model, graded = built(name)
    assert isinstance(task, Task)
    model = copy.deepcopy(cpu_model).to(device).train()
    batch = task.batch(0, 2, device)
    loss, count = task.loss(model, batch)
    assert on(loss, device) and loss.dim() == 0
    assert isinstance(count, int) and count > 0
    loss.backward()
    assert graded, "the CPU step gave no parameter a gradient"
    for param_name, param in model.named_parameters():
        assert on(param, device), param_name
        if param_name in graded:
            assert param.grad is not None, param_name
            assert on(param.grad, device), param_name


@pytest.mark.parametrize("name", list(MODELS))
def test_a_training_step_runs_under_bf16_autocast(name):
    """`train.autocast=bf16` is offered for every model: Bahdanau, Luong's local attention and
    the LSTMN failed at their first step (attention() refused a bfloat16 query beside float32
    keys). Every model's CPU step gives a finite loss and gradients under it, the loss in
    float32 as the loop's autocast promises (the bandits' and hard Show-Attend-Tell's were
    bfloat16: their REINFORCE returns and advantages too)."""
    task, cpu_model, graded = built(name)
    model = copy.deepcopy(cpu_model).train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = task.loss(model, task.batch(0, 2, "cpu"))
    assert torch.isfinite(loss) and loss.dtype == torch.float32
    loss.backward()
    for param_name, param in model.named_parameters():
        if param_name in graded:
            assert param.grad is not None and torch.isfinite(param.grad).all(), param_name


def _double(batch):
    """`batch` with its floating tensors in float64 (a tensor, a NamedTuple or a dataclass)."""
    if isinstance(batch, torch.Tensor):
        return batch.double() if batch.is_floating_point() else batch
    if dataclasses.is_dataclass(batch):
        fields = {f.name: _double(getattr(batch, f.name)) for f in dataclasses.fields(batch)}
        return dataclasses.replace(batch, **fields)
    if isinstance(batch, tuple):
        parts = [_double(part) for part in batch]
        return type(batch)(*parts) if hasattr(batch, "_fields") else tuple(parts)
    return batch


@pytest.mark.parametrize("name", list(MODELS))
def test_a_float64_model_trains_in_float64(name):
    """A model made float64 computes its task's loss and gradients in float64: the translation,
    language-model and bit tasks cast the logits with `.float()` (a float64 model trained on a
    float32 loss), and the GAN task drew float32 latents, which a float64 generator refuses."""
    task, cpu_model, graded = built(name)
    model = copy.deepcopy(cpu_model).double().train()
    loss, _ = task.loss(model, _double(task.batch(0, 2, "cpu")))
    assert loss.dtype == torch.float64
    loss.backward()
    for param_name, param in model.named_parameters():
        if param_name in graded:
            assert param.grad.dtype == torch.float64, param_name


def test_a_sampled_pointer_step_runs_on_the_device(device):
    """TSP's `task.objective=reinforce` samples tours through the decoding engine, which
    stopped on values (has every row ended?): the step failed on meta."""
    config = runs.apply_overrides(tiny_config("pointer-net", "tsp"), ["task.objective=reinforce"])
    task, net = runs.build(config)
    model = net.to(device).train()
    loss, _ = task.loss(model, task.batch(0, 2, device))
    assert on(loss, device) and loss.dim() == 0
    loss.backward()
    assert all(on(p.grad, device) for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", list(MODELS))
def test_evaluation_runs_on_the_models_device(name, device, request):
    if device.type == "meta":
        pytest.skip("evaluation decodes: it reads values")
    task, cpu_model, _ = built(name)
    if getattr(getattr(task, "config", None), "classifier", None) is not None:
        # a task whose metrics need a trained classifier's run (the GAN task's)
        config = dataclasses.replace(
            task.config, classifier=request.getfixturevalue("mnist_classifier")
        )
        task = type(task)(config, seed=task.seed, eval_config=task.eval_config)
        runs.attach_runs(task)
    model = copy.deepcopy(cpu_model).to(device).eval()
    with torch.no_grad():
        metrics = task.evaluate(model)
    assert metrics


def test_tiny_configs_shrink_every_registered_pair():
    """The overrides above reach every model and task config (a config with none of these
    fields would make the device tests slow, not wrong)."""
    for model, mspec in MODELS.items():
        fitting = [t for t, s in TASKS.items() if s.interface == mspec.interface]
        config = tiny_config(model, fitting[0])
        default = dataclasses.asdict(mspec.preset())
        assert config["model"] != default, model


def test_constants_of_a_float64_model_are_exact_in_float64():
    """Buffers that hold a constant were converted by `.double()` from their float32 rounding:
    the NTM's constant initial memory (1e-6 as 9.99999997e-07) and RAM's fixed policy std
    (log 0.1 off by ~1e-9). They are made again in the new dtype."""
    import math

    from attnzoo.core.hard import GaussianPolicy
    from attnzoo.models.ntm.ntm import CONSTANT_MEMORY, NTM, NTMConfig

    ntm = NTM(NTMConfig(controller_size=8, memory_rows=4, memory_cols=3), 5, 4).double()
    assert torch.equal(ntm.initial_memory, torch.full((4, 3), CONSTANT_MEMORY, dtype=torch.float64))
    policy = GaussianPolicy(3, std=0.1).float().double()
    assert torch.equal(policy.log_std, torch.full((2,), math.log(0.1), dtype=torch.float64))
    learned = GaussianPolicy(3, std=0.1, learn_std=True).double()  # a parameter: converted
    assert learned.log_std.dtype == torch.float64 and isinstance(
        learned.log_std, torch.nn.Parameter
    )
