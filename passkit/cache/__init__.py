"""The compile cache: a folder on this machine, and a Redis server shared by a team.

- ``key``: the key, everything that decides what a compile produces (symbolic shapes by their
  guards), hashed;
- ``store``: the cache as one compile sees it: what an entry holds, loading it (or waiting for
  the process compiling it) and storing it;
- ``callables``: how a compiled callable is kept in an entry, and got back;
- ``entry``: an entry's bytes: checksum, ed25519 signature, origin;
- ``signing``: the key pair, the signing key and the trusted keys the environment names;
- ``stores``: the store interface, the folder store (its lock-file leases) and their layering;
- ``server``: the Redis store (its leases with a time to live) and what ``cache info`` shows of it;
- ``folder``: the cache's folder, its size limit and least-recently-used eviction;
- ``pack``: a folder's entries as one file, and checking them back in.

May import the core, pipeline files, ``passkit._torch`` and ``passkit.errors``.
"""
