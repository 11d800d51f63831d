"""Own ``--plugin MODULE``: register a module the user names on the command line as a plugin.

For plugins that are not installed as a distribution (a pass under development, the pass a
reproducer needs): the module is imported and registered on the process-wide plugin manager,
exactly as an entry point would be. Only modules named explicitly on the command line run.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Iterable

import click

from passkit.errors import PasskitError

__all__ = ["plugin_option", "register_plugins"]

plugin_option = click.option(
    "--plugin", "plugins", metavar="MODULE", multiple=True,
    help="Import MODULE and register it as a passkit plugin first (repeatable).",
)


def register_plugins(modules: Iterable[str]) -> None:
    """Import and register each module; a module that does not import is a one-line error."""
    from passkit.plugins import get_plugin_manager

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: modules in the current folder
    pm = get_plugin_manager()
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise PasskitError(f"--plugin {name}: cannot import: {exc}") from exc
        if not pm.has_plugin(name) and not pm.is_registered(module):
            pm.register(module, name=name)
