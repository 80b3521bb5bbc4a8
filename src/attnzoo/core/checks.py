"""Argument checks shared by the core: one place that words every error message.

Every error names the argument, what was expected and what was received, and is raised before
any computation (DESIGN.md: bad input gets a clear error).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Sequence

import torch


def fail(function: str, argument: str, expected: str, received: object, kind=ValueError):
    """Raise `kind` with the project's one message format."""
    raise kind(f"{function}: argument '{argument}' expected {expected}, got {received}")


def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...] | None:
    """The broadcast of `shapes`, or None when they do not broadcast. Plain Python: torch's
    `broadcast_shapes` cost ~15 us a call here, as much as a whole small SDPA call."""
    rank = max(len(s) for s in shapes)
    out = [1] * rank
    for shape in shapes:
        for k, size in enumerate(shape, rank - len(shape)):
            if size != 1:
                if out[k] not in (1, size):
                    return None
                out[k] = size
    return tuple(out)


def check_tensor(function: str, argument: str, tensor: object, ranks: Sequence[int]) -> None:
    if not isinstance(tensor, torch.Tensor):
        fail(function, argument, "a torch.Tensor", type(tensor).__name__, TypeError)
    if tensor.dim() not in ranks:
        wanted = " or ".join(str(r) for r in ranks)
        fail(function, argument, f"a tensor of rank {wanted}", f"shape {tuple(tensor.shape)}")


def check_floating(function: str, argument: str, tensor: object) -> None:
    """A floating-point tensor: what attention weighs and sums (an integer, bool or complex
    tensor would fail deep inside an op, or be computed in integer arithmetic)."""
    if not isinstance(tensor, torch.Tensor):
        fail(function, argument, "a floating-point torch.Tensor", type(tensor).__name__, TypeError)
    if not tensor.is_floating_point():
        fail(function, argument, "a floating-point torch.Tensor", tensor.dtype, TypeError)


def check_images(
    function: str,
    images: object,
    channels: int | None = None,
    size: Sequence[int] | None = None,
    like: torch.nn.Module | None = None,
) -> None:
    """A floating (batch, channels, H, W) tensor, with the model's channels and (height,
    width) where given (an integer image, e.g. uint8 pixels, must be scaled by the caller),
    and the dtype and device of the parameters of `like` (the model)."""
    check_floating(function, "images", images)
    check_like_module(function, "images", images, like)
    if (
        images.dim() != 4
        or (channels is not None and images.shape[1] != channels)
        or (size is not None and tuple(images.shape[-2:]) != tuple(size))
    ):
        h, w = size if size is not None else ("H", "W")
        wanted = f"(batch, {'channels' if channels is None else channels}, {h}, {w})"
        fail(function, "images", wanted, tuple(images.shape))


def check_sequences(
    function: str,
    argument: str,
    x: object,
    features: int,
    *,
    empty: bool = True,
    like: torch.nn.Module | None = None,
) -> None:
    """A floating (batch, length, features) tensor; without `empty`, length >= 1 (a recurrent
    model has no output for no steps); the dtype and device of `like`'s parameters."""
    check_floating(function, argument, x)
    check_like_module(function, argument, x, like)
    if x.dim() != 3 or x.shape[-1] != features or (not empty and x.shape[1] == 0):
        least = "" if empty else " with length >= 1"
        fail(function, argument, f"a (batch, length, {features}) tensor{least}", tuple(x.shape))


def check_tokens(
    function: str,
    argument: str,
    tokens: object,
    rank: int,
    what: str,
    vocab: int | None = None,
    *,
    batch: tuple[int, str] | None = None,
) -> None:
    """Integer token ids of `rank` dims (`what` names them, e.g. "(batch, len)"), with
    `vocab` also each id in 0..vocab - 1. The ids are read on the CPU only (~5 us): on an
    accelerator the read would stall its queue, and the embedding's own index check stops an
    id out of range there; a decoding step passes no `vocab` (its ids are the engine's picks).
    `batch` (size, whose): teacher-forced input, at least one position in a batch of that
    size."""
    check_tensor(function, argument, tokens, (rank,))
    if not is_integer_tensor(tokens):
        fail(function, argument, f"integer token ids {what}", tokens.dtype, TypeError)
    if batch is not None:
        size, whose = batch
        if tokens.shape[0] != size:
            fail(function, argument, f"batch size {size} (that of {whose})", tokens.shape[0])
        if tokens.shape[-1] == 0:
            fail(function, argument, f"{what} with at least one position", tuple(tokens.shape))
    if vocab is not None and tokens.is_cpu and tokens.numel():
        low, high = _extremes(tokens)
        if low < 0 or high >= vocab:
            wanted = f"token ids in 0..{vocab - 1} (a vocabulary of {vocab})"
            fail(function, argument, wanted, f"ids from {low} to {high}")


def _extremes(tensor: torch.Tensor) -> tuple[int, int]:
    """The smallest and largest value of a non-empty integer tensor: one pass, one read."""
    low, high = torch.aminmax(tensor)
    return int(low), int(high)


def is_integer_tensor(tensor: torch.Tensor) -> bool:
    """An integer dtype (not floating, complex or bool): token ids, lengths, class indices."""
    return not (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool)


def check_integers(
    function: str,
    argument: str,
    value: object,
    shape: Sequence[int],
    low: int,
    high: int,
    *,
    kind: str = "an integer tensor",
    values: str,
    shape_note: str = "",
) -> None:
    """An integer tensor (`kind` words it) of `shape`, its values in [low, high] (`values`
    words the range); the values are read, except on the meta device, which has none."""
    if not isinstance(value, torch.Tensor):
        fail(function, argument, kind, type(value).__name__, TypeError)
    if not is_integer_tensor(value):
        fail(function, argument, kind, value.dtype, TypeError)
    if tuple(value.shape) != tuple(shape):
        fail(function, argument, f"shape {tuple(shape)}{shape_note}", tuple(value.shape))
    if value.device.type != "meta" and value.numel():
        smallest, largest = _extremes(value)
        if smallest < low or largest > high:
            fail(function, argument, values, f"{smallest} to {largest}")


def check_labels(
    function: str, argument: str, labels: object, classes: int, shape: Sequence[int]
) -> None:
    """Integer class indices of `shape`, each in [0, classes): a label past the classes would
    fail in one_hot or an embedding, a negative one index from the end."""
    kind, values = "an integer tensor of class indices", f"class indices in [0, {classes})"
    check_integers(function, argument, labels, shape, 0, classes - 1, kind=kind, values=values)


def check_count(function: str, argument: str, value: object, optional: bool = False) -> None:
    """A count (a length, an offset) is a non-negative int; `optional`: None too."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail(function, argument, "a non-negative int" + " or None" * optional, repr(value))


def check_number(
    function: str,
    argument: str,
    value: object,
    expected: str = "a finite number",
    low: float = -math.inf,
    high: float = math.inf,
) -> None:
    """A finite real number (a bool refused) in [low, high]; `expected` words the range."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        fail(function, argument, expected, repr(value))


def check_same_kind(function: str, reference: str, tensor: torch.Tensor, others: dict) -> None:
    """Dtype and device of every tensor in `others` must match `tensor`'s."""
    for name, other in others.items():
        if other.dtype != tensor.dtype:
            fail(
                function,
                name,
                f"dtype {tensor.dtype} (that of '{reference}')",
                other.dtype,
                TypeError,
            )
        if other.device != tensor.device:
            fail(function, name, f"device {tensor.device} (that of '{reference}')", other.device)


_MASK_DIMS = {3: "(batch, query_len, key_len)", 4: "(batch, heads, query_len, key_len)"}


def check_mask(
    function: str,
    mask: torch.Tensor | None,
    weights_shape: Sequence[int],
    device: torch.device,
    *,
    full_rank: bool = False,
) -> None:
    """A mask is boolean (True = may attend) and broadcastable to the weights' shape; with
    `full_rank` (what a user passes to a public entry) also of the weights' rank, or a
    (key_len,) mask shared by every query. A mask of other fewer dims lines up from the right,
    so where sizes happen to agree its batch dim would be read as the heads' (a (batch, 1,
    key_len) padding mask of 4-D attention with batch == heads) or a (batch, key_len) one as
    (query_len, key_len): another mask, silently."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        fail(function, "mask", "a bool torch.Tensor", type(mask).__name__, TypeError)
    if mask.dtype != torch.bool:
        fail(function, "mask", "dtype torch.bool (True = may attend)", mask.dtype, TypeError)
    if mask.device != device:
        fail(function, "mask", f"device {device}", mask.device)
    if full_rank and mask.dim() not in (1, len(weights_shape)):
        rank = len(weights_shape)
        dims = _MASK_DIMS.get(rank, "")
        wanted = f"rank {rank} {dims}, each dim 1 or the weights' {tuple(weights_shape)}"
        wanted += " (or a (key_len,) mask)"
        fail(function, "mask", wanted, f"shape {tuple(mask.shape)}")
    if not _broadcasts_to(mask.shape, weights_shape):
        fail(
            function,
            "mask",
            f"a shape broadcastable to the weights {tuple(weights_shape)}",
            tuple(mask.shape),
        )


def _broadcasts_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    """Whether `shape` broadcasts to `target` itself (no dim of `target` grows). A plain
    loop: it runs at every masked attention call (0.3 us here, against 1.0 for `all` over a
    zip)."""
    k = len(target) - len(shape)
    if k < 0:
        return False
    for size in shape:
        if size != 1 and size != target[k]:
            return False
        k += 1
    return True


def check_size(function: str, argument: str, value: object, optional: bool = False) -> None:
    """A size is a positive int (a bool or a float such as 2.0 is refused, not truncated);
    `optional`: None too."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        fail(function, argument, "a positive int" + " or None" * optional, repr(value))


def check_image_size(function: str, image_size: object) -> tuple[int, int]:
    """An image size is a (height, width) pair of positive ints; returned as a tuple."""
    if not matches(image_size, tuple[int, int]) or min(image_size) <= 0:
        fail(function, "image_size", "(height, width), two positive ints", repr(image_size))
    return tuple(image_size)


def check_like_parameter(
    function: str, argument: str, tensor: torch.Tensor, parameter: torch.Tensor
) -> None:
    """`tensor` has the dtype and device of a module's `parameter`. Under autocast a dtype
    other than the parameter's is the point (the ops cast), so only the device is checked."""
    if tensor.dtype != parameter.dtype and not torch.is_autocast_enabled(tensor.device.type):
        fail(
            function,
            argument,
            f"dtype {parameter.dtype} (that of the module's parameters)",
            tensor.dtype,
            TypeError,
        )
    if tensor.device != parameter.device:
        fail(
            function,
            argument,
            f"device {parameter.device} (that of the module's parameters)",
            tensor.device,
        )


def one_dtype_under_autocast(*tensors):
    """Under autocast, floating tensors of mixed dtypes (a query projected in bfloat16 beside
    float32 keys or memory) promoted to one dtype, as an eager op on them would; the attention
    kernels take one. Anything else (no autocast, one dtype, a non-tensor) as given, for the
    checks to judge."""
    if not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in tensors):
        return tensors
    first = tensors[0]
    if all(t.dtype == first.dtype for t in tensors) or autocast_dtype(first) is None:
        return tensors
    dtype = first.dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return tuple(t.to(dtype) for t in tensors)


def autocast_dtype(tensor: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast runs matrix products in on `tensor`'s device, or None where it is
    off (never on for a device type autocast does not know: `meta`)."""
    device_type = tensor.device.type
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
    except RuntimeError:  # "unknown device type for autocast"
        return None
    return torch.get_autocast_dtype(device_type)


def check_like_module(
    function: str, argument: str, tensor: torch.Tensor, module: torch.nn.Module | None
) -> None:
    """`check_like_parameter` against `module`'s first parameter (nothing without one): a
    float64 input to a float32 model was torch's 'mat1 and mat2 must have the same dtype'."""
    parameter = None if module is None else next(module.parameters(), None)
    if parameter is not None:
        check_like_parameter(function, argument, tensor, parameter)


def check_dropout(function: str, dropout: float) -> None:
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        fail(function, "dropout", "a probability in [0, 1)", repr(dropout))


def check_flag(function: str, argument: str, value: object) -> None:
    """A flag is True or False: a truthy string or tensor is refused, not taken as True."""
    if value is not True and value is not False:
        fail(function, argument, "True or False", repr(value), TypeError)


def check_window(function: str, window: int | None) -> None:
    if window is not None and (
        isinstance(window, bool) or not isinstance(window, int) or window <= 0
    ):
        fail(function, "window", "a positive int (keys within D positions)", window)


def matches(value: object, annotation: object) -> bool:
    """Whether a config value (as JSON gives it: a tuple may be a list, a float an int) is of
    the field type `annotation`; a type this does not know is left to the class's own checks
    (and a float's range, finite or positive, too)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, kind) for kind in args)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if origin is typing.Literal:
        return value in args
    if origin in (tuple, list):
        if not isinstance(value, tuple | list):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(map(matches, value, args))
        return all(matches(v, args[0]) for v in value) if args else True
    return True


def _describe(kind: object) -> str:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    named = {bool: "True or False", int: "an int", float: "a number", str: "a string"}
    if kind in named:
        return named[kind]
    if kind is type(None):
        return "None"
    if origin is typing.Literal:
        return f"one of {list(args)}"
    if origin is tuple and args and args[-1] is not Ellipsis:
        return f"{len(args)} values: {', '.join(_describe(a) for a in args)}"
    if origin in (tuple, list) and args:
        return f"a sequence, each {_describe(args[0])}"
    return getattr(kind, "__name__", str(kind))


def check_fields(config: object) -> None:
    """Every field of a config dataclass has its annotated type (an int is not a bool or 2.5,
    a float is a number, a flag is True or False): the first check of every config's
    `__post_init__`, before its own checks of ranges (finite, positive, one of a list)."""
    cls = type(config)
    hints = typing.get_type_hints(cls)  # no cache: no module state (DESIGN.md)
    for f in dataclasses.fields(cls):
        value = getattr(config, f.name)
        if not matches(value, hints[f.name]):
            fail(cls.__name__, f.name, _describe(hints[f.name]), repr(value))
