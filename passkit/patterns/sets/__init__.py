"""Own the built-in pattern sets: name -> factory, registered by the ``rewrite`` plugin.

Factories run only when a pipeline names the set, so listing plugins never traces anything.
Each runs once per process: the sets are immutable, and a traced search is lowered once per
search object and opset (``passkit.patterns.trace``), so a set built anew for every compile
would be traced anew every time (about a second for ``attention`` on a 2-layer block).
"""

from __future__ import annotations

import functools
from typing import Any, Callable


@functools.cache
def _attention() -> Any:
    from passkit.patterns.sets.attention import attention_set

    return attention_set()


@functools.cache
def _noops() -> Any:
    from passkit.patterns.sets.noops import noops_set

    return noops_set()


@functools.cache
def _conv_bn() -> Any:
    from passkit.patterns.sets.conv_bn import conv_bn_set

    return conv_bn_set()


@functools.cache
def _constant_fold() -> Any:
    from passkit.patterns.sets.constant_fold import constant_fold_set

    return constant_fold_set()


@functools.cache
def _gemm() -> Any:
    from passkit.patterns.sets.gemm import gemm_set

    return gemm_set()


BUILTIN_SETS: dict[str, Callable[[], Any]] = {
    "attention": _attention,
    "noops": _noops,
    "conv_bn": _conv_bn,
    "constant_fold": _constant_fold,
    "gemm": _gemm,
}
