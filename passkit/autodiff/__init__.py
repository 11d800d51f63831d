"""Differentiating a program.

- ``plain``: the joint function of a functional ``main`` (traced by ``joint``, run by
  verification);
- ``subclasses``: the joint function of a subclass program, differentiated at the subclass
  level and flattened as it is traced;
- ``hidden_writes``: in-place writes autograd does not record (under ``no_grad``, through
  ``.detach()``), found before ``functionalize`` hides them;
- ``traced_autograd``: what the autograd tape shows while tracing (outputs' ``requires_grad``,
  custom ``autograd.Function``s);
- ``differentiable_forms``: stand-ins ``joint`` differentiates where functionalization loses
  eager's gradient.

May import the core, ``passkit._torch`` and ``passkit.errors``; nothing else in passkit.
"""
