"""Repeated layers: found, traced once, outlined, refused.

- ``traced_once``: ``trace_once``, layers Dynamo traces once and marks as a region;
- ``stamped``: refusing a region call that reads another layer's parameters;
- ``layers``: finding a graph's layers, their structural keys and merges;
- ``marked``: the region bodies already marked when the ``regions`` step runs;
- ``outline``: the ``regions`` pass, each distinct layer outlined into one body.

The torch side (region schemas, values and calls) is ``passkit._torch.region_*``. May import
the core, ``passkit._torch`` and ``passkit.errors``.
"""
