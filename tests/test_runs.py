import pytest

from attnzoo import runs


def test_overrides_parse_each_field_type():
    config = runs.default_config("bahdanau", "dates")
    runs.apply_overrides(
        config,
        [
            "model.hidden=32",
            "model.bidirectional=false",
            "train.lr=0.01",
            "model.cell=lstm",
            "train.betas=0.8,0.9",
            "task.locales=en_US,de_DE",
            "eval.limit=0",
        ],
    )
    assert config["model"]["hidden"] == 32 and config["model"]["bidirectional"] is False
    assert config["train"]["lr"] == 0.01 and config["model"]["cell"] == "lstm"
    assert config["train"]["betas"] == (0.8, 0.9)
    assert config["task"]["locales"] == ("en_US", "de_DE")


def test_sequence_task_defaults_follow_the_task_name():
    assert runs.default_config("luong", "sort")["task"]["kind"] == "sort"
    assert runs.default_config("luong", "copy")["task"]["kind"] == "copy"


@pytest.mark.parametrize(
    ("item", "pattern"),
    [
        ("model.hidden", "key=value"),
        ("model.nope=1", "'model.nope'.*model.hidden"),
        ("nope.hidden=1", "'nope.hidden'"),
        ("model.hidden=big", "'model.hidden'.*int"),
        ("model.bidirectional=maybe", "'model.bidirectional'"),
        ("train.schedule=linear", "'schedule'"),
    ],
)
def test_bad_overrides(item, pattern):
    with pytest.raises(ValueError, match=pattern):
        runs.apply_overrides(runs.default_config("bahdanau", "dates"), [item])


def test_build_sizes_the_location_score_to_the_data():
    config = runs.apply_overrides(
        runs.default_config("luong", "reverse"),
        [
            "model.score=location",
            "task.n_train=50",
            "task.n_valid=5",
            "task.n_test=5",
            "task.max_len=9",
        ],
    )
    task, model = runs.build(config)
    assert model.score.max_keys == task.max_source_len == 10


def test_literal_fields_accept_only_their_choices():
    config = runs.apply_overrides(runs.default_config("luong", "numbers"), ["task.target=english"])
    assert config["task"]["target"] == "english"
    with pytest.raises(ValueError, match="'task.target'.*digits"):
        runs.apply_overrides(runs.default_config("luong", "numbers"), ["task.target=french"])
