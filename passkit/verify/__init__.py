"""Numerics: running a program at any stage and comparing it with eager.

- ``evaluate``: a program run at any stage on real inputs (numerics verification);
- ``compare``: the one tolerance rule, the comparator and the tolerance a pipeline allows.

May import ``passkit.autodiff``, the core, ``passkit._torch`` and ``passkit.errors``.
"""
