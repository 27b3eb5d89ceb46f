"""A checkpoint's ``config.json``: :class:`CheckpointMeta`, its one reader and writer, with the format
constants, the one-line :class:`CheckpointError`, and the GGUF keys under which an export records the
training (:class:`TrainingKeys`, read back by ``core.gguf_import``).

It lives below ``core.loaded`` (whose ``LoadedModel.checkpoint`` is a CheckpointMeta) and the readers
(``core.checkpoint``, ``core.gguf_import``), so that none of them imports the other. Also here: reading
the files of one checkpoint folder through an open descriptor of it (:func:`pin_folder`), which
``CheckpointMeta.read`` and ``core.checkpoint.load_checkpoint`` share; and the rules of a checkpoint
folder (:func:`check_output_folder`, :func:`check_export_target`): a folder is ours (our marker file
:data:`MARKER`, or the complete, valid files of a checkpoint written before it) or refused, and nothing
in it that we did not write is ever replaced or deleted.
"""
from __future__ import annotations

import io
import json
import math
import os
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Iterator

from core import __version__
from core.atomic import backup_in_the_way, backup_path, is_mark, readable_folder, swap_name_problem
from core.config import ModelConfig, StageConfig, TrainConfig
from core.folder_lock import FolderBusyError, FolderLock
from core.json_text import parse_json
from core.schema import MISSING, FieldError, items, kind, mapping, read, text, texts, whole
from core.stages import STAGES

FORMAT = "opencl-llm-studio-checkpoint"
FORMAT_VERSION = 4
"""1: files replaced one by one, no tokenizer hash; 2: the folder is swapped as a whole, tokenizer hash;
3: sha256 of weights.npz and optimizer.npz in config.json, the marker file :data:`MARKER`; 4: the dialogue
stage's settings under ``train.dialogues`` (before: core.stages.OLD_VALUES' key, still read)."""
MARKER = ".opencl-llm-checkpoint"
"""The file every save writes into a checkpoint folder: the folder is ours to replace."""
CONFIG_FILE, WEIGHTS_FILE, OPTIMIZER_FILE = "config.json", "weights.npz", "optimizer.npz"
TOKENIZER_FILE, DATASET_FILE = "tokenizer.json", "dataset.json"
CHECKPOINT_FILES = (CONFIG_FILE, WEIGHTS_FILE, OPTIMIZER_FILE, TOKENIZER_FILE, DATASET_FILE, MARKER)
"""Every file a save writes; anything else in a checkpoint folder is someone else's. Only this module
and core/checkpoint.py name them; others ask :func:`has_checkpoint`, :func:`dataset_path`,
:func:`has_our_weights`."""
STAGE_NAMES = tuple(s.value for s in STAGES)
"""The saved keys of the stages in config.json's ``train`` (core.stages.Stage values), in run order."""
MAX_CONFIG_BYTES = 1 << 20
META_PREFIX = "opencl_llm_studio."
"""Prefix of our own keys in a GGUF file (its ``opencl_llm_studio.app_version`` marks a file this app wrote)."""
APP_VERSION_KEY = META_PREFIX + "app_version"
MODELFILE_HEADER = "# Ollama Modelfile written by OpenCL LLM Studio"
"""The first line of every Modelfile this app writes (what marks it as ours)."""
BASE_META_KEYS = ("base_model", "gguf_general", "gguf_context_length", "name", "lora", "base_sha256",
                  "from_base", "general_replay")
"""Checkpoint keys of a model fine-tuned from a GGUF file (``Trainer.base_meta``): what the export
writes back (general.* keys, the file's context length, its name); for LoRA (core/lora.py) the
adapters' settings (``lora``: rank, alpha, targets) and the sha256 of the base file, which a LoRA
checkpoint does not copy (its weights.npz holds only the adapters); for a full fine-tune whose frozen
tensors are still the base's (``--freeze-embeddings``), their names (``from_base``) and the base file's
sha256: its weights.npz and optimizer.npz leave them out, a load reads them from the base file; where the run
replays the base's answers to general questions (core.known), which of dataset.json's dialogues they are
(``general_replay``: ``first_dialogue``, their ``questions``, the ``unfinished`` ones), so that a resumed run counts
them apart as the run it continues did."""


class TrainingKeys:
    """Our GGUF keys that record the training (after ``core.gguf_import.META_PREFIX``): written by
    :meth:`CheckpointMeta.training_summary` into an export, read back by ``core.gguf_import``."""

    APP_VERSION = "training.app_version"
    DATE = "training.date"
    STEPS = "training.steps"  # AdamW updates (CheckpointMeta.adam_step)
    PRETRAIN_STEPS = "training.pretrain_steps"
    DIALOGUES_STEPS = "training.tune_steps"  # the dialogue stage's steps (the key as exports have always named it)
    FINAL_LOSS = "training.final_loss"
    DATASET_SHA256 = "training.dataset_sha256"
    CONFIG = "training.config"  # TrainConfig.to_dict() as JSON


class CheckpointError(ValueError):
    """A checkpoint folder is missing, incomplete, damaged or of another format (one line, naming the
    file and, where it applies, the field)."""


# ------------------------------------------------------------------------------------ the file layout
def has_checkpoint(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a saved checkpoint's config.json (not validated: see
    :meth:`CheckpointMeta.read`)."""
    return (Path(folder) / CONFIG_FILE).is_file()


def has_our_weights(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` has a weights file of ours (tells a checkpoint from another tool's folder)."""
    return (Path(folder) / WEIGHTS_FILE).exists()


def dataset_path(folder: str | os.PathLike) -> Path:
    """The dataset a checkpoint in ``folder`` was trained on (it may be missing)."""
    return Path(folder) / DATASET_FILE


# ------------------------------------------------------------------------------------ config.json
def _check_lora_base(base: dict) -> None:
    """A LoRA checkpoint's ``base``: valid ``lora`` settings, the base file's path and sha256."""
    if "lora" not in base:
        return
    from core.lora import LoRAConfig, LoRAError

    try:
        LoRAConfig.from_dict(base["lora"])
    except LoRAError as e:
        raise FieldError("base.lora", str(e)) from None
    for key in ("base_model", "base_sha256"):
        if not isinstance(base.get(key), str) or not base[key]:
            raise FieldError(f"base.{key}", "must be a non-empty string in a LoRA checkpoint")


def _check_from_base(base: dict, model: ModelConfig) -> None:
    """A full fine-tune's ``base.from_base``: distinct tensors of ``model``, with the base file's path and
    sha256 to read them from; never with LoRA (whose base is the whole model but the adapters)."""
    if "from_base" not in base:
        return
    names = texts("base.from_base", base["from_base"])
    if "lora" in base:
        raise FieldError("base.from_base", "must not be set in a LoRA checkpoint (its base is read whole)")
    known = {n for n, _ in model.param_shapes()}
    for i, name in enumerate(names):
        if name not in known:
            raise FieldError(f"base.from_base[{i}]", f"is {name!r}, not one of the model's tensors")
        if name in names[:i]:
            raise FieldError(f"base.from_base[{i}]", f"names {name!r} a second time")
    for key in ("base_model", "base_sha256"):
        if not isinstance(base.get(key), str) or not base[key]:
            raise FieldError(f"base.{key}", "must be a non-empty string when base.from_base names tensors")


def _stage(name: str, d) -> StageConfig:
    names = {f.name for f in fields(StageConfig)}
    st = StageConfig(**{k: v for k, v in mapping(name, d).items() if k in names})
    st.validate(name)  # FieldError "train.dialogues.lr: ..."
    return st


# ModelConfig fields every checkpoint has (format version 1); fields added since have defaults that
# describe the older checkpoints (e.g. tie_embeddings = False), so they may be absent.
_V1_MODEL_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "context_length",
                    "rope_theta", "norm_eps")


def _model_config(name: str, d) -> ModelConfig:
    for key in _V1_MODEL_FIELDS:
        read(mapping(name, d), key, lambda _name, v: v, f"{name}.")  # present (ModelConfig checks the value)
    try:
        return ModelConfig.from_dict(d)
    except FieldError as e:
        raise FieldError(f"{name}.{e.field}", e.problem) from None


def _train_config(name: str, d) -> TrainConfig:
    d = mapping(name, d)  # a stage under its key, or an older version's (version 3 and before: Stage.key_in)
    kw = {stage.value: read(d, stage.key_in(d), _stage, f"{name}.") for stage in STAGES}
    names = {f.name for f in fields(TrainConfig)} - set(STAGE_NAMES)
    try:
        return TrainConfig(**kw, **{k: d[k] for k in names & d.keys()})
    except FieldError as e:
        raise FieldError(f"{name}.{e.field}", e.problem) from None


def _loss(name: str, v) -> float:
    if v is None:
        return float("nan")
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise FieldError(name, f"must be a number or null, got {kind(v)}")
    return float(v)


def _sha256(name: str, v) -> str:
    if text(name, v) and (len(v) != 64 or any(c not in "0123456789abcdef" for c in v)):
        raise FieldError(name, "must be a sha256 hex digest (64 characters 0-9a-f)")
    return v


def _base(name: str, v) -> dict:
    base = {k: x for k, x in mapping(name, v).items() if k in BASE_META_KEYS}
    _check_lora_base(base)
    if "general_replay" in base:
        r = mapping(f"{name}.general_replay", base["general_replay"])
        whole(0)(f"{name}.general_replay.first_dialogue", r.get("first_dialogue"))
        for key in ("questions", "unfinished"):
            texts(f"{name}.general_replay.{key}", r.get(key))
    return base


@dataclass(frozen=True)
class CheckpointMeta:
    """What ``config.json`` holds; the one reader (:meth:`read`) and writer (:meth:`to_json`) of it.

    Attributes:
        model: the architecture (vocab_size is the tokenizer's).
        train: the training settings of the run (both stages).
        stage_index: the next stage to run: 0 pretrain, 1 dialogues, 2 both done.
        stage_step: steps done in that stage.
        adam_step: AdamW updates so far (bias-correction counter).
        tokenizer_hash: sha256 of tokenizer.json's text ("" in version-1 checkpoints).
        dataset_hash: sha256 of the canonical dataset JSON (core.dataset.dataset_hash).
        previous_dataset_hashes: earlier datasets of this run (resumed with ``allow_new_data``).
        last_loss: loss of the last good step in nats/token (NaN before the first one).
        saved: local time of the save, ISO 8601.
        base: for a model fine-tuned from a GGUF file, what its export writes back (keys
            :data:`BASE_META_KEYS`: the base file's path, ``general.*`` keys, context length, name)
            and what a load reads from the base file (LoRA's base, a full fine-tune's
            :attr:`from_base` tensors); empty for a model trained from scratch.
        app_version: the app that wrote it.
        version: the checkpoint format version (:data:`FORMAT_VERSION` when written by this app).
        stages_run: the steps each finished stage ran, in stage order: fewer than its ``steps`` where it ended
            early (learned, no progress, time budget); empty in checkpoints written before this field (each
            finished stage then counts its ``steps``).
        weights_sha256: sha256 hex digest of weights.npz ("" before version 3).
        optimizer_sha256: sha256 hex digest of optimizer.npz ("" before version 3, or when the save had
            no optimizer state).
    """

    model: ModelConfig
    train: TrainConfig
    stage_index: int = 0
    stage_step: int = 0
    adam_step: int = 0
    tokenizer_hash: str = ""
    dataset_hash: str = ""
    previous_dataset_hashes: tuple[str, ...] = ()
    last_loss: float = float("nan")
    saved: str = ""
    base: dict = field(default_factory=dict)
    app_version: str = __version__
    version: int = FORMAT_VERSION
    weights_sha256: str = ""
    optimizer_sha256: str = ""
    stages_run: tuple[int, ...] = ()

    # ---- derived
    @property
    def done(self) -> bool:
        """Both stages have run all their steps."""
        return self.stage_index >= len(STAGE_NAMES)

    @property
    def from_base(self) -> tuple[str, ...]:
        """The tensors a full fine-tune's checkpoint leaves out of weights.npz and optimizer.npz: frozen
        since the base, they are read from the base file ``base["base_model"]`` (empty otherwise)."""
        return tuple(self.base.get("from_base", ()))

    @property
    def lora(self):
        """The :class:`core.lora.LoRAConfig` of a LoRA checkpoint (its weights.npz holds only the
        adapters; the base is the file ``base["base_model"]``), else None."""
        if "lora" not in self.base:
            return None
        from core.lora import LoRAConfig

        return LoRAConfig.from_dict(self.base["lora"])

    def stage_steps_done(self) -> tuple[int, int]:
        """(pretrain steps done, dialogue stage's steps done)."""
        pre, dialogues = self.train.pretrain.steps, self.train.dialogues.steps
        if self.stage_index == 0:
            return self.stage_step, 0
        if self.stage_index == 1:
            return pre, self.stage_step
        return pre, dialogues

    def stage_steps_run(self) -> tuple[int, int]:
        """(pretrain steps run, dialogue stage's steps run): as :meth:`stage_steps_done`, with a finished stage's
        steps as it ran them (:attr:`stages_run`) where that is recorded, not its most steps (a stage that ended
        early counts as all its steps done for a resume, but an export records what ran)."""
        done = list(self.stage_steps_done())
        for i, n in enumerate(self.stages_run[:min(self.stage_index, len(done))]):
            done[i] = n
        return done[0], done[1]

    def training_summary(self) -> dict:
        """What a GGUF export records of the training (keys without the ``opencl_llm_studio.`` prefix);
        entries without a value (a NaN loss, no date) are left out."""
        pre, dialogues = self.stage_steps_run()
        k = TrainingKeys
        values = {
            k.APP_VERSION: self.app_version, k.DATE: self.saved or None,
            k.STEPS: self.adam_step, k.PRETRAIN_STEPS: pre, k.DIALOGUES_STEPS: dialogues,
            k.FINAL_LOSS: self.last_loss if math.isfinite(self.last_loss) else None,
            k.DATASET_SHA256: self.dataset_hash or None,
            k.CONFIG: json.dumps(self.train.to_dict(), sort_keys=True),
        }
        return {k: v for k, v in values.items() if v is not None}

    # ---- writing
    def to_dict(self) -> dict:
        """The JSON object written to config.json (always the current format version)."""
        return {"format": FORMAT, "version": FORMAT_VERSION, "app_version": self.app_version,
                "model": self.model.to_dict(), "train": self.train.to_dict(),
                "stage_index": self.stage_index, "stage_step": self.stage_step, "adam_step": self.adam_step,
                "tokenizer_hash": self.tokenizer_hash, "dataset_hash": self.dataset_hash,
                "previous_dataset_hashes": list(self.previous_dataset_hashes),
                "last_loss": self.last_loss if math.isfinite(self.last_loss) else None,
                "saved": self.saved, "base": dict(self.base), "weights_sha256": self.weights_sha256,
                "optimizer_sha256": self.optimizer_sha256, "stages_run": list(self.stages_run)}

    def to_json(self) -> str:
        """config.json's text (indented JSON, no NaN literals)."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    # ---- reading
    @classmethod
    def from_dict(cls, d: object, path: str | os.PathLike = "config.json") -> "CheckpointMeta":
        """Validate a parsed config.json.

        Raises:
            CheckpointError: ``"<path>: field 'train.dialogues' must be an object"`` and the like; another
                format; a newer version.
        """
        try:
            d = mapping("(top level)", d)
            fmt = d.get("format")
            if fmt != FORMAT:
                raise FieldError("format", f"is {fmt!r}, expected {FORMAT!r} (not a checkpoint of this app)")
            version = read(d, "version", whole(1))
            if version > FORMAT_VERSION:
                raise FieldError("version", f"is {version}: written by a newer app version (this one reads "
                                 f"up to {FORMAT_VERSION})")
            model, train = read(d, "model", _model_config), read(d, "train", _train_config)
            stage_index = read(d, "stage_index", whole(0, len(STAGE_NAMES)))
            stage_step = read(d, "stage_step", whole(0))
            if stage_index == len(STAGE_NAMES) and stage_step:
                raise FieldError("stage_step", f"must be 0 when both stages are done, got {stage_step}")
            base = read(d, "base", _base, default={})
            _check_from_base(base, model)
            return cls(model=model, train=train, stage_index=stage_index, stage_step=stage_step,
                       adam_step=read(d, "adam_step", whole(0)),
                       tokenizer_hash=read(d, "tokenizer_hash", text, default=""),
                       dataset_hash=read(d, "dataset_hash", text, default=""),
                       previous_dataset_hashes=tuple(read(d, "previous_dataset_hashes", texts, default=[])),
                       last_loss=read(d, "last_loss", _loss, default=float("nan")),
                       saved=read(d, "saved", text, default=""), base=base,
                       app_version=read(d, "app_version", text, default=""), version=version,
                       weights_sha256=read(d, "weights_sha256", _sha256, default=MISSING if version >= 3 else ""),
                       optimizer_sha256=read(d, "optimizer_sha256", _sha256, default=""),
                       stages_run=tuple(read(d, "stages_run", items(whole(0)), default=[])[:len(STAGE_NAMES)]))
        except FieldError as e:
            raise CheckpointError(e.at(path)) from None

    @classmethod
    def from_json(cls, text: str, path: str | os.PathLike = "config.json") -> "CheckpointMeta":
        """Parse and validate config.json's text. Raises CheckpointError (one line)."""
        return cls.from_dict(parse_json(text, path, CheckpointError, "a checkpoint config"), path)

    @classmethod
    def read(cls, folder: str | os.PathLike, dir_fd: int | None = None) -> "CheckpointMeta":
        """Read ``folder/config.json`` (at most 1 MiB); with ``dir_fd`` (an open descriptor of the
        folder, :func:`pin_folder`) from that folder even if it has been renamed since.

        Raises:
            CheckpointError: no config.json (``not a checkpoint folder``), unreadable or invalid.
        """
        cfg = Path(folder) / "config.json"
        if not is_file(cfg, dir_fd):
            raise CheckpointError(f"{folder}: not a checkpoint folder (no config.json)")
        return cls.from_json(read_text(cfg, MAX_CONFIG_BYTES, dir_fd), cfg)


# ------------------------------------------------------------------------------------ reading a folder's files
def pin_folder(folder: Path) -> int | None:
    """An open descriptor of ``folder`` to read its files through (``dir_fd``), so that every file read
    comes from this one folder even when a save renames it away meanwhile (a path-based check cannot
    tell: the file system may give the next save's folder the same inode number). None where the
    platform cannot (Windows) or the folder cannot be opened."""
    if os.open not in os.supports_dir_fd or not hasattr(os, "O_DIRECTORY"):
        return None
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None


def is_file(path: Path, dir_fd: int | None) -> bool:
    """Whether ``path`` (with ``dir_fd``: the file of its name in the pinned folder) is a regular file."""
    if dir_fd is None:
        return path.is_file()
    try:
        return stat.S_ISREG(os.stat(path.name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def open_binary(path: Path, dir_fd: int | None) -> io.BufferedReader:
    """``path`` opened for reading; with ``dir_fd`` the file of that name in the pinned folder.

    Raises:
        CheckpointError: not a regular file (a device, a pipe: never read endlessly).
        OSError: it cannot be opened.
    """
    if dir_fd is None:
        if path.exists() and not path.is_file():
            raise CheckpointError(f"{path}: not a regular file")
        return open(path, "rb")
    fd = os.open(path.name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0), dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(f"{path}: not a regular file")
    return os.fdopen(fd, "rb")


def read_bytes(path: Path, limit: int, dir_fd: int | None = None) -> bytes:
    """The content of ``path`` (as :func:`open_binary` opens it), at most ``limit`` bytes.

    Raises:
        CheckpointError: it cannot be read, is not a regular file, or is larger than ``limit``.
    """
    try:
        with open_binary(path, dir_fd) as fh:
            data = fh.read(limit + 1)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    if len(data) > limit:
        raise CheckpointError(f"{path}: larger than {limit >> 20} MiB; not a file of a checkpoint")
    return data


def read_text(path: Path, limit: int, dir_fd: int | None = None) -> str:
    """:func:`read_bytes` decoded as UTF-8.

    Raises:
        CheckpointError: as :func:`read_bytes`, or not UTF-8 text.
    """
    try:
        return read_bytes(path, limit, dir_fd).decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not UTF-8 text (byte {e.start})") from None


# ------------------------------------------------------------------------------------ the folder
def _is_temp_leftover(name: str) -> bool:
    """``.FILE.<8 hex>.tmp`` of one of our files: what an interrupted core.atomic.atomic_write leaves."""
    stem, dot, rest = name[1:].rpartition(".tmp")[0].rpartition(".")
    return (name.startswith(".") and name.endswith(".tmp") and bool(dot) and stem in CHECKPOINT_FILES
            and len(rest) == 8 and all(c in "0123456789abcdef" for c in rest))


def foreign_files(folder: str | os.PathLike) -> list[str]:
    """The names in a checkpoint folder that no save of ours writes (sorted; subfolders and symlinks
    included: a save replaces the whole folder, so it would delete them).

    Raises:
        OSError: the folder cannot be listed.
    """
    out = []
    for entry in os.scandir(folder):
        ours = entry.name in CHECKPOINT_FILES and entry.is_file(follow_symlinks=False) or is_mark(entry.path)
        if not ours and not _is_temp_leftover(entry.name):
            out.append(entry.name)
    return sorted(out)


def is_checkpoint_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a checkpoint of this app: our marker file :data:`MARKER`, or (written
    before the marker, format versions 1 and 2) a config.json that :meth:`CheckpointMeta.read` accepts
    and a weights.npz. A config.json alone (a Hugging Face folder, a user's file) is not one."""
    f = Path(folder)
    marker = f / MARKER
    if marker.is_file() and not marker.is_symlink():
        return True
    if not (f / "weights.npz").is_file():
        return False
    try:
        return CheckpointMeta.read(f).version < 3
    except CheckpointError:
        return False


def not_saved_yet(path: str | os.PathLike) -> str | None:
    """"PATH: no model saved there yet (process N on HOST is writing it; ...)" where a live process holds the
    folder ``path`` (a first training run before its first save), else None."""
    from core.folder_lock import live_holder

    holder = live_holder(path)
    if holder is None or not holder.pid:
        return None
    return (f"{path}: no model saved there yet ({holder.describe()} is writing it; its first save comes at the end "
            "of its first stage or on a stop)")


def resume_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` holds no training run to continue, in one line, or None.

    "PATH: no such folder": neither the folder nor the backup of a save killed between its renames is there
    (the folder a load reads, core.atomic.readable_folder: the backup is put back, not refused). "PATH: no
    training run was saved here (--resume needs ...)": a folder with none of a save's own files (the marker,
    weights.npz, optimizer.npz, a config.json of our format), e.g. a user's folder or an empty one. A folder
    with any of them is left to the readers, whose one-line messages name what is damaged or missing; a file
    or a folder that cannot be listed to :func:`check_output_folder`'s.
    """
    folder = readable_folder(os.path.realpath(path))
    if not folder.exists():
        if writing := not_saved_yet(path):  # a first run that has not saved yet
            return writing
        bak = backup_path(folder)
        if bak.is_dir():  # not taken for a cut save's (readable_folder): no swap marked it
            return (f"{path}: no such folder ({bak.name} beside it is not a save's backup of this version; if it is "
                    f"your checkpoint, rename it to {folder.name})")
        return f"{path}: no such folder"
    try:
        names = set(os.listdir(folder)) if folder.is_dir() else None
    except OSError:
        names = None
    if names is None or names & {MARKER, WEIGHTS_FILE, OPTIMIZER_FILE}:
        return None
    if CONFIG_FILE in names:
        try:
            d = json.loads(read_text(folder / CONFIG_FILE, MAX_CONFIG_BYTES))
        except (CheckpointError, ValueError, RecursionError):
            d = None  # another tool's or a broken file: the format is ours only when it says so
        if isinstance(d, dict) and d.get("format") == FORMAT:
            return None
    if writing := not_saved_yet(path):
        return writing
    return f"{path}: no training run was saved here (--resume needs a folder that `train --out` wrote)"


def _not_ours(folder: Path, first: str) -> str:
    """Why a folder with files is no checkpoint of ours: its config.json's problem when it looks like
    an old one (config.json and weights.npz), else the first file in it."""
    if (folder / "weights.npz").is_file() and (folder / "config.json").is_file():
        try:
            CheckpointMeta.read(folder)
        except CheckpointError as e:
            return str(e)
    return f"it holds {first}"


def _read_only(p: Path) -> bool:
    """Not writable by this process, or its owner's write bit is off (a ``chmod 555`` means "do not
    write", for root too)."""
    try:
        return not os.access(p, os.W_OK | os.X_OK) or not p.stat().st_mode & stat.S_IWUSR
    except OSError:
        return True


def _newer_version(folder: Path) -> int | None:
    """config.json's version when it is newer than :data:`FORMAT_VERSION` (a newer app's checkpoint)."""
    try:
        d = json.loads(read_text(folder / "config.json", MAX_CONFIG_BYTES))
    except (CheckpointError, ValueError, RecursionError):
        return None
    v = d.get("version") if isinstance(d, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > FORMAT_VERSION else None


def enclosing_checkpoint(path: Path) -> Path | None:
    """The checkpoint folder of ours that ``path`` (a resolved path) is or lies in, nearest first; None."""
    return next((d for d in (path, *path.parents) if d.is_dir() and is_checkpoint_folder(d)), None)


def check_output_folder(path: str | os.PathLike) -> Path:
    """Resolve and check a folder a checkpoint is to be saved into, before any training.

    The folder may be new, empty, or hold a checkpoint of ours (:func:`is_checkpoint_folder`) with no
    file a save does not write (:func:`foreign_files`: a save replaces the folder as a whole). Symlinks
    and ``..`` are resolved here once (``os.path.realpath``); use the returned path from then on. The
    parent folder is created if needed.

    Args:
        path: the checkpoint folder (``train --out``, ``--resume``, a project's checkpoint folder).

    Returns:
        The resolved folder.

    Raises:
        CheckpointError: one line naming the folder and what is wrong: not a folder, inside another
            checkpoint folder, not ours (the first foreign file named), a newer app's checkpoint, read-only (the folder or the one it
            is in), an old backup ``.NAME.bak`` that cannot be removed, a name too long for a save's temp folder
            (core.atomic.swap_name_problem).
    """
    folder = Path(os.path.realpath(path))
    if folder.parent == folder:
        raise CheckpointError(f"{folder}: cannot be a checkpoint folder (a save writes beside it, in its parent)")
    if (too_long := swap_name_problem(folder)) is not None:  # before any training, not at the first save
        raise CheckpointError(too_long)
    holder = enclosing_checkpoint(folder.parent)
    if holder is not None:  # the outer checkpoint's next save would replace this one, or refuse it as foreign
        raise CheckpointError(f"{folder}: inside the checkpoint folder {holder} (a save replaces that folder as a "
                              "whole); give a folder outside it")
    if folder.exists() and not folder.is_dir():
        raise CheckpointError(f"{folder}: exists and is not a folder")
    if folder.is_dir():
        try:
            names = sorted(n for n in os.listdir(folder) if not is_mark(folder / n))  # (a mark a cut swap left)
            foreign = foreign_files(folder) if names else []
        except OSError as e:
            raise CheckpointError(f"{folder}: cannot be read ({e.strerror or e})") from None
        if names and not is_checkpoint_folder(folder):
            raise CheckpointError(f"{folder}: not a checkpoint folder of this app ({_not_ours(folder, names[0])}); "
                                  "give a new or empty folder")
        if foreign:
            raise CheckpointError(f"{folder}: holds {foreign[0]}, which this app did not write (a save replaces "
                                  "the whole folder); move it out or give another folder")
        newer = _newer_version(folder) if names else None
        if newer is not None:
            raise CheckpointError(f"{folder / 'config.json'}: field 'version' is {newer}: a checkpoint of a newer "
                                  f"app version (this one writes {FORMAT_VERSION}); not replaced")
        if _read_only(folder):
            raise CheckpointError(f"{folder}: the folder is read-only; make it writable or give another folder")
    bak = backup_path(folder)
    if backup_in_the_way(folder) is not None:
        raise CheckpointError(f"{bak}: in the way of saves (a save names the old {folder.name} so while it puts the "
                              "new one in place), and this app did not write it; move or rename it")
    if bak.is_dir() and folder.is_dir():
        stuck = next((d for d in [bak] + [Path(r) / n for r, ds, _ in os.walk(bak) for n in ds] if _read_only(d)), None)
        if stuck is not None:
            raise CheckpointError(f"{bak}: the backup of an earlier save cannot be removed ({stuck} is read-only); "
                                  "remove it by hand")
    parent = folder.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"{parent}: cannot create the folder ({e.strerror or e})") from None
    if _read_only(parent):
        raise CheckpointError(f"{parent}: the folder is read-only (a save writes {folder.name} beside its old "
                              "copy there); give another folder")
    return folder


def written_by_app(path: Path) -> bool:
    """Whether the file ``path`` is an export of this app: a GGUF file with our ``APP_VERSION_KEY``, or a
    Modelfile that begins with :data:`MODELFILE_HEADER`."""
    try:
        if path.suffix.lower() == ".gguf":
            import gguf

            return APP_VERSION_KEY in gguf.GGUFReader(str(path)).fields
        if path.suffix == ".Modelfile":
            with open(path, encoding="utf-8") as f:
                return f.readline().startswith(MODELFILE_HEADER)
    except (OSError, ValueError, UnicodeDecodeError):  # unreadable, not a GGUF file (gguf raises ValueError)
        return False
    return False


def check_export_target(path: str | os.PathLike, replace: bool = False, base: str | None = None) -> Path:
    """Resolve and check where an export (a .gguf file, a Modelfile, a Hugging Face folder) is to be
    written: never into a checkpoint folder, whose next save would delete it, never over the base file
    ``base`` of the model exported (``base.base_model``: a LoRA checkpoint reads its weights from it), and
    never over a file this app did not write (:func:`written_by_app`: a user's notes, a downloaded model)
    unless ``replace`` (the user was asked and said so: the app's Export tab asks before replacing a file).

    Returns:
        The resolved path.

    Raises:
        CheckpointError: ``path`` is a checkpoint folder or inside one, the model's base file (with ``replace``
            too), or an existing file not written by this app (one line naming it).
    """
    p = Path(os.path.realpath(path))
    if base and p.is_file() and os.path.realpath(base) == str(p):
        raise CheckpointError(f"{path}: is the base model this model was fine-tuned from (its checkpoint reads it); "
                              "export to another file")
    d = enclosing_checkpoint(p)
    if d is not None:
        raise CheckpointError(f"{path}: inside the checkpoint folder {d}, whose next save would delete it; "
                              "export to another folder" if d != p else
                              f"{path}: is a checkpoint folder; export to another folder")
    if p.is_file() and not replace and not written_by_app(p):
        raise CheckpointError(f"{path}: exists and was not written by this app; choose another name or remove it")
    return p


@contextmanager
def export_target(path: str | os.PathLike, replace: bool = False, base: str | None = None,
                  modelfile: bool = False) -> Iterator[Path]:
    """Hold where an export writes while it is checked and written, so two exports never write one target at once
    (one writer per folder: two HF exports racing into one folder could leave an unmarked ``.NAME.bak``) and none
    writes into a folder another process holds (a run, a project the app has open).

    First :func:`check_export_target` of ``path`` (and of its ``<stem>.Modelfile`` with ``modelfile``) and that its
    folder exists, before anything is written (a refused export creates no lock file, no folder); then the lock of
    the resolved path (:class:`core.folder_lock.FolderLock`: ``.NAME.lock`` beside it) and the same checks again
    under it. The caller writes the path yielded: the one checked and locked (links and ``..`` resolved as the OS
    walks them, so ``link/../name`` is the ``name`` beside the folder the link names).

    Yields:
        The resolved path; the lock is given back on leaving.

    Raises:
        CheckpointError: as :func:`check_export_target`; the folder it would go in does not exist; another live
            process holds the target or a folder above it (one line naming the holder and its lock file).
        OSError: the lock file cannot be written.
    """
    p = Path(os.path.realpath(path))
    given = Path(path)

    def check() -> None:
        check_export_target(path, replace, base)
        if modelfile:
            check_export_target(given.with_name(given.stem + ".Modelfile"), replace)
        if not p.name:
            raise CheckpointError(f"{path}: the root folder cannot be an export; choose a folder in it")
        if not p.parent.is_dir():
            raise CheckpointError(f"{given.parent}: folder does not exist")

    check()
    try:
        lock = FolderLock(p, "an export").acquire()
    except FolderBusyError as e:
        raise CheckpointError(str(e)) from None
    try:
        check()  # again: what another process did before the lock was taken
        yield p
    finally:
        lock.release()
