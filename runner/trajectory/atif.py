"""An attempt in Harbor's Agent Trajectory Interchange Format (ATIF), and a validator for it.

The models below are written from ATIF's published specification (Harbor's RFC 0001,
"Agent Trajectory Interchange Format", v1.4): the root, AgentSchema, StepObject,
ToolCallSchema, ObservationSchema and its results, MetricsSchema and FinalMetricsSchema,
with the RFC's rules: required fields, step ids sequential from 1, the agent-only fields
only on agent steps, an observation's ``source_call_id`` naming a tool call of its step,
ISO 8601 timestamps. Unknown fields are refused (``extra="forbid"``) so a typo is an error.

The mapping from codex: the prompt is the user step; each model response is an agent step
(its messages, reasoning, tool calls: ``exec_command`` for a command, ``apply_patch`` for a
file change, with their outputs as observations); tokens go to ``metrics`` (ATIF's
``prompt_tokens`` includes the cached ones, as codex's ``input_tokens`` does, so the counts
map one to one; reasoning and cache writes go to ``metrics.extra``). A codex item or event the
mapping does not know is kept whole in its step's ``extra`` (``codex_raw``), never dropped.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from runner.codex_usage import TokenCounts
from runner.errors import InvalidTrajectoryError, NoEventStreamError, first_problem
from runner.trajectory.attempt import AttemptView
from runner.trajectory.events import AGENT_MESSAGE, COMMAND, FILE_CHANGE, REASONING, TOOL_CALL, RawEvent, StreamItem
from runner.trajectory.model import Step, display_command

SCHEMA_VERSION = "ATIF-v1.4"
SCHEMA_VERSIONS = ("ATIF-v1.0", "ATIF-v1.1", "ATIF-v1.2", "ATIF-v1.3", "ATIF-v1.4")
Count = Field(default=None, ge=0)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Agent(_Strict):
    name: str
    version: str
    model_name: str | None = None
    extra: dict[str, Any] | None = None


class ToolCall(_Strict):
    tool_call_id: str
    function_name: str
    arguments: dict[str, Any]


class SubagentTrajectoryRef(_Strict):
    session_id: str
    trajectory_path: str | None = None
    extra: dict[str, Any] | None = None


class ObservationResult(_Strict):
    source_call_id: str | None = None
    content: str | None = None
    subagent_trajectory_ref: list[SubagentTrajectoryRef] | None = None


class Observation(_Strict):
    results: list[ObservationResult]


class Metrics(_Strict):
    prompt_tokens: int | None = Count
    completion_tokens: int | None = Count
    cached_tokens: int | None = Count
    cost_usd: float | None = Field(default=None, ge=0)
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    extra: dict[str, Any] | None = None


class FinalMetrics(_Strict):
    total_prompt_tokens: int | None = Count
    total_completion_tokens: int | None = Count
    total_cached_tokens: int | None = Count
    total_cost_usd: float | None = Field(default=None, ge=0)
    total_steps: int | None = Count
    extra: dict[str, Any] | None = None


_AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")


class AtifStep(_Strict):
    step_id: int = Field(ge=1)
    timestamp: str | None = None
    source: Literal["system", "user", "agent"]
    model_name: str | None = None
    reasoning_effort: str | float | None = None
    message: str
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    observation: Observation | None = None
    metrics: Metrics | None = None
    extra: dict[str, Any] | None = None

    @field_validator("timestamp")
    @classmethod
    def _iso_8601(cls, value: str | None) -> str | None:
        if value is not None:
            datetime.fromisoformat(value.replace("Z", "+00:00"))  # ValueError: not ISO 8601
        return value

    @model_validator(mode="after")
    def _agent_fields_on_agent_steps(self) -> AtifStep:
        if self.source != "agent":
            present = [name for name in _AGENT_ONLY if getattr(self, name) is not None]
            if present:
                raise ValueError(f"{', '.join(present)} only apply to agent steps, not {self.source} steps")
        return self


class AtifTrajectory(_Strict):
    schema_version: Literal[SCHEMA_VERSIONS]  # type: ignore[valid-type]
    session_id: str
    agent: Agent
    steps: list[AtifStep]
    notes: str | None = None
    final_metrics: FinalMetrics | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _steps_in_order_and_calls_referenced(self) -> AtifTrajectory:
        for i, step in enumerate(self.steps, start=1):
            if step.step_id != i:
                raise ValueError(f"steps[{i - 1}].step_id is {step.step_id}: step ids are sequential from 1")
            calls = {call.tool_call_id for call in step.tool_calls or []}
            for result in step.observation.results if step.observation else []:
                if result.source_call_id is not None and result.source_call_id not in calls:
                    raise ValueError(f"steps[{i - 1}]: observation source_call_id {result.source_call_id!r} "
                                     "names no tool call of its step")
        return self


def validate_atif(document: object) -> AtifTrajectory:
    """Raises: InvalidTrajectoryError naming the first problem."""
    try:
        return AtifTrajectory.model_validate(document)
    except ValidationError as e:
        raise InvalidTrajectoryError(f"not an ATIF trajectory: {first_problem(e)}") from e


# -- codex -> ATIF ----------------------------------------------------------------------------------

def _metrics(usage: TokenCounts, cost: float | None) -> Metrics:
    return Metrics(prompt_tokens=usage.input_tokens, completion_tokens=usage.output_tokens,
                   cached_tokens=usage.cached_input_tokens, cost_usd=cost,
                   extra={"reasoning_output_tokens": usage.reasoning_output_tokens,
                          "cache_write_input_tokens": usage.cache_write_input_tokens})


def _call(item: StreamItem) -> ToolCall:
    if item.kind == COMMAND:
        return ToolCall(tool_call_id=item.id, function_name="exec_command",
                        arguments={"cmd": display_command(item.command)})
    if item.kind == FILE_CHANGE:
        return ToolCall(tool_call_id=item.id, function_name="apply_patch",
                        arguments={"changes": [{"path": c.path, "kind": c.kind} for c in item.changes]})
    return ToolCall(tool_call_id=item.id, function_name=str(item.raw.get("tool") or item.raw.get("type") or "tool"),
                    arguments={k: v for k, v in item.raw.items() if k not in ("id", "type", "status", "result")})


def _result(item: StreamItem) -> ObservationResult:
    if item.kind == FILE_CHANGE:
        content = "\n".join(f"{c.kind} {c.path}" for c in item.changes)
    else:
        content = item.output or ""
    return ObservationResult(source_call_id=item.id, content=content)


def _raw(event: RawEvent) -> dict[str, Any]:
    return {"line": event.line, "why": event.why, "event": event.event}


def _agent_step(step_id: int, step: Step, model: str | None, raw: list[RawEvent]) -> AtifStep:
    tools = [item for item in step.items if item.kind in (COMMAND, FILE_CHANGE, TOOL_CALL)]
    reasoning = [item.text for item in step.of(REASONING) if item.text]
    runs = {item.id: {"status": item.status, "exit_code": item.exit_code, "duration_seconds": item.duration_seconds}
            for item in tools}
    unknown = [dict(item.raw) for item in step.items
               if item.kind not in (AGENT_MESSAGE, REASONING, COMMAND, FILE_CHANGE, TOOL_CALL)]
    extra: dict[str, Any] = {"codex_step": step.number, "tool_runs": runs} if runs else {"codex_step": step.number}
    if unknown or raw:
        extra["codex_raw"] = [*({"item": item} for item in unknown), *(_raw(event) for event in raw)]
    return AtifStep(
        step_id=step_id, timestamp=step.timestamp, source="agent", model_name=model,
        message="\n\n".join(step.messages), reasoning_content="\n\n".join(reasoning) if reasoning else None,
        tool_calls=[_call(item) for item in tools] or None,
        observation=Observation(results=[_result(item) for item in tools]) if tools else None,
        metrics=_metrics(step.usage, step.cost_usd) if step.usage is not None else None, extra=extra,
    )


def to_atif(view: AttemptView, *, codex_version: str | None) -> dict[str, Any]:
    """The attempt as an ATIF document (validated before it is returned).

    Raises:
        NoEventStreamError: codex has written no event stream in this job root.
    """
    trajectory = view.trajectory
    if trajectory is None:
        raise NoEventStreamError(f"{view.tag}: no codex event stream (logs/codex.stdout.log) in this job root; "
                                 "codex has not run here")
    steps = [AtifStep(step_id=1, source="user", message=view.prompt or "")]
    raw_by_step: dict[int, list[RawEvent]] = {}
    for number, event in trajectory.raw_events:
        raw_by_step.setdefault(number, []).append(event)
    for step in trajectory.steps:
        steps.append(_agent_step(len(steps) + 1, step, trajectory.model, raw_by_step.get(step.number, [])))
    usage = trajectory.usage
    extra: dict[str, Any] = {"tag": view.tag, "terminal_state": view.terminal_state, "resolved": view.resolved,
                             "running": view.running}
    if trajectory.errors:  # codex's stream-level errors and failed turns: no step holds them
        extra["codex_errors"] = list(trajectory.errors)
    if trajectory.preamble or raw_by_step.get(0):
        extra["codex_raw"] = [*({"item": dict(item.raw)} for item in trajectory.preamble),
                              *(_raw(event) for event in raw_by_step.get(0, []))]
    document = AtifTrajectory(
        schema_version=SCHEMA_VERSION,
        session_id=trajectory.thread_id or view.tag,
        agent=Agent(name="codex", version=(codex_version or "unknown").removeprefix("codex-cli ").strip() or "unknown",
                    model_name=trajectory.model, extra={"runner": "agentissue-runner", "tag": view.tag}),
        steps=steps,
        notes=("codex exec --json events; one agent step per model response"
               + (" (from codex's session record)" if trajectory.from_session_record else " (inferred from the stream)")),
        final_metrics=FinalMetrics(
            total_prompt_tokens=usage.input_tokens, total_completion_tokens=usage.output_tokens,
            total_cached_tokens=usage.cached_input_tokens, total_cost_usd=trajectory.cost_usd, total_steps=len(steps),
            extra={"reasoning_output_tokens": usage.reasoning_output_tokens,
                   "cache_write_input_tokens": usage.cache_write_input_tokens,
                   "codex_turns": trajectory.codex_turns, "failed_turns": trajectory.failed_turns}),
        extra=extra,
    )
    return document.model_dump(mode="json", exclude_none=True)


def tokens_of(document: dict[str, Any]) -> TokenCounts:
    """The token counts an ATIF document of ours carries (the inverse of the mapping above)."""
    final = validate_atif(document).final_metrics or FinalMetrics()
    extra = final.extra or {}
    return TokenCounts(input_tokens=final.total_prompt_tokens or 0, cached_input_tokens=final.total_cached_tokens or 0,
                       cache_write_input_tokens=int(extra.get("cache_write_input_tokens", 0)),
                       output_tokens=final.total_completion_tokens or 0,
                       reasoning_output_tokens=int(extra.get("reasoning_output_tokens", 0)))
