"""A LangGraph agent, unchanged, on `corps serve`: only its OpenAI endpoint points here.

Start a server (`corps serve`), then `python examples/serve_langgraph.py`. The graph
is an ordinary LangGraph with LangChain's `ChatOpenAI`: a solver drafts an answer, a
critic reviews it, the solver revises. Nothing in it knows corps: each call resends
the conversation's text, and the server reuses the encodings of everything it has
seen of it (the messages and its own earlier replies), which its metrics show
(`corps_cached_tokens_total`).
"""

from __future__ import annotations

import os
from typing import Annotated, TypedDict

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

QUESTION = "What is 15% of 80? Explain in one sentence."


class State(TypedDict):
    messages: Annotated[list[BaseMessage], add_messages]


def build(llm: ChatOpenAI):
    """solver -> critic -> solver, over one growing conversation."""

    def solve(state: State) -> dict:
        return {"messages": [llm.invoke(state["messages"])]}

    def critique(state: State) -> dict:
        review = llm.invoke(
            [SystemMessage("You are a strict reviewer."), *state["messages"],
             HumanMessage("Point out one mistake in the answer above, or say it is right.")]
        )  # fmt: skip
        return {"messages": [HumanMessage(f"A reviewer says: {review.content} Revise.")]}

    graph = StateGraph(State)
    graph.add_node("solve", solve)
    graph.add_node("critique", critique)
    graph.add_node("revise", solve)
    graph.add_edge(START, "solve")
    graph.add_edge("solve", "critique")
    graph.add_edge("critique", "revise")
    graph.add_edge("revise", END)
    return graph.compile()


def run(base_url: str, model: str, api_key: str = "none", max_tokens: int = 64) -> list:
    llm = ChatOpenAI(base_url=base_url, api_key=api_key, model=model, temperature=0,
                     max_tokens=max_tokens)  # fmt: skip
    out = build(llm).invoke({"messages": [HumanMessage(QUESTION)]})
    return out["messages"]


def main() -> None:
    base = os.environ.get("CORPS_URL", "http://127.0.0.1:8000/v1")
    key = os.environ.get("CORPS_API_KEY", "none")
    from openai import OpenAI

    model = OpenAI(base_url=base, api_key=key).models.list().data[0].id
    for m in run(base, model, key):
        who = "assistant" if isinstance(m, AIMessage) else "user"
        print(f"{who}: {m.content}")


if __name__ == "__main__":
    main()
