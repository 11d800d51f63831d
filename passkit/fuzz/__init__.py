"""Fuzzing: random programs compiled through a pipeline and compared with eager.

- ``program``: a program as data (inputs, a list of op nodes, outputs), printed as Python source
  and built into a module with its example inputs;
- ``ops``: the op vocabulary, chosen from what broke passkit before (views and in-place writes
  on inputs, outputs that alias inputs, random ops, custom ``autograd.Function``s, BatchNorm and
  buffers, data-dependent ops);
- ``generator``: hypothesis strategies over programs, so a seed replays exactly;
- ``compare``: one program through the pipeline and eager (and torch's own path, to skip what
  torch cannot run): outputs, gradients, mutated inputs, aliasing, ``requires_grad``;
- ``reduce``: delta debugging over a differing program's nodes, then the reproducer and the
  first bad step from ``passkit.debug``'s bisection;
- ``session``: a whole run (a count or a time budget), its progress and summary.

A tool layer beside ``passkit.debug``: it imports the front ends and ``passkit.debug``'s
bisection, and nothing above it. hypothesis is an optional dependency (``passkit[fuzz]``).
"""
