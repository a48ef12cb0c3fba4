"""Constrained parameter types for patterns' signatures.

A pattern's signature is the one source of truth for its parameters
(`corps.patterns.registry.params_model`): these ranges are checked with the
types before anything loads, so `corps run tree-of-thoughts --set branches=0`
exits 2 in one line instead of failing minutes into a run.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

#: Most of anything one workflow makes: a larger count is a typo, and was taken at its
#: word (`--set branches=9999999999` built ten billion coroutines until the machine
#: ran out of memory).
MAX_COUNT = 1024
#: How many of something a pattern makes (agents, rounds, branches, voters): 1 to
#: MAX_COUNT.
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
#: Tokens a call may generate: >= 1.
Tokens = Annotated[int, Field(ge=1, le=1 << 16)]
#: Sampling temperature: >= 0 (0 is greedy).
Temperature = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
#: Nucleus mass: in (0, 1].
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
#: A non-empty text.
Text = Annotated[str, Field(min_length=1)]
#: A non-empty list of non-empty texts.
Texts = Annotated[tuple[Text, ...], Field(min_length=1)]
