"""The ``tracescore`` group: global options and one subcommand per module."""

from __future__ import annotations

import importlib
import sys

import click

from worker.cli._common import run_command

__all__ = ["cli", "main"]


# Each command's module, imported only when that command runs (or help lists it): `tracescore
# probe`, which Kubernetes runs every few seconds, then loads what a probe needs, not the scorers,
# the Celery app and the backfill's readers (about 1 CPU-second a probe before; bench/cli.py).
_COMMANDS = {
    "backfill": "worker.cli._backfill:backfill_command",
    "compare": "worker.cli._compare:compare_command",
    "dlq": "worker.cli._dlq:dlq_group",
    "probe": "worker.cli._probe:probe_group",
    "score": "worker.cli._score:score_command",
    "scores": "worker.cli._scores:scores_command",
    "sinks": "worker.cli._sinks:sinks_group",
    "status": "worker.cli._status:status_command",
    "worker": "worker.cli._worker:worker_command",
}


class _LazyGroup(click.Group):
    """A group whose subcommands, all in ``_COMMANDS``, are imported on first use (click's
    documented lazy loading)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, name = target.partition(":")
        command = getattr(importlib.import_module(module), name)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command


def _show_version(ctx: click.Context, _param: click.Parameter, asked: bool) -> None:
    if not asked or ctx.resilient_parsing:
        return
    # Looked up only when asked: importlib.metadata and the lookup were ~60 ms of CPU in every
    # command, the probes included (bench/cli.py).
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("tracescore")
    except PackageNotFoundError:  # running from a source tree that was never installed
        found = "0+unknown"
    click.echo(f"tracescore, version {found}")
    ctx.exit()


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="Show the version and exit.",
)
@click.option("--verbose", "-v", is_flag=True, help="Show tracebacks and debug logs.")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """Score LLM-agent traces after the fact; write the scores back into your traces."""
    if ctx.invoked_subcommand != "probe":  # run every few seconds, logging nothing: no structlog import
        from worker._logs import configure_logs

        configure_logs()
    ctx.obj = {"verbose": verbose}


def main(argv: list[str] | None = None) -> int:
    return run_command(cli, argv if argv is not None else sys.argv[1:])
