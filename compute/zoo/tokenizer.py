"""The zoo tokenizer: a byte-level BPE trained on the built-in corpus.

One tokenizer is shared by every zoo model; a copy is saved into each checkpoint directory so
that `AutoTokenizer.from_pretrained(dir)` works offline on any one of them. `<|endoftext|>` is
id 0 and serves as BOS, EOS and padding (as in GPT-2).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from compute.corpus import builtin_corpus_documents

SPECIAL_TOKEN = "<|endoftext|>"
SPECIAL_TOKEN_ID = 0
DEFAULT_VOCAB_SIZE = 4096


def train_bpe_tokenizer(
    documents: Iterable[str] | None = None,
    *,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    model_max_length: int = 128,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE (GPT-2 style) on `documents` (default: the built-in corpus).

    The special token `<|endoftext|>` gets id 0 and is used as BOS, EOS and PAD. Training is
    deterministic for a given text and vocabulary size.

    >>> tok = train_bpe_tokenizer(["hello world"] * 10, vocab_size=300)
    >>> tok.decode(tok("hello world")["input_ids"])
    'hello world'
    """
    docs = list(builtin_corpus_documents() if documents is None else documents)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[SPECIAL_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(docs, trainer=trainer)
    return wrap_tokenizer(tokenizer, model_max_length=model_max_length)


def wrap_tokenizer(tokenizer: Tokenizer, *, model_max_length: int) -> PreTrainedTokenizerFast:
    """Wrap a raw `tokenizers.Tokenizer` as a Hugging Face fast tokenizer with GPT-2 specials."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=SPECIAL_TOKEN,
        eos_token=SPECIAL_TOKEN,
        unk_token=SPECIAL_TOKEN,
        pad_token=SPECIAL_TOKEN,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def save_zoo_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: str | Path) -> None:
    """Save the tokenizer with a portable `tokenizer_config.json`.

    Transformers 5 writes its own class name (`TokenizersBackend`) and loader flags
    (`local_files_only`, ...) into the config; the zoo writes the same minimal config everywhere,
    naming `PreTrainedTokenizerFast` so that Transformers 4 and 5 both load it.
    """
    out = Path(directory)
    tokenizer.save_pretrained(str(out))
    config = {
        "bos_token": SPECIAL_TOKEN,
        "clean_up_tokenization_spaces": False,
        "eos_token": SPECIAL_TOKEN,
        "model_max_length": int(tokenizer.model_max_length),
        "pad_token": SPECIAL_TOKEN,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": SPECIAL_TOKEN,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_zoo_tokenizer(directory: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer saved by `save_pretrained` (offline; the directory must hold it)."""
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise TypeError(f"{directory} does not hold a fast tokenizer")
    return tokenizer
