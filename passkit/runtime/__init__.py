"""Calling a compiled program.

- ``wrapper``: the ``torch.autograd.Function`` that calls the compiled forward and backward,
  writes input mutations back and rebuilds aliases;
- ``output_views``: outputs that are views, as the wrapper makes them (of an intermediate, of an
  input through a custom ``autograd.Function``, at any size) and their gradients;
- ``entry_check``: the check at the door of compiled code (fake, meta, subclass and
  wrong-device tensors refused in one line);
- ``shared_inputs``: refusing calls where a mutated input overlaps another input;
- ``subclasses``: the ``flatten_subclasses`` stage and ``SubclassProgram``, which takes
  subclass values apart on the way in and builds them again on the way out.

May import ``passkit.autodiff``, the core, ``passkit._torch`` and ``passkit.errors``.
"""
