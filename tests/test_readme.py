"""The README stays true: its built-in table and the commands it shows."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click

from scorers.builtin import catalogue_markdown
from worker.cli import cli

README = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")


def test_builtin_table_matches_the_catalogue() -> None:
    """The README's built-in scorer table is exactly what the catalogue generates."""
    table = README.split("<!-- builtin-table", 1)[1].split("-->", 1)[1].split("<!-- /builtin-table -->", 1)[0]
    assert table.strip() == catalogue_markdown().strip()


def test_every_tracescore_command_shown_exists() -> None:
    """Each `tracescore <command> --option` in the README is a real command and option."""
    code = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", README, re.S) + re.findall(r"`([^`\n]+)`", README))
    lines = [m.group(1) for m in re.finditer(r"(?:^|\s|/)tracescore ([a-z][^\n`#&]*)", code, re.M)]
    assert len(lines) >= 8
    for line in lines:
        words = shlex.split(line.split("|")[0])
        command: click.Command = cli
        with click.Context(cli) as ctx:
            while isinstance(command, click.Group) and words and (sub := command.get_command(ctx, words[0])):
                command = sub
                words.pop(0)
        assert command is not cli, f"README shows an unknown command: tracescore {line}"
        known = {opt for param in command.params for opt in getattr(param, "opts", [])}
        for word in words:
            if word.startswith("--"):
                assert word.split("=")[0] in known, f"README shows unknown option {word} in: tracescore {line}"


def test_run_command_output_shown_is_what_it_prints() -> None:
    """The per-scorer table (and first worst run) the README shows under its run command is
    what the command really prints."""
    from click.testing import CliRunner

    shown = README.split("<!-- run-output", 1)[1].split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    table, worst = shown[: shown.index("")], shown[shown.index("") + 1 :]
    traces = str(Path(__file__).parent.parent / "examples" / "traces")
    result = CliRunner().invoke(
        cli, ["backfill", traces, "--scorers", "examples.scorers"], env={"TRACESCORE_BROKER_URL": ""}
    )
    assert result.exit_code == 0, result.output
    printed = result.stdout.splitlines()
    start = printed.index(table[0])  # the header
    assert printed[start + 2 : start + len(table)] == table[2:], "the README's per-scorer table is stale"
    assert worst[0] in printed
    assert any(line.startswith(worst[1][:60]) for line in printed)


def _metrics_table() -> dict[str, tuple[str, ...]]:
    """The README's metrics table (*What to watch*) as exposed series name -> labels. A row of
    several metrics gives one label list for all, or one per metric split by " / " (the last
    list for the rest)."""
    section = README.split("### What to watch", 1)[1].split("### What it costs", 1)[0]
    table: dict[str, tuple[str, ...]] = {}
    for row in re.findall(r"^\| (`tracescore_.*)$", section, re.M):
        names_cell, labels_cell = (cell.strip() for cell in row.split("|")[:2])
        groups = [tuple(x.strip() for x in g.split(",") if x.strip()) for g in labels_cell.split(" / ")]
        for i, name in enumerate(re.findall(r"`(tracescore_[a-z_]+)`", names_cell)):
            table[name] = groups[min(i, len(groups) - 1)]
    return table


def test_metrics_table_names_every_metric_with_its_labels() -> None:
    """Each metric a worker node exposes is in the README's table under the series name a query
    uses (counters with ``_total``) and with exactly its labels: the table gave
    tracescore_queue_unacked a ``queue`` label it does not have (one series, all queues), so a
    query of ``tracescore_queue_unacked{queue="tracescore"}`` written from it matched nothing."""
    from worker.metrics import ALL_METRICS

    exposed = {f"{s.name}_total" if s.kind == "counter" else s.name: s.labels for s in ALL_METRICS}
    assert _metrics_table() == exposed
