"""Own ``--plugin MODULE``: register a module the user names on the command line as a plugin.

For plugins that are not installed as a distribution (a pass under development, the pass a
reproducer needs): the module is imported and registered on the process-wide plugin manager,
exactly as an entry point would be. Only modules named explicitly on the command line run.
Modules in the current folder are found after the installed ones, and only once the installed
plugins have loaded.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Iterable

import click

from passkit.errors import PasskitError

__all__ = ["import_from_working_directory", "plugin_option", "register_plugins"]

plugin_option = click.option(
    "--plugin", "plugins", metavar="MODULE", multiple=True,
    help="Import MODULE and register it as a passkit plugin first (repeatable).",
)


def register_plugins(modules: Iterable[str]) -> None:
    """Import and register each module; a module that does not import is a one-line error.

    The installed plugins load first, and only then does the current folder go on ``sys.path``
    (last), so ``--plugin`` and ``--model`` modules can come from it while a folder there named
    like an installed plugin's package never stands in for that plugin.
    """
    from passkit.core.plugins import get_plugin_manager

    pm = get_plugin_manager()
    import_from_working_directory()
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise PasskitError(f"--plugin {name}: cannot import: {exc}") from exc
        if not pm.has_plugin(name) and not pm.is_registered(module):
            pm.register(module, name=name)


def import_from_working_directory() -> None:
    """Make modules in the current folder importable, after the installed ones: appended, not put
    first as ``python -m`` does, so a package in site-packages is found before a folder of the
    same name here (``register_plugins`` has imported the installed plugins before this)."""
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
