"""engine/request/requests.py: a call's typed keywords become one checked, frozen request."""

from __future__ import annotations

import dataclasses

import pytest

from corps.cache.errors import InvalidRequest
from corps.engine.request.constraint import KINDS
from corps.engine.request.requests import (
    DecodeArgs,
    DecodeRequest,
    PrefillArgs,
    PrefillRequest,
    decode_request,
    prefill_request,
    prefill_request_of,
)
from corps.engine.request.sampling_params import SamplingParams

from conftest import open_tiny


def test_sampling_keywords_and_a_sampling_object_combine():
    r = decode_request(dict(max_tokens=5, temperature=0.5, stop="END"))
    assert r.sampling == SamplingParams(max_tokens=5, temperature=0.5, stop=("END",))
    base = SamplingParams(max_tokens=9, top_k=4)
    r = decode_request(dict(sampling=base, temperature=0.7))  # keywords override it
    assert r.sampling == dataclasses.replace(base, temperature=0.7)
    assert decode_request(dict(sampling=base, top_p=None)).sampling == base  # None: unset
    assert decode_request(r) is r  # a built request passes through


def test_a_forced_decode_runs_as_many_tokens_as_it_is_given():
    assert decode_request(dict(force=[5, 6, 7])).sampling.max_tokens == 3
    assert decode_request(dict(force=[5], max_tokens=4)).sampling.max_tokens == 4
    kept = decode_request(dict(sampling=SamplingParams(max_tokens=8), force=[1, 2]))
    assert kept.sampling.max_tokens == 8


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda: decode_request(dict(max_token=3)), "unknown decode argument.*'max_token'"),
        (lambda: prefill_request("hi", dict(rol="user")), "unknown prefill argument.*'rol'"),
        (lambda: decode_request(dict(sampling={"max_tokens": 3})), "SamplingParams"),
        (lambda: decode_request(dict(leak_policy="maybe")), "leak_policy must be one of"),
        (lambda: prefill_request_of(dict(role="user")), "needs a 'message'"),
        (lambda: decode_request(dict(role="")), "role must be a non-empty string"),
    ],
)
def test_bad_arguments_are_refused_with_what_to_do(build, says):
    with pytest.raises(InvalidRequest, match=says):
        build()


def test_the_typed_keywords_are_the_requests_fields():
    """`PrefillArgs` / `DecodeArgs` name exactly what a request takes (plus, for a
    decode, the sampling fields, its constraint as one of four keywords), so the
    engine's signatures stay in step."""
    prefill = {f.name for f in dataclasses.fields(PrefillRequest)} - {"message"}
    assert set(PrefillArgs.__annotations__) == prefill
    sampling = {f.name for f in dataclasses.fields(SamplingParams)} - {"constraint"}
    decode = {f.name for f in dataclasses.fields(DecodeRequest)}
    assert set(DecodeArgs.__annotations__) == decode | sampling | set(KINDS)


async def test_the_engine_takes_built_requests_and_keywords_alike(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        (q,) = await engine.prefill_many([PrefillRequest("hello world")])
        built = DecodeRequest(parents=[q], sampling=SamplingParams(max_tokens=4, ignore_eos=True))
        a, b = await engine.decode_many([built, dict(parents=[q], max_tokens=4, ignore_eos=True)])
        c = await engine.decode(parents=[q], sampling=SamplingParams(max_tokens=4, ignore_eos=True))
        assert a.tokens == b.tokens == c.tokens
        with pytest.raises(InvalidRequest, match="unknown decode argument"):
            await engine.decode(parents=[q], max_tokenz=4)
