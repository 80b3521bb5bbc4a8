"""The task registry: name -> data config class, data builder, detokenizer, headline metric.

A sequence-to-sequence task module gives `make_splits(config)` and `detokenize(tokens)`, and the
runs layer wraps its splits in a `TranslationTask`; a task module that builds its own task
object (a language model's) names that function in `factory`. `interface` says which models
fit: it must equal the model's `ModelSpec.interface`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TaskSpec:
    module: str  # attnzoo.tasks.<module>
    config_class: str
    metric: str
    max_vocab: int | None = None
    description: str = ""
    defaults: dict = field(default_factory=dict)  # the config's values for this task name
    interface: str = "seq2seq"  # seq2seq | lm
    factory: str = ""  # module function (config, *, seed, eval_config) -> task; "": TranslationTask

    def load(self):
        return importlib.import_module(f"attnzoo.tasks.{self.module}")

    def config_type(self):
        return getattr(self.load(), self.config_class)

    def default_config(self):
        return self.config_type()(**self.defaults)


TASKS = {
    "dates": TaskSpec(
        "dates",
        "DatesConfig",
        "exact_match",
        description="human-written dates in many locales -> ISO (babel)",
    ),
    "numbers": TaskSpec(
        "numbers",
        "NumbersConfig",
        "exact_match",
        description="German number words -> digits (num2words)",
    ),
    "kjv2web": TaskSpec(
        "kjv2web",
        "Kjv2WebConfig",
        "bleu",
        max_vocab=8000,
        description="King James verse -> World English Bible verse",
    ),
    **{
        kind: TaskSpec(
            "sequences",
            "SequenceConfig",
            "exact_match",
            defaults={"kind": kind},
            description=f"{kind} a random symbol sequence (generated)",
        )
        for kind in ("copy", "reverse", "sort")
    },
    "kjv_lm": TaskSpec(
        "kjv_lm",
        "KjvLmConfig",
        "bits_per_char",
        description="character-level language model of the King James text",
        interface="lm",
        factory="make_task",
    ),
    **{
        kind: TaskSpec(
            "pointing",
            "PointingConfig",
            metric,
            description=text,
            defaults={"kind": kind, **sizes},
            interface="pointer",
            factory="make_task",
        )
        for kind, metric, sizes, text in (
            (
                "sort_numbers",
                "exact_match",
                {"n_min": 5, "n_max": 10},
                "sort real numbers by pointing at them (Vinyals 2015)",
            ),
            (
                "convex_hull",
                "accuracy",
                {"n_min": 10, "n_max": 10},
                "planar convex hull, counter-clockwise (Vinyals 2015, Table 1)",
            ),
            (
                "tsp",
                "gap_pct",
                {"n_min": 10, "n_max": 10},
                "planar travelling salesman, optimum by Held-Karp (Vinyals 2015, Table 2)",
            ),
        )
    },
    **{
        name: TaskSpec(
            "bits",
            "BitsConfig",
            "bit_errors",
            description=text,
            defaults=defaults,
            interface="bits",
            factory="make_task",
        )
        for name, defaults, text in (
            ("bit_copy", {"kind": "copy"}, "copy random 8-bit vectors (Graves 2014, sec. 4.1)"),
            (
                "repeat_copy",
                {"kind": "repeat_copy", "max_len": 10, "test_lengths": (20,)},
                "copy a bit sequence K times, then an end marker (Graves 2014, sec. 4.2)",
            ),
            (
                "associative_recall",
                {"kind": "associative_recall", "min_len": 2, "max_len": 6, "test_lengths": (12,)},
                "recall the item after a query item (Graves 2014, sec. 4.3)",
            ),
        )
    },
}
