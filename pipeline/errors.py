"""The errors mlcpipe reports to its user: one line each, `error: <message>` and exit status 2.

They live here, below every other module, so that any module can raise them without importing
the module that owns the subject (config, artifact, profile, runner).
"""

from __future__ import annotations

import threading


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


_signals: list[int] = []  # what a command's watch (cli/common._InterruptWatch) turned into KeyboardInterrupt, until handled


def note_signal(signum: int) -> None:
    _signals.append(signum)


def signal_handled() -> None:
    """The KeyboardInterrupt was caught and acted on (a nightly writing its report, the watch's end)."""
    _signals.clear()


def raise_if_signalled() -> None:
    """KeyboardInterrupt again on the main thread when a signal came and nothing handled it: raised
    inside a Python callback of TVM's C++, KeyboardInterrupt comes back out of the FFI as a bare
    RuntimeError, which an `except Exception` may swallow. Called before a result is published."""
    if _signals and threading.current_thread() is threading.main_thread():
        raise KeyboardInterrupt


class OptionValueError(OptionError):
    """One option's value is refused: `Invalid value for <option>: <message>` (no option:
    `Invalid value: <message>`), below the command's usage line."""

    def __init__(self, message: str, option: str | None = None):
        super().__init__(message)
        self.option = option
