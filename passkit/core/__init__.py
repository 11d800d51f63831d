"""The pass framework: what every other part of passkit agrees on.

- ``program``: ``Program``, its ``Signature`` and descriptors, what passes transform;
- ``pass_api``: ``Pass``, ``graph_pass``, options models, fingerprints;
- ``facts``: ``Fact`` and the rules about facts (which steps apply, which facts hold after one);
- ``hookspecs``: every pluggy hook, documented, and ``StepContext``;
- ``plugins``: the plugin manager (built-ins, entry points, blocked and failed plugins);
- ``registry``: name -> pass, fact, decomposition table, pipeline file, settings key;
- ``runner``: the step loop;
- ``report``: what a run records for each step; ``progress``: progress events and heartbeats;
- ``failed_node``: where in a graph a step failed;
- ``private_folders``: the folders passkit reads pickles from (cache, reproducers) are the
  user's own: made 0700, refused when others can write them.

May import: ``passkit.pipeline`` (the registry validates settings with its models; pipeline
files use the fact rules, so the two packages share a layer), ``passkit._torch`` and
``passkit.errors``. Never imports a built-in pass, a front end or the command line: built-ins
reach the runner as plugins, through ``plugins.BUILTIN_PLUGINS``' module names.
"""
