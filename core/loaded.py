"""What every model reader returns: :class:`LoadedModel` (a checkpoint folder, a GGUF file or a
Hugging Face folder). It lives below the readers (``core.checkpoint``, ``core.gguf_import``,
``core.hf_io``) so that none of them imports another to build it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from core.config import ModelConfig

if TYPE_CHECKING:
    from core.checkpoint_meta import CheckpointMeta


@dataclass
class LoadedModel:
    """A model read from disk: config, tokenizer, weights, and whatever metadata came with it.

    Attributes:
        config: the architecture.
        tokenizer: ``core.tokenizer.Tokenizer`` (our models) or ``core.gguf_tokenizer.GGUFTokenizer``
            (an imported GGUF file's vocabulary); both have the same interface.
        weights: ``{gguf tensor name: float32 array}``.
        meta: for a GGUF file, what :func:`core.gguf_import.import_gguf` read (``format`` "gguf", ...);
            for a Hugging Face folder ``format`` "hf"; for a checkpoint the base-model keys of a
            fine-tuned import (``core.checkpoint_meta.BASE_META_KEYS``), else empty.
        path: where it was read from.
        checkpoint: a checkpoint folder's :class:`core.checkpoint_meta.CheckpointMeta` (None otherwise).
        lora, adapter, base_weights: a LoRA checkpoint's :class:`core.lora.LoRAConfig`, its adapters
            ``{<base name>.lora_a / .lora_b: array}`` and the base file's weights (``weights`` then holds
            the base with the adapters merged in: what the model computes); None otherwise.
    """

    config: ModelConfig
    tokenizer: Any
    weights: dict[str, np.ndarray]
    meta: dict
    path: Path
    checkpoint: CheckpointMeta | None = field(default=None)
    lora: Any = field(default=None)
    adapter: dict[str, np.ndarray] | None = field(default=None)
    base_weights: dict[str, np.ndarray] | None = field(default=None)
    quantized: Any = field(default=None)  # a GGUF file's core.quant_base.RawBase (its block bytes), else None
