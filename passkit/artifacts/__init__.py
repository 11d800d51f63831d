"""What a run writes down, and reads back later.

- ``snapshot``: a cheap copy of a ``Program`` that later steps cannot change;
- ``program_file``: a program written to a folder (graphs as code plus a replayable record)
  and read back without the model that produced it;
- ``pipeline_file``: a resolved pipeline (or some of its steps) written as a TOML file;
- ``reproducer``: the reproducer of a failing step, and what kind of failure it was;
- ``html_page``: the HTML run report's page.

The instruments write these files during a run and the debugging tools (``passkit repro``,
``passkit bisect``) read them, so they sit below both. May import the core, pipeline files,
``passkit.verify``, ``passkit._torch`` and ``passkit.errors``.
"""
