"""`forgestream dlq list | redrive`: see the dead letters, and send them back once their cause is fixed.

A redrive sends a letter's record, unchanged, to its source topic and partition with a header naming
the letter and the group that dead-lettered it: that group handles it again, other groups and
group-less readers skip it (they had handled, or seen, the original). Each redrive is journaled on
`forge.dlq.redriven`, so a letter is redriven once unless `--again` says otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from app.cli import BootstrapOpt, ConfigOpt, PrefixOpt, app, build_config, fail

dlq_app = typer.Typer(help="List dead letters, or redrive them to their source topics.", no_args_is_help=True)
app.add_typer(dlq_app, name="dlq")

WorkdirOpt = Annotated[Path | None, typer.Option(help="A run folder (its broker is started if stopped).")]
TopicOpt = Annotated[str | None, typer.Option(help="Only letters from this topic (logical name).")]
GroupOpt = Annotated[str | None, typer.Option(help="Only letters this consumer group dead-lettered.")]
MatchOpt = Annotated[str | None, typer.Option(help="Only letters whose error contains this text.")]
OffsetsOpt = Annotated[
    str | None, typer.Option(help="Only these letters: DLQ offsets A-B (inclusive), or A (one).")
]


@dataclass(frozen=True)
class Filters:
    topic: str | None = None  # logical
    group: str | None = None  # as `dlq list` shows it (the forge's carries the run's topic prefix)
    match: str | None = None
    first: int = 0
    last: int | None = None

    def keep(self, letter: Any, logical_topic: str | None) -> bool:
        """Whether a dead letter (Record[DeadLetter]) passes every filter given."""
        dead = letter.value
        return (
            (self.topic is None or logical_topic == self.topic)
            and (self.group is None or dead.group == self.group)
            and (self.match is None or self.match in dead.error)
            and self.first <= letter.offset
            and (self.last is None or letter.offset <= self.last)
        )


def parse_offsets(text: str | None) -> tuple[int, int | None]:
    """`A-B`, `A-` or `A` -> (first, last); bad text fails naming the flag."""
    if text is None:
        return 0, None
    head, sep, tail = text.partition("-")
    try:
        first = int(head)
        last = (int(tail) if tail else None) if sep else first
    except ValueError:
        fail(f"--offsets: {text!r} is not A-B, A- or A (DLQ offsets)")
    if first < 0 or (last is not None and last < first):
        fail(f"--offsets: {text!r} is not a range of DLQ offsets (0 ≤ A ≤ B)")
    return first, last


def why_not(letter: Any, done: dict[tuple[int, int], Any], *, again: bool, logical: str | None) -> str | None:
    """Why a selected letter is not redriven (None: it is)."""
    dead = letter.value
    if logical is None:
        return f"{dead.source_topic} is not a topic of this run"
    if "(value truncated from" in dead.error:
        return "its value was truncated to fit the DLQ"
    if (letter.partition, letter.offset) in done and not again:
        return f"redriven already (to offset {done[letter.partition, letter.offset].to_offset}; --again)"
    return None


def _logical(names: Any, physical: str) -> str | None:
    try:
        return names.logical(physical)
    except KeyError:
        return None


def _row(letter: Any, logical: str | None, done: dict[tuple[int, int], Any]) -> dict[str, Any]:
    dead = letter.value
    journal = done.get((letter.partition, letter.offset))
    return {
        "dlq_offset": letter.offset,
        "source": f"{logical or dead.source_topic}[{dead.partition}]@{dead.offset}",
        "group": dead.group,
        "at": datetime.fromtimestamp(dead.created_at, UTC).isoformat(timespec="seconds"),
        "error": dead.error,
        "redriven_to": None if journal is None else journal.to_offset,
    }


async def _letters(kafka: Any, filters: Filters) -> tuple[Any, list[tuple[Any, str | None]], dict]:
    """(bus, [(letter, logical topic)] passing the filters, {(partition, offset): Redriven})."""
    from infra.bus import Bus
    from schemas.topics import DLQ, REDRIVEN

    bus = Bus(kafka, role="dlq")
    letters = [(r, _logical(bus.names, r.value.source_topic)) for r in await bus.read_topic(DLQ)]
    done = {(r.value.dlq_partition, r.value.dlq_offset): r.value for r in await bus.read_topic(REDRIVEN)}
    return bus, [(r, t) for r, t in letters if filters.keep(r, t)], done


def _filters(topic: str | None, group: str | None, match: str | None, offsets: str | None) -> Filters:
    from schemas.topics import TOPICS

    if topic is not None and topic not in TOPICS:
        fail(f"--topic: {topic!r} is not a forgestream topic; known: {', '.join(sorted(TOPICS))}")
    first, last = parse_offsets(offsets)
    return Filters(topic=topic, group=group, match=match, first=first, last=last)


def _run(
    config: Path | None, bootstrap: str | None, topic_prefix: str | None, workdir: Path | None, body: Any
) -> Any:
    import anyio

    from app.run_folder import kafka_for
    from infra.broker import BrokerError

    flags: dict[str, Any] = {"kafka.topic_prefix": topic_prefix}
    if workdir is not None:
        flags["workdir"] = str(workdir)
    cfg = build_config(config, flags)

    async def main() -> Any:
        async with kafka_for(cfg.kafka, bootstrap=bootstrap, workdir=workdir) as kafka:
            return await body(kafka)

    try:
        return anyio.run(main)
    except (BrokerError, OSError) as e:
        fail(str(e))


def _table(rows: Iterable[dict[str, Any]], title: str) -> Any:
    from rich.table import Table

    table = Table(title=title)
    for col in ("dlq offset", "source", "group", "at", "redriven to", "error"):
        table.add_column(col, overflow="fold")
    for r in rows:
        redriven = "" if r["redriven_to"] is None else str(r["redriven_to"])
        table.add_row(str(r["dlq_offset"]), r["source"], r["group"], r["at"], redriven, r["error"][:200])
    return table


@dlq_app.command("list")
def list_letters(
    topic: TopicOpt = None,
    group: GroupOpt = None,
    match: MatchOpt = None,
    offsets: OffsetsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per letter.")] = False,
    config: ConfigOpt = None,
    bootstrap: BootstrapOpt = None,
    topic_prefix: PrefixOpt = None,
    workdir: WorkdirOpt = None,
) -> None:
    """The dead letters (filters combine), each with its source, group, error and redrive."""

    async def body(kafka: Any) -> list[dict[str, Any]]:
        _, letters, done = await _letters(kafka, _filters(topic, group, match, offsets))
        return [_row(r, t, done) for r, t in letters]

    rows = _run(config, bootstrap, topic_prefix, workdir, body)
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row))
        return
    from rich.console import Console

    Console().print(_table(rows, f"{len(rows)} dead letter(s)"))


@dlq_app.command()
def redrive(
    topic: TopicOpt = None,
    group: GroupOpt = None,
    match: MatchOpt = None,
    offsets: OffsetsOpt = None,
    again: Annotated[bool, typer.Option(help="Also letters that were redriven before.")] = False,
    dry_run: Annotated[bool, typer.Option(help="Say what would be redriven; send nothing.")] = False,
    config: ConfigOpt = None,
    bootstrap: BootstrapOpt = None,
    topic_prefix: PrefixOpt = None,
    workdir: WorkdirOpt = None,
) -> None:
    """Send the chosen dead letters' records back to their source topics, for the groups that
    dead-lettered them; print a JSON summary."""

    async def body(kafka: Any) -> dict[str, Any]:
        from infra.topics import create_topics

        if not dry_run:
            await create_topics(kafka)  # forge.dlq.redriven, for a run from before it existed
        bus, letters, done = await _letters(kafka, _filters(topic, group, match, offsets))
        sent: list[dict[str, Any]] = []
        skipped: list[dict[str, Any]] = []
        async with bus:
            for letter, logical in letters:
                reason = why_not(letter, done, again=again, logical=logical)
                if reason is not None:
                    skipped.append(_row(letter, logical, done) | {"why": reason})
                elif dry_run:
                    sent.append(_row(letter, logical, done))
                else:
                    journal = await bus.redrive(letter)
                    sent.append(_row(letter, logical, done) | {"redriven_to": journal.to_offset})
        return {"selected": len(letters), "redriven": sent, "skipped": skipped, "dry_run": dry_run}

    typer.echo(json.dumps(_run(config, bootstrap, topic_prefix, workdir, body), indent=2))
