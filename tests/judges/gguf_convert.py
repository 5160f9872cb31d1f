"""`python gguf_convert.py LLAMA_CPP_DIR CHECKPOINT_DIR OUT.gguf`: llama.cpp's convert_hf_to_gguf.py on a tiny
Qwen3 checkpoint whose byte-level BPE tokenizer it does not know (tests/judges/llama_cpp.py). Run in a process of
its own: it puts llama.cpp's conversion package and gguf-py on sys.path and patches two of its methods.

- The converter names a BPE pre-tokenizer by hashing a test text's tokens and refuses a hash it has not seen; the
  tiny tokenizer's pre-tokenizer is byte-level, which llama.cpp calls "gpt-2".
- Its Qwen2 family tries a SentencePiece vocabulary first (an ImportError without the sentencepiece package, not
  the FileNotFoundError it falls back on); the tiny tokenizer is a BPE tokenizer.json, read as GPT-2's are.
"""

import sys


def main() -> None:
    llama_cpp_dir, checkpoint_dir, out = sys.argv[1:4]
    sys.path[:0] = [llama_cpp_dir, f"{llama_cpp_dir}/gguf-py"]
    from conversion import base, qwen  # noqa: PLC0415  (from llama_cpp_dir)

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    qwen.Qwen2Model.set_vocab = base.TextModel._set_vocab_gpt2
    import convert_hf_to_gguf  # noqa: PLC0415

    sys.argv = ["convert_hf_to_gguf.py", checkpoint_dir, "--outfile", out, "--outtype", "f32"]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
