"""The OpenAI-compatible request bodies `corps serve` accepts, and its error objects.

Known fields are typed and checked; unknown fields are accepted and ignored (as
OpenAI-compatible servers do, so clients that send more still work). The corps
extension adds `corps_message_id` (and `offset`) to a message and `corps_agent`
to a request (see docs/serve.md). Every field is bounded: a body's size is
limited before it is parsed (`limits.BodyLimit`), and each list and string here
has a ceiling, so no field makes the server hold or loop over more than it says.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from corps.engine.request.tools import JSON_CALLS
from corps.serve.principals import NAME

#: an opaque message id over HTTP (MessageCache.public_id); others are "no such message"
MESSAGE_ID = Field(default=None, min_length=1, max_length=100)


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionDef(_Body):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class Tool(_Body):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedChoice(_Body):
    type: Literal["function"] = "function"
    function: dict[str, str]


class ToolCallFunction(_Body):
    """A call's name and its arguments' text: JSON, or not (a call the server cut at
    `max_tokens`, sent back in a history as it came) and then rendered as it is."""

    name: str = Field(max_length=64)
    arguments: str


class ToolCall(_Body):
    id: str = ""
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ContentPart(_Body):
    type: str
    text: str = ""


class Message(_Body):
    """A chat message: its content, or (the extension) a message of the store by id."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    function_call: ToolCallFunction | None = None  # the legacy form of one tool call
    tool_call_id: str | None = None
    corps_message_id: str | None = MESSAGE_ID
    offset: int | None = Field(default=None, ge=0)
    corps_visibility: Literal["public", "private"] | None = None  # of a message encoded now

    @model_validator(mode="after")
    def _content_or_id(self) -> Message:
        if self.function_call is not None and not self.tool_calls:
            self.tool_calls = [ToolCall(function=self.function_call)]
        if self.corps_message_id is None and self.content is None and not self.tool_calls:
            raise ValueError("a message needs content, tool_calls or corps_message_id")
        if self.offset is not None and self.corps_message_id is None:
            raise ValueError("offset places a message given by corps_message_id")
        return self

    def text(self, syntax=None) -> str:
        """The content as text (parts joined; an assistant's tool calls as `syntax`, a
        `tools.Syntax`, writes them: as the model would have)."""
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content if p.type == "text")
        if self.content is not None:
            return self.content
        calls = [(c.function.name, c.function.arguments) for c in self.tool_calls or []]
        return (syntax or JSON_CALLS).render_text(calls)


class JsonSchemaFormat(_Body):
    name: str = "response"
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Body):
    include_usage: bool = False


class Sampling(_Body):
    """Fields both endpoints share."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None  # any size: the engine reduces it to its generator's range
    stop: str | list[str] | None = Field(default=None, max_length=16)
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    logit_bias: dict[str, float] | None = Field(default=None, max_length=300)
    corps_agent: str | None = Field(default=None, pattern=NAME.pattern)

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not key.isdigit() or len(key) > 9:
                raise ValueError(f"logit_bias keys are token ids, got {key[:20]!r}")
            if not -100 <= bias <= 100:
                raise ValueError("logit_bias values are in [-100, 100]")
        return v


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool = True
    # the legacy function-calling fields, read as tools and tool_choice
    functions: list[FunctionDef] | None = Field(default=None, max_length=128)
    function_call: Literal["none", "auto"] | dict[str, str] | None = None

    @model_validator(mode="after")
    def _choice_names_a_tool(self) -> ChatRequest:
        if self.functions is not None:
            if self.tools is not None:
                raise ValueError("give tools or the legacy functions, not both")
            self.tools = [Tool(function=f) for f in self.functions]
            call = self.function_call
            self.tool_choice = (
                NamedChoice(function=call) if isinstance(call, dict) else call
            )  # fmt: skip
            self.parallel_tool_calls = False  # a legacy reply holds one function_call
        if isinstance(self.tool_choice, NamedChoice):
            name = self.tool_choice.function.get("name")
            if name not in {t.function.name for t in self.tools or []}:
                raise ValueError(
                    f"tool_choice names {str(name)[:64]!r}, which is not among the tools"
                )
        return self


class CompletionRequest(Sampling):
    prompt: str | list[str]
    echo: bool = False
