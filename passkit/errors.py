"""Own every error type that passkit raises to users.

Each error renders as one line. The CLI prints that line without a traceback and exits with
the status of its outcome (``EXIT_*``: 2 for bad input, 4 for a step that failed, 1 for a step
that changed numerics, 5 for any other exception: a bug in passkit or a plugin;
``PASSKIT_DEBUG=1`` shows the traceback). Messages are part of the contract: tests pin them.
"""

from __future__ import annotations

__all__ = [
    "EXIT_OK",
    "EXIT_MISMATCH",
    "EXIT_USAGE",
    "EXIT_FELL_BACK",
    "EXIT_STEP_FAILED",
    "EXIT_INTERNAL",
    "NUMERICS_MARKER",
    "exit_code_for",
    "exit_code_for_kind",
    "DEBUG_ENV",
    "debug_enabled",
    "PasskitError",
    "CaptureError",
    "PipelineError",
    "PluginError",
    "PassError",
    "VerificationError",
]

DEBUG_ENV = "PASSKIT_DEBUG"


def debug_enabled() -> bool:
    """Whether ``PASSKIT_DEBUG`` asks for tracebacks and torch's full errors instead of one line."""
    import os

    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


# The exit status of every outcome (README's table); ``passkit.cli.run.exit_code_for`` maps errors.
EXIT_OK = 0  # the results agree with eager's (or the file is valid, every step is good, ...)
EXIT_MISMATCH = 1  # the results differ: at the end, at a ``verify = "numerics"`` step, in a bisection
EXIT_USAGE = 2  # bad input: a file, an option, an argument, a model factory
EXIT_FELL_BACK = 3  # the compile failed and fell back to eager (``on_error = "eager"``)
EXIT_STEP_FAILED = 4  # a step failed: its pass raised, or broke a fact
# An exception that is not a PasskitError (a bug in passkit, a plugin crashing outside a step):
# neither the user's input nor their model is at fault, so it must not read as bad input.
EXIT_INTERNAL = 5


class PasskitError(Exception):
    """Base of every error passkit raises on purpose."""


class CaptureError(PasskitError):
    """The user's model could not be captured: it raised, or ``torch.export`` refused it (a
    branch on a tensor's value, a dimension marked dynamic that the model fixes). The message
    names the model's line and torch's reason; torch's own error is the exception's
    ``__context__`` (its ``__cause__`` too with ``PASSKIT_DEBUG=1``, so the traceback prints it)."""


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


NUMERICS_MARKER = " changed numerics: "  # in a VerificationError's message: results, not a fact


def exit_code_for_kind(kind: str | None) -> int:
    """The exit status for a failure kind (``passkit.artifacts.reproducer.failure_kind``: bisect's blame,
    repro's replay): ``numerics`` differ (1), a ``crash`` or a broken ``fact`` is a failed step
    (4), ``contract`` (a needed fact is missing) is bad input (2), None is ok (0)."""
    if kind is None:
        return EXIT_OK
    return {"numerics": EXIT_MISMATCH, "contract": EXIT_USAGE}.get(kind, EXIT_STEP_FAILED)


def exit_code_for(exc: BaseException) -> int:
    """The exit status for an error: a step that changed numerics is results that differ, a step
    that raised or broke a fact is a failed step, anything else passkit raises is bad input."""
    if isinstance(exc, VerificationError):
        return EXIT_MISMATCH if NUMERICS_MARKER in str(exc) else EXIT_STEP_FAILED
    if isinstance(exc, PassError):
        return EXIT_STEP_FAILED
    return EXIT_USAGE
