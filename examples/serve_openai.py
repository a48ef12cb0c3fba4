"""A tree of thoughts over HTTP with the plain `openai` SDK, choreographed by message id.

Start a server (`corps serve`), then `python examples/serve_openai.py`. The question
is sent once; every proposal names it by id (`corps_message_id`) instead of resending
its text, and every vote names the question and all the proposals: nothing is encoded
twice. A client that ignores the extension still works: it resends text, and the
server reuses what it already encoded of the conversation.
"""

from __future__ import annotations

import os

from openai import OpenAI

QUESTION = "A train travels 60 km in 45 minutes. What is its speed in km/h?"


def tree_of_thoughts(client: OpenAI, model: str, branches: int = 4, voters: int = 3) -> dict:
    """Proposals over one question, votes over all of them, by id; returns the ids,
    the proposals, the votes and the prompt tokens the server found cached."""

    def ask(messages: list[dict], **kw):
        kw.setdefault("max_tokens", 48)
        return client.chat.completions.create(model=model, messages=messages, **kw)

    first = ask([{"role": "user", "content": QUESTION}], max_tokens=1)
    question = first.model_extra["corps"]["prompt"][-1]
    proposals = ask(
        [{"role": "user", "corps_message_id": question}], n=branches, temperature=0.8, seed=1
    )
    ids = [c.message.model_extra["corps"]["id"] for c in proposals.choices]
    ballot = [{"role": "user", "corps_message_id": question}]
    ballot += [{"role": "assistant", "corps_message_id": i} for i in ids]
    ballot.append({"role": "user", "content": f"Which answer (1-{branches}) is right? "
                                              "Reply with its number."})  # fmt: skip
    choices = [str(i + 1) for i in range(branches)]
    schema = {"type": "object", "properties": {"best": {"enum": choices}}, "required": ["best"],
              "additionalProperties": False}  # fmt: skip
    fmt = {"type": "json_schema", "json_schema": {"name": "vote", "schema": schema}}
    votes = ask(ballot, n=voters, temperature=0.7, seed=2, response_format=fmt, max_tokens=32)
    return {
        "question": question,
        "proposals": [c.message.content for c in proposals.choices],
        "votes": [c.message.content for c in votes.choices],
        "cached_tokens": votes.usage.prompt_tokens_details.cached_tokens,
        "prompt_tokens": votes.usage.prompt_tokens,
    }


def main() -> None:
    base = os.environ.get("CORPS_URL", "http://127.0.0.1:8000/v1")
    client = OpenAI(base_url=base, api_key=os.environ.get("CORPS_API_KEY", "none"))
    model = client.models.list().data[0].id
    out = tree_of_thoughts(client, model)
    for i, p in enumerate(out["proposals"], 1):
        print(f"proposal {i}: {p!r}")
    print("votes:", out["votes"])
    print(f"the ballot's prompt: {out['prompt_tokens']} tokens, "
          f"{out['cached_tokens']} read from the store")  # fmt: skip


if __name__ == "__main__":
    main()
