"""The task fields a config class lists in `HELD_OUT` (those `attnzoo eval --set` may change in
a finished run, `runs.evaluation_keys`) change only what is scored: every task built with one
of them changed trains on the very batches of the task without the change."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnzoo.tasks.base import SPLITS
from attnzoo.tasks.registry import TASKS

CASES = [
    (name, field)
    for name, spec in TASKS.items()
    for field in getattr(spec.config_type(), "HELD_OUT", ())
]


def _other(value):
    """Another valid value of a held-out field: fewer items, or one more size or length."""
    if isinstance(value, bool) or not isinstance(value, int | tuple):
        raise AssertionError(f"no rule here for a held-out field holding {value!r}")
    if isinstance(value, int):
        return value // 2 if value > 1 else value + 1
    return (*value, 3)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and _same(vars(a), vars(b))
    return a == b


def test_some_tasks_declare_held_out_fields_and_each_is_a_field():
    assert CASES
    for name, field in CASES:
        names = {f.name for f in dataclasses.fields(TASKS[name].config_type())}
        assert field in names, (name, field)


@pytest.mark.parametrize("name, field", CASES)
def test_a_held_out_field_leaves_the_training_batches_alone(name, field):
    spec = TASKS[name]
    config = spec.default_config()
    changed = dataclasses.replace(config, **{field: _other(getattr(config, field))})
    tasks = [spec.build(c, seed=3, eval_config=spec.eval_config()) for c in (config, changed)]
    for step in (0, 1):
        first, second = (task.batch(step, 4, "cpu") for task in tasks)
        assert _same(first, second), f"{name}: task.{field} changed the batch of step {step}"


class _InOrder(torch.nn.Module):
    """A pointer "model" that visits the inputs in their order: scores depend on the data."""

    def decode(self, points, beam_size=1):
        return torch.arange(points.shape[1]).expand(points.shape[0], -1)


def test_a_pointing_task_scores_the_split_it_is_asked_for():
    """eval.split=valid was accepted and the test set scored: each split is its own draw
    (the tours' lengths of visiting the cities in order differ)."""
    spec = TASKS["tsp"]
    config = dataclasses.replace(spec.default_config(), n_test=50)

    def scored(split):
        eval_config = dataclasses.replace(spec.eval_config(), split=split)
        return spec.build(config, seed=0, eval_config=eval_config).evaluate(_InOrder())

    test, valid = scored("test"), scored("valid")
    assert test == scored("test") and valid == scored("valid")
    assert test.keys() == valid.keys() and test != valid


def test_bits_and_bandits_draw_each_split_on_its_own():
    for name, held, changes in (
        ("bit_copy", lambda t: t.held_out(), {"n_test_per_length": 4}),
        ("bandits", lambda t: t.held_out(30), {}),
    ):
        spec = TASKS[name]
        built = {
            split: spec.build(
                dataclasses.replace(spec.default_config(), **changes),
                seed=0,
                eval_config=dataclasses.replace(spec.eval_config(), split=split),
            )
            for split in ("test", "valid")
        }
        test, valid = held(built["test"]), held(built["valid"])
        assert _same(test, held(built["test"]))
        assert not _same(test, valid), name


def test_no_training_batch_of_the_bandits_is_a_held_out_batch():
    """The held-out episodes were drawn from the seed of training step 2 at run seed 0: its
    whole batch was the test set's first episodes. Now no early step of any small run seed
    draws them."""
    spec = TASKS["bandits"]
    for split in ("test", "valid"):
        eval_config = dataclasses.replace(spec.eval_config(), split=split)
        for run_seed in range(3):
            task = spec.build(spec.default_config(), seed=run_seed, eval_config=eval_config)
            held = task.held_out(8).probs
            for step in range(20):
                assert not torch.equal(task.batch(step, 8, "cpu").probs, held), (run_seed, step)


def test_no_glyphs_held_out_chunk_is_a_training_batch():
    """The glyph task seeded its held-out chunks by hand: the valid split's first chunk at data
    seed 0, (0 * 7919 + 1) * 100_003, was the whole training batch of step 100_003 at run seed 0
    (same background classes, same draws). Held-out chunks now come from the split's
    held_out_generator stream."""
    from attnzoo.tasks.glyphs import EVAL_CHUNK

    spec = TASKS["glyphs"]
    config = dataclasses.replace(spec.default_config(), queries=2, eval_queries=2)
    for split in SPLITS:
        eval_config = dataclasses.replace(spec.eval_config(), split=split)
        task = spec.build(config, seed=0, eval_config=eval_config)
        held = task.held_out(split, EVAL_CHUNK)[0]
        for step in (100_003, 2 * 100_003, 0, 1):
            batch = task.batch(step, EVAL_CHUNK, "cpu")
            assert not torch.equal(batch.classes, held.classes), (split, step)


def test_held_out_streams_are_none_a_training_step_draws_from():
    """torch's CPU generator reads the low 32 bits of a seed (the bit tasks' held-out seed
    2**40 + seed was the seed of training step `seed` at run seed 0): the held-out generators'
    states differ from every training batch's of small run seeds and early steps."""
    from attnzoo.tasks.base import held_out_generator

    held = [held_out_generator(seed, split).get_state() for seed in (0, 1) for split in SPLITS]
    assert len({bytes(h.numpy()) for h in held}) == len(held)
    for run_seed in range(3):
        for step in range(0, 100_000, 997):
            state = torch.Generator().manual_seed(run_seed * 1_000_003 + step).get_state()
            assert not any(torch.equal(state, h) for h in held), (run_seed, step)


def test_a_held_out_seed_from_2_to_the_30_stays_above_the_training_seeds():
    """HELD_OUT_SEEDS + 2 seed + valid reached 2**32 from seed 2**30 on, and torch kept the
    low 32 bits: seed 2**30's test set was run seed 0's training step 0, seed 2**30 + 7's
    step 14. Every held-out seed's low 32 bits now lie at or above HELD_OUT_SEEDS."""
    from attnzoo.tasks.base import HELD_OUT_SEEDS, held_out_generator, training_generator

    for seed in (0, 2**30 - 1, 2**30, 2**30 + 7, 2**31 - 1):
        for split in SPLITS:
            held = held_out_generator(seed, split)
            assert held.initial_seed() % 2**32 >= HELD_OUT_SEEDS, (seed, split)
            steps = [training_generator(0, step).get_state() for step in range(20)]
            assert not any(torch.equal(held.get_state(), s) for s in steps), (seed, split)


def test_a_large_run_seed_never_draws_a_held_out_batch():
    """Run seed 139586 at step 18362 drew the bandits' test episodes: its unreduced training
    seed's low 32 bits were the held-out seed. Training seeds are now reduced below every
    held-out seed; a run seed of 2**31 or more is refused (torch would read s + 2**32 as s)."""
    from attnzoo.train.loop import TrainConfig

    spec = TASKS["bandits"]
    task = spec.build(spec.default_config(), seed=139586, eval_config=spec.eval_config())
    assert not torch.equal(task.batch(18362, 64, "cpu").probs, task.held_out(64).probs)
    with pytest.raises(ValueError, match="TrainConfig: argument 'seed' expected a seed below"):
        TrainConfig(seed=2**32 + 5)
