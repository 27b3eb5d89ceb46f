"""Sizes the GUI shows before anything runs: device memory a training run needs, GGUF file size,
and token / sequence counts of a dataset.

Estimates, not guarantees: the memory figure adds up the buffers ``core.model.Model`` allocates
(weights, gradients, two AdamW moments, activations for one batch of ``context_length`` tokens);
the GGUF size counts tensor data plus a rough allowance for the tokenizer metadata.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.config import ModelConfig

if TYPE_CHECKING:
    from core.dataset import Dataset

# Bytes per stored value in a GGUF file. Q8_0 stores blocks of 32 int8 values and one f16 scale.
GGUF_BYTES_PER_VALUE = {"f32": 4.0, "f16": 2.0, "q8_0": 34.0 / 32.0, "q4_0": 18.0 / 32.0}


def training_memory_bytes(config: ModelConfig, batch_size: int, grad_accum: int = 1,
                          freeze_embeddings: bool = False) -> int:
    """Device memory of a training run in bytes (4-byte elements everywhere).

    Weights, gradients and AdamW m and v (16 bytes per parameter; 4 for a frozen embedding) plus
    every activation buffer :class:`core.model.Model` allocates for one micro-batch of
    ``ceil(batch_size / grad_accum) x context_length`` tokens: :func:`core.model.memory_bytes`, the
    figure :func:`core.model.check_fits` checks with :func:`core.model.fits_in`.
    """
    from core.model import frozen_tensors, memory_bytes

    return memory_bytes(config, _micro_batch(batch_size, grad_accum), training=True,
                        frozen=frozen_tensors(freeze_embeddings))[0]


def training_memory_problem(config: ModelConfig, batch_size: int, grad_accum: int, freeze_embeddings: bool,
                            global_mem_bytes: int, max_alloc_bytes: int | None, device_name: str) -> str | None:
    """Why a device cannot hold a training run (one line), or None when it can: the one memory rule,
    :func:`core.model.memory_problem` (every buffer together within :data:`core.model.MEMORY_SHARE` of
    ``global_mem_bytes``, the largest within ``max_alloc_bytes``), for the Model the trainer builds (one
    micro-batch of ``ceil(batch_size / grad_accum)`` sequences, ``token_embd`` frozen or not). The GUI
    and the CLI ask this before a run, so they refuse what :func:`core.model.check_fits` would refuse.
    """
    from core.model import frozen_tensors, memory_problem

    return memory_problem(config, _micro_batch(batch_size, grad_accum), global_mem_bytes, max_alloc_bytes,
                          device_name, training=True, frozen=frozen_tensors(freeze_embeddings))


def _micro_batch(batch_size: int, grad_accum: int) -> int:
    return -(-batch_size // max(1, grad_accum))


def gguf_size_bytes(config: ModelConfig, dtype: str) -> int:
    """Approximate size of the exported GGUF file for ``dtype`` ("f32", "f16" or "q8_0").

    Norm weights (1-D) stay float32 in every dtype, as llama.cpp's converter keeps them; for Q8_0
    a matrix whose rows are not a multiple of 32 long is written as F16 (see core.gguf_io).
    """
    per = GGUF_BYTES_PER_VALUE[dtype.lower()]
    size = 0.0
    for _, shape in config.param_shapes():
        count = math.prod(shape)
        if len(shape) == 1:
            size += count * 4.0
        elif dtype.lower() in ("q8_0", "q4_0") and shape[-1] % 32:
            size += count * GGUF_BYTES_PER_VALUE["f16"]
        else:
            size += count * per
    size += config.vocab_size * 24 + 4096  # token strings, scores, types, merges, other keys
    return int(size)


@dataclass(frozen=True)
class DatasetStats:
    """Token counts of a dataset with a tokenizer trained on it.

    Attributes:
        vocab_size: tokens in the trained vocabulary.
        fact_tokens, dialogue_tokens: tokens of all facts / dialogues with BOS/EOS and chat format.
        fact_sequences, dialogue_sequences: training sequences (long entries are cut into windows).
        longest: tokens of the longest single entry.
        too_long: ``EntryProblem`` list of entries longer than ``context_length + 1`` tokens.
    """

    vocab_size: int
    fact_tokens: int
    dialogue_tokens: int
    fact_sequences: int
    dialogue_sequences: int
    longest: int
    too_long: list


def dataset_stats(dataset: Dataset, vocab_size: int, context_length: int) -> DatasetStats:
    """Train a tokenizer on ``dataset`` (as training would) and count tokens and sequences.

    Raises:
        ValueError: the dataset is empty or ``vocab_size`` is below the tokenizer's minimum.
    """
    from core.chat_format import encode_dialogue, encode_fact
    from core.tokenizer import Tokenizer
    from core.batches import dialogue_examples, fact_examples

    if not dataset.facts and not dataset.dialogues:
        raise ValueError("the dataset has no facts and no dialogues")
    tok = Tokenizer.train(dataset.tokenizer_texts(), vocab_size=vocab_size)
    fact_lens = [len(encode_fact(tok, f)) for f in dataset.facts]
    dlg_lens = [len(encode_dialogue(tok, d)[0]) for d in dataset.dialogues if d.turns]
    facts = fact_examples(tok, dataset.facts, context_length)
    dialogues = dialogue_examples(tok, dataset.dialogues, context_length)
    too_long = dataset.validate(tok, context_length + 1)
    too_long = [p for p in too_long if p.message.startswith("too long")]
    return DatasetStats(tok.vocab_size, sum(fact_lens), sum(dlg_lens), len(facts), len(dialogues),
                        max(fact_lens + dlg_lens, default=0), too_long)
