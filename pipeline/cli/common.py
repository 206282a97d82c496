"""What every command shares: the default model, stderr logging, the one-line error report
(exit 2), usage errors raised by `pipeline.interface`, and the device options."""

from __future__ import annotations

import math
import signal
import sys
import threading

import click

from ..errors import ArtifactError, ConfigError, OptionError, OptionValueError, ProfileError, note_signal, signal_handled

DEFAULT_MODEL = "llama-3.2-1b"
MAX_ERROR_CHARS = 2000


def log(message: str) -> None:
    click.echo(message, err=True)


def fail(exc: Exception) -> None:
    """`error: <message>` on one line (cut at MAX_ERROR_CHARS) and exit status 2."""
    message = " ".join(str(exc).split("\n"))  # one line, whatever raised it
    if len(message) > MAX_ERROR_CHARS:
        message = message[: MAX_ERROR_CHARS - 8] + "...(cut)"
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


class PositiveFinite(click.ParamType):
    """A float option that must be finite and > 0 (a bandwidth, a rate)."""

    name = "float"

    def convert(self, value, param, ctx):
        number = click.FLOAT.convert(value, param, ctx)
        if not (math.isfinite(number) and number > 0):
            self.fail(f"{value!r} is not a positive finite number", param, ctx)
        return number


def _usage_error(exc: OptionError, ctx: click.Context) -> click.UsageError:
    if isinstance(exc, OptionValueError):
        return click.BadParameter(str(exc), ctx=ctx, param_hint=exc.option)
    return click.UsageError(str(exc), ctx=ctx)


# Options whose empty value means something: --kernels '' (every kernel), --rpc-key '' (a server
# started without a key). Any other empty value (`--weights "$W"` with W unset) is a usage error:
# a path option read it as "." (the current directory), a name option as "use the default".
EMPTY_ALLOWED = ("pattern", "rpc_key")


def refuse_empty_values(command: click.Command, ctx: click.Context, args: list[str]) -> None:
    """A usage error for the first empty option value or argument in `args` (a group's own only)."""
    options = {opt: param for param in command.get_params(ctx) if isinstance(param, click.Option)
               and not param.is_flag and not param.count for opt in param.opts}
    for i, arg in enumerate(args):
        if arg == "--" or (isinstance(command, click.Group) and arg in command.commands):
            return
        name, eq, value = arg.partition("=")
        if eq and not value and name in options:  # --output=
            given = name
        elif arg == "" and i and args[i - 1] in options:  # --output ''
            given = args[i - 1]
        elif arg == "":
            raise click.UsageError("an empty argument (an unset variable?)", ctx=ctx)
        else:
            continue
        if options[given].name not in EMPTY_ALLOWED:
            raise click.BadParameter("an empty value (an unset variable?)", ctx=ctx, param_hint=given)


class Command(click.Command):
    """A command whose OptionError (from the interface) is click's usage error: usage line, exit 2;
    so is an empty option value or argument (refuse_empty_values)."""

    def parse_args(self, ctx, args):
        refuse_empty_values(self, ctx, args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OptionError as exc:
            raise _usage_error(exc, ctx) from None


class Group(click.Group):
    """A command group with the same usage errors as Command."""

    command_class = Command

    def parse_args(self, ctx, args):
        refuse_empty_values(self, ctx, args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OptionError as exc:
            raise _usage_error(exc, ctx) from None


class UserErrors(click.Group):
    """Turn known user-facing errors into a one-line message and exit status 2, Ctrl-C into click's
    "Aborted!" wherever it lands, and SIGTERM into "Terminated." and exit status 143 once the
    command has cleaned up."""

    command_class = Command

    def invoke(self, ctx):
        with _InterruptWatch() as watch:
            try:
                result = super().invoke(ctx)
                if watch.received:  # the KeyboardInterrupt was swallowed (a TVM callback's RuntimeError, caught)
                    raise KeyboardInterrupt
                return result
            except BaseException as exc:
                if watch.received == signal.SIGTERM:  # stopped (`timeout`, a service manager): cleaned up, 128 + 15
                    click.echo("Terminated.", err=True)
                    sys.exit(128 + signal.SIGTERM)
                if not isinstance(exc, Exception):
                    raise
                if watch.received:  # the error is what Ctrl-C became inside a TVM callback
                    raise KeyboardInterrupt from None
                _report(exc)
                raise


def _report(exc: Exception) -> None:
    """Exit with the one-line report of a known user-facing error; return for anything else."""
    if isinstance(exc, (ConfigError, ArtifactError, ProfileError, ValueError)):
        fail(exc)
    if isinstance(exc, OSError):  # a full or read-only disk, a vanished directory: the file and the reason
        fail(f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else (exc.strerror or str(exc) or type(exc).__name__))
    if isinstance(exc, MemoryError):
        fail("out of memory (this machine's memory, or the process's limit, is too small for this step)")


class _InterruptWatch:
    """Turns Ctrl-C (SIGINT) and SIGTERM while a command runs into KeyboardInterrupt, noting which
    came: the command's temp dirs are removed and a nightly writes its report either way. Raised
    inside a Python callback of TVM's C++ (a pass, a packed function), KeyboardInterrupt comes back
    out as a bare RuntimeError (tvm_ffi re-raises error kinds it does not know so), which would
    print a traceback instead of "Aborted!"."""

    # Only the default handlers are replaced: a caller that ignores a signal (a nightly worker
    # ignores SIGINT) or handles it keeps its choice.
    DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}

    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def _on_signal(self, signum, frame):
        self.received = signum
        note_signal(signum)  # until handled, nothing is published (errors.raise_if_signalled)
        raise KeyboardInterrupt

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum, default in self.DEFAULTS.items():
                if signal.getsignal(signum) is default:
                    self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc_info):
        signal_handled()
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        return False


def device_options(command):
    """Where the artifact runs: --rpc / --rpc-tracker / --rpc-key (TVM's runtime on another machine:
    llvm, cuda, metal) or --adapter / --browser (a WebGPU runtime for webgpu artifacts)."""
    options = [
        click.option("--rpc", default=None, metavar="HOST:PORT",
                     help="Upload the library to this TVM RPC server and run it there (e.g. a Mac for metal artifacts)."),
        click.option("--rpc-tracker", default=None, metavar="HOST:PORT", help="Get an RPC server from this TVM tracker (with --rpc-key)."),
        click.option("--rpc-key", default=None, help="Key of the RPC server (rpc_server --key) or of the tracker's device."),
        click.option("--adapter", type=click.Choice(["auto", "gles", "swiftshader", "gpu"]), default=None,
                     help="webgpu: Dawn adapter (gles: OpenGL ES on llvmpipe; swiftshader: Vulkan on SwiftShader; gpu: a real GPU; "
                          "default auto: gpu, else swiftshader, else gles)."),
        click.option("--browser", is_flag=True, help="webgpu: run in headless Chromium (page on 127.0.0.1) instead of node."),
    ]
    for option in reversed(options):
        command = option(command)
    return command
