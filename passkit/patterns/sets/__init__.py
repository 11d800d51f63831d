"""Own the built-in pattern sets: name -> factory, registered by the ``rewrite`` plugin.

Factories run only when a pipeline names the set, so listing plugins never traces anything.
"""

from __future__ import annotations

from typing import Any, Callable


def _attention() -> Any:
    from passkit.patterns.sets.attention import attention_set

    return attention_set()


def _noops() -> Any:
    from passkit.patterns.sets.noops import noops_set

    return noops_set()


def _conv_bn() -> Any:
    from passkit.patterns.sets.conv_bn import conv_bn_set

    return conv_bn_set()


def _constant_fold() -> Any:
    from passkit.patterns.sets.constant_fold import constant_fold_set

    return constant_fold_set()


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
