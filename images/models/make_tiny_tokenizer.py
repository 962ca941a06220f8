"""Write tiny-llama/tokenizer.json: a byte-level tokenizer with the model's vocab size, so
vLLM's OpenAI server can take text prompts and return text (the weights are random).

    python images/models/make_tiny_tokenizer.py images/models/tiny-llama   # needs `tokenizers`

Ids 0-2 are <unk>, <s>, </s> (config.json's bos/eos), 3-258 the 256 bytes (no merges, so
any text encodes), the rest unreachable fillers up to vocab_size so every id decodes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ("<unk>", "<s>", "</s>")


def main(model_dir: Path) -> None:
    vocab_size = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    while len(vocab) < vocab_size:
        vocab[f"<|filler_{len(vocab)}|>"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(str(model_dir / "tokenizer.json"))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
