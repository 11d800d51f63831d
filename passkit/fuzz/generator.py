"""Own the program generator: hypothesis strategies over ``FuzzProgram``, and seeded runs of them.

A program is drawn op by op: each op is drawn from those whose operands fit the shapes made so
far (``OpSpec.fits``), so every program is well-typed. Writes are not drawn into what eager
itself refuses: a leaf input that requires grad or a view of one (a ``detach()`` of it is fair
game: a write autograd does not see), or an ``expand`` (overlapping memory). What eager still
refuses (a write into a value the backward saved) is found by running it, and not counted.

``each_program`` runs a callback over the programs a seed draws, in order, through hypothesis's
generate phase, so ``--seed S`` replays the same programs; hypothesis's own shrinking is not
used (the callback never fails): differences are reduced over the graph by ``passkit.fuzz.reduce``.
"""

from __future__ import annotations

from typing import Any, Callable

from passkit.errors import PasskitError
from passkit.fuzz.ops import OPS, WIDTH
from passkit.fuzz.program import FuzzProgram, Input, Mode, Node

__all__ = ["programs", "each_program", "require_hypothesis"]

MAX_NODES = 8


def require_hypothesis() -> Any:
    """The hypothesis module, or a one-line error saying how to install it."""
    try:
        import hypothesis
    except ImportError:
        raise PasskitError("passkit fuzz needs hypothesis: pip install 'passkit[fuzz]' (or hypothesis)") from None
    return hypothesis


def programs(modes: tuple[Mode, ...] = ("training",), *, dynamic: bool = True) -> Any:
    """A hypothesis strategy over programs run in one of ``modes``; ``dynamic``: some are
    compiled with symbolic sizes."""
    st = require_hypothesis().strategies

    @st.composite
    def draw_program(draw: Callable[..., Any]) -> FuzzProgram:
        mode = draw(st.sampled_from(modes))
        inputs = []
        for _ in range(draw(st.integers(1, 3))):
            rows = draw(st.sampled_from([1, 3, 4]))
            inputs.append(Input((rows, WIDTH), requires_grad=mode == "training" and draw(st.booleans())))
        shapes = [x.shape for x in inputs]
        # Per value: whether a write into it is one eager refuses (a leaf that requires grad or
        # a view of one; overlapping memory).
        unwritable = [x.requires_grad for x in inputs]
        nodes: list[Node] = []
        for _ in range(draw(st.integers(1, MAX_NODES))):
            candidates = [
                name for name, spec in OPS.items()
                if any(_first_fits(spec, shapes, unwritable, v) for v in range(len(shapes)))
                and not (mode == "export" and spec.function)
            ]
            spec = OPS[draw(st.sampled_from(sorted(candidates)))]
            first = draw(st.sampled_from([v for v in range(len(shapes)) if _first_fits(spec, shapes, unwritable, v)]))
            args = [first]
            if spec.arity == 2:
                seconds = [v for v in range(len(shapes)) if spec.fits(shapes[first], shapes[v])]
                args.append(draw(st.sampled_from(seconds)))
            second = shapes[args[1]] if spec.arity == 2 else ()
            shapes.append(spec.shape(shapes[first], second))
            inherits = spec.view or spec.inplace
            unwritable.append((unwritable[first] and inherits and spec.name != "detach") or spec.name == "expand")
            nodes.append(Node(spec.name, tuple(args)))
        last = len(shapes) - 1
        extra = draw(st.lists(st.integers(0, last), max_size=2, unique=True))
        outputs = tuple(dict.fromkeys([last, *extra]))
        return FuzzProgram(
            inputs=tuple(inputs), nodes=tuple(nodes), outputs=outputs, mode=mode,
            dynamic=dynamic and draw(st.integers(0, 4)) == 3, seed=draw(st.integers(0, 2**16)),
        )

    return draw_program()


def _first_fits(spec: Any, shapes: list[Any], unwritable: list[bool], value: int) -> bool:
    if spec.inplace and unwritable[value]:
        return False
    if spec.arity == 2:
        return any(spec.fits(shapes[value], shapes[v]) for v in range(len(shapes)))
    return spec.fits(shapes[value], ())


def each_program(strategy: Any, visit: Callable[[FuzzProgram], bool], *, seed: int, count: int) -> None:
    """Call ``visit`` on up to ``count`` programs drawn from ``strategy`` with ``seed``, in the
    same order every time; ``visit`` returns False to stop (a time budget spent)."""
    hypothesis = require_hypothesis()
    stopped = False

    @hypothesis.settings(
        max_examples=count, database=None, deadline=None, phases=[hypothesis.Phase.generate],
        suppress_health_check=list(hypothesis.HealthCheck), derandomize=False, print_blob=False,
    )
    @hypothesis.seed(seed)
    @hypothesis.given(strategy)
    def run(program: FuzzProgram) -> None:
        nonlocal stopped
        if not stopped and not visit(program):
            stopped = True

    run()
