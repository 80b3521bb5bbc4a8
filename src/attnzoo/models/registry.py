"""The model registry: name -> config preset and builder."""

from __future__ import annotations

from dataclasses import replace

from attnzoo.models.seq2seq import Seq2Seq, Seq2SeqConfig, bahdanau, luong

MODELS = {
    "bahdanau": (bahdanau, "RNNsearch: BiGRU encoder, additive attention (Bahdanau 2015)"),
    "luong": (luong, "global/local attention, input feeding (Luong 2015)"),
    "encdec": (
        lambda **kw: replace(Seq2SeqConfig(attention="none"), **kw),
        "encoder-decoder without attention (Sutskever 2014 / Cho 2014)",
    ),
    "simple": (
        lambda **kw: replace(Seq2SeqConfig(attention="simple", score="general", cell="rnn"), **kw),
        "SimpleRNN + attention (the lecture model)",
    ),
}


def build_model(config: Seq2SeqConfig, task):
    return Seq2Seq(config, len(task.source_vocab), len(task.target_vocab))
