"""Chat framing: a message wrapped in the model's own role markers, nothing more.

Chat templates render whole conversations and some inject a default system
prompt when none is given (SmolLM2, Qwen2). We frame one message at a time by
rendering a small *base* conversation with and without the message and keeping
the difference: whatever the template puts at the start (a default system
prompt, a BOS) is in both renderings and drops out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from corps.engine.errors import InvalidRequest

_SENTINEL = "\u2063corps\u2063"
_BASES: tuple[tuple[dict[str, str], ...], ...] = (
    ({"role": "system", "content": "s"},),
    ({"role": "system", "content": "s"}, {"role": "user", "content": "u"}),
    ({"role": "user", "content": "u"},),
    ({"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}),
    (),
)


@dataclass
class ChatFormat:
    """Frames messages with a tokenizer's chat template and knows the stop tokens."""

    tokenizer: object  # a transformers tokenizer
    _frames: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False)
    _frame_ids: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=dict, repr=False
    )

    def __post_init__(self) -> None:
        tok = self.tokenizer
        self.has_template = bool(getattr(tok, "chat_template", None))
        self.sink: list[int] = _bos_sink(tok)
        self.stop_ids: frozenset[int] = frozenset(self._stop_ids())

    def encode(self, text: str) -> list[int]:
        """Token ids of raw text, with no special tokens added."""
        if not text:
            return []
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def frame(self, role: str) -> tuple[str, str]:
        """(header, footer) text the template puts around a message of `role`."""
        if role not in self._frames:
            self._frames[role] = self._split(role)
        return self._frames[role]

    def frame_ids(self, role: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Token ids of `frame(role)`'s header and footer, each encoded alone, once
        per role (every decode call needs them: ~15 us a tokenizer call)."""
        if role not in self._frame_ids:
            header, footer = self.frame(role)
            self._frame_ids[role] = (tuple(self.encode(header)), tuple(self.encode(footer)))
        return self._frame_ids[role]

    def render(self, role: str, content: str) -> str:
        header, footer = self.frame(role)
        return header + content + footer

    def _split(self, role: str) -> tuple[str, str]:
        if not self.has_template:
            raise InvalidRequest(
                "this tokenizer has no chat template: pass frame=False with raw text or ids"
            )
        for base in _BASES:
            framed = self._difference(list(base), {"role": role, "content": _SENTINEL})
            if framed is not None and framed.count(_SENTINEL) == 1:
                header, footer = framed.split(_SENTINEL)
                return header, footer
        raise InvalidRequest(
            f"the chat template cannot render a lone {role!r} message; use a role it knows "
            f"(system, user, assistant) or frame=False"
        )

    def _difference(self, base: list[dict[str, str]], msg: dict[str, str]) -> str | None:
        try:
            full = self._apply([*base, msg])
            pre = self._apply(base) if base else ""
        except Exception:  # templates raise for conversations they do not accept
            return None
        if not full.startswith(pre):
            return None
        framed = full[len(pre) :]
        if not base:
            framed = _strip_prefix(framed, getattr(self.tokenizer, "bos_token", None))
        return framed

    def _apply(self, messages: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False)

    def _stop_ids(self) -> set[int]:
        tok = self.tokenizer
        ids: set[int] = set()
        eos = getattr(tok, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        if self.has_template:
            try:
                _, footer = self.frame("assistant")
            except InvalidRequest:
                footer = ""
            special = set(getattr(tok, "all_special_ids", []) or [])
            special |= set(getattr(tok, "added_tokens_decoder", {}) or {})
            ids.update(i for i in self.encode(footer) if i in special)
        return ids


def _strip_prefix(text: str, prefix: str | None) -> str:
    return text[len(prefix) :] if prefix and text.startswith(prefix) else text


def _bos_sink(tokenizer) -> list[int]:
    """[BOS] if the tokenizer adds a BOS by default, else []."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return []
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    default = tokenizer("a")["input_ids"]
    return [bos] if list(default[:1]) == [bos] and list(default[1:]) == list(plain) else []
