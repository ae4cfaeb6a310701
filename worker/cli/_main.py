"""The ``tracescore`` group: global options and one subcommand per module."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

import click

from worker.cli._backfill import backfill_command
from worker.cli._common import run_command
from worker.cli._compare import compare_command
from worker.cli._dlq import dlq_group
from worker.cli._probe import probe_group
from worker.cli._score import score_command
from worker.cli._scores import scores_command
from worker.cli._sinks import sinks_group
from worker.cli._status import status_command
from worker.cli._worker import worker_command

__all__ = ["cli", "main"]


def _version() -> str:
    try:
        return version("tracescore")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(_version(), "--version", prog_name="tracescore")
@click.option("--verbose", "-v", is_flag=True, help="Show tracebacks and debug logs.")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """Score LLM-agent traces after the fact; write the scores back into your traces."""
    ctx.obj = {"verbose": verbose}


cli.add_command(score_command)
cli.add_command(backfill_command)
cli.add_command(compare_command)
cli.add_command(worker_command)
cli.add_command(scores_command)
cli.add_command(dlq_group)
cli.add_command(sinks_group)
cli.add_command(status_command)
cli.add_command(probe_group)


def main(argv: list[str] | None = None) -> int:
    return run_command(cli, argv if argv is not None else sys.argv[1:])
