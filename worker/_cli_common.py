"""What every subcommand shares: the one-line error contract and the exit codes."""

from __future__ import annotations

import traceback

import click

from tracing._broker import redact

__all__ = ["EXIT_ERROR", "EXIT_USAGE", "CliError", "run_command"]

EXIT_ERROR = 1
EXIT_USAGE = 2


class CliError(click.ClickException):
    """An expected failure: printed as one line, exit code 1."""

    exit_code = EXIT_ERROR


def run_command(group: click.Group, argv: list[str]) -> int:
    verbose = "--verbose" in argv or "-v" in argv
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
    except Exception as exc:
        if verbose:
            traceback.print_exc()
        # An unexpected error's text may quote a connection URL: never print its password.
        click.echo(f"error: {type(exc).__name__}: {redact(str(exc))}", err=True)
        if not verbose:
            click.echo("(run with --verbose for the traceback)", err=True)
        return EXIT_ERROR
    return 0
