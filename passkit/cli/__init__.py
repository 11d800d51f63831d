"""Own the ``passkit`` command's wiring: the click group, its subcommands and error handling.

Each subcommand lives in its own module and imports heavy modules (torch, the registry) inside
its body. Every ``PasskitError`` and usage error prints one line on stderr; ``PASSKIT_DEBUG=1``
re-raises instead, to show the traceback. Exit codes (``passkit.errors.EXIT_*``, the same for
every command): 0 ok, 1 results differ from eager (also a step that ``verify = "numerics"``
caught, bisect's numerics blame, repro's numerics replay), 2 bad input (file, options,
arguments), 3 the compile fell back to eager (``passkit run``), 4 a step failed: its pass raised
or broke a fact (``passkit.errors.exit_code_for``, ``exit_code_for_kind``), 5 an internal error:
an exception that is not a ``PasskitError`` (a bug in passkit or a plugin).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from passkit.cli.shadowing import use_installed_package

# Before anything else of passkit: a passkit/ folder in the working directory must not stand in
# for the installed package.
use_installed_package()

from passkit.cli import bisect, cache, explain, export, fuzz, passes, patterns, pipelines, repro, run, terminal, validate  # noqa: E402
from passkit.errors import EXIT_INTERNAL, PasskitError  # noqa: E402

__all__ = ["main", "PasskitGroup", "EXIT_USAGE"]

EXIT_USAGE = run.EXIT_USAGE


class PasskitGroup(click.Group):
    """A click group that turns every failure into one line on stderr and an exit status."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            terminal.out(exc.ctx.get_help())
            result = 0
        except click.ClickException as exc:
            terminal.usage_error(exc)
            result = EXIT_USAGE
        except click.Abort:
            terminal.error("passkit: interrupted")
            result = 130
        except PasskitError as exc:
            if terminal.debug_enabled():
                raise
            terminal.error(str(exc))
            result = run.exit_code_for(exc)
        except BrokenPipeError:
            # The reader (`| head`) went away: stop quietly, and keep Python's exit-time flush quiet.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            result = 1
        except Exception as exc:
            if terminal.debug_enabled():
                raise
            terminal.internal_error(exc)
            result = EXIT_INTERNAL
        if not standalone_mode:
            return result
        sys.exit(result if isinstance(result, int) else 0)


@click.group("passkit", cls=PasskitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="passkit", prog_name="passkit")
def main() -> None:
    """passkit: PyTorch's AOT training compiler as a pipeline of named passes.

    Errors print one line; set PASSKIT_DEBUG=1 for the traceback.
    """


for _module in (passes, pipelines, patterns, validate, explain, run, export, bisect, repro, fuzz, cache):
    main.add_command(_module.command)
