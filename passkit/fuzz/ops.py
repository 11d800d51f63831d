"""Own the fuzzer's op vocabulary: what each op node means, when it applies, what shape it makes.

The vocabulary is what broke passkit before (Csmith's lesson: aim at what optimizers get
wrong): views of inputs and of intermediates (``expand`` returned as an output), in-place writes
on inputs and through views, random ops, custom ``autograd.Function``s (an identity forward, a
backward that writes into its gradient), BatchNorm and a buffer written in place, data-dependent
ops (``nonzero``, ``.item()``, ``masked_select``). Every op is a line of Python source with
``{0}``, ``{1}`` for its operands, so a program prints as code a person reads and runs.

``OpSpec.fits`` says whether operands of the given shapes make a valid call; ``shape`` gives the
result's. Writes (``inplace``) return their first operand; views (``view``) share its storage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["OpSpec", "OPS", "FUNCTIONS", "Shape", "broadcasts"]

Shape = tuple[int, ...]
WIDTH = 4  # every program's feature size: what ``self.w`` and ``self.bn`` take


def broadcasts(small: Shape, big: Shape) -> bool:
    """Whether ``small`` broadcasts to ``big`` exactly (the result keeps ``big``'s shape)."""
    if len(small) > len(big):
        return False
    return all(s in (1, b) for s, b in zip(reversed(small), reversed(big)))


@dataclass(frozen=True)
class OpSpec:
    """One op: its source template, how many tensor operands, which shapes fit, the result's."""

    name: str
    template: str
    arity: int = 1
    fits: Callable[[Shape, Shape], bool] = lambda a, b: True  # (first, second or ()) -> valid
    shape: Callable[[Shape, Shape], Shape] = lambda a, b: a
    inplace: bool = False  # writes into its first operand and returns it
    view: bool = False  # the result shares its first operand's storage
    random: bool = False
    needs: str = ""  # a module attribute it reads: "w", "bn", "buf"
    function: str = ""  # a custom autograd.Function it calls (``FUNCTIONS``)


def _two_d(a: Shape, b: Shape) -> bool:
    return len(a) == 2


def _same_or_broadcast(a: Shape, b: Shape) -> bool:
    return broadcasts(b, a)


_OPS = [
    # pointwise
    OpSpec("abs", "{0}.abs()"),
    OpSpec("neg", "-{0}"),
    OpSpec("sin", "torch.sin({0})"),
    OpSpec("tanh", "torch.tanh({0})"),
    OpSpec("sigmoid", "torch.sigmoid({0})"),
    OpSpec("relu", "torch.relu({0})"),
    OpSpec("scale", "{0} * 2.0"),
    OpSpec("shift", "{0} + 1.0"),
    OpSpec("clone", "{0}.clone()"),
    OpSpec("add", "{0} + {1}", 2, _same_or_broadcast),
    OpSpec("mul", "{0} * {1}", 2, _same_or_broadcast),
    OpSpec("sub", "torch.sub({0}, {1})", 2, _same_or_broadcast),
    # reductions and matmuls
    OpSpec("sum_rows", "{0}.sum(0, keepdim=True)", fits=_two_d, shape=lambda a, b: (1, a[1])),
    OpSpec("mean_cols", "{0}.mean(-1, keepdim=True)", fits=lambda a, b: len(a) >= 1, shape=lambda a, b: (*a[:-1], 1)),
    OpSpec("mm", "{0} @ {1}.t()", 2, lambda a, b: len(a) == 2 and len(b) == 2 and a[1] == b[1], lambda a, b: (a[0], b[0])),
    OpSpec("linear", "{0} @ self.w", fits=lambda a, b: len(a) >= 1 and a[-1] == WIDTH, needs="w"),
    # views of inputs and of intermediates
    OpSpec("t", "{0}.t()", fits=_two_d, shape=lambda a, b: (a[1], a[0]), view=True),
    OpSpec("flat", "{0}.view(-1)", fits=lambda a, b: len(a) == 2, shape=lambda a, b: (a[0] * a[1],), view=True),
    OpSpec("unsqueeze", "{0}.unsqueeze(0)", fits=lambda a, b: len(a) < 3, shape=lambda a, b: (1, *a), view=True),
    OpSpec("squeeze", "{0}.squeeze(0)", fits=lambda a, b: len(a) == 3 and a[0] == 1, shape=lambda a, b: a[1:], view=True),
    OpSpec("tail", "{0}[1:]", fits=lambda a, b: len(a) >= 1 and a[0] > 1, shape=lambda a, b: (a[0] - 1, *a[1:]), view=True),
    OpSpec("row", "{0}[0]", fits=_two_d, shape=lambda a, b: a[1:], view=True),
    OpSpec("cols", "{0}[..., :2]", fits=lambda a, b: len(a) >= 1 and a[-1] > 2, shape=lambda a, b: (*a[:-1], 2), view=True),
    OpSpec("expand", "{0}.expand(3, -1)", fits=lambda a, b: len(a) == 2 and a[0] == 1, shape=lambda a, b: (3, a[1]), view=True),
    OpSpec("diagonal", "{0}.diagonal()", fits=lambda a, b: len(a) == 2 and a[0] == a[1], shape=lambda a, b: (a[0],), view=True),
    OpSpec("detach", "{0}.detach()", view=True),
    # in-place writes, on inputs, views and intermediates
    OpSpec("add_", "{0}.add_(1.0)", inplace=True),
    OpSpec("mul_", "{0}.mul_(2.0)", inplace=True),
    OpSpec("relu_", "{0}.relu_()", inplace=True),
    OpSpec("zero_", "{0}.zero_()", inplace=True),
    OpSpec("copy_", "{0}.copy_({1})", 2, _same_or_broadcast, inplace=True),
    OpSpec("add_from", "{0}.add_({1})", 2, _same_or_broadcast, inplace=True),
    # random ops
    OpSpec("dropout", "F.dropout({0}, p=0.5, training=True)", random=True),
    OpSpec("rand_mul", "{0} * torch.rand_like({0})", random=True),
    OpSpec("bernoulli", "{0} * torch.bernoulli(torch.full_like({0}, 0.5))", random=True),
    # custom autograd.Functions
    OpSpec("half", "Half.apply({0})", function="Half"),
    OpSpec("double_mut", "DoubleInPlaceGrad.apply({0})", function="DoubleInPlaceGrad"),
    OpSpec("view_fn", "ViewOf.apply({0})", function="ViewOf", view=True),
    # BatchNorm and a buffer written in place
    OpSpec("batchnorm", "self.bn({0})", fits=lambda a, b: len(a) == 2 and a[0] > 1 and a[1] == WIDTH, needs="bn"),
    OpSpec("buf_update", "self.buf.add_({0}.detach().mean(0))",
           fits=lambda a, b: len(a) == 2 and a[1] == WIDTH, shape=lambda a, b: (WIDTH,), needs="buf"),
    OpSpec("buf_read", "{0} * self.buf", fits=lambda a, b: len(a) >= 1 and a[-1] == WIDTH, needs="buf"),
    # data-dependent sizes and values
    OpSpec("nonzero", "{0} + {0}.nonzero().shape[0]"),
    OpSpec("item", "{0} * {0}.sum().item()"),
    OpSpec("masked_select", "{0} + torch.masked_select({0}, {0} > 0).sum()"),
]

OPS: dict[str, OpSpec] = {op.name: op for op in _OPS}

# The custom autograd.Functions ops may call, as source a program includes when it uses them.
FUNCTIONS: dict[str, str] = {
    "Half": '''\
class Half(torch.autograd.Function):
    """Identity forward (returns its input); backward halves the gradient."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 0.5
''',
    "DoubleInPlaceGrad": '''\
class DoubleInPlaceGrad(torch.autograd.Function):
    """Forward doubles; backward writes into the gradient it is given, and returns it."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g.mul_(2)
''',
    "ViewOf": '''\
class ViewOf(torch.autograd.Function):
    """Forward returns a view of its input; backward passes the gradient through."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g
''',
}
