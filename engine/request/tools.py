"""Tool calls: the syntax a model family writes them in, the grammar that makes a reply
either text or well-formed calls, and the parse of a reply (whole, cut by
`max_tokens`, or as it streams) into calls. `corps serve` offers a request's tools
with it (and streams calls as OpenAI deltas: `corps.serve.tools`); an agent offers
its own (`corps.agents.tools`).

The syntax is chosen in one place (`syntax_of`), from the model's chat template:
Hermes/Qwen's `<tool_call>` tags where the template has them, Llama 3.1's JSON
with `parameters` where it has the ipython role, plain JSON objects otherwise
(SmolLM2 and the dummy models). Every tool reply is constrained: the grammar
admits content (`tool_choice: "auto"`) or one call (or several, one per line,
with `parallel_tool_calls`) of a given tool, its arguments constrained to the
tool's parameter schema. Content is free text that does not begin like a call,
or, when the request also has a `response_format`, JSON that matches its schema:
a typed agent with tools gets a call or its typed answer. So a call, once begun,
is always well-formed unless the token budget cuts it; a cut call comes back in
`tool_calls` with `finish_reason: "length"`, its arguments as far as they got.

Where calls and JSON content may begin alike (syntaxes without an opening tag),
a reply is a call once it begins as one of the offered tools' calls does
(`{"name": "get_weather", "arguments": `) and content once it cannot; a stream
holds its first characters back until they say which (`Offer.kind`).

A call's `arguments` is the model's own text of them, streamed or not, so the
OpenAI SDK's stream helper rebuilds exactly the calls of the unstreamed reply.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from corps.engine.request.constraint import JSON_LAYOUT


@dataclass(frozen=True)
class Syntax:
    """How a model family writes tool calls: each call a JSON object with `name` and
    `args`, between `open` and `close`, calls joined by `sep`. Free text may not
    begin with `first` (the first character of a call)."""

    name: str
    open: str = ""
    close: str = ""
    sep: str = "\n"
    args: str = "arguments"

    @property
    def first(self) -> str:
        return (self.open or "{")[0]

    def render(self, calls: list[tuple[str, Any]]) -> str:
        """An assistant's earlier calls, (name, arguments) each, as this syntax writes them."""
        return self.sep.join(
            self.open + json.dumps({"name": n, self.args: a}) + self.close for n, a in calls
        )

    def head(self, name: str) -> str:
        """How a call of `name` begins, up to its arguments (the grammar's layout)."""
        return f'{self.open}{{"name": {json.dumps(name)}, {json.dumps(self.args)}: '

    def render_text(self, calls: list[tuple[str, str]]) -> str:
        """Earlier calls given as (name, arguments' text): a call whose arguments are
        JSON as `render` writes it; one whose arguments are not (a call a token budget
        cut) as the model wrote it, its text ending where the arguments end."""
        out = []
        for name, arguments in calls:
            try:
                out.append(self.render([(name, json.loads(arguments or "{}"))]))
            except (ValueError, RecursionError):
                out.append(self.head(name) + arguments)
        return self.sep.join(out)


JSON_CALLS = Syntax("json")
HERMES = Syntax("hermes", open="<tool_call>\n", close="\n</tool_call>")
LLAMA3 = Syntax("llama3", args="parameters")


def syntax_of(chat_template: str | None) -> Syntax:
    """The tool-call syntax of a model whose chat template is `chat_template`."""
    template = chat_template or ""
    if "<tool_call>" in template:  # Qwen2/2.5/3, Hermes
        return HERMES
    if "<|python_tag|>" in template or "ipython" in template:  # Llama 3.1+
        return LLAMA3
    return JSON_CALLS


@dataclass(frozen=True)
class Offer:
    """The tools a request offers and how the reply may use them."""

    syntax: Syntax
    tools: tuple[tuple[str, str, dict], ...]  # (name, description, parameter schema)
    choice: str  # "auto", "required", or the one tool's name the reply must call
    parallel: bool = True
    content: dict | None = None  # the JSON schema content matches; None: free text

    def instructions(self) -> str:
        """The system message that tells the model its tools and how to call them."""
        example = self.syntax.render([("<tool name>", {})]).replace("{}", "<its arguments>")
        several = "For several calls, write each on its own line.\n" if self.parallel else ""
        listed = "\n".join(
            json.dumps({"name": n, "description": d, "parameters": p}) for n, d, p in self.tools
        )
        return (
            f"You can call these tools. To call one, reply with only:\n{example}\n{several}{listed}"
        )

    def grammar(self) -> str:
        """A Lark grammar (llguidance's dialect) of the replies this offer admits."""
        syn = self.syntax
        shapes = [
            {"type": "object", "additionalProperties": False, "required": ["name", syn.args],
             "properties": {"name": {"const": n}, syn.args: p}}
            for n, _, p in self._offered()
        ]  # fmt: skip
        schema = shapes[0] if len(shapes) == 1 else {"anyOf": shapes}
        schema = {**schema, "x-guidance": JSON_LAYOUT}
        call = " ".join(
            [*([json.dumps(syn.open)] if syn.open else []), f"%json {json.dumps(schema)}",
             *([json.dumps(syn.close)] if syn.close else [])]
        )  # fmt: skip
        calls = f"call ({json.dumps(syn.sep)} call)*" if self.parallel else "call"
        start = "content | calls" if self.choice == "auto" else "calls"
        return f"start: {start}\ncalls: {calls}\ncall: {call}\n{self._content_rules()}"

    def _offered(self) -> list[tuple[str, str, dict]]:
        return [t for t in self.tools if self.choice in ("auto", "required", t[0])]

    def _content_rules(self) -> str:
        if self.content is not None:  # JSON matching the response format's schema
            return f"content: %json {json.dumps({**self.content, 'x-guidance': JSON_LAYOUT})}\n"
        first = self.syntax.first.replace("\\", "\\\\").replace("/", "\\/")
        return f"content: TEXT\nTEXT: /[^{first}\\s][\\s\\S]*/\n"

    def kind(self, text: str) -> str | None:
        """Whether a reply (so far) is "calls" or "content"; None while it could still
        be either (its text a proper prefix of how an offered call begins)."""
        if self.content is None:  # free text never begins as a call does
            return "calls" if text.startswith(self.syntax.first) else "content"
        heads = [self.syntax.head(name) for name, _, _ in self._offered()]
        if any(text.startswith(h) for h in heads):
            return "calls"
        return None if any(h.startswith(text) for h in heads) else "content"

    def parse(self, text: str) -> tuple[str | None, list[Call]]:
        """A reply as (content, calls), as `parse` reads it, content told from calls by
        `kind` (a reply cut while it could be either has neither)."""
        kind = self.kind(text)
        if kind == "content":
            return text, []
        return parse(self.syntax, text) if kind == "calls" else (None, [])


@dataclass
class Call:
    """One call of a reply: its tool's name (None until written), its arguments' text
    so far, and whether it is whole."""

    name: str | None
    arguments: str
    complete: bool
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name or "", "arguments": self.arguments}}  # fmt: skip


def parse(syntax: Syntax, text: str) -> tuple[str | None, list[Call]]:
    """A reply as (content, calls): text that does not begin like a call is content;
    otherwise its calls, the last possibly cut (`complete` False). A call cut before
    its name is written is left out (a stream never announced it)."""
    content, calls = parse_calls(syntax, text)
    return content, [c for c in calls if c.name is not None]


def parse_calls(syntax: Syntax, text: str) -> tuple[str | None, list[Call]]:
    """`parse`, keeping a last call cut before its name (name None): a stream's view."""
    if not text.startswith(syntax.first):
        return text, []
    calls: list[Call] = []
    i = 0
    while i < len(text):
        if not text.startswith(syntax.open, i):
            if not syntax.open.startswith(text[i:]):
                break  # not a call: nothing the grammar admits; stop here
            calls.append(Call(None, "", False))
            return None, calls
        i += len(syntax.open)
        call, end = _call(syntax, text, i)
        calls.append(call)
        if end is None or not text.startswith(syntax.close, end):
            call.complete = False
            break
        i = end + len(syntax.close)
        if not text.startswith(syntax.sep, i):
            break
        i += len(syntax.sep)
    if not calls:
        return text, []
    return None, calls


def _call(syntax: Syntax, text: str, i: int) -> tuple[Call, int | None]:
    """The call whose JSON object starts at `i`; and where the object ends (None: cut)."""
    fields, end = _object(text, i)
    name = None
    span = fields.get("name")
    if span is not None and span[1] is not None:
        try:
            name = json.loads(text[span[0] : span[1]])
        except ValueError:
            name = None
    args = fields.get(syntax.args)
    arguments = "" if args is None else text[args[0] : args[1]]
    return Call(name, arguments, end is not None), end


def _object(text: str, i: int) -> tuple[dict[str, tuple[int, int | None]], int | None]:
    """The top-level fields of the JSON object at `i` (key -> value span, its end None if
    cut) and the object's end (None: cut)."""
    fields: dict[str, tuple[int, int | None]] = {}
    if i >= len(text) or text[i] != "{":
        return fields, None
    j = i + 1
    while True:
        j = _skip(text, j, " \n\t\r,")
        if j >= len(text):
            return fields, None
        if text[j] == "}":
            return fields, j + 1
        key_end = _value_end(text, j)
        if key_end is None:
            return fields, None
        key = json.loads(text[j:key_end])
        j = _skip(text, key_end, " \n\t\r:")
        if j >= len(text):
            fields[key] = (j, None)
            return fields, None
        end = _value_end(text, j)
        fields[key] = (j, end)
        if end is None:
            return fields, None
        j = end


def _skip(text: str, j: int, chars: str) -> int:
    while j < len(text) and text[j] in chars:
        j += 1
    return j


def _value_end(text: str, j: int) -> int | None:
    """Where the JSON value starting at `j` ends (None: the text ends first)."""
    if text[j] == '"':
        k = j + 1
        while k < len(text):
            if text[k] == "\\":
                k += 2
                continue
            if text[k] == '"':
                return k + 1
            k += 1
        return None
    if text[j] in "{[":
        depth, k, in_string = 0, j, False
        while k < len(text):
            c = text[k]
            if in_string:
                if c == "\\":
                    k += 1
                elif c == '"':
                    in_string = False
            elif c == '"':
                in_string = True
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return k + 1
            k += 1
        return None
    k = j
    while k < len(text) and text[k] not in ",}] \n\t\r":
        k += 1
    return k if k < len(text) else None  # a number or literal may still go on
