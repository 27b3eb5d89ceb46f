"""Text generation on the OpenCL device with a KV cache, and sampling.

The prompt is run once (prefill) and its keys/values kept per layer in a cache of
``context_length`` rows; each new token then costs one single-row forward that attends to the cache.
The forward pass is ``core.model.forward``, the same code path as training's (for one token of a small
float32 model it runs each layer as one launch, core/kernels/decode.cl); from the third new token on, that
step's recorded launches are replayed (core/replay.py). Only the last position's logits are read back to
the host, where the sampler picks the next token.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gguf import MODEL_TENSOR as T

from core import quant_base
from core.config import ModelConfig, tensor_name
from core.device import Device
from core.lora import DenseFrozen, LoRAConfig, lora_matmuls
from core.model import (LOGITS_MATRIX, Activations, Ops, adapter_layout, block_matrices, check_fits, forward, lora_views,
                        param_layout, step_matmuls)
from core.quant_base import RawBase
from core.replay import StepReplayer
from core.schema import check_dataclass, number, spec, whole
from core.tensor_store import TensorStore

if TYPE_CHECKING:
    from core.loaded import LoadedModel


class ContextFullError(ValueError):
    """The prompt alone does not fit into ``context_length`` tokens."""


@dataclass(frozen=True)
class SamplingSettings:
    """How the next token is chosen.

    Attributes:
        temperature: 0 = greedy (argmax); otherwise logits are divided by it.
        top_k: keep the k most likely tokens (0 = all).
        top_p: nucleus sampling, keep the smallest set with probability mass >= top_p (1 = all)
            (Holtzman et al. 2020).
        repetition_penalty: > 1 makes tokens already in the context less likely, dividing
            positive logits and multiplying negative ones (Keskar et al. 2019, CTRL; as llama.cpp's
            ``penalty_repeat``).
        max_tokens: most new tokens to generate.
        seed: seed of the sampler's random generator.
    """

    temperature: float = spec(0.0, number(minimum=0))
    top_k: int = spec(0, whole(0))
    top_p: float = spec(1.0, number(above=0, maximum=1))
    repetition_penalty: float = spec(1.0, number(above=0))
    max_tokens: int = spec(64, whole(1))
    seed: int = spec(0, whole(0))

    def __post_init__(self) -> None:
        """Raises core.schema.FieldError (a ValueError) naming the field, e.g. ``top_p: must be <= 1, got 2``."""
        check_dataclass(self)


def sample_token(logits: np.ndarray, settings: SamplingSettings, history: list[int],
                 rng: np.random.Generator) -> tuple[int, np.ndarray]:
    """Choose the next token id from one row of logits.

    Args:
        logits: float32 (vocab_size,).
        settings: sampling settings.
        history: token ids already in the context (for the repetition penalty).
        rng: random generator (unused when greedy).

    Returns:
        (token id, probabilities (vocab_size,) float64 after penalty and temperature) — the
        probabilities the GUI shows for a token and its alternatives.

    Raises:
        FloatingPointError: the logits are not all finite (a diverged model).
    """
    z = logits.astype(np.float64).copy()
    if not np.all(np.isfinite(z)):
        raise FloatingPointError("the model's outputs are not finite numbers (its training diverged); "
                                 "train it again with a lower learning rate")
    if settings.repetition_penalty != 1.0 and history:
        ids = np.unique(np.asarray(history, dtype=np.int64))
        vals = z[ids]
        z[ids] = np.where(vals > 0, vals / settings.repetition_penalty, vals * settings.repetition_penalty)
    t = settings.temperature if settings.temperature > 0 else 1.0
    p = np.exp((z - z.max()) / t)
    p /= p.sum()
    if settings.temperature == 0:
        return int(np.argmax(z)), p
    q = p.copy()
    if settings.top_k and settings.top_k < q.size:
        kth = np.partition(q, -settings.top_k)[-settings.top_k]
        q[q < kth] = 0.0
    if settings.top_p < 1.0:
        order = np.argsort(-q, kind="stable")
        cum = np.cumsum(q[order])
        keep = cum - q[order] < settings.top_p * cum[-1]
        drop = order[~keep]
        q[drop] = 0.0
    q /= q.sum()
    return int(rng.choice(q.size, p=q)), p


class Generator:
    """Runs the model forward for generation, with a per-layer KV cache on the device.

    A Generator holds its own copy of the weights and its own kernel objects, so it can run in a
    chat thread while another thread trains. Decoding one token at a time replays the recorded launches
    of that step (core/replay.py) from the third token on.

    Args:
        dev: OpenCL device.
        config: architecture.
        weights: ``{gguf tensor name: float32 array}``, or a ``core.tensor_store.TensorStore`` to copy
            on the device.
        quantized: the GGUF file's tensors as stored (``LoadedModel.quantized``) when ``weights`` are that
            file's weights unchanged: its block matrices (core.quant_base.plan) and its output projection
            are then read in their formats (core/kernels/qmatmul.py) instead of float32, as llama.cpp
            reads the file: the same values, a quarter to an eighth of the bytes per token. Never pass
            it with weights that differ from the file's (a fine-tune, merged adapters).
        lora, adapter: a LoRA model's configuration and adapters (``{<base name>.lora_a / .lora_b: array}``),
            run beside the base matrices (core.model.lora_views) rather than merged into them: with
            ``quantized``, the file's matrices stay in their formats.

    Raises:
        ValueError: the device cannot hold the generator's buffers (core.model.check_fits, the memory rule
            training uses, with ``generation``; a tied model's quantized copy of token_embd for the logits
            is not counted), or ``quantized`` lacks a planned tensor's bytes.
    """

    def __init__(self, dev: Device, config: ModelConfig, weights: TensorStore | dict[str, np.ndarray],
                 quantized: RawBase | None = None, lora: LoRAConfig | None = None,
                 adapter: dict[str, np.ndarray] | None = None):
        blocks = quant_base.plan(config, block_matrices(config), quantized.types) if quantized else {}
        logits = quant_base.plan(config, [(LOGITS_MATRIX, [config.output_weight])], quantized.types) if quantized else {}
        tied = config.output_weight == tensor_name(T.TOKEN_EMBD)
        lora = lora if adapter is not None else None
        check_fits(dev, config, 1, training=False, generation=True,
                   quantized={**blocks, **({} if tied else logits)} or None, lora=lora)
        self.dev, self.config = dev, config
        self.ops = Ops(dev)
        self.ops.attention.tiles(config.head_dim)  # builds attention for this head_dim now, not mid-step
        ctx = config.context_length
        self.ops.matmul.reserve(step_matmuls(config, ctx, training=False)  # a full prompt
                                + (lora_matmuls(config, lora, ctx, training=False) if lora else []))
        # RoPE's cos/sin table for the whole context now: a replayed step keeps the buffer it recorded
        self.ops.rope.cos_sin_table(config.head_dim, config.rope_theta, config.context_length)
        in_quant = quant_base.members(blocks) + (() if tied else quant_base.members(logits))
        self.params = TensorStore(dev, param_layout(dev, config, in_quant))
        if isinstance(weights, TensorStore):
            self.params.copy_from(weights)
        else:
            self.params.load(weights)
        # what forward reads: buffers, or quantized matrices (core.model.LOGITS_MATRIX: the output projection)
        self.views: dict = {**self.params.views, **quant_base.frozen_matrices(
            dev, config, {**blocks, **logits}, quantized, self.ops.matmul._scratch, rows=ctx)}
        if lora:  # the adapted matrices: the base's (as stored, or float32) plus the adapters' products
            self.adapter = TensorStore(dev, adapter_layout(dev, config, lora))
            self.adapter.load(adapter)

            def frozen_of(name: str, n_out: int, n_in: int):
                view = self.views[name]
                return view if not isinstance(view, dev.cl.Buffer) else DenseFrozen(self.ops.matmul, view, n_out, n_in)

            adapted, linears = lora_views(dev, config, lora, frozen_of, self.adapter.views, {}, self.ops.matmul, ctx)
            for lin in linears:
                lin.refresh()
            self.views.update(adapted)
        # the buffers core.model.forward reads and writes: one per kind, shared by all layers (nothing
        # is kept for a backward), except the KV cache (act.k[i], act.v[i]: context_length rows per layer)
        self.act = Activations(dev, config, 1, config.context_length, training=False, generation=True)
        self.n_past = 0
        self._decode = StepReplayer(dev)  # one token's forward, replayed from the third token on (core/replay.py)

    @classmethod
    def for_model(cls, dev: Device, loaded: LoadedModel) -> Generator:
        """The Generator of a loaded model: an imported GGUF file's quantized matrices read as stored
        (``quantized``), also under a LoRA model's adapters when some block matrices stay quantized (as
        llama.cpp's ``--lora`` runs them); anything else (our models, a full fine-tune, LoRA on a float32
        base, even a GGUF file's: its merged weights, decoded faster) in float32."""
        kept = (quant_base.plan(loaded.config, block_matrices(loaded.config), loaded.quantized.types)
                if loaded.adapter is not None and loaded.quantized is not None else {})
        if kept:  # LoRA on a file whose block matrices stay quantized: base + adapters (else merged: faster)
            return cls(dev, loaded.config, loaded.base_weights, quantized=loaded.quantized, lora=loaded.lora,
                       adapter=loaded.adapter)
        quantized = loaded.quantized if loaded.adapter is None else None
        return cls(dev, loaded.config, loaded.weights, quantized=quantized)

    def reset(self) -> None:
        """Forget the cached context."""
        self.n_past = 0

    def feed(self, ids: list[int]) -> np.ndarray:
        """Append tokens to the context and return the logits after the last one.

        Args:
            ids: token ids (at least one).

        Returns:
            float32 (vocab_size,) logits predicting the token after ``ids[-1]``.

        Raises:
            ContextFullError: the context would exceed ``context_length``.
            ValueError: empty ``ids`` or an id outside the vocabulary.
        """
        c = self.config
        t = len(ids)
        if t == 0:
            raise ValueError("feed() needs at least one token")
        if self.n_past + t > c.context_length:
            raise ContextFullError(f"{self.n_past + t} tokens do not fit the context_length of {c.context_length}")
        arr = np.asarray(ids, np.int32)
        if arr.min() < 0 or arr.max() >= c.vocab_size:
            raise ValueError(f"token id outside vocab_size {c.vocab_size}")
        if t == 1:
            self.dev.set_int(self.act.tokens, int(arr[0]))
            self._decode(self.n_past, self._forward_one)
        else:
            self.dev.upload(arr, self.act.tokens)
            forward(self.ops, c, self.views, self.act, 1, t, pos=self.n_past, last_row_only=True)
        self.n_past += t
        return self.dev.download(self.act.logits, (c.vocab_size,))

    def _forward_one(self, pos: int) -> None:
        """The forward of the one token in ``act.tokens`` at position ``pos`` (what :attr:`_decode` replays)."""
        forward(self.ops, self.config, self.views, self.act, 1, 1, pos=pos, last_row_only=True)

    def generate(self, prompt_ids: list[int], settings: SamplingSettings, stop_ids: set[int] | None = None,
                 ) -> Iterator[tuple[int, np.ndarray]]:
        """Yield new tokens one by one after ``prompt_ids``, with their probability rows.

        Stops after ``settings.max_tokens`` tokens, after a token in ``stop_ids`` (which is yielded),
        or when prompt + answer reach ``context_length`` tokens (no error: the answer is cut).

        Yields:
            (token id, probabilities (vocab_size,) float64 at that step).

        Raises:
            ContextFullError: the prompt itself does not fit.
        """
        self.reset()
        if len(prompt_ids) >= self.config.context_length:
            raise ContextFullError(
                f"the prompt has {len(prompt_ids)} tokens; context_length is {self.config.context_length}")
        rng = np.random.default_rng(settings.seed)
        history = list(prompt_ids)
        logits = self.feed(list(prompt_ids))
        for _ in range(settings.max_tokens):
            if len(history) >= self.config.context_length:
                return  # prompt + answer never exceed context_length
            tok, probs = sample_token(logits, settings, history, rng)
            yield tok, probs
            history.append(tok)
            if (stop_ids and tok in stop_ids) or len(history) >= self.config.context_length:
                return
            logits = self.feed([tok])
