"""The model registry: name -> config preset, model class, description, interface.

Every model is built as `model_class(config, **task.model_dims())`: the task names the sizes
the model needs. A task pairs with the models of its `TaskSpec.interface`, which must equal the
model's `ModelSpec.interface`; the interface says which sizes the task gives and which methods
the model offers (documented with the task of that interface, e.g.
`attnzoo.tasks.translation` for "seq2seq"):

- "seq2seq": `(config, source_vocab, target_vocab, max_source_len, max_target_len)`;
- "lm": `(config, vocab, max_len)`;
- "pointer": `(config, input_dim, end_token)`;
- "bits": `(config, input_size, output_size)`;
- "image": `(config, image_size, channels, classes)`;
- "multi_image": `(config, image_size, channels, classes, labels)`;
- "caption": `(config, vocab, max_len, image_size, channels)`;
- "fewshot": `(config, image_size, channels, ways, shots)`;
- "bandit": `(config, arms, pulls)`;
- "gan": `(config, image_size, channels, classes)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from attnzoo.models import (
    dram,
    image_baselines,
    lstmn,
    protonet,
    ram,
    sagan,
    seq2seq,
    show_attend_tell,
    snail,
    transformer,
)
from attnzoo.models.ntm import NTM, LSTMBaseline, lstm, ntm
from attnzoo.models.pointer_net import PointerNet, PointerNetConfig
from attnzoo.models.seq2seq import Seq2Seq, bahdanau, encdec, luong, simple


@dataclass(frozen=True)
class ModelSpec:
    preset: Callable[..., object]  # (**overrides) -> frozen config dataclass
    model_class: type
    description: str
    interface: str = "seq2seq"  # seq2seq | lm | pointer | bits | image | multi_image | gan
    # a config.json "model" section written by an earlier version -> today's fields
    upgrade: Callable[[dict], dict] = lambda fields: fields
    attends: bool = True  # False: a baseline without attention (the explorer shows none)
    unread: tuple[str, ...] = ()  # config keys it never reads: `--set` refuses them

    @property
    def config_class(self) -> type:
        return type(self.preset())

    def build(self, config, task):
        return self.model_class(config, **task.model_dims())


# each of its optimisers takes its rate and betas from the model (`optimizer_groups`: model.d_lr,
# model.g_lr, model.betas), never from the train section
GAN_UNREAD = ("train.lr", "train.betas")
# a classifier that samples no path: the task's Monte-Carlo average is the one pass
NO_PATHS = ("task.mc_samples",)
# the attention models have one recurrent layer; the plain LSTM has no attention
ONE_LAYER, NO_ATTENTION = ("model.layers",), ("model.attn_hidden",)

MODELS = {
    "bahdanau": ModelSpec(
        bahdanau,
        Seq2Seq,
        "RNNsearch: BiGRU encoder, additive attention (Bahdanau 2015)",
        upgrade=seq2seq.upgrade,
    ),
    "luong": ModelSpec(
        luong,
        Seq2Seq,
        "global/local attention, input feeding (Luong 2015)",
        upgrade=seq2seq.upgrade,
    ),
    "encdec": ModelSpec(
        encdec,
        Seq2Seq,
        "encoder-decoder without attention (Sutskever 2014 / Cho 2014)",
        upgrade=seq2seq.upgrade,
        attends=False,
    ),
    "simple": ModelSpec(
        simple, Seq2Seq, "SimpleRNN + attention (the lecture model)", upgrade=seq2seq.upgrade
    ),
    "transformer": ModelSpec(
        transformer.tiny,
        transformer.Transformer,
        "Transformer, CPU-sized: d_model 128, 2 + 2 layers (Vaswani 2017)",
        upgrade=transformer.upgrade,
    ),
    "transformer-base": ModelSpec(
        transformer.base,
        transformer.Transformer,
        "Transformer base: d_model 512, 6 + 6 layers, 8 heads (Vaswani 2017, Table 3)",
        upgrade=transformer.upgrade,
    ),
    "transformer-lm": ModelSpec(
        transformer.tiny,
        transformer.TransformerLM,
        "decoder-only Transformer language model, CPU-sized: d_model 128, 2 layers",
        upgrade=transformer.upgrade,
        interface="lm",
        unread=("model.layers_enc",),  # a decoder alone
    ),
    "pointer-net": ModelSpec(
        lambda **kw: replace(PointerNetConfig(), **kw),
        PointerNet,
        "Pointer Network: LSTM encoder/decoder, additive attention as the output (Vinyals 2015)",
        interface="pointer",
    ),
    "ntm": ModelSpec(
        ntm,
        NTM,
        "Neural Turing Machine: LSTM controller, 128 x 20 memory, 1 read + 1 write head "
        "(Graves 2014)",
        interface="bits",
    ),
    "lstm": ModelSpec(
        lstm,
        LSTMBaseline,
        "LSTM without memory, 3 layers sized to the NTM's parameter count (Graves 2014 baseline)",
        interface="bits",
        attends=False,
    ),
    "ram": ModelSpec(
        ram.ram,
        ram.RAM,
        "Recurrent Attention Model: 6 glimpses of 8 x 8, REINFORCE locations (Mnih 2014)",
        interface="image",
    ),
    "ram-translated": ModelSpec(
        ram.ram_translated,
        ram.RAM,
        "Recurrent Attention Model: 8 glimpses of 12 x 12 at 3 scales, for 60 x 60 (Mnih 2014)",
        interface="image",
    ),
    "fc": ModelSpec(
        image_baselines.fc,
        image_baselines.FullyConnected,
        "fully connected classifier, 2 layers of 256 (Mnih 2014 baseline)",
        interface="image",
        attends=False,
        unread=NO_PATHS,
    ),
    "convnet": ModelSpec(
        image_baselines.conv,
        image_baselines.ConvNet,
        "two-layer convnet classifier (Mnih 2014 baseline)",
        interface="image",
        attends=False,
        unread=NO_PATHS,
    ),
    "dram": ModelSpec(
        dram.dram,
        dram.DRAM,
        "Deep Recurrent Attention Model: context network, two LSTM layers, 3 glimpses per "
        "label (Ba 2014)",
        interface="multi_image",
    ),
    "convnet-multi": ModelSpec(
        image_baselines.conv,
        image_baselines.MultiHeadConvNet,
        "two-layer convnet with one softmax head per label (Ba 2014 baseline)",
        interface="multi_image",
        attends=False,
        unread=NO_PATHS,
    ),
    "show-attend-tell": ModelSpec(
        show_attend_tell.soft,
        show_attend_tell.ShowAttendTell,
        "Show, Attend and Tell, soft attention: CNN annotations, LSTM, additive attention "
        "(Xu 2015)",
        interface="caption",
    ),
    "show-attend-tell-hard": ModelSpec(
        show_attend_tell.hard,
        show_attend_tell.ShowAttendTell,
        "Show, Attend and Tell, hard attention: a sampled location, REINFORCE (Xu 2015)",
        interface="caption",
    ),
    "sat-encoder": ModelSpec(
        show_attend_tell.encoder_classifier,
        show_attend_tell.EncoderClassifier,
        "the Show-Attend-Tell CNN encoder as a classifier, to start a captioner's encoder "
        "(train.init_from)",
        interface="image",
        attends=False,
        unread=NO_PATHS,
    ),
    "lstm-captioner": ModelSpec(
        show_attend_tell.no_attention,
        show_attend_tell.ShowAttendTell,
        "LSTM captioner without attention (mean annotation), sized to the soft model",
        interface="caption",
        attends=False,
        unread=NO_ATTENTION,
    ),
    "sagan": ModelSpec(
        sagan.sagan,
        sagan.SAGAN,
        "Self-Attention GAN: conditional generator, projection discriminator, a self-attention "
        "block in each, spectral norm, hinge loss, TTUR (Zhang 2018)",
        interface="gan",
        unread=GAN_UNREAD,
    ),
    "sagan-noattn": ModelSpec(
        sagan.sagan_noattn,
        sagan.SAGAN,
        "the same GAN without the self-attention blocks (within 2% of sagan's parameters)",
        interface="gan",
        attends=False,
        unread=GAN_UNREAD,
    ),
    "snail": ModelSpec(
        snail.snail,
        snail.SNAIL,
        "SNAIL: 4-block conv embedding, TC blocks + causal attention blocks (Mishra 2017)",
        interface="fewshot",
    ),
    "protonet": ModelSpec(
        protonet.protonet,
        protonet.ProtoNet,
        "prototypical network, SNAIL's embedding (Snell 2017 baseline)",
        interface="fewshot",
    ),
    "snail-bandit": ModelSpec(
        snail.snail_bandit,
        snail.SnailPolicy,
        "SNAIL as a bandit policy: 2 TC blocks + causal attention, REINFORCE (Mishra 2017)",
        interface="bandit",
    ),
    "lstmn": ModelSpec(
        lstmn.lstmn,
        lstmn.LSTMNLM,
        "LSTMN language model: hidden and memory tapes read by intra-attention (Cheng 2016)",
        interface="lm",
        unread=ONE_LAYER,
    ),
    "simplernn-self": ModelSpec(
        lstmn.simple_self,
        lstmn.SimpleSelfAttentionLM,
        "SimpleRNN + self-attention over its past states (the lecture model) language model",
        interface="lm",
        unread=ONE_LAYER,
    ),
    "lstm-lm": ModelSpec(
        lstmn.lstm_lm,
        lstmn.LSTMLM,
        "LSTM language model (torch.nn.LSTM), no attention",
        interface="lm",
        attends=False,
        unread=NO_ATTENTION,
    ),
}
