"""bench_lstmn's recomputing peer: the same model and outputs as the library's LSTMN, differing
only in projecting the whole hidden tape again at every step (what the speed rows compare)."""

import shutil
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


def test_multiply_adds_count_what_torch_counts():
    """`multiply_adds` against torch's own count of the forward's matrix products
    (`FlopCounterMode`: two flops per multiply-add), for both implementations at odd sizes;
    the one term it does not see is the score's v over the tanh rows (an elementwise product
    and sum, t * attn_hidden at step t), added here."""
    from torch.utils.flop_counter import FlopCounterMode

    batch, length = 3, 9
    params = {"embed_dim": 5, "hidden": 7, "attn_hidden": 3}
    tokens = torch.randint(1, V, (batch, length))
    v_dot = (length + 1) / 2 * CONFIG.attn_hidden  # per token
    for name, model in zip(("tape", "recompute"), pair(), strict=True):
        with FlopCounterMode(display=False) as counter:
            model(tokens)
        counted = counter.get_total_flops() / 2 / (batch * length) + v_dot
        expected = bench_lstmn.multiply_adds(params, length, V)[name]
        assert abs(counted - expected) < 1e-9 * expected, name


def test_figures_come_from_the_run_the_caption_names(tmp_path):
    """The caption says "declared-budget run" where the JSON has matched rows: the figures
    then come from that run's dir only (the reduced run's replaced them when the declared
    run's dir was absent), and from the reduced run's where the JSON has none."""
    runs = tmp_path / "runs"
    for unit in ("matched-lstmn", "matched-short-lstmn"):
        run = bench_lstmn.C.run_folder(runs, "lstmn", unit, 0)
        (run / "figures").mkdir(parents=True)
        for name in ("intra_attention", "intra_attention_1", "intra_attention_heatmap"):
            (run / "figures" / f"{name}.png").write_text(unit)
    docs = tmp_path / "docs"
    docs.mkdir()
    with_matched = {"summary": {"matched-lstmn": {"seeds": [0]}}}
    written = bench_lstmn.figures(with_matched, docs, runs)
    assert len(written) == 3 and {p.read_text() for p in written} == {"matched-lstmn"}
    written = bench_lstmn.figures({"summary": {}}, docs, runs)
    assert len(written) == 3 and {p.read_text() for p in written} == {"matched-short-lstmn"}
    shutil.rmtree(bench_lstmn.C.run_folder(runs, "lstmn", "matched-lstmn", 0))  # not kept
    assert bench_lstmn.figures(with_matched, docs, runs) == []
