"""Step segmentation (`rubric_jax.rubrics.steps`): hand-computed spans, and token step ids against a slow
reference (a per-character loop over the text, and per-token bytes of the byte-level BPE tokenizer) on tricky and
random texts, for canonical and non-canonical (byte-split) tokenizations, with special tokens anywhere."""

import numpy as np
import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from rubric_jax.models.tokenizer import load_tokenizer
from rubric_jax.rubrics.steps import (
    MAX_STEP_NUMBER,
    STEP_HEADER,
    StepSpan,
    _starts_from_decoding,
    _starts_from_offset_mapping,
    fenced_code_regions,
    response_step_ids,
    response_text,
    split_steps,
    step_ids_from_offsets,
    step_spans,
    token_char_offsets,
)
from tests.tiny_checkpoints import IM_END_ID, IM_START_ID, PAD_ID

SPECIAL_IDS = (PAD_ID, IM_START_ID, IM_END_ID)


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_dir):
    return load_tokenizer(tiny_qwen3_dir)


# ------------------------------------------------------------------ slow references


def reference_char_steps(text: str) -> list[int]:
    """The step of every character position 0..len(text), by one loop over the characters: a fence state per
    line, and at each position outside a fence, whether a header starts there (and does not overlap the previous
    header). Position len(text) holds the step in force at the end. A text without a header is all step 1."""
    in_fence = [False] * (len(text) + 1)
    fence = None  # (character, length) of the open fence
    position = 0
    for line in text.split("\n"):
        indent = len(line) - len(line.lstrip(" "))
        body = line[indent:]
        run = len(body) - len(body.lstrip(body[:1])) if body[:1] in ("`", "~") else 0
        is_fence_line = indent <= 3 and run >= 3
        closes = fence is not None and is_fence_line and body[0] == fence[0] and run >= fence[1]
        closes = closes and not body[run:].strip()
        opens = fence is None and is_fence_line
        if opens:
            fence = (body[0], run)
        line_end = position + len(line) + 1  # the newline belongs to the line
        if fence is not None:
            for i in range(position, min(line_end, len(text) + 1)):
                in_fence[i] = True
        if closes:
            fence = None
        position = line_end
    steps, current, header_end = [], 0, 0
    for i in range(len(text) + 1):
        match = STEP_HEADER.match(text, i)
        if match and not in_fence[i] and i >= header_end:
            current, header_end = min(int(match.group(1)), MAX_STEP_NUMBER), match.end()
        steps.append(current)
    return steps if header_end else [1] * (len(text) + 1)


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable-character table, inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes)}


BYTE_DECODER = _byte_level_decoder()


def token_bytes(tokenizer, token_id: int) -> bytes:
    if token_id in SPECIAL_IDS:
        return b""
    return bytes(BYTE_DECODER[c] for c in tokenizer.convert_ids_to_tokens(token_id))


def reference_first_chars(tokenizer, ids: list[int]) -> tuple[str, list[int]]:
    """The decoded text and the character holding each token's first byte (len(text) for a token with no bytes
    at the end), from the tokens' bytes: valid UTF-8 responses only."""
    pieces = [token_bytes(tokenizer, i) for i in ids]
    text = b"".join(pieces).decode("utf-8")
    char_of_byte = [index for index, char in enumerate(text) for _ in char.encode("utf-8")] + [len(text)]
    firsts, offset = [], 0
    for piece in pieces:
        firsts.append(char_of_byte[offset])
        offset += len(piece)
    return text, firsts


def reference_step_ids(tokenizer, ids: list[int]) -> list[int]:
    text, firsts = reference_first_chars(tokenizer, ids)
    char_steps = reference_char_steps(text)
    return [char_steps[first] for first in firsts]


def byte_split(tokenizer, ids: list[int], split: list[bool]) -> list[int]:
    """A non-canonical tokenization of the same bytes: the tokens marked in `split` replaced by one token per
    byte (the byte-level vocabulary holds every byte)."""
    inverse = {byte: char for char, byte in BYTE_DECODER.items()}
    out = []
    for token_id, do_split in zip(ids, split):
        if do_split and token_id not in SPECIAL_IDS:
            out += [tokenizer.convert_tokens_to_ids(inverse[b]) for b in token_bytes(tokenizer, token_id)]
        else:
            out.append(token_id)
    return out


# ------------------------------------------------------------------ split_steps, hand-computed


def test_no_header_is_one_step_spanning_the_whole_text(tokenizer):
    # the authors' parse_steps: [(0, len(response))], so the judge's step 1 is the whole response
    text = "Add the numbers. The answer is 42. 中文 😀"
    assert split_steps(text) == []
    assert step_spans(text) == [StepSpan(1, 0, 0, len(text))]
    ids = tokenizer.encode(text, add_special_tokens=False) + [IM_END_ID]
    assert response_step_ids(tokenizer, ids).tolist() == [1] * len(ids)
    assert step_spans("") == [StepSpan(1, 0, 0, 0)]
    assert response_step_ids(tokenizer, [IM_END_ID]).tolist() == [1]  # an empty response: its EOS is in step 1


def test_the_step_count_comes_from_the_headers_and_keeps_a_step_without_tokens():
    # "### Step 2:" lies inside one token that starts in step 1, so step 2 holds no token's first character;
    # the response still has 2 steps (the authors' len(spans)), and the core keeps step 2 as a step of its own
    text = "### Step 1: a### Step 2:"
    spans = step_spans(text)
    assert [(s.number, s.header_start, s.end) for s in spans] == [(1, 0, 13), (2, 13, 24)]
    offsets_t2 = np.array([[0, 11], [11, 24]])  # the second token runs from " a" through the whole second header
    assert step_ids_from_offsets(spans, offsets_t2, len(text)).tolist() == [1, 1]


def test_spans_run_from_each_header_to_the_next_and_text_before_is_in_none():
    text = "Intro. ### Step 1: add. ### Step 2: check."
    assert split_steps(text) == [StepSpan(1, 7, 18, 24), StepSpan(2, 24, 35, 42)]
    assert text[7:18] == "### Step 1:" and text[24:35] == "### Step 2:"


@pytest.mark.parametrize(
    "text, numbers",
    [
        ("###Step1:", [1]),
        ("###  Step \t12 :", [12]),
        ("###\nStep\n3\n:", [3]),  # \s crosses newlines in the authors' regex
        ("### step 1: ## Step 2: ### Step x: ### Step 4 x:", []),  # case, two #, no number, junk before ':'
        ("#### Step 5:", [5]),  # matched from the second '#'
        ("### Step 007:", [7]),
        ("### Step 0:", [0]),
        ("### Step ٣: ### Step ３:", [3, 3]),  # Unicode decimal digits (Arabic-Indic, fullwidth)
        ("### Step 99999999999999999999:", [MAX_STEP_NUMBER]),
        ("### Step " + "9" * 5000 + ":", [MAX_STEP_NUMBER]),  # more digits than int() accepts
        ("### Step " + "0" * 5000 + "1:", [1]),
    ],
)
def test_header_numbers(text, numbers):
    assert [span.number for span in split_steps(text)] == numbers


def test_repeated_and_non_increasing_numbers_are_kept_as_written():
    text = "### Step 1: a ### Step 3: b ### Step 2: c ### Step 2: d"
    spans = split_steps(text)
    assert [s.number for s in spans] == [1, 3, 2, 2]
    assert [text[s.header_start : s.end] for s in spans] == ["### Step 1: a ", "### Step 3: b ", "### Step 2: c ",
                                                             "### Step 2: d"]


@pytest.mark.parametrize(
    "text, numbers",
    [
        ("### Step 1: a\n```\n### Step 2: code\n```\n### Step 3: b", [1, 3]),
        ("### Step 1: a\n```python\n### Step 2: x = 1\n```\n", [1]),  # info string
        ("### Step 1: a\n~~~\n### Step 2:\n~~~\n### Step 3:", [1, 3]),
        ("### Step 1: a\n````\n```\n### Step 2:\n````\n### Step 3:", [1, 3]),  # a shorter fence does not close
        ("### Step 1: a\n```\n~~~\n### Step 2:\n```\n### Step 3:", [1, 3]),  # nor does the other character
        ("### Step 1: a\n```\n### Step 2: never closed", [1]),
        ("### Step 1: a\n```\n``` ### Step 2:\n### Step 3:", [1]),  # text after a fence: not a closing fence
        ("### Step 1: a\n    ```\n### Step 2: indented 4: no fence", [1, 2]),
        ("### Step 1: a\n   ```\n### Step 2:\n   ```\n### Step 3:", [1, 3]),  # up to 3 spaces: a fence
        ("### Step 1: a ``` ### Step 2: inline backticks are not a fence", [1, 2]),
        ("### Step 1: `### Step 2:` inline code is not special", [1, 2]),
    ],
)
def test_headers_inside_fenced_code_are_ignored(text, numbers):
    assert [s.number for s in split_steps(text)] == numbers


def test_fenced_code_is_content_of_the_step_around_it():
    text = "### Step 1: a\n```\n### Step 2:\n```\nafter"
    assert fenced_code_regions(text) == [(14, 33)]  # the closing line, not its newline
    assert split_steps(text) == [StepSpan(1, 0, 11, len(text))]


# ------------------------------------------------------------------ step_ids_from_offsets, hand-computed


def test_step_ids_from_offsets_by_first_character():
    spans = [StepSpan(1, 2, 6, 8), StepSpan(4, 8, 12, 12)]
    offsets_t2 = np.array([[0, 2], [1, 3], [2, 4], [7, 9], [8, 12], [11, 12], [12, 12]])
    # a token starting before a header stays in the earlier step even when it reaches into the header
    assert step_ids_from_offsets(spans, offsets_t2, 12).tolist() == [0, 0, 1, 1, 4, 4, 4]
    assert step_ids_from_offsets(spans, offsets_t2, 12).dtype == np.int32
    assert step_ids_from_offsets([], np.zeros((0, 2), int), 0).shape == (0,)


def test_a_token_at_the_end_gets_the_last_step_only_when_it_runs_to_the_end():
    assert step_ids_from_offsets([StepSpan(2, 0, 3, 5)], np.array([[5, 5]]), 5).tolist() == [2]
    assert step_ids_from_offsets([StepSpan(2, 0, 3, 4)], np.array([[5, 5]]), 5).tolist() == [0]


@pytest.mark.parametrize(
    "spans, offsets, length, match",
    [
        ([], np.zeros((3,), int), 4, "shape"),
        ([], np.array([[5, 5]]), 4, "offsets_t2 must lie"),
        ([], np.array([[-1, 0]]), 4, "offsets_t2 must lie"),
        ([StepSpan(1, 0, 3, 9)], np.array([[0, 1]]), 4, "does not lie"),
    ],
)
def test_step_ids_from_offsets_rejects_bad_input(spans, offsets, length, match):
    with pytest.raises(ValueError, match=match):
        step_ids_from_offsets(spans, offsets, length)


# ------------------------------------------------------------------ tokens, against the reference

TRICKY_TEXTS = [
    "",
    "no headers at all, 中文 and 😀",
    "### Step 1: add the numbers. ### Step 2: check the sum. The answer is 42.",
    "preamble\n### Step 1: a\n### Step 1: again\n### Step 2: b\n### Step 1: back",
    "### Step 3: b ### Step 1: a",
    "### Step 1: a\n```\n### Step 2: inside code\n```\n### Step 2: after the fence",
    "### Step 1: 你好世界\n### Step 2: 😀👨\u200d👩\u200d👧 e\u0301 a\u0308\u0301\n### Step 3: \\boxed{42}",
    "中### Step 1:文😀### Step 2:😀",  # multi-byte characters right against the headers
    "### Step 1:### Step 2:### Step 3:",
    "#### Step 1: extra hash\n\n\n   ### Step 2: spaces before",
    "### Step 0: zero ### Step 1: one",
    "\n\n```\nunclosed ### Step 1: fence",
]


@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_tricky_texts_match_the_reference(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    for response in (ids, ids + [IM_END_ID], [IM_START_ID] + ids[:3] + [PAD_ID] + ids[3:] + [IM_END_ID]):
        assert response_text(tokenizer, response) == text
        assert response_step_ids(tokenizer, response).tolist() == reference_step_ids(tokenizer, response)
        fully_split = byte_split(tokenizer, response, [True] * len(response))
        assert response_step_ids(tokenizer, fully_split).tolist() == reference_step_ids(tokenizer, fully_split)


def test_offset_mapping_and_decoding_paths_agree(tokenizer):
    text = TRICKY_TEXTS[6]
    ids = tokenizer.encode(text, add_special_tokens=False) + [IM_END_ID]
    from_offsets = _starts_from_offset_mapping(tokenizer, ids, text)
    assert from_offsets is not None
    assert from_offsets == _starts_from_decoding(tokenizer, ids, text) == reference_first_chars(tokenizer, ids)[1]


def test_a_non_canonical_tokenization_takes_the_decoding_path(tokenizer):
    text = TRICKY_TEXTS[7]
    ids = byte_split(tokenizer, tokenizer.encode(text, add_special_tokens=False), [True, False] * 50)
    assert _starts_from_offset_mapping(tokenizer, ids, text) is None
    decoded_text, offsets_t2 = token_char_offsets(tokenizer, ids)
    assert decoded_text == text
    assert offsets_t2[:, 0].tolist() == reference_first_chars(tokenizer, ids)[1]
    assert offsets_t2[:, 1].tolist() == offsets_t2[1:, 0].tolist() + [len(text)]


def test_trimmed_offsets_are_not_trusted(tokenizer):
    """GPT-2's post-processor trims spaces out of the offsets (" Step" -> "Step"): the tiling check sends such a
    tokenizer down the decoding path, which places the space in the token that holds it."""
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.post_processor = processors.ByteLevel(trim_offsets=True)
    trimming = transformers.PreTrainedTokenizerFast(tokenizer_object=backend)
    text = "### Step1: add the sum.### Step2: the answer"
    ids = trimming.encode(text, add_special_tokens=False)
    offsets = trimming(text, return_offsets_mapping=True)["offset_mapping"]
    assert offsets[1] == (4, 8) and all(end > start for start, end in offsets)  # " Step" trimmed, none empty
    assert _starts_from_offset_mapping(trimming, ids, text) is None
    assert response_step_ids(trimming, ids).tolist() == reference_step_ids(tokenizer, ids)


def _metaspace_tokenizer():
    """A SentencePiece-style tokenizer: '▁' for spaces, one prepended at the start and stripped when decoding."""
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    backend.decoder = decoders.Metaspace(prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>"], show_progress=False)
    backend.train_from_iterator(["### Step 1: add the numbers. ### Step 2: check the sum. a b c 0 1 2"], trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>")


def test_decoding_path_with_a_start_stripping_decoder():
    """Windows of the incremental decode strip their leading '▁' as the start of the text does; the context
    window makes that cancel. Reference: token pieces with '▁' as a space, the first space stripped."""
    metaspace = _metaspace_tokenizer()
    text = "a b ### Step 1: add the sum ### Step 2: check 12"
    ids = metaspace.encode(text, add_special_tokens=False)
    chars = [metaspace.convert_tokens_to_ids(c) for piece in metaspace.convert_ids_to_tokens(ids) for c in piece]
    eos = metaspace.convert_tokens_to_ids("</s>")
    for response in (ids + [eos], chars + [eos]):
        pieces = [p.replace("▁", " ") for p in metaspace.convert_ids_to_tokens(response[:-1])] + [""]
        lengths = np.cumsum([0] + [len(p) for p in pieces])[:-1]
        assert response_text(metaspace, response) == text
        first_chars = np.maximum(lengths - 1, 0)  # the prepended space of the first token is stripped
        expected = [reference_char_steps(text)[c] for c in first_chars]
        assert response_step_ids(metaspace, response).tolist() == expected
    assert _starts_from_offset_mapping(metaspace, chars, text) is None


# ------------------------------------------------------------------ properties on random texts

PIECES = st.sampled_from(
    [
        "### Step 1:", "### Step 2:", "###Step3 :", "### Step 10:", "### Step 0:", "### Step 2:", "#", "##",
        " Step", "1", ":", "```", "```python", "~~~", "\n", "\n\n", " ", "   ", "中文", "你", "😀", "👨\u200d👩",
        "e\u0301", "\u0301", "ß", "é", "\\boxed{4}", "answer", "`",
    ]
)
# A literal U+FFFD is left out: split into bytes, its prefixes decode to U+FFFD too, so incremental decoding
# cannot tell where it ends (`steps._starts_from_decoding`, documented).
TEXTS = st.lists(PIECES | st.text(st.characters(blacklist_characters="\ufffd"), max_size=4), max_size=30).map("".join)


@settings(max_examples=150)
@given(text=TEXTS, data=st.data())
def test_random_texts_match_the_reference(tokenizer, text, data):
    ids = tokenizer.encode(text, add_special_tokens=False)
    split = data.draw(st.lists(st.booleans(), min_size=len(ids), max_size=len(ids)))
    response = byte_split(tokenizer, ids, split)
    for position in data.draw(st.lists(st.integers(0, len(response)), max_size=3)):
        response.insert(position, data.draw(st.sampled_from(SPECIAL_IDS)))
    step_ids = response_step_ids(tokenizer, response)
    text_back, first_chars = reference_first_chars(tokenizer, response)
    char_steps = reference_char_steps(text_back)
    assert text_back == text == response_text(tokenizer, response)
    # every token gets the step of its first character, and the steps are non-negative int32
    assert step_ids.dtype == np.int32 and step_ids.shape == (len(response),)
    assert step_ids.tolist() == [char_steps[c] for c in first_chars]
    assert (step_ids >= 0).all()
    # tokens before the first header are 0; a text without headers is all step 1
    spans = split_steps(text)
    if spans:
        assert all(step_ids[t] == 0 for t, c in enumerate(first_chars) if c < spans[0].header_start)
    else:
        assert (step_ids == 1).all()
