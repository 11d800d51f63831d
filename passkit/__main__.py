"""Run the ``passkit`` command as ``python -m passkit``."""

from __future__ import annotations

from passkit.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    main(prog_name="passkit")
