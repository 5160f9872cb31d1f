"""Tokenizer loading from local directories and chat-template token ids, on conftest.py's tiny BPE tokenizer."""

import pytest

from rubric_jax.models.tokenizer import apply_chat_template, load_tokenizer
from tests.tiny_checkpoints import EMPTY_THINK_BLOCK, IM_END_ID, IM_START_ID

MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "what is two plus two?"},
]


def _text_ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def _turn_ids(tokenizer, role, content):
    """<|im_start|>{role}\\n{content}<|im_end|>\\n, the fixture's template for one message."""
    return [IM_START_ID, *_text_ids(tokenizer, f"{role}\n{content}"), IM_END_ID, *_text_ids(tokenizer, "\n")]


def test_chat_template_ids_with_a_generation_prompt(tiny_qwen3_dir):
    tokenizer = load_tokenizer(tiny_qwen3_dir)
    expected = [id_ for m in MESSAGES for id_ in _turn_ids(tokenizer, m["role"], m["content"])]
    expected += [IM_START_ID, *_text_ids(tokenizer, "assistant\n")]
    assert apply_chat_template(tokenizer, MESSAGES) == expected


def test_chat_template_ids_without_a_generation_prompt(tiny_qwen3_dir):
    tokenizer = load_tokenizer(tiny_qwen3_dir)
    ids = apply_chat_template(tokenizer, MESSAGES, add_generation_prompt=False)
    assert ids == [id_ for m in MESSAGES for id_ in _turn_ids(tokenizer, m["role"], m["content"])]
    assert all(isinstance(i, int) for i in ids)


def test_template_kwargs_are_the_templates_variables(tiny_qwen3_dir):
    """The fixture's template, as Qwen3's, opens the assistant turn with an empty think block when
    enable_thinking is false; unset (or true) it does not, and a variable the template does not read changes
    nothing."""
    tokenizer = load_tokenizer(tiny_qwen3_dir)
    plain = apply_chat_template(tokenizer, MESSAGES)
    no_thinking = apply_chat_template(tokenizer, MESSAGES, template_kwargs={"enable_thinking": False})
    assert no_thinking == plain + _text_ids(tokenizer, EMPTY_THINK_BLOCK)
    assert apply_chat_template(tokenizer, MESSAGES, template_kwargs={"enable_thinking": True}) == plain
    assert apply_chat_template(tokenizer, MESSAGES, template_kwargs={"unread": 1}) == plain


def test_tokenizer_round_trips_through_save_pretrained(tiny_qwen3_dir, tmp_path):
    tokenizer = load_tokenizer(tiny_qwen3_dir)
    tokenizer.save_pretrained(tmp_path)
    reloaded = load_tokenizer(tmp_path)
    text = "### Step 1: add the numbers. The answer is 42."
    assert reloaded.encode(text) == tokenizer.encode(text)
    assert reloaded.decode(tokenizer.encode(text)) == text
    assert apply_chat_template(reloaded, MESSAGES) == apply_chat_template(tokenizer, MESSAGES)


def test_a_directory_without_tokenizer_files_is_a_file_not_found_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no tokenizer files in .*tokenizer.json"):
        load_tokenizer(tmp_path)
