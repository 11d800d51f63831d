"""Own every error type that passkit raises to users.

Each error renders as one line. The CLI prints that line without a traceback and exits 2
(``PASSKIT_DEBUG=1`` shows the traceback). Messages are part of the contract: tests pin them.
"""

from __future__ import annotations

__all__ = [
    "PasskitError",
    "PipelineError",
    "PluginError",
    "PassError",
    "VerificationError",
]


class PasskitError(Exception):
    """Base of every error passkit raises on purpose."""


class PipelineError(PasskitError):
    """A pipeline file or plan is invalid: syntax, keys, options, contracts, ``extends``."""


class PluginError(PasskitError):
    """Plugins disagree: a duplicate pass name, a bad registration record."""


class PassError(PasskitError, RuntimeError):
    """A step raised while it ran. The message names the step and the steps before it.

    Also a ``RuntimeError``, the type torch raises for the same failures in eager and in its own
    AOT Autograd (``set_()`` then a write through an old view: "cannot mutate tensors with
    frozen storage"), so code that catches torch's errors catches passkit's too.
    """


class VerificationError(PasskitError):
    """A step broke an established fact, or its graphs deviate numerically from the capture."""
