"""bench_lstmn's recomputing peer: the same model and outputs as the library's LSTMN, differing
only in projecting the whole hidden tape again at every step (what the speed rows compare)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import bench_lstmn
from attnzoo.models.lstmn import LSTMNLM, RecurrentLMConfig

CONFIG = RecurrentLMConfig(embed_dim=5, hidden=7, attn_hidden=3)
V = 11


def pair():
    torch.manual_seed(0)
    tape = LSTMNLM(CONFIG, V, 9).double()
    recomputing = bench_lstmn.recomputing_class()(CONFIG, V, 9).double()
    recomputing.load_state_dict(tape.state_dict())
    return tape, recomputing


def test_recomputing_peer_gives_the_same_outputs_and_gradients():
    tape, recomputing = pair()
    tokens = torch.randint(1, V, (3, 6))
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, :2] = False  # left padding in one row
    for kwargs in ({}, {"mask": mask}):
        a, b = tape(tokens, **kwargs).logits, recomputing(tokens, **kwargs).logits
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        a.square().sum().backward()
        b.square().sum().backward()
        for (name, p), q in zip(tape.named_parameters(), recomputing.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=name)
        tape.zero_grad()
        recomputing.zero_grad()


def test_recomputing_peer_projects_the_whole_tape_at_every_step():
    """The library projects one state per write; the peer every state at every read."""
    tape, recomputing = pair()
    tokens = torch.randint(1, V, (2, 5))
    for model, expected in ((tape, [1] * 6), (recomputing, [1, 2, 3, 4, 5])):
        rows = []
        model.score.key_proj.register_forward_hook(lambda m, i, o, rows=rows: rows.append(i[0]))
        model(tokens)
        assert [r.shape[1] for r in rows] == expected
