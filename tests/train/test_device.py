import pytest
import torch

from attnzoo.train.checkpoint import load_checkpoint, load_weights, save_checkpoint
from attnzoo.train.device import check_device, resolve_device
from attnzoo.train.loop import TrainConfig

CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("spec", ["auto", "cpu", "cuda", "cuda:0", "cuda:12", "mps"])
def test_valid_spellings(spec):
    check_device(spec)
    assert TrainConfig(device=spec).device == spec


@pytest.mark.parametrize("spec", ["gpu", "cuda:", "cuda:x", "CPU", "cpu:0", "", "meta"])
def test_bad_spellings_name_the_key(spec):
    with pytest.raises(ValueError, match=r"'device'.*'auto', 'cpu', 'cuda', 'cuda:N', 'mps'"):
        TrainConfig(device=spec)


def test_auto_is_cuda_where_there_is_one_else_cpu():
    assert resolve_device("auto").type == ("cuda" if CUDA else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(CUDA, reason="this machine has CUDA")
@pytest.mark.parametrize("spec", ["cuda", "cuda:0"])
def test_missing_cuda_is_an_error_naming_the_key(spec):
    with pytest.raises(ValueError, match="'device'.*no CUDA"):
        resolve_device(spec)


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has MPS")
def test_missing_mps_is_an_error():
    with pytest.raises(ValueError, match="'device'.*'mps'"):
        resolve_device("mps")


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_torchrun_gives_each_process_the_gpu_of_its_local_rank(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("auto") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="one GPU per process"):
        resolve_device("cuda:0")


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_a_gpu_index_beyond_the_machine_is_an_error():
    with pytest.raises(ValueError, match="GPU index below"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


def _saved(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return model, save_checkpoint(tmp_path, 0, model, opt, sched)


def test_weights_load_onto_map_location(tmp_path, device):
    model, folder = _saved(tmp_path)
    weights = load_weights(folder, device)
    assert weights.keys() == model.state_dict().keys()
    assert all(w.device.type == device.type for w in weights.values())
    if device.type != "meta":
        assert torch.equal(weights["weight"].cpu(), model.weight.detach())


def test_a_checkpoint_resumes_on_the_models_device(tmp_path, device):
    if device.type == "meta":
        pytest.skip("loading copies values")
    model, folder = _saved(tmp_path)
    other = torch.nn.Linear(3, 2).to(device)
    opt = torch.optim.AdamW(other.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    assert load_checkpoint(folder, other, opt, sched) == 0
    assert torch.equal(other.weight.detach().cpu(), model.weight.detach())
    state = opt.state_dict()["state"][0]
    assert state["exp_avg"].device.type == device.type
    assert state["step"].device.type == "cpu"  # AdamW's step count stays on the CPU
    other(torch.randn(4, 3, device=device)).sum().backward()
    opt.step()  # the restored state steps on the device
