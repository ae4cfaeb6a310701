"""What every subcommand shares: the one-line error contract, the exit codes, and the options
that mean the same in every command (``--broker``, ``--json``)."""

from __future__ import annotations

import math
import sys
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import click

from tracing import redact
from worker._terminal import EXIT_OUTPUT_CLOSED, outputs_open, printable, reader_left

if TYPE_CHECKING:
    from pydantic import BaseModel

    from worker._settings import Settings

__all__ = [
    "EXIT_ERROR",
    "EXIT_USAGE",
    "CliError",
    "FiniteRange",
    "broker_option",
    "cli_settings",
    "confirm_drop",
    "json_line",
    "json_option",
    "known",
    "names_an_input",
    "redis_settings",
    "run_command",
    "unreachable",
]

EXIT_ERROR = 1
EXIT_USAGE = 2

F = TypeVar("F", bound=Callable[..., Any])

BROKER_HELP = (
    "Redis broker URL, e.g. redis://:PASSWORD@host:6379/0 (default: TRACESCORE_BROKER_URL, "
    "else redis://127.0.0.1:6379/0). The score store is TRACESCORE_REDIS_URL, else this broker."
)


class CliError(click.ClickException):
    """An expected failure: printed as one line, exit code 1."""

    exit_code = EXIT_ERROR

    def format_message(self) -> str:
        return printable(self.message)  # it may name a file, a URL or a backend's answer


class FiniteRange(click.FloatRange):
    """``click.FloatRange`` that also refuses nan and inf (a range lets nan through: every
    comparison with it is false, so "--wait-timeout nan" waited forever)."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


# pydantic's JSON escapes C0 control characters but writes C1 ones (a CSI, U+009B) raw, which a
# terminal reading the output acts on as on ESC.
_C1_ESCAPES = {c: f"\\u{c:04x}" for c in range(0x80, 0xA0)}


def json_line(model: BaseModel, *, line: int | None = None) -> str:
    """``model`` as one ``--json`` line: pydantic's JSON with each C1 control character escaped;
    ``line``, the input line it came from (``score``'s), as its first key. (Spliced into pydantic's
    text, not dumped again: its JSON is what every other ``--json`` line of a model is.)"""
    text = model.model_dump_json()
    if line is not None:
        text = f'{{"line":{line:d}' + ("," if text != "{}" else "") + text[1:]
    return text.translate(_C1_ESCAPES)


def known(count: float | None) -> str:
    """A count as the text shows it, thousands grouped as every command's summary groups them
    (123,456; a whole float, such as the limiter's calls, as an integer); None (a key of another
    type, a counter in Redis that is no number) as "unknown", never 0: read as 0 it showed a
    smaller figure than the truth."""
    if count is None:
        return "unknown"
    return f"{int(count):,}" if isinstance(count, int) or count.is_integer() else f"{count:,}"


def names_an_input(out: Path, inputs: Iterable[Path]) -> bool:
    """Whether ``--out`` is one of the input files: by path, and for a file that exists by the
    file itself (a hard link to an input has a path of its own, and writing it emptied the input)."""
    resolved, exists = out.resolve(), out.exists()
    for path in inputs:
        if path.resolve() == resolved:
            return True
        try:
            if exists and path.exists() and out.samefile(path):
                return True
        except OSError:
            continue
    return False


def broker_option(command: F) -> F:
    """``--broker URL``: the flag, else ``TRACESCORE_BROKER_URL``, else the default."""
    return click.option("--broker", default=None, metavar="URL", help=BROKER_HELP)(command)


def json_option(help_text: str) -> Callable[[F], F]:
    """``--json``: output for scripts (what each line or object is, in ``help_text``)."""

    def decorate(command: F) -> F:
        return click.option("--json", "as_json", is_flag=True, help=help_text)(command)

    return decorate


def out_option(help_text: str) -> Callable[[F], F]:
    """``--out FILE``: every score record as plain JSON Lines (what else, in ``help_text``). A name
    that says compressed is refused: the file would be plain text under it, which gzip, zstd and
    their tools refuse."""

    def plain(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
        if value is not None and value.name.lower().endswith((".gz", ".zst", ".zstd")):
            raise click.BadParameter(
                f"{value} names a compressed file; --out writes plain JSON Lines: name it *.jsonl (compress it"
                " afterwards if you like: compare and score read gzip and zstd)",
                ctx,
                param,
            )
        return value

    def decorate(command: F) -> F:
        return click.option("--out", type=click.Path(dir_okay=False, path_type=Path), callback=plain, help=help_text)(
            command
        )

    return decorate


def input_caps() -> None:
    """The size caps on compressed input files (``score``'s runs, ``compare``'s records) are
    readable numbers: a bad one is one line naming the variable, before any work."""
    from tracing.sources import SourceError, max_decompressed_bytes

    try:
        max_decompressed_bytes()
    except SourceError as exc:
        raise CliError(str(exc)) from exc


def cli_settings(broker: str | None = None, **overrides: Any) -> Settings:
    """The worker settings a command runs with: ``TRACESCORE_*`` with its options on top
    (``None`` keeps the variable's value); a bad value is one ``CliError`` line."""
    # Imported here, not above: `probe live` (every 30 s in every pod) reads no settings, and
    # loading them (pydantic-settings) was most of its CPU.
    from worker._settings import SettingsError, broker_url_problem, load_settings, shown_url

    given = {k: v for k, v in overrides.items() if v is not None}
    if broker is not None:  # --broker "" too: no broker, as an empty variable (not the default)
        problem = broker_url_problem(broker)
        if problem:  # a bad option value: a usage error (exit 2), as the README's table says
            raise click.BadParameter(f"{shown_url(broker)} {problem}", param_hint="--broker")
        given["broker_url"] = broker
    try:
        return load_settings(**given)
    except SettingsError as exc:
        raise CliError(str(exc)) from exc


def redis_settings(broker: str | None = None, **overrides: Any) -> Settings:
    """``cli_settings`` for a command that talks to Redis: an empty broker URL (embedded mode,
    which only ``backfill`` and ``score`` have) is a ``CliError`` saying what to set, not an
    error of the Redis client naming no setting."""
    from worker._settings import NO_BROKER

    settings = cli_settings(broker, **overrides)
    if not settings.broker_url:
        if broker is not None:
            raise CliError("--broker is empty and this command talks to Redis: pass --broker redis://HOST:6379/0")
        raise CliError(f"{NO_BROKER} and this command talks to Redis: set it or pass --broker redis://HOST:6379/0")
    return settings


# How long the probe behind the rediss:// hint waits for a connection, then for a TLS answer.
_HINT_PROBE_S = 2.0


def unreachable(what: str, url: str, exc: BaseException) -> CliError:
    """The one line for a Redis a command could not use (``what``: "broker", "score store"):
    refused credentials say so and where the URL is set, anything else is the client's own
    words; the URL's password masked either way."""
    from redis.exceptions import AuthenticationError

    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, AuthenticationError):
        cause = cause.__cause__ or cause.__context__
    where = "--broker or TRACESCORE_BROKER_URL"
    if what != "broker":
        where = f"TRACESCORE_REDIS_URL, else {where}"
    if cause is None and "DB index is out of range" in str(exc):  # (reached: it has no such database)
        from worker._settings import missing_database

        return CliError(missing_database(what, url, where))
    if cause is None:
        said = f"cannot reach the {what} at {redact(url)}: {redact(str(exc))}"
        if urlsplit(url).scheme == "rediss" and _timed_out(exc):
            from worker._settings import TLS_TO_PLAIN, silent_to_tls

            # (only a port that takes the connection and answers no TLS: an unreachable one is
            # no plain Redis, and the hint sent its user to change a URL that was right)
            if silent_to_tls(url, _HINT_PROBE_S):
                said += f"; {TLS_TO_PLAIN}"
        return CliError(said)
    parts = urlsplit(url)
    if parts.password:
        return CliError(f"the {what} at {redact(url)} refused the URL's credentials: fix them in {where}")
    # Never the user-info itself: "redis://s3cret@host" (the colon forgotten) is a password
    # read as a user name.
    form = "redis://USER:PASSWORD@host:6379/0" if parts.username else "redis://:PASSWORD@host:6379/0"
    return CliError(
        f"the {what} at {redact(url)} asks for a password and the URL gives none: set it in {where} ({form})"
    )


def _timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` or what caused it is a timeout (redis-py's or the socket's)."""
    from redis.exceptions import TimeoutError as RedisTimeoutError

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, RedisTimeoutError | TimeoutError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def run_command(group: click.Group, argv: list[str]) -> int:
    # --verbose is the group's flag, and the hint below says "run with --verbose": taken
    # anywhere before a "--", not only before the command ("status --verbose" was refused).
    end = argv.index("--") if "--" in argv else len(argv)
    verbose = any(a in ("--verbose", "-v") for a in argv[:end])
    if verbose:
        argv = ["--verbose", *(a for a in argv[:end] if a not in ("--verbose", "-v")), *argv[end:]]
    outputs_open()
    try:
        group.main(args=argv, prog_name="tracescore", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except BrokenPipeError:  # stdout's reader left (`| head`): quiet, as a process SIGPIPE ends
        reader_left(sys.stdout)
        return EXIT_OUTPUT_CLOSED
    except Exception as exc:
        if verbose:
            traceback.print_exc()
        # The worker's own errors are expected, and their text says what to do: no traceback
        # hint. (Looked up, not imported: `probe live` loads neither the settings nor pydantic.)
        errors = sys.modules.get("worker._errors")
        if errors is not None and isinstance(exc, errors.WorkerError):
            click.echo(printable(f"error: {redact(str(exc))}"), err=True)
            return EXIT_ERROR
        # An unexpected error's text may quote a connection URL: never print its password.
        click.echo(printable(f"error: {type(exc).__name__}: {redact(str(exc))}"), err=True)
        if not verbose:
            click.echo("(run with --verbose for the traceback)", err=True)
        return EXIT_ERROR
    return 0


def confirm_drop(what: str, yes: bool) -> None:
    """Dropping ``what`` (every dead letter, or every one of a reason) cannot be undone: asked
    first on a terminal; elsewhere (a script, a cron job) it needs ``--yes``. (``dlq drop`` and
    ``sinks drop``.)"""
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.UsageError(f"dropping {printable(what)} cannot be undone: add --yes")
    click.confirm(f"Drop {printable(what)} for good?", abort=True, err=True)
