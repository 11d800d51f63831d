"""The on-disk compile cache.

- ``key``: the key, everything that decides what a compile produces (symbolic shapes by their
  guards), hashed;
- ``store``: the entries on disk under those keys: their format, atomic writes, corrupt
  entries, and how compiled callables are stored;
- ``folder``: the cache's folder, its size limit and least-recently-used eviction.

May import the core, pipeline files, ``passkit._torch`` and ``passkit.errors``.
"""
