"""Debugging tools: program snapshots and files, reproducers, and bisection.

- ``snapshot``: a cheap copy of a ``Program`` that later steps cannot change;
- ``program_file``: write a program to a folder (graphs as code plus a replayable record) and
  read it back without the model that produced it;
- ``pipeline_file``: write a resolved pipeline (or some of its steps) as a TOML file;
- ``repro``: write a reproducer for a failing step and replay it (``passkit repro``);
- ``bisect``: find the first step that changes numerics or crashes (``passkit bisect``).
"""
