"""Debugging tools: program snapshots and files, reproducers, bisection and the HTML page.

Built-ins layer (the instruments use them; they import nothing above it):

- ``snapshot``: a cheap copy of a ``Program`` that later steps cannot change;
- ``program_file``: write a program to a folder (graphs as code plus a replayable record) and
  read it back without the model that produced it;
- ``pipeline_file``: write a resolved pipeline (or some of its steps) as a TOML file;
- ``repro``: write a reproducer for a failing step;
- ``html``: render the HTML run report.

Front-end layer: ``replay`` (``passkit repro``), ``bisect`` and ``bisect_model``
(``passkit bisect``).
"""
