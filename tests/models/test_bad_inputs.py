"""Each model's forward refuses bad input by name, before any computation (DESIGN.md: bad
input gets a clear error naming the argument, the expected and the received value): the
inputs a user of the model is most likely to get wrong (integer pixels, the wrong channel
count or size, a missing batch dim, float token ids or positions, ids outside the
vocabulary)."""

import pytest
import torch

from attnzoo.models.registry import MODELS

DIMS = {
    "image": dict(image_size=(28, 28), channels=1, classes=10),
    "bits": dict(input_size=5, output_size=4),
    "pointer": dict(input_dim=2, end_token=True),
    "multi_image": dict(image_size=(28, 28), channels=1, classes=10, labels=2),
    "caption": dict(vocab=12, max_len=6, image_size=(32, 32), channels=1),
    "seq2seq": dict(source_vocab=12, target_vocab=9, max_source_len=8, max_target_len=8),
    "lm": dict(vocab=12, max_len=8),
}
TOKENS, LENGTHS = torch.ones(2, 4, dtype=torch.long), torch.tensor([4, 3])
OUT_OF_VOCAB = torch.tensor([[1, 2, 12, 3], [1, 1, 1, 1]])  # id 12 of a vocabulary of 12
NEGATIVE = torch.tensor([[1, 2, 3, 4], [1, -1, 1, 1]])
IMAGES = torch.rand(2, 1, 28, 28)
IMAGES32 = torch.rand(2, 1, 32, 32)
DTYPE = "expected dtype torch.float32 \\(that of the module's parameters\\), got torch.float64"
# (inputs of the model's interface, error type, message pattern)
BAD = {
    "image": [
        (((IMAGES * 255).to(torch.uint8),), TypeError, "'images' expected a floating-point"),
        ((IMAGES[:, 0],), ValueError, "'images' expected \\(batch, 1, "),
        ((IMAGES.expand(2, 3, 28, 28),), ValueError, "'images' expected \\(batch, 1, "),
        # float64 into a float32 model: torch's 'mat1 and mat2 must have the same dtype'
        ((IMAGES.double(),), TypeError, "'images' " + DTYPE),
    ],
    "bits": [
        ((torch.ones(2, 7, 5, dtype=torch.long),), TypeError, "'inputs' expected a floating"),
        ((torch.rand(7, 5),), ValueError, "'inputs' expected a \\(batch, length, 5\\) tensor"),
        ((torch.rand(2, 7, 6),), ValueError, "'inputs' expected a \\(batch, length, 5\\) tensor"),
        ((torch.rand(2, 0, 5),), ValueError, "'inputs' expected .* with length >= 1, got"),
        ((torch.rand(2, 7, 5).double(),), TypeError, "'inputs' " + DTYPE),
    ],
    "pointer": [
        ((torch.ones(2, 5, 2, dtype=torch.long), torch.zeros(2, 6).long()), TypeError, "'points'"),
        ((torch.rand(2, 5, 2), torch.zeros(2, 6)), TypeError, "'targets' expected integer"),
        ((torch.rand(2, 5, 2), torch.zeros(2, 6).bool()), TypeError, "'targets' expected integer"),
        ((torch.rand(2, 5, 2), torch.full((2, 6), 6)), ValueError, "'targets' .* got 6 to 6"),
        # past n + 1 steps (the end token's) nothing is left to point at
        ((torch.rand(2, 5, 2), torch.zeros(2, 7).long()), ValueError, "'targets' .* 1 to 6 steps"),
        # no steps: the decoder's first input alone gave one step of output
        ((torch.rand(2, 5, 2), torch.zeros(2, 0).long()), ValueError, "'targets' .* 1 to 6 steps"),
        # a position twice before the end (a closed position would score about -3.4e38)
        (
            (torch.rand(2, 5, 2), torch.tensor([[1, 2, 0, 0, 0, 0], [3, 4, 3, 0, 0, 0]])),
            ValueError,
            "'targets' expected .* each at most once before the end, got position 3 again at "
            "step 2 of row 1",
        ),
        ((torch.rand(2, 5, 2).double(), torch.zeros(2, 6).long()), TypeError, "'points' " + DTYPE),
    ],
    "multi_image": [
        (((IMAGES * 255).to(torch.uint8),), TypeError, "'images' expected a floating-point"),
        ((IMAGES.expand(2, 3, 28, 28),), ValueError, "'images' expected \\(batch, 1, 28, 28\\)"),
        ((IMAGES.double(),), TypeError, "'images' " + DTYPE),
    ],
    "caption": [
        (
            (torch.rand(2, 1, 32, 32).double().to(torch.uint8), TOKENS, LENGTHS),
            TypeError,
            "'images'",
        ),
        ((torch.rand(2, 1, 28, 28), TOKENS, LENGTHS), ValueError, "'images' expected .*32, 32"),
        ((IMAGES32, TOKENS.float(), LENGTHS), TypeError, "'tokens_in' expected integer token"),
        ((IMAGES32.double(), TOKENS, LENGTHS), TypeError, "'images' " + DTYPE),
        ((IMAGES32, OUT_OF_VOCAB, LENGTHS), ValueError, "'tokens_in' expected token ids in 0..11"),
        ((IMAGES32, TOKENS[:1], LENGTHS), ValueError, "'tokens_in' expected batch size 2"),
        ((IMAGES32, TOKENS[:, :0], LENGTHS), ValueError, "'tokens_in' .* at least one position"),
        # lengths mark the doubly stochastic term's real steps: 1..steps, an integer per caption
        ((IMAGES32, TOKENS, LENGTHS + 1), ValueError, "'lengths' expected values in 1..steps = 4"),
        ((IMAGES32, TOKENS, LENGTHS - 3), ValueError, "'lengths' expected values in 1..steps"),
        ((IMAGES32, TOKENS, LENGTHS.float()), TypeError, "'lengths' expected an integer tensor"),
        ((IMAGES32, TOKENS, LENGTHS[:1]), ValueError, "'lengths' expected shape \\(2,\\)"),
    ],
    "seq2seq": [
        ((TOKENS.float(), LENGTHS, TOKENS), TypeError, "'source' expected integer token ids"),
        ((OUT_OF_VOCAB, LENGTHS, TOKENS), ValueError, "'source' expected token ids in 0..11 "),
        ((NEGATIVE, LENGTHS, TOKENS), ValueError, "'source' .* got ids from -1 to 4"),
        ((TOKENS, LENGTHS, OUT_OF_VOCAB.clamp(max=9)), ValueError, "'target_in' .*0..8 .*1 to 9"),
        ((TOKENS, LENGTHS, TOKENS[:1]), ValueError, "'target_in' expected batch size 2"),
        ((TOKENS, LENGTHS, TOKENS[:, :0]), ValueError, "'target_in' .* at least one position"),
        ((TOKENS, LENGTHS - 3, TOKENS), ValueError, "'lengths' expected values in 1..source_len"),
    ],
    "lm": [
        ((TOKENS.bool(),), TypeError, "'tokens' expected integer token ids"),
        (
            (OUT_OF_VOCAB,),
            ValueError,
            "'tokens' expected token ids in 0..11 .* got ids from 1 to 12",
        ),
        ((NEGATIVE,), ValueError, "'tokens' expected token ids in 0..11"),
    ],
}
CASES = [
    (name, *case)
    for name, spec in MODELS.items()
    if spec.interface in BAD
    for case in BAD[spec.interface]
]


@pytest.mark.parametrize(
    ("model", "inputs", "kind", "pattern"),
    CASES,
    ids=[f"{c[0]}-{k}" for k, c in enumerate(CASES)],
)
def test_a_model_refuses_bad_input_by_name(model, inputs, kind, pattern):
    spec = MODELS[model]
    net = spec.model_class(spec.preset(), **DIMS[spec.interface]).eval()
    # the model's name, or the method's that checks (e.g. Transformer.encode)
    with pytest.raises(kind, match=rf"{type(net).__name__}(\.\w+)?: argument {pattern}"):
        net(*inputs)


def test_every_model_of_these_interfaces_is_covered():
    """A model added with one of these interfaces gets the rows of its interface."""
    covered = {c[0] for c in CASES}
    assert covered == {n for n, s in MODELS.items() if s.interface in BAD}
    assert len(covered) >= 6
