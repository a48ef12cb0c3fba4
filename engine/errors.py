"""Typed errors of the model layer. Each message says what to do about it."""

from __future__ import annotations

from corps.cache.errors import CorpsError, InvalidRequest

__all__ = [
    "AwaitingInput",
    "BadAdapter",
    "BadConfig",
    "BadWeights",
    "CallCancelled",
    "ConstraintViolated",
    "CorpsError",
    "EngineBusy",
    "EngineClosed",
    "FetchError",
    "InvalidConstraint",
    "InvalidRequest",
    "ModelNotFound",
    "NonFiniteLogits",
    "UnsupportedModel",
]


class AwaitingInput(CorpsError):
    """A recorded run asked for an outside input (a person's answer, a tool's callback)
    nobody has given yet: the run pauses there. Every call it finished is kept in the
    store; give the input (`run.give`, from this process or another) and run it again
    under its name: its finished calls replay and it goes on from the input."""

    def __init__(self, run: str, key: str) -> None:
        self.run, self.key = run, key
        super().__init__(
            f"run {run!r} waits for its input {key!r}: give it (`with engine.recorded("
            f"{run!r}) as run: await run.give({key!r}, text)`) and run it again under "
            f"that name, or ask with wait=True to wait in this process"
        )


class BadAdapter(InvalidRequest):
    """A LoRA adapter directory that is missing, not in PEFT's format, or made for
    another model (its modules or shapes do not match)."""


class BadWeights(CorpsError):
    """A weight file corps cannot read as it is: truncated or not a GGUF, a tensor
    missing, of a block type nothing decodes, or of a shape the model's config does
    not give. The message names the file and the tensor; nothing is loaded."""


class ModelNotFound(CorpsError):
    """An alias, directory or hub id that names no loadable model."""


class UnsupportedModel(CorpsError):
    """A model whose architecture corps cannot run (not a RoPE decoder of the Llama family)."""


class FetchError(CorpsError):
    """The embedded default model could not be fetched (no network, no pip, bad wheel)."""


class EngineBusy(CorpsError):
    """The engine's queue is full (raised by the *_nowait calls); retry or await instead."""


class EngineClosed(CorpsError):
    """The engine is not running: not started, shut down, or its loop crashed."""


class CallCancelled(CorpsError):
    """The call was cancelled (`Pending.cancel()`) before it finished; it left no message."""


class NonFiniteLogits(CorpsError):
    """A sampled call's next-token scores hold NaN or inf (e.g. a 16-bit overflow): that
    call fails; open the engine with dtype="float32"."""


class InvalidConstraint(InvalidRequest):
    """A regex, JSON schema, choice list or grammar that cannot constrain a decode
    (raised when the call is made, before anything is encoded)."""


class ConstraintViolated(CorpsError):
    """A token a constrained call had to emit (a forced token) breaks its constraint:
    that call fails, the others go on."""


#: where a setting's command-line option is not its name
_FLAGS = {"otel": "--otel-endpoint"}


class BadConfig(InvalidRequest):
    """Engine settings that are not valid; `fields` names the settings at fault."""

    def __init__(self, message: str, fields: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.fields = fields

    def for_cli(self) -> str:
        """The message with the command-line option of each field (`--leak-policy`)."""
        flags = ", ".join(_FLAGS.get(f, "--" + f.replace("_", "-")) for f in self.fields)
        return f"{flags}: {self}" if flags else str(self)
