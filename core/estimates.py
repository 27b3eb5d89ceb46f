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
    from core.lora import LoRAConfig

# Bytes per stored value in a GGUF file. Q8_0 stores blocks of 32 int8 values and one f16 scale.
GGUF_BYTES_PER_VALUE = {"f32": 4.0, "f16": 2.0, "q8_0": 34.0 / 32.0, "q4_0": 18.0 / 32.0}


def training_memory_bytes(config: ModelConfig, batch_size: int, grad_accum: int = 1,
                          freeze_embeddings: bool = False, lora: LoRAConfig | None = None,
                          base_types: dict[str, str] | None = None, max_seq: int | None = None) -> int:
    """Device memory of a training run in bytes (4-byte elements everywhere but a quantized base's).

    Weights, gradients and AdamW m and v (16 bytes per parameter; 4 for a frozen embedding) plus
    every activation buffer :class:`core.model.Model` allocates for one micro-batch of
    ``ceil(batch_size / grad_accum) x max_seq`` tokens (None: ``context_length``, the most; a trainer's
    model: ``core.trainer.max_seq_of`` its data): :func:`core.model.memory_bytes`, the figure
    :func:`core.model.check_fits` checks with :func:`core.model.fits_in`. With ``lora`` the base
    is frozen and only the adapters are trained; ``base_types`` (the base file's tensor types,
    core.gguf_import.read_tensor_types) keeps its block matrices in their GGUF formats, as a LoRA run of
    that file does (:func:`lora_base_plan`).
    """
    from core.model import frozen_tensors, memory_bytes

    return memory_bytes(config, _micro_batch(batch_size, grad_accum), training=True,
                        frozen=frozen_tensors(freeze_embeddings), lora=lora,
                        quantized=lora_base_plan(config, lora, base_types), max_seq=max_seq)[0]


def training_memory_problem(config: ModelConfig, batch_size: int, grad_accum: int, freeze_embeddings: bool,
                            global_mem_bytes: int, max_alloc_bytes: int | None, device_name: str,
                            lora: LoRAConfig | None = None, base_types: dict[str, str] | None = None,
                            max_seq: int | None = None) -> str | None:
    """Why a device cannot hold a training run (one line), or None when it can: the one memory rule,
    :func:`core.model.memory_problem` (every buffer together within :data:`core.model.MEMORY_SHARE` of
    ``global_mem_bytes``, the largest within ``max_alloc_bytes``), for the Model the trainer builds (one
    micro-batch of ``ceil(batch_size / grad_accum)`` sequences of ``max_seq`` tokens, ``token_embd`` frozen
    or not; ``lora``, ``base_types`` and ``max_seq`` as :func:`training_memory_bytes`). The GUI and the CLI
    ask this before a run, so they refuse what :func:`core.model.check_fits` would refuse.
    """
    from core.model import frozen_tensors, memory_problem

    return memory_problem(config, _micro_batch(batch_size, grad_accum), global_mem_bytes, max_alloc_bytes,
                          device_name, training=True, frozen=frozen_tensors(freeze_embeddings), lora=lora,
                          quantized=lora_base_plan(config, lora, base_types), max_seq=max_seq)


def lora_base_plan(config: ModelConfig, lora: LoRAConfig | None, base_types: dict[str, str] | None) -> dict:
    """The block matrices a LoRA run keeps in their GGUF formats (core.model.quantized_plan) for a base file
    whose tensors have ``base_types`` (``{tensor name: ggml type name}``); ``{}`` without LoRA or types."""
    from core.model import quantized_plan
    from core.quant_base import RawBase

    return quantized_plan(config, lora, RawBase(dict(base_types), {})) if lora and base_types else {}


def resident_bytes() -> int | None:
    """This process's resident memory now, in bytes (Linux ``/proc/self/statm``; None where it cannot
    be read, e.g. on macOS and Windows)."""
    import os

    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _values(config: ModelConfig, names: tuple[str, ...]) -> int:
    return sum(math.prod(s) for name, s in config.param_shapes() if name in names)


def checkpoint_file_bytes(config: ModelConfig, from_base: tuple[str, ...] = ()) -> int:
    """Bytes of a full model's checkpoint's weights.npz and optimizer.npz (their headers aside): 4 bytes a
    weight and 8 its two AdamW moments (zeros for a frozen tensor), but for the ``from_base`` tensors
    (core.checkpoint_meta.CheckpointMeta.from_base: read back from the base file, neither saved)."""
    return 12 * (config.n_params() - _values(config, from_base))


def save_copy_bytes(config: ModelConfig, freeze_embeddings: bool = False, from_base: tuple[str, ...] = (),
                    lora: LoRAConfig | None = None) -> int:
    """Host bytes a checkpoint save (core.checkpoint.save_trainer) holds at once: the weights it saves and
    the trained tensors' AdamW moments read back from the device (4 bytes a weight but the ``from_base``
    ones, 8 a trained parameter; a frozen tensor's zero moments are never written to) and the ``.npz``
    bytes (:func:`checkpoint_file_bytes`); with ``lora`` only the adapters and their moments (a LoRA
    checkpoint does not hold its base)."""
    from core.model import frozen_tensors

    if lora is not None:
        from core.lora import adapter_params

        return 2 * 4 * 3 * adapter_params(config, lora)
    n = config.n_params()
    frozen = _values(config, frozen_tensors(freeze_embeddings))
    return 4 * (n - _values(config, from_base)) + 8 * (n - frozen) + checkpoint_file_bytes(config, from_base)


KERNEL_BUILD_BYTES = 100 << 20
"""Resident memory the OpenCL compiler keeps after building a training run's kernels the first time
(PoCL's LLVM heap): measured 0.66 GiB peak with the kernels in PoCL's cache, 0.75 without, same run."""


def check_copy_bytes(config: ModelConfig, rows: int) -> int:
    """Host bytes of a recall check's logits (core.recall.greedy_batch): each row's last logits, float32
    ``(rows, vocab_size)`` (core.model.Model.last_logits), read back for every new token: the next one's array
    and its chunk's download while the last is still held."""
    return 3 * 4 * rows * config.vocab_size


def peak_resident_bytes(resident_before: int, config: ModelConfig, device_bytes: int, device_on_host: bool,
                        freeze_embeddings: bool = False, check_rows: int = 1,
                        from_base: tuple[str, ...] = (), lora: LoRAConfig | None = None) -> int:
    """Peak resident memory of a training process in bytes.

    What the process holds before its trainer is built (``resident_before``: Python, the OpenCL driver,
    a base model's float32 weights), plus, when the device's buffers live in host memory (a CPU
    device), ``device_bytes`` (the trainer's ``Model.memory_estimate``: its buffers, LoRA's and a quantized
    base's included, are sized for the longest batch of the run, core.trainer.max_seq_of), plus the larger of
    a checkpoint save's copies (:func:`save_copy_bytes`: the ``from_base`` tensors are not saved, a ``lora``
    run saves its adapters only) and a recall check's logits of ``check_rows`` rows
    (:func:`check_copy_bytes`; the check runs after the save), plus :data:`KERNEL_BUILD_BYTES`.
    Measured on PoCL (2-core VM), estimate / peak: SmolLM2-135M 7.96 / 7.92-7.94 GiB (rows of 47 tokens); a
    3.2M-parameter base with SmolLM2's vocabulary 0.75 / 0.66-0.75 GiB (kernels cached or not).
    """
    device = device_bytes if device_on_host else 0
    copies = max(save_copy_bytes(config, freeze_embeddings, from_base, lora), check_copy_bytes(config, check_rows))
    return resident_before + device + copies + KERNEL_BUILD_BYTES


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
        fact_questions: facts that core.augment.fact_questions writes a question for (0: no dialogue is a
            pattern for any fact); None: not counted (core.plan.data_mix then assumes questions are written).
    """

    vocab_size: int
    fact_tokens: int
    dialogue_tokens: int
    fact_sequences: int
    dialogue_sequences: int
    longest: int
    too_long: list
    fact_questions: int | None = None


class _EncodeOnce:
    """A tokenizer that encodes each distinct text once and otherwise answers as ``tok`` does
    (:func:`dataset_stats` asks for every entry's ids three times: its length, its training examples and
    the too-long check; with 20,000 facts that was 84,000 calls instead of 28,000)."""

    def __init__(self, tok) -> None:
        self._tok, self._ids = tok, {}

    def encode(self, text: str, parse_special: bool = False, **kw) -> list[int]:
        key = (text, parse_special, *sorted(kw.items()))  # kw: a GGUF tokenizer's add_special
        ids = self._ids.get(key)
        if ids is None:
            ids = self._ids[key] = self._tok.encode(text, parse_special, **kw)
        return list(ids)  # the caller's own list, as the tokenizer's

    def __getattr__(self, name: str):
        return getattr(self._tok, name)


def dataset_stats(dataset: Dataset, vocab_size: int, context_length: int, tokenizer=None) -> DatasetStats:
    """Train a tokenizer on ``dataset`` (as training would) and count tokens and sequences; with
    ``tokenizer`` (a fine-tune's base model's, its chat template included) count with that one instead
    (``vocab_size`` then unused).

    Raises:
        ValueError: the dataset is empty or ``vocab_size`` is below the tokenizer's minimum.
    """
    from core.augment import fact_questions
    from core.chat_format import encode_dialogue, encode_fact
    from core.tokenizer import Tokenizer
    from core.batches import dialogue_examples, fact_examples

    if not dataset.facts and not dataset.dialogues:
        raise ValueError("the dataset has no facts and no dialogues")
    trained = tokenizer or Tokenizer.train(dataset.tokenizer_texts(), vocab_size=vocab_size)
    tok = _EncodeOnce(trained)
    fact_lens = [len(encode_fact(tok, f)) for f in dataset.facts]
    dlg_lens = [len(encode_dialogue(tok, d)[0]) for d in dataset.dialogues if d.turns]
    facts = fact_examples(tok, dataset.facts, context_length)
    dialogues = dialogue_examples(tok, dataset.dialogues, context_length)
    too_long = dataset.validate(tok, context_length + 1)
    too_long = [p for p in too_long if p.message.startswith("too long")]
    asked = {i for i, _, _ in fact_questions(dataset)} if dataset.facts and dataset.dialogues else set()
    return DatasetStats(trained.vocab_size, sum(fact_lens), sum(dlg_lens), len(facts), len(dialogues),
                        max(fact_lens + dlg_lens, default=0), too_long, len(asked))
