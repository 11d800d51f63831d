"""How programs come in and go out.

- ``api``: ``passkit.compile``, ``passkit.backend`` (Dynamo), ``load_pipeline`` and
  ``compile_program``, which every way in ends in;
- ``aot``: ``aot_function`` and ``aot_module`` (``make_fx``, no Dynamo);
- ``capture``: a ``Program`` built from Dynamo's graph or from ``make_fx``;
- ``graph_attributes``: parameters Dynamo leaves on its graph, lifted into program inputs;
- ``synthetic_base``: two views of one tensor, one written, compiled over the memory they share;
- ``recompiles``: the line that opens each (re)compile; ``user_warnings``: warnings at the
  user's line; ``compile_options``: the settings a caller passes beside the pipeline;
- ``saved_limit``: ``max_saved`` across the graphs Dynamo splits one model into;
- ``inductor_slots``: ``passkit.inductor_options``, a pipeline mounted in Inductor's slots;
- ``data_dependent``: the one-line refusals of what data-dependent tracing cannot hold (an op torch
  traces no symbolic result for, a Python decision on tensor data);
- ``check``: one compiled step against eager, what ``passkit run`` does.

May import every compiler part (passes, autodiff, regions, runtime, cache, verify, instruments,
artifacts, patterns), the core, pipeline files and ``_torch``. Only the command line, the
debugging tools and the pytest plugin import it.
"""
