"""Model and training configuration: frozen dataclasses that reject impossible values.

Every error names the field, so the GUI can highlight it and the CLI can print it.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace

from gguf import MODEL_TENSOR, TENSOR_NAMES

from core.schema import FieldError, check_dataclass, flag, number, spec, whole
from core.stages import STAGES, Stage, upgrade_keys

# The tensors of one block in the order llama.cpp's converter writes them (the GGUF file order).
BLOCK_TENSORS = (MODEL_TENSOR.ATTN_NORM, MODEL_TENSOR.ATTN_Q, MODEL_TENSOR.ATTN_K, MODEL_TENSOR.ATTN_V,
                 MODEL_TENSOR.ATTN_OUT, MODEL_TENSOR.FFN_NORM, MODEL_TENSOR.FFN_GATE, MODEL_TENSOR.FFN_UP,
                 MODEL_TENSOR.FFN_DOWN)


def tensor_name(tensor: MODEL_TENSOR, block: int | None = None) -> str:
    """llama.cpp's GGUF name of a weight from gguf-py's table, e.g. ``blk.3.attn_q.weight``."""
    return TENSOR_NAMES[tensor].format(bid=block) + ".weight"


ConfigError = FieldError
"""A configuration value is impossible (:class:`core.schema.FieldError`: ``field`` names the field,
``str()`` is ``"field: problem"``)."""


MAX_LR = 1.0
"""Largest learning rate accepted: an AdamW step moves each weight by about lr."""
_SHARE = number(minimum=0, below=1)  # a fraction 0 <= x < 1


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of the llama-architecture transformer.

    Attributes:
        vocab_size: number of token ids (embedding rows and logits).
        d_model: width of the residual stream (GGUF ``embedding_length``).
        n_layers: transformer blocks (GGUF ``block_count``).
        n_heads: query heads; ``head_dim = d_model // n_heads`` must be even (RoPE pairs).
        n_kv_heads: key/value heads (grouped-query attention); divides ``n_heads``.
        ffn_dim: hidden width of the SwiGLU feed-forward (GGUF ``feed_forward_length``).
        context_length: longest sequence in tokens.
        rope_theta: RoPE base frequency (GGUF ``rope.freq_base``).
        norm_eps: RMSNorm epsilon (GGUF ``attention.layer_norm_rms_epsilon``).
        tie_embeddings: the output projection is ``token_embd.weight`` itself (no ``output.weight``),
            as in SmolLM2 and other small models; its gradient adds into the embedding's.
    """

    vocab_size: int = spec(1024, whole(1))
    d_model: int = spec(128, whole(1))
    n_layers: int = spec(2, whole(1))
    n_heads: int = spec(4, whole(1))
    n_kv_heads: int = spec(4, whole(1))
    ffn_dim: int = spec(384, whole(1))
    context_length: int = spec(128, whole(2, 8192))  # the longest the kernels support
    rope_theta: float = spec(10000.0, number(minimum=1, why="the RoPE base; 10000 is usual"))
    norm_eps: float = spec(1e-5, number(above=0))
    tie_embeddings: bool = spec(False, flag)

    def __post_init__(self) -> None:
        check_dataclass(self)
        if self.d_model % self.n_heads:
            raise ConfigError("n_heads", f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if (self.d_model // self.n_heads) % 2:
            raise ConfigError("n_heads", f"head_dim = d_model / n_heads = {self.d_model // self.n_heads} must be even for RoPE")
        if self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads:
            raise ConfigError("n_kv_heads", f"must divide n_heads ({self.n_heads}), got {self.n_kv_heads}")

    @property
    def head_dim(self) -> int:
        """Width of one attention head: d_model // n_heads."""
        return self.d_model // self.n_heads

    @property
    def kv_dim(self) -> int:
        """Width of the K and V projections: n_kv_heads * head_dim."""
        return self.n_kv_heads * self.head_dim

    @property
    def output_weight(self) -> str:
        """The tensor the logits are projected with (``output.weight``, or ``token_embd.weight`` when tied)."""
        return tensor_name(MODEL_TENSOR.TOKEN_EMBD if self.tie_embeddings else MODEL_TENSOR.OUTPUT)

    def gguf_tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """Parameter names (llama.cpp's GGUF tensor names, from ``gguf.TENSOR_NAMES``) and numpy shapes
        in the order llama.cpp's converter writes them: embedding, each block (:data:`BLOCK_TENSORS`),
        output norm, output. Linear weights are (out_features, in_features). With ``tie_embeddings``
        there is no ``output.weight``.
        """
        d, f, kv = self.d_model, self.ffn_dim, self.kv_dim
        T = MODEL_TENSOR
        block = {T.ATTN_NORM: (d,), T.ATTN_Q: (d, d), T.ATTN_K: (kv, d), T.ATTN_V: (kv, d), T.ATTN_OUT: (d, d),
                 T.FFN_NORM: (d,), T.FFN_GATE: (f, d), T.FFN_UP: (f, d), T.FFN_DOWN: (d, f)}
        out = [(tensor_name(T.TOKEN_EMBD), (self.vocab_size, d))]
        for i in range(self.n_layers):
            out += [(tensor_name(t, i), block[t]) for t in BLOCK_TENSORS]
        out.append((tensor_name(T.OUTPUT_NORM), (d,)))
        if not self.tie_embeddings:
            out.append((tensor_name(T.OUTPUT), (self.vocab_size, d)))
        return out

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """The tensors of :meth:`gguf_tensors` in storage order: the matrices first, the RMSNorm
        weights (1-D) last, each in file order, so weight decay applies to one contiguous range.
        """
        tensors = self.gguf_tensors()
        return [t for t in tensors if len(t[1]) > 1] + [t for t in tensors if len(t[1]) == 1]

    def n_params(self) -> int:
        """Total number of parameters."""
        return sum(math.prod(s) for _, s in self.param_shapes())

    def to_dict(self) -> dict:
        """Plain dict of every field (JSON-serialisable), for checkpoints and GGUF metadata."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """Build from a dict, ignoring unknown keys; raises ConfigError for bad values."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class StageConfig:
    """One training stage (pretraining on facts, or tuning on dialogues).

    Attributes:
        steps: optimizer steps in this stage (0 skips the stage).
        lr: peak learning rate.
        batch_size: sequences per step.
        warmup_steps: linear warmup from 0 to ``lr``; then cosine decay to ``lr * min_lr_ratio``.
        min_lr_ratio: final lr as a fraction of ``lr``.
        decay_steps: the cosine decay ends at this step (0: at ``steps``); later steps keep the final lr.
            Train until learned: ``steps`` is a maximum, the decay fits the steps expected to learn.
    """

    steps: int = spec(300, whole(0))
    lr: float = spec(3e-3, number(above=0, maximum=MAX_LR, why="AdamW steps of a larger size destroy the weights; "
                                                          "1e-3 is usual"))
    batch_size: int = spec(16, whole(1))
    warmup_steps: int = spec(20, whole(0))
    min_lr_ratio: float = spec(0.1, number(minimum=0, maximum=1))
    decay_steps: int = spec(0, whole(0))

    def validate(self, prefix: str) -> None:
        """Check every field; ``prefix`` (the stage's key, core.stages.Stage) goes into the field name of a ConfigError.

        Raises:
            ConfigError: a field is out of range.
        """
        check_dataclass(self, f"{prefix}.")


@dataclass(frozen=True)
class TrainConfig:
    """Training settings for both stages.

    Attributes:
        pretrain: stage 1, next-token loss on facts.
        dialogues: stage 2, loss on assistant tokens of dialogues, with facts replayed (earlier versions
            saved it under core.stages.OLD_VALUES' key; :meth:`from_dict` reads either).
        replay_share: fraction of each tuning batch drawn from facts (0 disables replay).
        grad_clip: max global gradient L2 norm (0 disables clipping).
        weight_decay: AdamW decoupled weight decay on matrices (not on norm weights).
        beta1, beta2, adam_eps: AdamW moments.
        seed: seeds initialisation and batch sampling.
        vocab_size: target size of the BPE vocabulary trained on the dataset.
        grad_accum: micro-batches per optimizer step (each of ``batch_size / grad_accum``
            sequences): the same step with less device memory.
        freeze_embeddings: do not train ``token_embd.weight`` (no gradient, no AdamW moments: less
            memory; for fine-tuning a large-vocabulary model on a small device).
        check_every: train until learned: every ``check_every`` steps a stage checks recall of what it
            must reproduce (pretrain: facts, dialogues: dialogue answers and facts) and ends early when ``recall_target`` of
            them is reproduced; its ``steps`` are then a maximum. 0: no checks during a stage.
        recall_target: share (0..1] of the stage's items that counts as learned (1: every one).
        patience: with ``check_every``, end a stage after this many checks in a row without a new best
            count (0: never for that reason); checks before a stage's ``decay_steps`` do not count (the
            planned steps run in any case).
        learned_after: with ``check_every``, a check ends a stage "learned" only once this share (0..1) of
            the stage's planned steps (``decay_steps``, or ``steps``) is done: a sampled check that finds
            everything early says little about the items it did not look at (0: any check may).
        min_gain: with ``check_every``, once a stage's planned steps (``decay_steps``) are done its checks look
            at every item, and it goes on only while each check reproduces at least this share (0..1) of the
            checked items more than the check before (0: ``patience`` decides, on any check).
        time_budget_s: wall-clock seconds for the whole run (0: none); pretraining may use its share of
            the steps of both stages, tuning the rest; a stage at its limit ends as if its steps were done.
        mix_share: share (0..1) of each pretraining batch taken from the question-and-answer examples
            (dialogues, fact questions), so facts are learned together with being asked about (Allen-Zhu
            & Li 2023, Physics of LMs 3.1: "mixed training").
        fact_questions: questions written for each fact that no dialogue answers, in the dataset's own
            question patterns (core.augment.fact_questions); 0: none.
        fact_question_share: share (0..1) of the question-and-answer part of a batch drawn from those
            fact questions (the rest from the dataset's dialogues).
        conversation_every: every this many tuning steps, a batch of conversations of several unrelated
            dialogues one after another (core.augment.conversations), so the model answers the latest
            question of a chat; 0: none.
        heldout: fact questions kept out of training to measure how well questions about facts without
            a dialogue are answered (the recall check's "heldout" kind); 0: none.
        check_sample: checks during a stage look at most this many items of each kind, evenly spaced; only a
            check that looked at every item of a kind ends a stage "learned" (the check at the planned steps'
            end and those after it look at all); the end-of-stage table checks all; 0: all.
        pack_facts: facts one after another in each pretraining row of facts (core.batches.pack): a
            batch is padded to its longest row, and a question row is about as long as two facts.
    """

    pretrain: StageConfig = field(default_factory=lambda: StageConfig(steps=250, lr=3e-3, batch_size=16, warmup_steps=20))
    dialogues: StageConfig = field(default_factory=lambda: StageConfig(steps=200, lr=2e-3, batch_size=16, warmup_steps=10))
    replay_share: float = spec(0.25, _SHARE)
    grad_clip: float = spec(1.0, number(minimum=0))
    weight_decay: float = spec(0.01, number(minimum=0))
    beta1: float = spec(0.9, _SHARE)
    beta2: float = spec(0.98, _SHARE)
    adam_eps: float = spec(1e-8, number(above=0))
    seed: int = spec(0, whole(0))
    vocab_size: int = spec(1024, whole(260))
    grad_accum: int = spec(1, whole(1))
    freeze_embeddings: bool = spec(False, flag)
    check_every: int = spec(0, whole(0))
    recall_target: float = spec(1.0, number(above=0, maximum=1, why="1: every item"))
    patience: int = spec(3, whole(0))
    learned_after: float = spec(0.0, _SHARE)
    min_gain: float = spec(0.0, _SHARE)
    time_budget_s: float = spec(0.0, number(minimum=0))
    mix_share: float = spec(0.0, _SHARE)
    fact_questions: int = spec(0, whole(0))
    fact_question_share: float = spec(0.5, _SHARE)
    conversation_every: int = spec(0, whole(0))
    heldout: int = spec(0, whole(0))
    check_sample: int = spec(0, whole(0))
    pack_facts: int = spec(1, whole(1))

    def __post_init__(self) -> None:
        self.pretrain.validate(Stage.PRETRAIN.value)
        self.dialogues.validate(Stage.DIALOGUES.value)
        check_dataclass(self)
        for st, prefix in ((self.pretrain, Stage.PRETRAIN.value), (self.dialogues, Stage.DIALOGUES.value)):
            if self.grad_accum > st.batch_size:
                raise ConfigError("grad_accum", f"{self.grad_accum} micro-batches do not fit a {prefix} batch of "
                                                f"{st.batch_size} sequences")

    def to_dict(self) -> dict:
        """Plain dict of every field, stages as nested dicts (JSON-serialisable)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """Build from a dict (as written by :meth:`to_dict`, or by an earlier version: a stage under its old
        key, core.stages.upgrade_keys); raises ConfigError for bad values."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in upgrade_keys(d).items() if k in names}
        for stage in (s.value for s in STAGES):
            if isinstance(kw.get(stage), dict):
                sn = {f.name for f in fields(StageConfig)}
                kw[stage] = StageConfig(**{k: v for k, v in kw[stage].items() if k in sn})
        return cls(**kw)


PRESETS: dict[str, tuple[ModelConfig, TrainConfig]] = {
    "Tiny": (ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, ffn_dim=192, context_length=128),
             TrainConfig(pretrain=StageConfig(steps=200, lr=4e-3, batch_size=16, warmup_steps=20),
                         dialogues=StageConfig(steps=150, lr=3e-3, batch_size=16, warmup_steps=10))),
    "Small": (ModelConfig(), TrainConfig()),
    "Larger": (ModelConfig(d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=768, context_length=256),
               TrainConfig(pretrain=StageConfig(steps=400, lr=2e-3, batch_size=16, warmup_steps=40),
                           dialogues=StageConfig(steps=300, lr=1e-3, batch_size=16, warmup_steps=20))),
}
"""Named model/training presets offered by the GUI (the default is "Small")."""


def lr_at(stage: StageConfig, step: int) -> float:
    """Learning rate at 0-based ``step`` of a stage: linear warmup, then cosine decay.

    1. step < warmup: lr * (step + 1) / warmup.
    2. afterwards: progress p in [0, 1] up to ``decay_steps`` (or ``steps``);
       lr * (min + (1 - min) * 0.5 * (1 + cos(pi * p))).
    (Loshchilov & Hutter 2017, SGDR, without restarts.)
    """
    if stage.warmup_steps and step < stage.warmup_steps:
        return stage.lr * (step + 1) / stage.warmup_steps
    span = max(1, (stage.decay_steps or stage.steps) - stage.warmup_steps)
    p = min(1.0, (step - stage.warmup_steps) / span)
    return stage.lr * (stage.min_lr_ratio + (1 - stage.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


# Checks that read another field: their message names that field's value (see config_errors).
_READS_OTHER = {"n_heads": ("d_model",), "n_kv_heads": ("n_heads",),
                "grad_accum": tuple(f"{s.value}.batch_size" for s in STAGES)}


def config_errors(build: Callable[[dict], object], values: dict, defaults: dict) -> list[ConfigError]:
    """Every field error of a form, not only the first one the constructors raise.

    ``build(values)`` makes the configs from flat field values (``"d_model"``, ``"pretrain.lr"``, ...)
    and raises a ConfigError naming a field. Each failing field is given its value from ``defaults``
    and the form is built again, until it builds. An error on a field whose check reads a field that
    was replaced (``n_kv_heads`` must divide ``n_heads``) is not reported: its message would name the
    default, not the form's value; it shows once that field is fixed.

    Returns:
        The errors, in the order found ([] when ``build(values)`` succeeds).
    """
    values, errors, replaced = dict(values), [], set()
    for _ in range(len(values) + 1):
        try:
            build(values)
            return errors
        except ConfigError as e:
            if e.field in replaced:
                return errors
            if not set(_READS_OTHER.get(e.field, ())) & replaced:
                errors.append(e)
            if e.field not in defaults or e.field not in values:
                return errors
            replaced.add(e.field)
            values[e.field] = defaults[e.field]
    return errors


__all__ = ["ConfigError", "ModelConfig", "StageConfig", "TrainConfig", "PRESETS", "config_errors", "lr_at",
           "replace"]
