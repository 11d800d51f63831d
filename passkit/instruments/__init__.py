"""Own the cross-cutting step instruments: wrapper ``passkit_run_step`` hookimpls.

Each module is a built-in plugin (see pyproject's ``passkit`` entry points) that wraps every
step the runner runs, so the runner's loop stays free of timing, dumping and verification:

- ``timing``: wall time of the step into ``record.seconds`` (innermost, so it times the pass);
- ``dumps``: each graph's code after a step, per ``settings.dump``, into ``settings.dump_dir``;
- ``verify``: re-checks facts (and numerics) after each step, per ``settings.verify``
  (outside ``dumps``, so a dump of the offending step exists before verification fails);
- ``repro``: snapshots the program before each step and writes a reproducer when the step
  fails, per ``settings.repro_dir`` (so verification failures are caught too);
- ``progress``: a ``started`` line for a step that runs over a second, then heartbeats with the
  elapsed time (``passkit.core.progress``), to the run's progress callback or the log (outermost).

Instruments only read the step context and annotate ``context.record``; they never change the
program.
"""
