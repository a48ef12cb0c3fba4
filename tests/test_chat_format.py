"""Chat framing (engine/request/chat_format.py) on the SmolLM2, Qwen2, Qwen3, Llama-3 templates."""

from __future__ import annotations

import pytest

from corps.engine.request.chat_format import ChatFormat

from helpers import SMOL_TEMPLATE, make_tokenizer

QWEN2 = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content']"
    " + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba "
    "Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant') %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
QWEN3 = (
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + "
    "'<|im_end|>\\n' }}{%- endif %}{%- set ns = namespace(multi_step_tool=true, "
    "last_query_index=messages|length - 1) %}{%- for message in messages[::-1] %}{%- set index = "
    "(messages|length - 1) - loop.index0 %}{%- if ns.multi_step_tool and message.role == 'user' %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}"
    "{%- endfor %}{%- if ns.multi_step_tool %}{{- raise_exception('No user query found in "
    "messages.') }}{%- endif %}{%- for message in messages %}{%- if (message.role == 'user') or "
    "(message.role == 'system' and not loop.first) %}{{- '<|im_start|>' + message.role + '\\n' + "
    "message.content + '<|im_end|>' + '\\n' }}{%- elif message.role == 'assistant' %}{%- if "
    "loop.index0 > ns.last_query_index %}{{- '<|im_start|>' + message.role + "
    "'\\n<think>\\n\\n</think>\\n\\n' + message.content }}{%- else %}{{- '<|im_start|>' + "
    "message.role + '\\n' + message.content }}{%- endif %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
CHATML = {r: (f"<|im_start|>{r}\n", "<|im_end|>\n") for r in ("system", "user", "assistant")}
EXPECTED = {
    "smollm2": (SMOL_TEMPLATE, CHATML),
    "qwen2": (QWEN2, CHATML),
    "qwen3": (
        QWEN3,
        {**CHATML, "assistant": ("<|im_start|>assistant\n<think>\n\n</think>\n\n", "<|im_end|>\n")},
    ),
    "llama3": (
        LLAMA3,
        {
            r: (f"<|start_header_id|>{r}<|end_header_id|>\n\n", "<|eot_id|>")
            for r in ("system", "user", "assistant")
        },
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_frames_each_role_with_nothing_injected(tmp_path, name):
    template, expected = EXPECTED[name]
    fmt = ChatFormat(make_tokenizer(tmp_path, template=template, bos_sink=name == "llama3"))
    for role, frame in expected.items():
        assert fmt.frame(role) == frame
        rendered = fmt.render(role, "What is 7*6?")
        assert "helpful" not in rendered and "<s>" not in rendered
    assert fmt.encode(fmt.render("user", "hi")) == fmt.encode(
        expected["user"][0] + "hi" + expected["user"][1]
    )
    for role, (header, footer) in expected.items():  # encoded once, each part alone
        ids = fmt.frame_ids(role)
        assert ids == (tuple(fmt.encode(header)), tuple(fmt.encode(footer)))
        assert fmt.frame_ids(role) is ids
    assert fmt.encode("") == []


def test_stop_ids_and_sink(tmp_path):
    fmt = ChatFormat(make_tokenizer(tmp_path / "a"))
    im_end = fmt.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in fmt.stop_ids and fmt.sink == []
    with_bos = ChatFormat(make_tokenizer(tmp_path / "b", bos_sink=True))
    assert with_bos.sink == [with_bos.tokenizer.convert_tokens_to_ids("<s>")]


async def test_unframed_messages_pass_through(tiny_dirs):
    from conftest import open_tiny

    async with open_tiny(tiny_dirs, "llama") as engine:
        raw = await engine.prefill([7, 8, 9], frame=False)
        assert raw.tokens == [7, 8, 9]
        text = await engine.prefill("hello world", frame=False)
        assert text.tokens == engine.chat.encode("hello world") and text.text == "hello world"
        framed = await engine.prefill("hello world", role="user")
        assert framed.tokens == engine.chat.encode("<|im_start|>user\nhello world<|im_end|>\n")
