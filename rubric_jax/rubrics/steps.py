"""Step segmentation of SRaR responses: `### Step N:` headers -> character spans -> `step_ids [T]` for the core.

SRaR (srar.txt, section 3.3) prompts the policy to write "### Step N:" headers and recovers "step token spans
{(a_k, b_k)} ... via the tokenizer's offset mapping". The authors' code splits at the regex `STEP_HEADER` (each
span runs to the next header) and maps characters to tokens proportionally (REFERENCE.md section 2); here the
mapping is exact.

Conventions (`rubric_jax.core.srar`'s step ids: k >= 1 inside step k, 0 outside any step; its `num_steps`):
- A header is a match of the authors' regex anywhere in the text, mid-line included (their regex has no anchor).
  Its span runs from the header's first `#` to the next counted header (or the end of the text), so the header
  belongs to its own step. Text before the first header belongs to no step (0).
- A text without a header is one step, step 1, spanning the whole text (`step_spans`, the authors'
  `parse_steps`), so the judge's "step 1" of such a response is all of it.
- The number of steps is counted from the headers, `len(step_spans(text))` (the authors' `len(spans)`), not from
  the tokens: a step whose span holds no token's first character (a header that shares its tokens with the text
  before it) still counts, and an item the judge attributes to it reaches no token (`core.srar`).
- Step numbers are the numbers *as written*, because the judge attributes items to "the 1-indexed step number
  (### Step N)" it reads in the response (srar.txt, Appendix 7.3). Hence:
  repeated headers (two "### Step 2:") start two spans that are both step 2, and an item attributed to step 2
  reaches the tokens of both; non-increasing numbers (1, 3, 2) are kept as written; "### Step 0:" starts a span
  of step 0, i.e. its tokens count as outside any step; numbers are read from any Unicode decimal digits (the
  regex's `\\d`) and clamped to MAX_STEP_NUMBER (int32). The authors index spans by position instead (the
  judge's step k is the k-th header); the two agree whenever the headers are numbered 1, 2, ..., n in order
  (docs/fidelity/srar.md).
- Headers inside fenced code blocks are ignored (a fence is a line of 3+ backticks or tildes indented by at most
  3 spaces, closed by a line of the same character, at least as long, with nothing else on it; an unclosed fence
  runs to the end of the text, as in CommonMark). A fenced block is content of the step it sits in. Inline code
  (single backticks) is not special.
- Offsets are Python `str` indices (Unicode code points), so emoji, CJK and combining characters are single
  characters; a token's step is the step of the character holding the token's first byte. A token that decodes
  to no text (a special token such as the EOS `<|im_end|>`, skipped in the decoded text) gets the step in force
  where it sits: that of the next token's first character, or, at the end, the last step.

The decoded text is `response_text(tokenizer, ids)` (special tokens skipped, no clean-up of tokenization spaces):
the judge must be shown that text for its step numbers to index these step ids.
"""

import bisect
import dataclasses
import re
import unicodedata
from typing import Optional, Sequence

import numpy as np

# The authors' regex (REFERENCE.md section 2), with the number captured.
STEP_HEADER = re.compile(r"###\s*Step\s*(\d+)\s*:")
# Step numbers are int32 (`step_ids [T]`); larger written numbers are clamped to this.
MAX_STEP_NUMBER = 2**31 - 1
# A code fence line: up to 3 spaces of indentation, then 3+ backticks or tildes, then the rest of the line.
_FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class StepSpan:
    """One step of a response, in character offsets: the header `text[header_start:start]` ("### Step N:"),
    then the step's content up to `end` (exclusive), the next header or the end of the text."""

    number: int
    header_start: int
    start: int
    end: int


def _header_number(digits: str) -> int:
    """The value of a header's decimal digits (any Unicode decimal digits), clamped to MAX_STEP_NUMBER."""
    value = 0
    for digit in digits:
        value = min(value * 10 + unicodedata.decimal(digit), MAX_STEP_NUMBER)
    return value


def fenced_code_regions(text: str) -> list[tuple[int, int]]:
    """The [start, end) character ranges of the fenced code blocks of `text`, fence lines included.

    A fence opens with a line of 3+ backticks or tildes (at most 3 spaces of indentation) and closes with a line
    of the same character, at least as long, followed only by whitespace; an unclosed fence runs to the end.
    """
    regions = []
    opening = None  # (region start, fence character, fence length) while inside a fence
    for line in _FENCE_LINE.finditer(text):
        fence, rest = line.group(1), line.group(2)
        if opening is None:
            opening = (line.start(), fence[0], len(fence))
        elif fence[0] == opening[1] and len(fence) >= opening[2] and not rest.strip():
            regions.append((opening[0], line.end()))
            opening = None
    if opening is not None:
        regions.append((opening[0], len(text)))
    return regions


def split_steps(text: str) -> list[StepSpan]:
    """The steps of `text`, in order: one StepSpan per `STEP_HEADER` match outside fenced code (module docstring).

    Each span runs from its header to the next counted header, the last one to the end of the text. Text before
    the first header is in no span. Numbers are as written (repeats and non-increasing numbers kept).
    """
    regions = fenced_code_regions(text)
    region_starts = [start for start, _ in regions]

    def in_fence(position: int) -> bool:
        index = bisect.bisect_right(region_starts, position) - 1
        return index >= 0 and position < regions[index][1]

    headers = [match for match in STEP_HEADER.finditer(text) if not in_fence(match.start())]
    ends = [match.start() for match in headers[1:]] + [len(text)]
    return [
        StepSpan(number=_header_number(match.group(1)), header_start=match.start(), start=match.end(), end=end)
        for match, end in zip(headers, ends)
    ]


def step_spans(text: str) -> list[StepSpan]:
    """The steps the SRaR advantage indexes, as the authors' `parse_steps`: `split_steps(text)`, or, for a text
    without a header, one step numbered 1 spanning the whole text (with an empty header)."""
    return split_steps(text) or [StepSpan(number=1, header_start=0, start=0, end=len(text))]


def step_ids_from_offsets(spans: Sequence[StepSpan], offsets_t2: np.ndarray, length: int) -> np.ndarray:
    """Each token's step, [T] int32: the number of the span holding the token's first character, 0 outside spans.

    `offsets_t2` [T, 2] holds each token's (first character, end) offsets into a text of `length` characters
    (a fast tokenizer's offset mapping; only the first column is read). A token starting at `length` (it decodes
    to nothing at the end of the text) gets the step in force at the end: the last span's, if it runs to the end.
    ValueError on offsets outside [0, length] or spans past `length`.
    """
    offsets_t2 = np.asarray(offsets_t2)
    if offsets_t2.ndim != 2 or offsets_t2.shape[1] != 2:
        raise ValueError(f"offsets_t2 must have shape [T, 2], got {offsets_t2.shape}")
    first_char_t = offsets_t2[:, 0].astype(np.int64)
    if first_char_t.size and (first_char_t.min() < 0 or first_char_t.max() > length):
        raise ValueError(f"offsets_t2 must lie in [0, length={length}]")
    step_at_char = np.zeros(length + 1, np.int32)  # one more slot: the end of the text
    for span in spans:
        if not 0 <= span.header_start <= span.end <= length:
            raise ValueError(f"span {span} does not lie in a text of length {length}")
        step_at_char[span.header_start : span.end] = span.number
    if spans and spans[-1].end == length:
        step_at_char[length] = spans[-1].number
    return step_at_char[first_char_t]


def response_text(tokenizer, response_ids: Sequence[int]) -> str:
    """The text whose steps `response_step_ids` indexes: the response decoded with special tokens skipped and
    no clean-up of tokenization spaces (clean-up moves characters between tokens). Show the judge this text."""
    return tokenizer.decode(list(response_ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def _starts_from_offset_mapping(tokenizer, ids: list[int], text: str) -> Optional[list[int]]:
    """Each token's first character from the fast tokenizer's offset mapping of `text`, or None when it cannot be
    trusted: not a fast tokenizer, re-encoding `text` does not give back the ids (a non-canonical tokenization
    was sampled), or the offsets do not tile the text (trimmed offsets, e.g. GPT-2's post-processor).

    Tokens that decode to nothing (special tokens) are left out of the round trip and start where the next token
    starts. Tiling: each token starts where the previous one ends, or one character earlier when both hold bytes
    of that (multi-byte) character.
    """
    if not getattr(tokenizer, "is_fast", False):
        return None
    skipped = {i for i in set(ids) if response_text(tokenizer, [i]) == ""}
    kept = [t for t, token_id in enumerate(ids) if token_id not in skipped]
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if list(encoding["input_ids"]) != [ids[t] for t in kept]:
        return None
    starts = [len(text)] * len(ids)
    previous_end = 0
    for t, (start, end) in zip(kept, encoding["offset_mapping"]):
        splits_a_character = start == previous_end - 1 and len(text[start].encode("utf-8", "surrogatepass")) > 1
        if end <= start or not (start == previous_end or splits_a_character):
            return None
        starts[t] = start
        previous_end = end
    if previous_end != len(text):
        return None
    for t in reversed(range(len(ids) - 1)):  # a skipped token starts where the next token starts
        if ids[t] in skipped:
            starts[t] = starts[t + 1]
    return starts


def _common_prefix_length(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _starts_from_decoding(tokenizer, ids: list[int], text: str) -> list[int]:
    """Each token's first character by incremental decoding: token t starts at the length of the longest common
    prefix of decode(ids[:t]) and `text`. A prefix that ends inside a multi-byte character decodes to a
    replacement character there, so the common prefix stops at the character holding token t's first byte.

    decode(ids[:t]) is computed on a short window, as incremental detokenizers do (vLLM's prefix/read offsets):
    from `context` (the anchor before the current one, so decoder effects at a window's start, such as
    SentencePiece's stripped leading space, cancel) as decode(ids[context:t]) minus decode(ids[context:anchor]),
    where `anchor` is the last token boundary at which the decoded prefix was a complete prefix of `text`.
    Exact for valid UTF-8 without a literal U+FFFD; a response holding invalid UTF-8, or a U+FFFD character split
    across tokens (whose partial bytes decode to the same U+FFFD), may place a token starting inside that
    character one character late.
    """
    starts = []
    context, anchor, anchor_char = 0, 0, 0
    anchor_text = ""  # decode(ids[context:anchor])
    for t in range(len(ids)):
        window = response_text(tokenizer, ids[context:t])
        if window.startswith(anchor_text):
            tail = window[len(anchor_text) :]
            start = anchor_char + _common_prefix_length(tail, text[anchor_char : anchor_char + len(tail)])
            if start == anchor_char + len(tail) and t > anchor:  # a complete prefix: move the window on
                context, anchor, anchor_char = anchor, t, start
                anchor_text = response_text(tokenizer, ids[context:anchor])
        else:  # the decoder is not incremental here: decode the whole prefix
            start = _common_prefix_length(response_text(tokenizer, ids[:t]), text)
        starts.append(start)
    return starts


def token_char_offsets(tokenizer, response_ids: Sequence[int]) -> tuple[str, np.ndarray]:
    """`response_text(tokenizer, response_ids)` and each token's character offsets in it, [T, 2] int64.

    Column 0 is the token's first character (the character holding its first byte), exactly: from the fast
    tokenizer's offset mapping when re-encoding the text round-trips to `response_ids` and the offsets tile the
    text, else by incremental decoding (`_starts_from_decoding`). Column 1 is where the next token starts (the end
    of the text for the last token), so that the rows tile the text.
    """
    ids = [int(i) for i in response_ids]
    text = response_text(tokenizer, ids)
    starts = _starts_from_offset_mapping(tokenizer, ids, text)
    if starts is None:
        starts = _starts_from_decoding(tokenizer, ids, text)
    starts_t = np.asarray(starts, np.int64).reshape(-1)
    ends_t = np.append(starts_t, len(text))[1:]
    return text, np.stack([starts_t, ends_t], axis=1)


def response_step_ids(tokenizer, response_ids: Sequence[int]) -> np.ndarray:
    """`step_ids [T]` int32 of a response's tokens (module docstring): the step (`step_spans`) of each token's
    first character in `response_text(tokenizer, response_ids)`, 0 outside any step; every token 1 when the
    response has no header."""
    text, offsets_t2 = token_char_offsets(tokenizer, response_ids)
    return step_ids_from_offsets(step_spans(text), offsets_t2, len(text))
