"""Own what the compile cache reads from a program's shape environment: the symbolic signature
that keys an entry, and the guards an entry brings back into the loading process.

A program captured with symbolic sizes (Dynamo's ``dynamic=None`` after a second shape, or
``dynamic=True``) holds its inputs as fake tensors of one fake mode whose ``ShapeEnv`` names the
sizes (``s0``, ``s1``...) and lists the guards that must hold for the compiled code to be right
(``2 <= s0``, ``Eq(s1, 128)``...). Compiling adds guards (Inductor specialises on what it had to
decide); a process that loads the compiled code instead of compiling it must add them too, or
the caller (Dynamo) would run that code for sizes it was never checked on.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

__all__ = ["shape_env_of", "symbolic_signature", "shape_guards", "install_shape_guards"]


def shape_env_of(values: Sequence[Any]) -> Any | None:
    """The ``ShapeEnv`` of the first symbolic value (a fake tensor with symbolic sizes or a
    ``SymInt``), or None when every size is static."""
    for value in values:
        if isinstance(value, torch.SymInt):
            return value.node.shape_env
        if isinstance(value, torch.Tensor) and any(isinstance(n, torch.SymInt) for n in (*value.shape, *value.stride())):
            mode = getattr(value, "fake_mode", None)
            if mode is not None and mode.shape_env is not None:
                return mode.shape_env
            found = next(n for n in (*value.shape, *value.stride()) if isinstance(n, torch.SymInt))
            return found.node.shape_env
    return None


def _hints(env: Any) -> dict[Any, Any]:
    # torch 2.13 splits backed hints out; torch 2.11 keeps them all in ``var_to_val``.
    return dict(getattr(env, "backed_var_to_val", None) or env.var_to_val)


def symbolic_signature(values: Sequence[Any]) -> dict[str, Any] | None:
    """The input symbols' ranges and the shape environment's guards, as stable text (what the
    compile cache keys a symbolic program on); None when every size is static."""
    env = shape_env_of(values)
    if env is None:
        return None
    return {
        "guards": sorted({str(guard.expr) for guard in env.guards}),
        "ranges": {str(symbol): str(env.var_to_range.get(symbol)) for symbol in sorted(env.var_to_range, key=str)},
    }


def shape_guards(values: Sequence[Any]) -> list[Any]:
    """The guards of ``values``' shape environment (sympy expressions, picklable)."""
    env = shape_env_of(values)
    return [] if env is None else list(dict.fromkeys(guard.expr for guard in env.guards))


def install_shape_guards(values: Sequence[Any], guards: Sequence[Any]) -> bool:
    """Add ``guards`` to ``values``' shape environment, so its owner checks them before reusing
    what was compiled under them. False (and nothing added) when one does not hold for the
    current sizes: what was compiled under them does not apply."""
    env = shape_env_of(values)
    if env is None:
        return not guards
    hints = _hints(env)
    known = {str(guard.expr) for guard in env.guards}
    missing = [expr for expr in guards if str(expr) not in known]
    for expr in missing:
        if not expr.free_symbols <= hints.keys() or not bool(expr.xreplace(hints)):
            return False
    for expr in missing:
        env.evaluate_expr(expr)
    return True
