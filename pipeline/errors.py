"""The errors mlcpipe reports to its user: one line each, `error: <message>` and exit status 2.

They live here, below every other module, so that any module can raise them without importing
the module that owns the subject (config, artifact, profile, runner).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A user-facing configuration error (one line: file, field, value, what is allowed)."""


class ArtifactError(ValueError):
    """A user-facing error about an artifact or weights directory."""


class ProfileError(ValueError):
    """A profile file that cannot be read or compared."""


class RunnerError(ValueError):
    """The WebGPU runner cannot start or was refused (one line for the user)."""


class OptionError(ValueError):
    """Command-line options that do not go together: the CLI shows the command's usage line."""


class OptionValueError(OptionError):
    """One option's value is refused: `Invalid value for <option>: <message>` (no option:
    `Invalid value: <message>`), below the command's usage line."""

    def __init__(self, message: str, option: str | None = None):
        super().__init__(message)
        self.option = option
