"""Tokenizers of local Hugging Face model directories, and chat-template token ids.

Conventions:
- Only local files are read (`local_files_only=True`): nothing here downloads.
- `TOKENIZER_FILES` names the files a Hugging Face tokenizer may consist of; a checkpoint saved by
  `safetensors_io.save_hf_checkpoint` copies exactly these, so a saved directory loads here and in SGLang.
"""

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from transformers import AutoTokenizer, PreTrainedTokenizerBase

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)


def tokenizer_files(directory: Union[str, Path]) -> list[Path]:
    """The tokenizer files present in `directory`; FileNotFoundError when there are none."""
    directory = Path(directory)
    present = [directory / name for name in TOKENIZER_FILES if (directory / name).is_file()]
    if not present:
        raise FileNotFoundError(f"no tokenizer files in {directory}: expected some of {', '.join(TOKENIZER_FILES)}")
    return present


def load_tokenizer(directory: Union[str, Path]) -> PreTrainedTokenizerBase:
    """The tokenizer saved in the local directory `directory` (through `transformers.AutoTokenizer`)."""
    tokenizer_files(directory)
    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


def apply_chat_template(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    template_kwargs: Optional[Mapping[str, Any]] = None,
) -> list[int]:
    """Token ids of `messages` ([{"role": ..., "content": ...}, ...]) rendered by the tokenizer's chat template.

    With `add_generation_prompt` the ids end with the header that opens an assistant turn, ready for sampling.
    The template itself places any BOS token, so no special tokens are added on top. `template_kwargs` are the
    template's own variables (`ModelSpec.chat_template_kwargs`), e.g. {"enable_thinking": False} for a Qwen3
    template's non-thinking mode (SGLang's `chat_template_kwargs`, verl's `apply_chat_template_kwargs`); a
    variable the template does not read has no effect.
    """
    # return_dict=False: transformers 5 returns a BatchEncoding by default, transformers 4 a list; ask for the list.
    ids = tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False,
        **dict(template_kwargs or {}),
    )
    return [int(i) for i in ids]
