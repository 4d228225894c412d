"""The attempt as a timeline of styled lines: one rendering for the terminal (``show``, through
rich), plain text (``show`` when stdout is not a terminal) and the private report (HTML).

A line is (text, style); styles are rich's names (``bold``, ``red``, ``dim``...), which the
report maps to CSS. Pure: formats an ``AttemptView``, reads nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.codex_usage import TokenCounts
from runner.trajectory.attempt import AttemptView
from runner.trajectory.events import AGENT_MESSAGE, COMMAND, ERROR, FILE_CHANGE, REASONING, TOOL_CALL, RawEvent, \
    StreamItem
from runner.trajectory.model import Step, display_command, runs_tests

MESSAGE_LINES = 12  # of an agent message in the timeline
FAILED_OUTPUT_LINES = 6  # of a failed command's output


@dataclass(frozen=True)
class Line:
    text: str
    style: str = ""


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}s" if value < 60 else f"{value / 60:.1f}min"


def dollars(value: float | None) -> str:
    return "cost unknown" if value is None else f"${value:.6f}"


def tokens_text(usage: TokenCounts) -> str:
    return (f"in {usage.input_tokens:,} (cached {usage.cached_input_tokens:,}) out {usage.output_tokens:,} "
            f"(reasoning {usage.reasoning_output_tokens:,})")


def header_lines(view: AttemptView) -> list[Line]:
    if view.running:
        state, style = "running", "bold cyan"
    elif view.terminal_state is None:
        state, style = "not finished (no runner holds it)", "bold yellow"
    else:
        state = view.terminal_state + (f" ({view.failure_label})" if view.failure_label and not view.resolved else "")
        style = "bold green" if view.resolved else "bold red"
    lines = [Line(f"attempt {view.tag}: {state}", style), Line("prompt:", "bold")]
    lines += [Line(f"  | {text}", "dim") for text in view.prompt_head] or [Line("  (no prompt)", "dim")]
    if view.trajectory is not None and view.trajectory.preamble:
        lines += [Line(f"  codex: {item.text or item.kind}", "yellow") for item in view.trajectory.preamble]
    return lines


def step_header(step: Step) -> Line:
    usage = f"  tokens {tokens_text(step.usage)}, {dollars(step.cost_usd)}" if step.usage is not None else ""
    return Line(f"step {step.number}{usage}", "bold magenta")


def item_lines(item: StreamItem) -> list[Line]:
    if item.kind == AGENT_MESSAGE:
        text = (item.text or "").strip().splitlines() or [""]
        out = [Line(f"  agent: {text[0]}", "")]
        out += [Line(f"         {more}", "") for more in text[1:MESSAGE_LINES]]
        if len(text) > MESSAGE_LINES:
            out.append(Line(f"         ... ({len(text) - MESSAGE_LINES} more lines)", "dim"))
        return out
    if item.kind == REASONING:
        first = (item.text or "").strip().splitlines()[:1]
        return [Line(f"  thinking: {first[0] if first else ''}", "dim")]
    if item.kind in (COMMAND, TOOL_CALL):
        command = display_command(item.command) if item.kind == COMMAND else f"{item.command or 'tool'} (tool)"
        shown = command.splitlines()[0] + (" ..." if "\n" in command else "")
        exit_text = "running" if not item.completed else f"exit {item.exit_code}" if item.exit_code is not None \
            else item.status or "done"
        test = " [test]" if runs_tests(command) else ""
        duration = f" {_seconds(item.duration_seconds)}" if item.duration_seconds is not None else ""
        out = [Line(f"  $ {shown}{test}  -> {exit_text}{duration}", "red" if item.failed else "green" if item.completed
                    else "cyan")]
        if item.failed and item.output:
            out += [Line(f"      {text}", "dim red") for text in item.output.rstrip().splitlines()[-FAILED_OUTPUT_LINES:]]
        return out
    if item.kind == FILE_CHANGE:
        status = "" if item.status in (None, "completed") else f" ({item.status})"
        return [Line(f"  ~ {change.kind} {change.path}{status}", "yellow") for change in item.changes] \
            or [Line(f"  ~ file change{status}", "yellow")]
    if item.kind == ERROR:
        return [Line(f"  codex error: {item.text or ''}", "red")]
    return [Line(f"  codex item {item.kind} (kept raw)", "dim")]


def raw_lines(event: RawEvent) -> list[Line]:
    kind = event.event.get("type") if isinstance(event.event, dict) else None
    return [Line(f"  codex event {kind or event.why} (kept raw, line {event.line})", "dim")]


def step_lines(step: Step, raw: list[RawEvent]) -> list[Line]:
    lines = [step_header(step)]
    for item in step.items:
        lines += item_lines(item)
    for event in raw:
        lines += raw_lines(event)
    return lines


def steps_lines(view: AttemptView) -> list[Line]:
    trajectory = view.trajectory
    if trajectory is None:
        return [Line("codex: no event stream yet (codex has not run)", "yellow")]
    raw: dict[int, list[RawEvent]] = {}
    for number, event in trajectory.raw_events:
        raw.setdefault(number, []).append(event)
    lines = [line for event in raw.get(0, []) for line in raw_lines(event)]
    for step in trajectory.steps:
        lines += step_lines(step, raw.get(step.number, []))
    return lines


def summary_lines(view: AttemptView) -> list[Line]:
    lines: list[Line] = []
    trajectory = view.trajectory
    if trajectory is not None:
        commands = trajectory.commands
        failed = sum(1 for c in commands if c.failed)
        tests = sum(1 for c in commands if runs_tests(display_command(c.command)))
        lines.append(Line(f"total: {len(trajectory.steps)} steps, {len(commands)} commands ({failed} failed, "
                          f"{tests} test runs), {len(trajectory.files_changed)} files changed", "bold"))
        lines.append(Line(f"  tokens {tokens_text(trajectory.usage)}, {dollars(trajectory.cost_usd)}"
                          + ("" if trajectory.usage_reported else " (from the session record; codex reported none)"),
                          ""))
        if trajectory.failed_turns:
            lines.append(Line(f"codex: {trajectory.failed_turns} turn(s) failed", "bold red"))
        lines += [Line(f"  codex error: {error}", "red") for error in trajectory.errors]
    if view.patch is not None:
        added = sum(a for _, a, _ in view.patch.files)
        removed = sum(r for _, _, r in view.patch.files)
        lines.append(Line(f"patch: {len(view.patch.files)} files, +{added} -{removed}, {view.patch.size:,} bytes", "bold"))
        lines += [Line(f"  {path}  +{a} -{r}", "") for path, a, r in view.patch.files]
    else:
        lines.append(Line("patch: none", "dim"))
    evaluation = view.evaluation
    if evaluation is not None:
        lines.append(Line(f"evaluation: apply exit {evaluation.apply_exit_code}, test exit {evaluation.test_exit_code}"
                          + (" (timed out)" if evaluation.timed_out else ""), "bold"))
        lines.append(Line(f"  official verdict: {'resolved' if evaluation.resolved else 'not resolved'}; exit-code "
                          f"verdict: {'pass' if evaluation.exit_code_verdict else 'fail'}"
                          + ("; THEY DISAGREE" if evaluation.verdicts_disagree else ""),
                          "green" if evaluation.resolved else "red"))
        for name, tail in evaluation.log_tails.items():
            if tail.strip():
                lines.append(Line(f"  --- {name} (last lines)", "dim"))
                lines += [Line(f"  {text}", "") for text in tail.splitlines()]
    else:
        lines.append(Line("evaluation: not run", "dim"))
    if view.phases:
        lines.append(Line("time: " + ", ".join(f"{p.phase} {_seconds(p.seconds)}" + ("" if p.status == "ok" else
                                                f" ({p.status}: {p.reason})") for p in view.phases), "bold"))
    return lines


def timeline(view: AttemptView) -> list[Line]:
    return [*header_lines(view), *steps_lines(view), *summary_lines(view)]
