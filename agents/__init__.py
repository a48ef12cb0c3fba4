"""corps.agents: agents as async actors that exchange message handles."""

from corps.agents.agent import Agent
from corps.agents.errors import (
    AgentError,
    AgentStopped,
    AskTimeout,
    IncompleteReply,
    MailboxFull,
    UnknownAgent,
)
from corps.agents.runtime import DEAD_LETTERS, AgentRuntime, DeadLetter, Runtime

__all__ = [
    "DEAD_LETTERS",
    "Agent",
    "AgentError",
    "AgentRuntime",
    "AgentStopped",
    "AskTimeout",
    "DeadLetter",
    "IncompleteReply",
    "MailboxFull",
    "Runtime",
    "UnknownAgent",
]
