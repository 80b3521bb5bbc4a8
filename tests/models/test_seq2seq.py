import pytest
import torch
import torch.nn.functional as F

from attnzoo.core import scores
from attnzoo.decoding import decode, greedy
from attnzoo.models.seq2seq import (
    CELLS,
    DECODERS,
    LOCAL,
    OPTIONS,
    Seq2Seq,
    Seq2SeqConfig,
    upgrade,
)
from tests.models import seq2seq_reference

V_SRC, V_TGT, MAX_SOURCE_LEN = 13, 11, 9
BOS, EOS = 1, 2


def batch(b=3, j=7, t=5, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([j, j - 2, 1][:b])
    source = torch.randint(4, V_SRC, (b, j), generator=g)
    source[torch.arange(j)[None] >= lengths[:, None]] = 0
    target = torch.randint(4, V_TGT, (b, t), generator=g)
    target_in = torch.cat([torch.full((b, 1), BOS), target[:, :-1]], 1)
    return tuple(x.to(device) for x in (source, lengths, target_in, target))


VARIANTS = [
    dict(attention="none"),
    dict(attention="none", cell="lstm", layers=2),
    dict(attention="bahdanau", score="additive", attn_hidden=10),
    dict(attention="bahdanau", score="general", cell="lstm"),
    dict(attention="bahdanau", score="cosine", bidirectional=False),
    dict(attention="luong", score="dot", bidirectional=False),
    dict(attention="luong", score="scaled_dot", bidirectional=False, input_feeding=False),
    dict(attention="luong", score="general", cell="lstm"),
    dict(attention="luong", score="additive", attn_hidden=10, input_feeding=False),
    dict(attention="luong", score="location"),
    dict(attention="luong-local", score="general", local="local-m", window=2),
    dict(attention="luong-local", score="general", local="local-p", window=2, cell="rnn"),
    dict(
        attention="luong-local",
        score="dot",
        local="local-m",
        input_feeding=False,
        bidirectional=False,
    ),
    dict(attention="simple", score="general", cell="rnn"),
    dict(attention="bahdanau", layers=2),
]


def make(**kw):
    config = Seq2SeqConfig(embed_dim=8, hidden=12, dropout=0.0, **kw)
    return Seq2Seq(config, V_SRC, V_TGT, MAX_SOURCE_LEN, 20)


def ids(value):
    return "-".join(map(str, value.values())) if isinstance(value, dict) else str(value)


@pytest.mark.parametrize("kw", VARIANTS, ids=ids)
def test_every_variant_takes_an_empty_batch(kw):
    """Batch 0 gives empty logits, as every other model gives (Bahdanau's maxout readout
    reshaped with -1, which an empty tensor cannot infer)."""
    source, lengths, target_in, _ = batch()
    out = make(**kw)(source[:0], lengths[:0], target_in[:0])
    assert out.logits.shape == (0, 5, V_TGT)


@pytest.mark.parametrize("kw", VARIANTS, ids=ids)
def test_every_variant_shapes_gradients_and_step_consistency(kw):
    torch.manual_seed(0)
    model = make(**kw).eval()
    assert type(model.decoder) is DECODERS[kw["attention"]]
    source, lengths, target_in, _ = batch()
    out = model(source, lengths, target_in, return_weights=True)
    assert out.logits.shape == (3, 5, V_TGT)
    if kw["attention"] == "none":
        assert out.weights is None
    else:
        assert out.weights.shape == (3, 5, 7)
        # padded source positions get no weight
        assert (out.weights[1, :, 5:] == 0).all() and (out.weights[2, :, 1:] == 0).all()
        sums = out.weights.sum(-1)
        if kw.get("local") is None:
            torch.testing.assert_close(sums, torch.ones(3, 5))
        elif kw.get("local") == "local-m":  # p_t = t may leave a short source's window empty
            assert ((sums - 1).abs() < 1e-5).logical_or(sums == 0).all()
        else:  # local-p: Gaussian-reweighted, not renormalised (Luong eq. 10)
            assert (sums <= 1 + 1e-6).all()
    assert model(source, lengths, target_in).weights is None  # weights only when asked
    # decoding one token at a time gives the teacher-forced logits
    state = model.start(model.encode(source, lengths))
    steps = []
    for t in range(5):
        log_probs, state = model.decode_step(target_in[:, t], state)
        steps.append(log_probs)
    torch.testing.assert_close(
        torch.stack(steps, 1), torch.log_softmax(out.logits, -1), rtol=1e-4, atol=1e-5
    )
    model.train()
    model(source, lengths, target_in).logits.sum().backward()
    for name, p in model.named_parameters():
        if name.endswith("embed.weight"):  # the padding row gets none; used rows do
            assert torch.isfinite(p.grad).all() and p.grad[1:].abs().sum() > 0, name
        else:
            assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("kw", VARIANTS, ids=ids)
def test_a_padded_sentence_gives_what_it_gives_alone(kw):
    """Each row of a padded batch, in float64, equals the same sentence run alone without
    padding: the backward direction reversed over the padded length (padding leaking into
    real annotations), the final backward state taken at the last position instead of the
    first, or local-p's S taken as the padded length (Luong eq. 9) all passed the tests above,
    which compare a padded batch with itself decoded step by step."""
    torch.manual_seed(0)
    model = make(**kw).double().eval()
    source, lengths, target_in, _ = batch()
    with torch.no_grad():
        padded = model(source, lengths, target_in).logits
        for k, n in enumerate(lengths.tolist()):
            alone = model(source[k : k + 1, :n], lengths[k : k + 1], target_in[k : k + 1])
            torch.testing.assert_close(padded[k], alone.logits[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kw", VARIANTS, ids=ids)
def test_every_family_equals_a_float64_loop_over_its_equations(kw):
    """Every variant against `seq2seq_reference`, sentence by sentence in plain loops (the
    tests above compare the model with itself: Luong's input feeding of h_t for h~_t,
    the simple decoder never feeding c_{t-1}, and Bahdanau querying the first layer's state
    all passed them)."""
    torch.manual_seed(0)
    model = make(**kw).double().eval()
    with torch.no_grad():
        for p in model.parameters():  # away from the small initial weights
            p.add_(torch.randn_like(p) * 0.3)
        source, lengths, target_in, _ = batch()
        want = seq2seq_reference.logits(model, source, lengths, target_in)
        got = model(source, lengths, target_in).logits
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("attention", list(DECODERS))
def test_overfits_one_tiny_batch(attention):
    torch.manual_seed(0)
    model = make(attention=attention, **({} if attention == "none" else {"score": "general"}))
    source, lengths, target_in, target = batch(seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    for _ in range(150):
        loss = F.cross_entropy(
            model(source, lengths, target_in).logits.reshape(-1, V_TGT), target.reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    assert (model(source, lengths, target_in).logits.argmax(-1) == target).all()


def test_keys_prepared_once_per_sentence():
    model = make(attention="bahdanau").eval()
    source, lengths, target_in, _ = batch()
    calls = []
    original = model.decoder.score.key_proj.forward
    model.decoder.score.key_proj.forward = lambda x: calls.append(1) or original(x)
    model(source, lengths, target_in)
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("kw", "rnn_calls"),
    [
        (dict(attention="none"), 1),
        (dict(attention="luong", input_feeding=False), 1),
        (dict(attention="luong-local", input_feeding=False, local="local-m"), 1),
        (dict(attention="luong", input_feeding=True), 5),
        (dict(attention="bahdanau"), 5),
        (dict(attention="simple"), 5),
    ],
    ids=ids,
)
def test_teacher_forcing_runs_the_rnn_once_when_nothing_feeds_back(kw, rnn_calls):
    model = make(**kw)
    source, lengths, target_in, _ = batch(t=5)
    calls = []
    model.decoder.rnn.register_forward_hook(lambda *args: calls.append(1))
    model(source, lengths, target_in)
    assert len(calls) == rnn_calls


@pytest.mark.parametrize("attention", list(DECODERS))
@pytest.mark.parametrize("beam_size", [1, 3])
def test_decode_stops_at_the_first_eos(attention, beam_size):
    """The decoded length is the first EOS + 1 of the longest row, or max_len without EOS."""
    model = make(attention=attention).eval()
    source, lengths, _, _ = batch()
    common = dict(bos=BOS, eos=EOS, max_len=6, device=source.device, beam_size=beam_size)

    def run():
        return decode(model.decode_step, model.start(model.encode(source, lengths)), 3, **common)

    with torch.no_grad():
        model.output.bias[EOS] = -100.0  # never EOS
        out = run()
        assert out.shape == (3, 6) and (out != EOS).all()
        model.output.bias[EOS] = 100.0  # EOS first; a beam may run on while others finish
        out = run()
        assert (out[:, 0] == EOS).all() and (out[:, 1:] == 0).all()
        assert out.shape[1] == 1 or beam_size > 1


@pytest.mark.parametrize(("stops", "length"), [((3, 5, 2), 5), ((3, None, 2), 8)])
def test_greedy_length_is_the_last_first_eos_plus_one(stops, length):
    """Row r is made to emit EOS at its step stops[r] (never for None): the decoded length is
    the latest first EOS, or max_len when a row never ends; padding follows each EOS."""
    model = make(attention="bahdanau").eval()
    source, lengths, _, _ = batch()
    at = torch.tensor([-1 if s is None else s for s in stops])

    def step(tokens, state):
        log_probs, state = model.decode_step(tokens, state)
        log_probs[:, EOS] = torch.where(at == state.step, 0.0, -1e4)  # state.step: tokens read
        return log_probs, state

    state = model.start(model.encode(source, lengths))
    out = greedy(step, state, 3, bos=BOS, eos=EOS, max_len=8, device=source.device)
    assert out.shape == (3, length)
    for row, stop in zip(out.tolist(), stops, strict=True):
        if stop is None:
            assert EOS not in row
        else:
            assert row.index(EOS) == stop - 1 and set(row[stop:]) <= {0}


def test_variants_cover_every_option():
    """Every family, score, cell, local form and input-feeding setting is in VARIANTS: compared
    with the code's own registries, so a new option without a test fails here."""
    configs = [Seq2SeqConfig(**kw) for kw in VARIANTS]

    def seen(name):  # the values of option `name` among the variants whose family reads it
        return {c.option(name) for c in configs if name in DECODERS[c.attention].reads(c)}

    assert {c.attention for c in configs} == set(DECODERS)
    assert {c.cell for c in configs} == set(CELLS)
    assert seen("score") == set(scores.SCORES)
    assert seen("local") == set(LOCAL)
    assert seen("input_feeding") == {True, False}


def _readers():
    """(config kwargs, options read) for every family and, where it reads one, every score."""
    for attention, decoder in DECODERS.items():
        for score in scores.SCORES if "score" in decoder.options else [None]:
            kw = {"attention": attention, "score": score, "bidirectional": False}
            yield kw, tuple(sorted(decoder.reads(Seq2SeqConfig(**kw))))


@pytest.mark.parametrize(("kw", "reads"), list(_readers()), ids=lambda v: ids(v) if v else "")
def test_an_option_the_family_does_not_read_is_an_error_naming_it(kw, reads):
    for name, default in OPTIONS.items():
        if name == "score":
            continue  # kw sets it when the family reads it
        given = {**kw, name: default}
        if name in reads:
            make(**given)  # builds
        else:
            with pytest.raises(ValueError, match=f"'{name}'.*attention={kw['attention']!r}"):
                Seq2SeqConfig(**given)
    if "score" not in reads:
        with pytest.raises(ValueError, match="'score'"):
            Seq2SeqConfig(**{**kw, "score": OPTIONS["score"]})


def test_each_family_reads_what_its_docstring_table_says():
    """attn_hidden goes with the additive score only; local and window with local attention."""
    for attention, decoder in DECODERS.items():
        reads = decoder.reads(Seq2SeqConfig(attention=attention))  # default score: additive
        assert ("attn_hidden" in reads) == ("score" in reads)
        assert ("window" in reads) == ("local" in reads) == (attention == "luong-local")
        assert ("input_feeding" in reads) == attention.startswith("luong")


@pytest.mark.parametrize(
    ("kw", "pattern"),
    [
        (dict(attention="bogus"), "'attention'"),
        (dict(cell="lstmx"), "'cell'"),
        (dict(attention="bahdanau", score="bogus"), "'score'"),
        (dict(attention="luong-local", local="global"), "'local'"),
        (dict(attention="luong-local", window=0), "'window'"),
        (dict(attention="bahdanau", local="local-m"), "'local'"),
        (dict(hidden=0), "'hidden'"),
    ],
    ids=ids,
)
def test_config_errors(kw, pattern):
    with pytest.raises(ValueError, match=pattern):
        Seq2SeqConfig(**kw)


def test_dot_score_needs_matching_sizes():
    with pytest.raises(ValueError, match="'score'.*d_query \\(12\\) != d_key \\(24\\)"):
        make(attention="luong", score="dot", bidirectional=True)


def test_location_addresses_max_source_len_positions():
    config = Seq2SeqConfig(attention="luong", score="location", embed_dim=8, hidden=12)
    assert Seq2Seq(config, V_SRC, V_TGT, max_source_len=17).decoder.score.max_keys == 17
    with pytest.raises(ValueError, match="'max_source_len'"):
        Seq2Seq(config, V_SRC, V_TGT)


# State-dict keys of checkpoints written before the decoders were classes (main at 4432568),
# in parameter order, for bahdanau() and for a 2-layer LSTM Luong local-p with general score.
OLD_KEYS = {
    "bahdanau": [
        *(f"{e}_embed.weight" for e in ("source", "target")),
        *(
            f"encoder.0.{d}.{w}_l0"
            for d in (0, 1)
            for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        ),
        "bridge.weight",
        "bridge.bias",
        *(f"decoder.{w}_l0" for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")),
        "score.v",
        "score.query_proj.weight",
        "score.key_proj.weight",
        "readout.weight",
        "readout.bias",
        "output.weight",
        "output.bias",
    ],
    "luong-local": [
        *(f"{e}_embed.weight" for e in ("source", "target")),
        *(
            f"encoder.{layer}.{d}.{w}_l0"
            for layer in (0, 1)
            for d in (0, 1)
            for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        ),
        "bridge.weight",
        "bridge.bias",
        *(
            f"decoder.{w}_l{layer}"
            for layer in (0, 1)
            for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        ),
        "score.weight",
        "local.score.weight",
        "local.w_p.weight",
        "local.v_p.weight",
        "combine.weight",
        "output.weight",
        "output.bias",
    ],
}


@pytest.mark.parametrize("attention", list(OLD_KEYS))
def test_checkpoints_with_the_old_keys_load(attention):
    kw = dict(attention=attention, score="general", cell="lstm", layers=2, local="local-p")
    kw = dict(attention="bahdanau") if attention == "bahdanau" else kw
    torch.manual_seed(0)
    saved = make(**kw).state_dict()
    assert len(saved) == len(OLD_KEYS[attention])
    old = dict(
        zip(OLD_KEYS[attention], saved.values(), strict=True)
    )  # the same tensors in the same order
    torch.manual_seed(1)
    model = make(**kw)
    model.load_state_dict(old)  # strict: every key renamed, none left over
    for name, value in model.state_dict().items():
        assert torch.equal(value, saved[name]), name
    model.load_state_dict(saved)  # the new keys load as they are


@pytest.mark.parametrize("kw", VARIANTS, ids=ids)
def test_runs_on_any_device(kw, device):
    """Built on `device`, a teacher-forced forward + backward and one decode_step make every
    tensor there (meta: shapes and devices only, no values)."""
    model = make(**kw).to(device)
    source, lengths, target_in, _ = batch(device=device)
    out = model(source, lengths, target_in, return_weights=True)
    assert out.logits.shape == (3, 5, V_TGT) and out.logits.device.type == device.type
    if out.weights is not None:
        assert out.weights.shape == (3, 5, 7) and out.weights.device.type == device.type
    out.logits.sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.device.type == device.type for g in grads)
    with torch.no_grad():
        state = model.start(model.encode(source, lengths))
        log_probs, state = model.decode_step(target_in[:, 0], state)
        log_probs, state = model.decode_step(log_probs.argmax(-1), state)
    assert log_probs.shape == (3, V_TGT) and log_probs.device.type == device.type
    if device.type != "meta":  # the engine reads values (has every row ended?)
        with torch.no_grad():
            state = model.start(model.encode(source, lengths))
            out = decode(
                model.decode_step, state, 3, bos=BOS, eos=EOS, max_len=4, device=device, beam_size=2
            )
        assert out.device.type == device.type


# config.json "model" sections written by main at 4432568 (every field, read or not).
OLD_CONFIG = dict(
    score="additive",
    local="global",
    window=4,
    input_feeding=True,
    cell="gru",
    embed_dim=64,
    hidden=128,
    attn_hidden=128,
    layers=1,
    bidirectional=True,
    dropout=0.1,
    max_source_len=31,
)


@pytest.mark.parametrize(
    ("old", "want"),
    [
        (dict(attention="bahdanau"), dict(attention="bahdanau", score="additive", attn_hidden=128)),
        (dict(attention="none"), dict(attention="none")),
        (
            dict(attention="luong", score="general", local="local-p", input_feeding=False),
            dict(
                attention="luong-local",
                score="general",
                local="local-p",
                window=4,
                input_feeding=False,
            ),
        ),
        (
            dict(attention="luong", score="dot"),
            dict(attention="luong", score="dot", input_feeding=True),
        ),
        (dict(attention="simple", score="general"), dict(attention="simple", score="general")),
    ],
    ids=lambda v: v["attention"] + "-" + str(v.get("local")),
)
def test_old_config_dicts_upgrade_to_the_same_model(old, want):
    fields = upgrade({**OLD_CONFIG, **old})
    config = Seq2SeqConfig(**fields)
    for name in OPTIONS:
        assert getattr(config, name) == want.get(name), name
    assert config.attention == want["attention"] and config.hidden == 128
    assert upgrade(fields) == fields  # today's dicts pass through


@pytest.mark.parametrize("dropout", [-0.5, 1.0, 1.5, float("nan")])
def test_dropout_outside_a_probability_is_an_error_naming_it(dropout):
    with pytest.raises(ValueError, match="'dropout'"):
        Seq2SeqConfig(dropout=dropout)


def _bad_input_model():
    torch.manual_seed(0)
    return Seq2Seq(Seq2SeqConfig(hidden=8, attn_hidden=8, embed_dim=4), 10, 12)


_SOURCE, _LENGTHS, _TARGET = torch.randint(1, 10, (2, 5)), torch.tensor([5, 3]), torch.ones(2, 4)


@pytest.mark.parametrize(
    ("source", "lengths", "target_in", "kind", "pattern"),
    [
        (_SOURCE.float(), _LENGTHS, _TARGET.long(), TypeError, "'source' expected integer"),
        (_SOURCE[0], _LENGTHS, _TARGET.long(), ValueError, "'source' expected a tensor of rank 2"),
        (_SOURCE, _LENGTHS.float(), _TARGET.long(), TypeError, "'lengths' expected an integer"),
        (_SOURCE, [5, 3], _TARGET.long(), TypeError, "'lengths' expected an integer tensor"),
        # one length for the batch, a length past the source, an empty source: each would read
        # padding as words (or index from the end) without the check
        (_SOURCE, _LENGTHS[:1], _TARGET.long(), ValueError, r"'lengths' expected shape \(2,\)"),
        (_SOURCE, torch.tensor([7, 3]), _TARGET.long(), ValueError, "source_len = 5, got 3 to 7"),
        (_SOURCE, torch.tensor([0, 3]), _TARGET.long(), ValueError, "source_len = 5, got 0 to 3"),
        (_SOURCE, _LENGTHS, _TARGET, TypeError, "'target_in' expected integer"),
        (_SOURCE, _LENGTHS, _TARGET[:1].long(), ValueError, "'target_in' expected batch size 2"),
    ],
    ids=["float-source", "1d-source", "float-lengths", "list-lengths", "one-length",
         "past-source", "empty-source", "float-target", "target-batch"],
)  # fmt: skip
def test_bad_inputs_are_refused_by_name(source, lengths, target_in, kind, pattern):
    with pytest.raises(kind, match=pattern):
        _bad_input_model()(source, lengths, target_in)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_decode_refuses_a_batch_other_than_the_states(beam_size):
    model = make(attention="bahdanau").eval()
    source, lengths, _, _ = batch()
    state = model.start(model.encode(source, lengths))
    assert state.batch_size == 3 and state.reorder(torch.tensor([0, 2])).batch_size == 2
    with pytest.raises(ValueError, match=r"argument 'batch' expected the rows of 'state' \(3\)"):
        decode(model.decode_step, state, 2, bos=BOS, eos=EOS, max_len=4, device="cpu",
               beam_size=beam_size)  # fmt: skip
