"""Domain errors. Each carries the exit code the CLI returns; `cli.main` prints one line and exits."""

from __future__ import annotations


class KernelbakeError(Exception):
    """Base class: an expected failure with a message a user can act on (never a traceback)."""

    return_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class BadInput(KernelbakeError):
    """The user's input (spec, flag, policy, reference) is wrong: exit code 2, as argparse does."""

    return_code = 2


class SpecError(BadInput):
    """A spec file is malformed; the message names file:field."""


class UnknownName(BadInput):
    """A name (GPU, engine, field) is not one we know; suggests the closest."""


class EnvironmentProblem(KernelbakeError):
    """A tool or service we need is missing or down (Docker, registry)."""

    return_code = 3


class BuildFailed(KernelbakeError):
    """A build stage failed; the message names the stage and the log."""

    return_code = 4


class RegistryError(KernelbakeError):
    """The registry refused, failed or timed out."""

    return_code = 5


class KeyMismatch(KernelbakeError):
    """What was measured does not match what was planned (e.g. the builder's GPU or torch)."""

    return_code = 6
