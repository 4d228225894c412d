"""The typed trajectory: codex's items grouped into steps, one step per model response.

The exec stream says what happened and in which order; the session record (when there is
one) says which model response each item came from, how long it ran and what each response
spent. Matching the two: the n-th agent message / command / file change of the stream is the
n-th one the record completed. Without a record (or past its end, on a running attempt) a
step is what one response usually holds: reasoning, at most one message, then a tool call.

Pure: builds from what the two readers returned.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace

from runner.codex_usage import USAGE_FIELDS, TokenCounts
from runner.pricing import RateCard, price
from runner.trajectory.events import AGENT_MESSAGE, COMMAND, FILE_CHANGE, REASONING, TOOL_KINDS, ExecStream, \
    RawEvent, StreamItem
from runner.trajectory.session import SessionRecord

# A command that runs tests, by the test runners' names (shown as such in the timeline).
_TEST_COMMAND = re.compile(
    r"\b(pytest|py\.test|unittest|tox|nox|jest|mocha|vitest|rspec|phpunit|ctest)\b"
    r"|\b(npm|yarn|pnpm)( run)? test\b|\b(go|cargo|dotnet|mix) test\b|\bmake (test|check)\b"
)


def runs_tests(command: str | None) -> bool:
    return bool(command and _TEST_COMMAND.search(command))


def display_command(command: str | None) -> str:
    """The agent's command as it wrote it: codex's ``/bin/bash -lc '...'`` wrapper taken off."""
    if not command:
        return ""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    if len(words) == 3 and words[0].rsplit("/", 1)[-1] in ("bash", "sh", "zsh") and words[1] in ("-lc", "-c"):
        return words[2]
    return command


@dataclass(frozen=True)
class Step:
    number: int  # 1-based
    items: tuple[StreamItem, ...]
    usage: TokenCounts | None = None  # this model response's, when the session record has it
    cost_usd: float | None = None
    timestamp: str | None = None  # when the response ended (session record)

    def of(self, *kinds: str) -> list[StreamItem]:
        return [item for item in self.items if item.kind in kinds]

    @property
    def messages(self) -> list[str]:
        return [item.text or "" for item in self.of(AGENT_MESSAGE)]

    @property
    def commands(self) -> list[StreamItem]:
        return self.of(COMMAND)

    @property
    def file_changes(self) -> list[StreamItem]:
        return self.of(FILE_CHANGE)


@dataclass(frozen=True)
class Trajectory:
    steps: tuple[Step, ...]
    preamble: tuple[StreamItem, ...]  # items before the first step: codex's own notices (a model it does not know)
    usage: TokenCounts  # the run's total: codex's own report, else the session record's sum
    cost_usd: float | None
    model: str | None
    thread_id: str | None
    raw_events: tuple[tuple[int, RawEvent], ...] = ()  # (step number, event); step 0: before the first step
    codex_turns: int = 0
    failed_turns: int = 0
    errors: tuple[str, ...] = ()  # codex's stream-level errors and failed turns' messages, in order
    from_session_record: bool = False
    usage_reported: bool = False  # codex reported its usage (its turn ended), not only the session record

    @property
    def commands(self) -> list[StreamItem]:
        return [item for step in self.steps for item in step.commands]

    @property
    def files_changed(self) -> list[str]:
        seen: dict[str, None] = {}
        for step in self.steps:
            for item in step.file_changes:
                for change in item.changes:
                    seen.setdefault(change.path, None)
        return list(seen)


def _sum(counts: list[TokenCounts]) -> TokenCounts:
    return TokenCounts(**{key: sum(getattr(c, key) for c in counts) for key in USAGE_FIELDS})


def _responses_of(stream: ExecStream, record: SessionRecord | None) -> tuple[list[int | None], list[StreamItem]]:
    """Each item's model response (None: unknown) and the items with the record's durations."""
    taken: dict[str, int] = {}
    responses: list[int | None] = []
    items: list[StreamItem] = []
    for item in stream.items:
        found = None
        if record is not None and item.kind in (AGENT_MESSAGE, COMMAND, FILE_CHANGE, REASONING):
            n = taken.get(item.kind, 0)
            completed = record.completed.get(item.kind, [])
            if n < len(completed) and item.completed:
                taken[item.kind] = n + 1
                found = record.response_of.get(completed[n].ref)
                if item.kind in TOOL_KINDS and item.duration_seconds is None and completed[n].seconds is not None:
                    item = replace(item, duration_seconds=completed[n].seconds)
        responses.append(found)
        items.append(item)
    return responses, items


def _group(responses: list[int | None], items: list[StreamItem]
           ) -> tuple[list[StreamItem], list[tuple[int | None, list[StreamItem]]]]:
    """The items before any step (codex's own notices), and the steps' items."""
    preamble: list[StreamItem] = []
    groups: list[tuple[int | None, list[StreamItem]]] = []
    for response, item in zip(responses, items):
        if not groups and response is None and item.kind not in (AGENT_MESSAGE, REASONING, *TOOL_KINDS):
            preamble.append(item)
            continue
        if groups:
            last_response, last = groups[-1]
            if response is not None and response == last_response:
                last.append(item)
                continue
            if response is None and item.kind not in (AGENT_MESSAGE, REASONING, *TOOL_KINDS):
                last.append(item)  # an error, a to-do list, an unknown item: where it came
                continue
            if response is None and last_response is None and _fits(last, item):
                last.append(item)
                continue
        groups.append((response, [item]))
    return preamble, groups


def _fits(step: list[StreamItem], item: StreamItem) -> bool:
    """Without the record: does ``item`` belong to the response ``step`` holds so far?"""
    kinds = [i.kind for i in step]
    if any(k in TOOL_KINDS for k in kinds):
        return False  # a response ends with its tool call; what follows is the next one
    if item.kind == AGENT_MESSAGE:
        return AGENT_MESSAGE not in kinds
    return item.kind in TOOL_KINDS or item.kind == REASONING and AGENT_MESSAGE not in kinds


def _step_of(event: RawEvent, preamble: int, steps: list[Step]) -> int:
    """The step holding the item just before ``event`` (0: it came before any step's item)."""
    if event.after_items <= preamble:
        return 0
    seen = preamble
    for step in steps:
        seen += len(step.items)
        if event.after_items <= seen:
            return step.number
    return len(steps)


def _relative(item: StreamItem, tree: str | None) -> StreamItem:
    """A file change's paths relative to the agent's tree (codex reports them absolute)."""
    if tree is None or not item.changes:
        return item
    prefix = tree.rstrip("/") + "/"
    return replace(item, changes=tuple(replace(c, path=c.path.removeprefix(prefix)) for c in item.changes))


def build_trajectory(stream: ExecStream, record: SessionRecord | None, *, model: str | None,
                     card: RateCard | None, tree: str | None = None) -> Trajectory:
    """The steps, their usage and cost (on ``card``, when it knows ``model``), the run's totals;
    file paths relative to ``tree`` (the agent's working directory) where they are under it."""
    model = model or (record.model if record else None)
    responses, items = _responses_of(stream, record)
    items = [_relative(item, tree) for item in items]
    preamble, groups = _group(responses, items)
    steps: list[Step] = []
    known = record.responses if record is not None else []
    for number, (response, group) in enumerate(groups, start=1):
        answered = known[response] if response is not None and response < len(known) else None
        usage = answered.usage if answered else None
        steps.append(Step(number, tuple(group), usage, price(usage, model, card) if usage and card else None,
                          answered.timestamp if answered else None))
    if record is not None and not record.response_of and len(known) == len(steps):  # counts only: align by order
        steps = [replace(s, usage=r.usage, cost_usd=price(r.usage, model, card) if card else None, timestamp=r.timestamp)
                 for s, r in zip(steps, known)]
    usage = stream.usage if stream.reported_usage else _sum([r.usage for r in known])
    raw = tuple((_step_of(event, len(preamble), steps), event) for event in stream.raw_events)
    return Trajectory(
        steps=tuple(steps), preamble=tuple(preamble), usage=usage, cost_usd=price(usage, model, card) if card else None, model=model,
        thread_id=stream.thread_id, raw_events=raw, codex_turns=len(stream.turns),
        failed_turns=sum(1 for t in stream.turns if t.failed),
        errors=tuple([*stream.errors, *(t.error for t in stream.turns if t.failed and t.error
                                        and t.error not in stream.errors)]),
        from_session_record=record is not None and bool(record.response_of), usage_reported=stream.reported_usage,
    )
