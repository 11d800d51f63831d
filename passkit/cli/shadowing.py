"""Own one start-up repair: the installed passkit, not a ``passkit/`` folder of the working directory.

``python -m passkit`` puts the working directory first on ``sys.path`` (so does
``PYTHONPATH=.``). A folder there named ``passkit/`` without an ``__init__.py`` (a checkout of
passkit's repository, an empty folder) is then a namespace package, and Python's path finder
returns it before an editable install's finder (which comes after it in ``sys.meta_path``) is
asked. The command's own modules still load through that finder, but ``passkit`` itself is the
empty namespace: plugins fail on ``passkit.hookimpl``, and names under it resolve to the folder's
subfolders (``cannot import name 'get_plugin_manager' from 'passkit.plugins' (unknown location)``).

``use_installed_package`` runs before the command imports anything else: when ``passkit`` is a
namespace package, it loads the real package (the folder holding this one) in its place, and
moves the working directory to the end of ``sys.path``, where ``--model`` and ``--plugin``
modules are looked up anyway (``passkit.cli.plugin_option``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

__all__ = ["use_installed_package"]


def use_installed_package() -> None:
    """Make ``passkit`` the installed package when a working-directory folder shadowed it."""
    found = sys.modules.get("passkit")
    if found is None or getattr(found, "__file__", None) is not None:
        return  # a regular package: the installed one (or a real one the user chose)
    here = os.getcwd()
    front = [entry for entry in sys.path if entry in ("", ".", here)]
    sys.path[:] = [entry for entry in sys.path if entry not in front] + front
    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("passkit", root / "__init__.py", submodule_search_locations=[str(root)])
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    for name, module in list(sys.modules.items()):  # the submodules already loaded (this one, passkit.cli)
        if name.startswith("passkit.") and name.count(".") == 1:
            setattr(package, name.split(".", 1)[1], module)
    sys.modules["passkit"] = package
    spec.loader.exec_module(package)
