"""The digit captions task (`attnzoo.tasks.captions`): the grammar, the boxes, determinism,
the correctness metric against a pixel-level float64 reference, the loss's parts."""

import dataclasses
import math
import re
from types import SimpleNamespace

import pytest
import torch
from tests.tasks.test_mnist import with_blank_part
from tests.train.test_distributed_loss import Wrapper

from attnzoo.models.show_attend_tell import CREDITS, ShowAttendTell, hard, soft
from attnzoo.tasks import captions
from attnzoo.tasks.base import EvalConfig
from attnzoo.tasks.captions import (
    BOS,
    END,
    INDEX,
    NUMBERS,
    PAD,
    WORDS,
    DigitCaptionsConfig,
    DigitCaptionsTask,
    attention_supervision,
    box_cover,
    collate,
    compose,
    detokenize,
    grown,
)
from attnzoo.tasks.mnist import DIGIT, MC_CHUNK

NP = r"a (small|large) (" + "|".join(NUMBERS) + ")"
PAIR = rf"{NP}( (above|left of) {NP})?"
GRAMMAR = re.compile(rf"^{PAIR}( and {PAIR})*$")


@pytest.fixture(scope="module")
def task(digits):
    config = DigitCaptionsConfig(n_test=40, n_valid=40)
    return DigitCaptionsTask(config, seed=0, eval_config=EvalConfig(batch_size=16))


def test_captions_follow_the_grammar_and_name_every_digit(task):
    scene = compose(
        task.config,
        task.digits.test_images,
        task.digits.test_labels,
        64,
        torch.Generator().manual_seed(0),
    )
    batch, texts = collate(scene)
    counts = (scene.slots >= 0).sum(-1)
    assert set(counts.tolist()) == {1, 2, 3, 4}
    for k, text in enumerate(texts):
        assert GRAMMAR.match(text), text
        named = [w for w in text.split() if w in NUMBERS]
        assert named == [NUMBERS[int(d)] for d in scene.labels[k] if d >= 0]
        assert int(batch.has_box[k].sum()) == int(counts[k])
        # the words with a box are the digit words, each with its own digit's box
        boxed = batch.has_box[k]
        assert [WORDS[i] for i in batch.tokens_out[k, boxed].tolist()] == named
        assert torch.equal(batch.boxes[k, boxed], scene.boxes[k, scene.labels[k] >= 0])
        assert detokenize(batch.tokens_out[k].tolist()) == text
        assert (
            batch.tokens_in[k, 0] == BOS and batch.tokens_out[k, int(batch.lengths[k]) - 1] == END
        )
    # a relation says where the first digit's quadrant is: above (different rows) or left of
    one = scene.slots[:, :2]
    for k, text in enumerate(texts):
        if int(counts[k]) >= 2:
            rel = "above" if int(one[k, 0]) // 2 < int(one[k, 1]) // 2 else "left of"
            assert text.split(" ", 3)[3].startswith(rel), text


def test_detokenize_keeps_a_pad_or_bos_before_the_end():
    """It stopped at <pad>: "one seven <pad> junk" scored as "one seven"."""
    ids = [WORDS.index("a"), PAD, WORDS.index("small"), BOS, END, WORDS.index("a"), PAD]
    assert detokenize(ids) == "a <pad> small <bos>"


def test_each_box_holds_its_digits_ink(task):
    """With one digit per image, nearly all of the image's ink lies inside its box."""
    config = DigitCaptionsConfig(min_digits=1, max_digits=1, n_valid=40)
    scene = compose(
        config,
        task.digits.train_images[:500],
        task.digits.train_labels[:500],
        32,
        torch.Generator().manual_seed(1),
    )
    box = scene.boxes[:, 0]  # (n, 4)
    assert (box[:, :2] >= 0).all() and (box[:, 2:] <= config.canvas).all()
    ys, xs = torch.meshgrid(torch.arange(64.0) + 0.5, torch.arange(64.0) + 0.5, indexing="ij")
    for k in range(32):
        x0, y0, x1, y1 = box[k].tolist()
        inside = (xs >= x0 - 1) & (xs < x1 + 1) & (ys >= y0 - 1) & (ys < y1 + 1)
        image = scene.images[k, 0]
        assert image[inside].sum() >= 0.97 * image.sum()
        side = x1 - x0 if x1 - x0 > y1 - y0 else y1 - y0
        small, large = config.small, config.large
        limit = large[1] if scene.large[k, 0] else small[1]
        assert side <= limit + 1e-4


def _ink_height(image: torch.Tensor) -> int:
    rows = (image >= 0.5).any(-1).nonzero()
    return int(rows.max() - rows.min()) + 1


def one_digit_scenes(task, pool=slice(None), **fields):
    """64 canvases of one digit each, drawn from the official test digits `pool`."""
    config = DigitCaptionsConfig(min_digits=1, max_digits=1, n_valid=40, **fields)
    images, labels = task.digits.test_images[pool], task.digits.test_labels[pool]
    return config, compose(config, images, labels, 64, torch.Generator().manual_seed(0))


def test_a_digit_is_drawn_in_the_quadrant_of_its_slot(task):
    """Slots are the quadrants in reading order: slot s is row s // 2, column s % 2. With one
    digit per image and no jitter, its ink lies in its slot's quadrant (every slot seen)."""
    config, scene = one_digit_scenes(task, jitter=0)
    half = config.canvas // 2
    assert set(scene.slots[:, 0].tolist()) == set(range(captions.SLOTS))
    for image, slot in zip(scene.images[:, 0], scene.slots[:, 0].tolist(), strict=True):
        top, left = slot // 2 * half, slot % 2 * half
        quadrant = image[top : top + half, left : left + half]
        assert image.sum() > 0 and quadrant.sum() >= 0.99 * image.sum(), slot


def test_the_size_word_says_how_large_the_digit_is_drawn(task):
    """A pool of one digit, so its ink's height at 28 x 28 is known: drawn small (a side of
    at most small[1] pixels) its ink is at most small[1] / 28 of that height, large at least
    large[0] / 28; the caption says "small" exactly where it is below their midpoint."""
    config, scene = one_digit_scenes(task, pool=slice(0, 1))
    native = _ink_height(task.digits.test_images[0].float() / 255)
    midpoint = (config.small[1] + config.large[0]) / 2 / DIGIT
    drawn = ["small" if _ink_height(x) / native < midpoint else "large" for x in scene.images[:, 0]]
    said = [text.split()[1] for text in collate(scene)[1]]
    assert said == drawn and set(said) == {"small", "large"}


def test_batches_are_a_pure_function_of_seed_and_step(task):
    a, b = task.batch(3, 8, "cpu"), task.batch(3, 8, "cpu")
    assert torch.equal(a.images, b.images) and torch.equal(a.tokens_out, b.tokens_out)
    c = task.batch(4, 8, "cpu")
    assert not torch.equal(a.images, c.images)
    half = task.batch(3, 8, "cpu", rank=1, world=2)
    assert torch.equal(half.images, a.images[1::2])


@pytest.mark.parametrize("split", ["train", "valid", "test"])
def test_each_split_draws_only_its_official_digits(task, split):
    """With the split's official digits blank (training: all but the last n_valid training
    digits; validation: those last n_valid; test: the official test digits), every image of
    the split is blank while those of another split are not. For the training batches half
    the training set is validation, so a draw from it would show within the batch."""
    n_valid = 30_000 if split == "train" else task.config.n_valid
    other = DigitCaptionsTask(dataclasses.replace(task.config, n_valid=n_valid), seed=0)
    other.digits = with_blank_part(task.digits, split, n_valid)

    def images(name):
        if name == "train":
            return other.batch(0, 64, "cpu").images
        return other.held_out(name)[0].images

    assert images(split).abs().sum() == 0
    assert images("test" if split == "train" else "train").sum() > 0


def test_box_cover_against_a_pixel_level_reference():
    """sum_l alpha_l cover_l equals the mass of the attention upsampled to pixels (each cell's
    weight spread evenly over its pixels) inside the box, for boxes at pixel edges."""
    g = torch.Generator().manual_seed(0)
    grid, canvas = (4, 8), 32
    weights = torch.rand(5, 32, generator=g, dtype=torch.float64).softmax(-1)
    corners = torch.randint(0, 30, (5, 2), generator=g).double()
    boxes = torch.cat([corners, corners + torch.randint(1, 9, (5, 2), generator=g)], -1).clamp(
        max=32
    )
    got = (weights * box_cover(boxes, grid, canvas)).sum(-1)
    for k in range(5):
        x0, y0, x1, y1 = (int(v) for v in boxes[k])
        total = 0.0
        for y in range(y0, y1):
            for x in range(x0, x1):
                cell = (y * grid[0] // canvas) * grid[1] + x * grid[1] // canvas
                total += float(weights[k, cell]) / ((canvas / grid[0]) * (canvas / grid[1]))
        assert got[k].item() == pytest.approx(total, rel=1e-12)
    uniform = torch.full((5, 32), 1 / 32, dtype=torch.float64)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) / canvas**2
    torch.testing.assert_close((uniform * box_cover(boxes, grid, canvas)).sum(-1), area)


def test_grown_boxes_against_a_pixel_level_reference():
    """The mass inside a box grown by a cell: that of the attention upsampled to pixels over
    the box's pixels and every pixel within one cell's width (columns) or height (rows) of
    it, on the canvas; for a box at the edge too."""
    g = torch.Generator().manual_seed(1)
    grid, canvas = (4, 8), 32  # cells 4 wide, 8 high
    weights = torch.rand(6, 32, generator=g, dtype=torch.float64).softmax(-1)
    corners = torch.randint(0, 30, (6, 2), generator=g).double()
    corners[0] = 0  # at the top left corner: nothing to grow into there
    boxes = torch.cat([corners, corners + torch.randint(1, 9, (6, 2), generator=g)], -1).clamp(
        max=32
    )
    got = (weights * box_cover(grown(boxes, grid, canvas), grid, canvas)).sum(-1)
    for k in range(6):
        x0, y0, x1, y1 = (int(v) for v in boxes[k])
        total = 0.0
        for y in range(max(0, y0 - 8), min(canvas, y1 + 8)):
            for x in range(max(0, x0 - 4), min(canvas, x1 + 4)):
                cell = (y * grid[0] // canvas) * grid[1] + x * grid[1] // canvas
                total += float(weights[k, cell]) / ((canvas / grid[0]) * (canvas / grid[1]))
        assert got[k].item() == pytest.approx(total, rel=1e-12)


def test_near_correctness_of_uniform_attention_is_the_grown_area(task):
    """Uniform attention puts in the grown box its share of the canvas: near_correctness is
    the mean over digit words of that area (one cell of the 8 x 8 map is canvas / 8 wide and
    high), and at least the correctness."""
    small = dict(channels=(4, 8, 8, 8), embed_dim=8, hidden=8, attn_hidden=8, dropout=0.0)
    model = ShowAttendTell(soft(**small), **task.model_dims()).eval()
    with torch.no_grad():
        for p in model.score.parameters():
            p.zero_()  # every logit 0: uniform weights
    metrics = task.evaluate(model)
    batch, _ = task.held_out("test")
    canvas = task.config.canvas
    cell = canvas / 8
    areas = []
    for x0, y0, x1, y1 in batch.boxes[batch.has_box].tolist():
        width = min(canvas, x1 + cell) - max(0, x0 - cell)
        height = min(canvas, y1 + cell) - max(0, y0 - cell)
        areas.append(width * height / canvas**2)
    assert metrics["near_correctness"] == pytest.approx(sum(areas) / len(areas), rel=1e-5)
    assert metrics["near_correctness"] > metrics["correctness"]


def test_the_loss_adds_the_penalty_and_counts_real_tokens(task):
    torch.manual_seed(0)
    small = dict(channels=(4, 8, 8), embed_dim=8, hidden=8, attn_hidden=8, dropout=0.0)
    model = ShowAttendTell(soft(**small), **task.model_dims())
    batch = task.batch(0, 4, "cpu")
    loss, count = task.loss(model, batch)
    assert count == int((batch.tokens_out != 0).sum())
    out = model(batch.images, batch.tokens_in, batch.lengths, sample=True)
    nll = -(
        out.log_probs.gather(-1, batch.tokens_out.unsqueeze(-1)).squeeze(-1)
        * (batch.tokens_out != 0)
    ).sum()
    assert loss.item() == pytest.approx((nll + out.penalty).item(), rel=1e-5)
    hard_model = ShowAttendTell(hard(**small), **task.model_dims())
    assert not bool(hard_model.reward_baseline.started)
    loss, _ = task.loss(hard_model, batch)
    loss.backward()
    assert bool(hard_model.reward_baseline.started)  # the moving average has its first value
    assert hard_model.score.query_proj.weight.grad.abs().max() > 0
    # every image attending by expectation: no policy term, the baseline left unstarted
    every = ShowAttendTell(hard(**small, expectation_rate=1.0), **task.model_dims())
    every.load_state_dict(hard_model.state_dict())
    every.reward_baseline.started.fill_(False)
    every.reward_baseline.value.zero_()
    loss, _ = task.loss(every, batch)
    g = torch.Generator().manual_seed(task.seed * 7 + batch.step)  # the loss's own draws
    out = every(batch.images, batch.tokens_in, batch.lengths, sample=True, generator=g)
    real = batch.tokens_out != 0
    nll = -(out.log_probs.gather(-1, batch.tokens_out.unsqueeze(-1)).squeeze(-1) * real).sum()
    assert out.expected.all() and loss.item() == pytest.approx(nll.item(), rel=1e-6)
    assert not bool(every.reward_baseline.started)
    # the loss passes the batch's step: at step 0 of a warm-up every image attends by
    # expectation, so the baseline stays unstarted; after it, images sample again
    warm = ShowAttendTell(hard(**small, expectation_warmup=10), **task.model_dims())
    task.loss(warm, batch)
    assert batch.step == 0 and not bool(warm.reward_baseline.started)
    task.loss(warm, task.batch(10, 4, "cpu"))
    assert bool(warm.reward_baseline.started)


def test_to_go_credit_is_the_words_from_each_step_on_against_reading_by_expectation(task):
    """credit="to_go": the policy term of step t weighs log pi_t by the log-likelihood of the
    words from t on minus theirs when every step reads by expectation (a float64 reference
    with a reversed cumulative sum), in place of the caption credit's whole-caption reward and
    moving average."""
    torch.manual_seed(0)
    small = dict(channels=(4, 8, 8), embed_dim=8, hidden=8, attn_hidden=8, dropout=0.0)
    config = hard(**small, expectation_rate=0.0, entropy_weight=0.0, credit="to_go")
    model = ShowAttendTell(config, **task.model_dims()).double()
    assert not hasattr(model, "reward_baseline")
    batch = task.batch(3, 6, "cpu")
    batch = batch._replace(images=batch.images.double())
    loss, _ = task.loss(model, batch)
    g = torch.Generator().manual_seed(task.seed * 7 + batch.step)  # the loss's own draws
    inputs = (batch.images, batch.tokens_in, batch.lengths)
    out = model(*inputs, sample=True, generator=g, step=batch.step)
    ref = model(*inputs, sample=False, expectation=True)
    real = batch.tokens_out != 0

    def words(log_probs):
        return log_probs.gather(-1, batch.tokens_out.unsqueeze(-1)).squeeze(-1) * real

    to_go = lambda x: x.flip(1).cumsum(1).flip(1)  # noqa: E731
    advantage = to_go(words(out.log_probs)) - to_go(words(ref.log_probs))
    expected = -words(out.log_probs).sum() - (advantage * out.log_pi * real).sum()
    assert out.expected is None  # expectation_rate 0: every image samples
    assert loss.item() == pytest.approx(expected.item(), rel=1e-9)
    assert advantage.abs().max() > 1e-3  # the samples did change the words' likelihood


@pytest.mark.parametrize(("reinforce_weight", "entropy_weight"), [(1.0, 0.0), (0.3, 0.05)])
def test_caption_credit_baseline_is_the_first_batch_mean_then_the_moving_average(
    task, reinforce_weight, entropy_weight
):
    """credit="caption" (Xu 2015 eq. 12): every step of a sampled caption is credited with the
    caption's log-likelihood minus a baseline. At the first step the baseline is that batch's
    mean (the tracker holds no log-likelihood yet); from then on it is the moving average as it
    stood before the step, which the step then moves by (1 - momentum) toward its own mean
    (a float64 reference of each step's loss and of the tracker). The policy term is weighted
    by lambda_r (reinforce_weight) and the entropy bonus lambda_e sum_t H_t over the real steps,
    H_t = -sum_l alpha_tl log alpha_tl, is subtracted (entropy_weight)."""
    torch.manual_seed(0)
    small = dict(channels=(4, 8, 8), embed_dim=8, hidden=8, attn_hidden=8, dropout=0.0)
    config = hard(
        **small,
        expectation_rate=0.0,
        entropy_weight=entropy_weight,
        reinforce_weight=reinforce_weight,
        baseline_momentum=0.75,
    )
    model = ShowAttendTell(config, **task.model_dims()).double()
    tracker = model.reward_baseline
    for step in (3, 4):
        batch = task.batch(step, 6, "cpu")
        batch = batch._replace(images=batch.images.double())
        started, before = bool(tracker.started), tracker.value.item()
        loss, _ = task.loss(model, batch)
        g = torch.Generator().manual_seed(task.seed * 7 + batch.step)  # the loss's own draws
        out = model(batch.images, batch.tokens_in, batch.lengths, sample=True, generator=g)
        real = batch.tokens_out != 0
        words = out.log_probs.gather(-1, batch.tokens_out.unsqueeze(-1)).squeeze(-1) * real
        reward = words.sum(-1).detach()  # (b,) log p(y | s, a)
        baseline = before if started else reward.mean().item()
        policy = -((reward - baseline)[:, None] * out.log_pi * real).sum()
        alpha = out.weights  # (b, steps, locations)
        entropy = -(alpha * alpha.clamp_min(1e-300).log()).sum(-1)  # (b, steps)
        expected = (
            -words.sum() + reinforce_weight * policy - entropy_weight * (entropy * real).sum()
        )
        assert out.expected is None  # expectation_rate 0: every image samples
        assert loss.item() == pytest.approx(expected.item(), rel=1e-9)
        moved = 0.75 * before + 0.25 * reward.mean().item() if started else reward.mean().item()
        assert tracker.value.item() == pytest.approx(moved, rel=1e-12)
        assert bool(tracker.started)
    assert reward.std() > 1e-3  # the captions' rewards differ: the baseline matters


@pytest.mark.parametrize("credit", CREDITS)
def test_hard_loss_runs_on_the_device(task, credit, device):
    small = dict(channels=(4, 8, 8), embed_dim=8, hidden=8, attn_hidden=8, credit=credit)
    model = ShowAttendTell(hard(**small), **task.model_dims()).to(device)
    loss, _ = task.loss(model, task.batch(0, 4, device))
    loss.backward()
    assert loss.device.type == device.type
    assert all(p.grad.device.type == device.type for p in model.parameters() if p.grad is not None)


def test_evaluate_reports_bleu_with_its_signature_and_correctness(task):
    torch.manual_seed(0)
    small = dict(channels=(4, 8, 8), embed_dim=8, hidden=8, attn_hidden=8, dropout=0.0)
    model = ShowAttendTell(soft(**small), **task.model_dims()).eval()
    metrics = task.evaluate(model)
    assert metrics["n"] == 40
    assert {f"bleu{k}" for k in range(1, 5)} <= set(metrics)
    assert "tok:13a" in metrics["sacrebleu"]
    assert 0 <= metrics["correctness"] <= 1 and 0 < metrics["uniform_correctness"] < 1
    assert metrics["correctness_over_uniform"] == pytest.approx(
        metrics["correctness"] / metrics["uniform_correctness"]
    )


def test_bleu_n_counts_n_grams_up_to_n(task, monkeypatch):
    """Each caption decoded as its reference's first two words ("a small", "a large"): every
    unigram and bigram is in the reference (p_1 = p_2 = 1), so BLEU-1 = BLEU-2 = 100 BP with
    BP = exp(1 - r / c) (r, c: the summed reference and hypothesis word counts). There is no
    trigram to match: BLEU-3 and BLEU-4 are 0 (sacrebleu's score of a corpus without one)."""
    batch, references = task.held_out(task.eval_config.split)
    by_image = {
        bytes(image.numpy()): ref for image, ref in zip(batch.images, references, strict=True)
    }

    def decode(model, images, generator=None, **kwargs):
        prefixes = [by_image[bytes(image.cpu().numpy())].split()[:2] for image in images]
        return [[WORDS.index(w) for w in words] + [END] for words in prefixes]

    class Stub(torch.nn.Module):  # no attention weights: no correctness
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))

        def forward(self, *args, **kwargs):
            return SimpleNamespace(weights=None)

    monkeypatch.setattr(task, "decode", decode)
    metrics = task.evaluate(Stub())
    assert metrics["n"] == len(references) == 40
    r = sum(len(ref.split()) for ref in references)
    want = 100 * math.exp(1 - r / (2 * len(references)))
    assert metrics["bleu1"] == pytest.approx(want, rel=1e-9)
    assert metrics["bleu2"] == pytest.approx(want, rel=1e-9)
    assert metrics["bleu3"] == metrics["bleu4"] == 0.0


@pytest.mark.parametrize("variant", ["soft", "hard"])
def test_supervised_attention_loss_runs_on_the_device(task, variant, device):
    """The supervision term's box maps are made on the batch's device (meta included)."""
    small = dict(channels=(4, 8, 8), embed_dim=8, hidden=8, attn_hidden=8)
    make = {"soft": soft, "hard": hard}[variant]
    model = ShowAttendTell(make(**small, attention_supervision=1.0), **task.model_dims())
    model = model.to(device)
    loss, _ = task.loss(model, task.batch(0, 4, device))
    loss.backward()
    assert loss.device.type == device.type
    assert model.score.key_proj.weight.grad.device.type == device.type


def test_attention_supervision_against_a_pixel_level_reference():
    """Liu 2017's strong supervision: per word with a box, -sum_l beta_l log alpha_l with
    beta_l the share of the box's pixels in cell l (a float64 loop over pixels); words
    without a box add nothing; a weight that underflowed to 0 inside a box gives a finite
    loss; and descending the loss moves attention into the boxes."""
    g = torch.Generator().manual_seed(1)
    grid, canvas, b, t = (4, 4), 16, 2, 5
    corners = torch.randint(0, 12, (b, t, 2), generator=g).double()
    boxes = torch.cat([corners, corners + torch.randint(1, 5, (b, t, 2), generator=g)], -1)
    has_box = torch.rand(b, t, generator=g) < 0.5
    has_box[0, 0] = True
    batch = SimpleNamespace(boxes=boxes, has_box=has_box)
    logits = torch.randn(b, t, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weights = logits.softmax(-1)
    expected = 0.0
    for i in range(b):
        for j in range(t):
            if not has_box[i, j]:
                continue
            x0, y0, x1, y1 = (int(v) for v in boxes[i, j])
            pixels = [0.0] * 16
            for y in range(y0, y1):
                for x in range(x0, x1):
                    pixels[(y * grid[0] // canvas) * grid[1] + x * grid[1] // canvas] += 1
            total = sum(pixels)
            expected -= sum(n / total * math.log(weights[i, j, k].item()) for k, n in
                            enumerate(pixels) if n)  # fmt: skip
    got = attention_supervision(weights, batch, grid, canvas)
    assert got.item() == pytest.approx(expected, rel=1e-12)
    dead = weights.detach().clone()
    dead[has_box] = torch.nn.functional.one_hot(torch.tensor(15), 16).double()  # 0 elsewhere
    assert torch.isfinite(attention_supervision(dead, batch, grid, canvas))

    def mass():
        return (logits.softmax(-1)[has_box] * box_cover(boxes[has_box], grid, canvas)).sum()

    before = mass().item()
    optimizer = torch.optim.SGD([logits], lr=0.5)
    for _ in range(20):
        optimizer.zero_grad()
        attention_supervision(logits.softmax(-1), batch, grid, canvas).backward()
        optimizer.step()
    assert mass().item() > before + 0.5


@pytest.mark.parametrize("variant", ["soft", "hard"])
def test_the_loss_adds_the_weighted_attention_supervision(task, variant):
    """`model.attention_supervision` w adds w times `attention_supervision` of the model's own
    weights on the batch to the loss, for both variants; at 0 the loss is the paper's."""
    small = dict(channels=(4, 8, 8), embed_dim=8, hidden=8, attn_hidden=8, dropout=0.0)
    make = {"soft": soft, "hard": hard}[variant]
    torch.manual_seed(0)
    plain = ShowAttendTell(make(**small), **task.model_dims()).double()
    supervised = ShowAttendTell(make(**small, attention_supervision=0.7), **task.model_dims())
    supervised = supervised.double()
    supervised.load_state_dict(plain.state_dict())
    batch = task.batch(2, 6, "cpu")
    batch = batch._replace(images=batch.images.double(), boxes=batch.boxes.double())
    base, _ = task.loss(plain, batch)
    loss, _ = task.loss(supervised, batch)
    g = torch.Generator().manual_seed(task.seed * 7 + batch.step)  # the loss's own draws
    inputs = (batch.images, batch.tokens_in, batch.lengths)
    out = plain(*inputs, sample=True, generator=g, step=batch.step)
    term = attention_supervision(out.weights, batch, out.grid, task.config.canvas)
    assert term.item() > 0
    assert loss.item() - base.item() == pytest.approx(0.7 * term.item(), rel=1e-9)


@pytest.mark.parametrize("variant", ["soft", "hard"])
def test_the_loss_reads_the_model_inside_a_distributed_wrapper(task, variant):
    """Under torchrun the loop passes `DistributedDataParallel(model)`, which holds the model
    as `.module` and has no `config`: the loss reads its options (attention supervision,
    credit, weights) and the moving-average baseline from the model inside, with the same
    result as on the bare model."""

    small = dict(channels=(4, 8, 8), embed_dim=8, hidden=8, attn_hidden=8, dropout=0.0)
    make = {"soft": soft, "hard": hard}[variant]
    torch.manual_seed(0)
    bare = ShowAttendTell(make(**small, attention_supervision=0.5), **task.model_dims())
    inside = ShowAttendTell(make(**small, attention_supervision=0.5), **task.model_dims())
    inside.load_state_dict(bare.state_dict())
    batch = task.batch(1, 4, "cpu")
    want, _ = task.loss(bare, batch)
    got, _ = task.loss(Wrapper(inside), batch)
    assert got.item() == pytest.approx(want.item(), rel=1e-6)


def test_size_word_correctness_scores_each_box_one_step_earlier(task):
    """`size_word_correctness` reads the step before each digit word: a model whose attention
    is moved one step earlier scores there what the unmoved one scores at the digit words."""
    torch.manual_seed(0)
    small = dict(channels=(4, 8, 8), embed_dim=8, hidden=8, attn_hidden=8, dropout=0.0)
    model = ShowAttendTell(soft(**small), **task.model_dims()).eval()
    with torch.no_grad():  # sharp attention that differs from step to step
        for p in model.score.parameters():
            p.mul_(30)
    plain = task.evaluate(model)
    forward = model.forward

    def earlier(*args, **kwargs):
        out = forward(*args, **kwargs)
        w = out.weights
        return dataclasses.replace(out, weights=torch.cat([w[:, 1:], w[:, -1:]], 1))

    model.forward = earlier
    moved = task.evaluate(model)
    assert moved["size_word_correctness"] == pytest.approx(plain["correctness"], rel=1e-6)
    assert plain["size_word_correctness"] != pytest.approx(plain["correctness"], rel=0.05)


def test_evaluate_decodes_a_hard_model_also_by_expectation(task):
    """A hard model's `exact_match_expected_pct` is its captions decoded by the expectation;
    the sampled metrics are those of decoding without that pass (its own generator)."""
    torch.manual_seed(0)
    small = dict(channels=(4, 8, 8), embed_dim=8, hidden=8, attn_hidden=8, dropout=0.0)
    model = ShowAttendTell(hard(**small), **task.model_dims()).eval()
    metrics = task.evaluate(model)
    batch, references = task.held_out("test")
    images = batch.images[: metrics["n"]]
    by_expectation = [detokenize(x) for x in task.decode(model, images, expectation=True)]
    exact = sum(h == r for h, r in zip(by_expectation, references, strict=False))
    assert metrics["exact_match_expected_pct"] == pytest.approx(100 * exact / metrics["n"])
    # the same model under a variant name evaluate does not know as hard (it attends and
    # samples the same way) gets no expectation pass, and the same sampled scores (in parts of
    # eval.batch_size, which a known hard model's parts are not: MC_CHUNK)
    model.config = SimpleNamespace(**{**vars(model.config), "variant": "hard, unnamed"})
    wide = DigitCaptionsTask(task.config, seed=0, eval_config=EvalConfig(batch_size=MC_CHUNK))
    without = wide.evaluate(model)
    assert "exact_match_expected_pct" not in without
    assert {k: v for k, v in metrics.items() if k != "exact_match_expected_pct"} == without
    soft_metrics = task.evaluate(ShowAttendTell(soft(**small), **task.model_dims()).eval())
    assert "exact_match_expected_pct" not in soft_metrics


def test_a_hard_models_scores_do_not_depend_on_the_evaluation_batch(task):
    """A hard model samples a location per image and step from one stream: evaluated in parts
    of eval.batch_size, the locations an image drew (so its caption, BLEU and correctness)
    depended on how many images shared its part. Its parts are now MC_CHUNK images."""
    torch.manual_seed(0)
    small = dict(channels=(4, 8, 8), embed_dim=8, hidden=8, attn_hidden=8, dropout=0.0)
    model = ShowAttendTell(hard(**small), **task.model_dims()).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4)  # sharper: the sampled locations change the words
    scores = [
        DigitCaptionsTask(task.config, seed=0, eval_config=EvalConfig(batch_size=size)).evaluate(
            model
        )
        for size in (7, 16, MC_CHUNK)
    ]
    assert scores[0] == scores[1] == scores[2]


def test_vocabulary_and_config_errors():
    assert WORDS[0] == "<pad>" and INDEX["<end>"] == END
    with pytest.raises(ValueError, match="max_digits"):
        DigitCaptionsConfig(max_digits=5)
    with pytest.raises(ValueError, match="large"):
        DigitCaptionsConfig(small=(14, 20), large=(18, 30))
    with pytest.raises(ValueError, match="small"):
        DigitCaptionsConfig(small=(14,))
    longest = scene_words(4)
    assert len(longest) + 1 == captions.MAX_LEN  # + <end>


def scene_words(k: int) -> list[str]:
    """The words of a caption of k digits with the longest relation ("left of") in each pair."""
    words = []
    for p in range(0, k, 2):
        words += ["and"] * bool(p) + ["a", "large", "one"]
        if p + 1 < k:
            words += ["left", "of", "a", "small", "two"]
    return words


def test_figures_and_explorer_show_each_words_attention(task, tmp_path):
    """The hard model's explorer rows are the sampled cells (one-hot) and the picture is
    written; every row of the explorer is one output word (or <end>)."""
    torch.manual_seed(0)
    small = dict(channels=(4, 8, 8), embed_dim=8, hidden=8, attn_hidden=8)
    for config in (soft(**small), hard(**small)):
        model = ShowAttendTell(config, **task.model_dims()).eval()
        if config.variant == "hard":  # one picture is enough to see it written
            (path,) = task.figures(model, tmp_path, count=1)
            assert path.name == "captions.png" and path.stat().st_size > 0
        data = task.explore(model, 2)
        gh, gw = model.grid
        for example in data["examples"]:
            (kind,) = example["attention"]
            w = kind["weights"][0, 0]
            assert kind["rows"] == [*example["prediction"].split(), "<end>"][: len(w)]
            assert example["grid"] == [gh, gw] and w.shape[-1] == gh * gw
            if config.variant == "hard":
                assert ((w == 0) | (w == 1)).all()
                assert example["sizes"] == [task.config.canvas // gh]


def test_the_explorer_refuses_a_grid_that_does_not_fit_the_columns(task):
    from attnzoo.viz.explore import validate

    torch.manual_seed(0)
    small = dict(channels=(4, 8, 8), embed_dim=8, hidden=8, attn_hidden=8)
    data = task.explore(ShowAttendTell(soft(**small), **task.model_dims()).eval(), 1)
    validate(data)
    data["examples"][0]["grid"] = [3, 5]
    with pytest.raises(ValueError, match="grid"):
        validate(data)
