"""Checkpoints: a folder with everything needed to chat with a model or resume its training exactly.

    DIR/config.json      :class:`CheckpointMeta`: format and version, model and training config,
                         stage/step, adam step, tokenizer and dataset hashes, last loss, app version
    DIR/weights.npz      every weight under its GGUF tensor name, float32
    DIR/optimizer.npz    AdamW moments m.<name>, v.<name>
    DIR/tokenizer.json   the `tokenizers` BPE
    DIR/dataset.json     the dataset the model was trained on

A checkpoint is one unit, like an SQLite commit (:func:`core.atomic.replace_folder`): it is written
completely into a temporary sibling folder, fsynced, and swapped in by rename, keeping the previous
checkpoint as ``.DIR.bak`` until the swap is done. A reader sees the old or the new checkpoint, never a
mix; what an interrupted save left is finished or removed by the next save or load.

:class:`CheckpointMeta` is the one reader and writer of ``config.json``: everything else uses its typed
fields. It validates what it reads into a one-line :class:`CheckpointError` naming the file and field.
Format version 1 (written before the atomic swap, without a tokenizer hash) still loads.

Nothing non-finite is saved: :func:`save_checkpoint` refuses NaN or infinite weights or moments.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import stat
import time
import zipfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core import __version__
from core.atomic import atomic_write, backup_path, readable_folder, recover_folder, replace_folder
from core.config import ConfigError, ModelConfig, StageConfig, TrainConfig
from core.dataset import Dataset, DatasetError, dataset_hash, load_dataset, save_dataset
from core.json_text import parse_json
from core.loaded import LoadedModel
from core.tokenizer import Tokenizer

if TYPE_CHECKING:
    from core.device import Device
    from core.trainer import Trainer

FORMAT = "opencl-llm-studio-checkpoint"
FORMAT_VERSION = 2
"""1: files replaced one by one, no tokenizer hash; 2: the folder is swapped as a whole, tokenizer hash."""
STAGE_NAMES = ("pretrain", "tune")

MAX_CONFIG_BYTES = 1 << 20
MAX_TOKENIZER_BYTES = 64 << 20
MAX_ARRAYS_BYTES = 8 << 30
BASE_META_KEYS = ("base_model", "gguf_general", "gguf_context_length", "name")
"""Checkpoint keys of a model fine-tuned from a GGUF file (``Trainer.base_meta``): what the export
writes back (general.* keys, the file's context length, its name)."""
READ_ATTEMPTS = 12
"""Reads of a folder that a save keeps swapping before load_checkpoint gives up (one line: try again)."""


class CheckpointError(ValueError):
    """A checkpoint folder is missing, incomplete, damaged or of another format (one line, naming the
    file and, where it applies, the field)."""


class NonFiniteError(CheckpointError):
    """Weights or optimizer moments contain NaN or infinite values; such a model is never saved."""


def tokenizer_hash(tokenizer: Tokenizer) -> str:
    """sha256 hex digest of the tokenizer's JSON text (ties a tokenizer.json to its weights)."""
    return hashlib.sha256(tokenizer.to_json().encode("utf-8")).hexdigest()


# ------------------------------------------------------------------------------------ config.json
class _FieldError(Exception):
    def __init__(self, name: str, message: str):
        super().__init__(f"field {name!r} {message}")


def _obj(d, name: str) -> dict:
    if not isinstance(d, dict):
        raise _FieldError(name, f"must be an object, got {_kind(d)}")
    return d


def _kind(v) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(v), type(v).__name__)


def _int(d: dict, key: str, prefix: str = "", default=..., minimum: int = 0, maximum: int | None = None) -> int:
    name = prefix + key
    if key not in d:
        if default is ...:
            raise _FieldError(name, "is missing")
        return default
    v = d[key]
    if not isinstance(v, int) or isinstance(v, bool):
        raise _FieldError(name, f"must be an integer, got {_kind(v)}")
    if v < minimum or (maximum is not None and v > maximum):
        raise _FieldError(name, f"must be within {minimum}..{maximum if maximum is not None else ''}, got {v}")
    return v


def _str(d: dict, key: str, default=...) -> str:
    if key not in d:
        if default is ...:
            raise _FieldError(key, "is missing")
        return default
    if not isinstance(d[key], str):
        raise _FieldError(key, f"must be a string, got {_kind(d[key])}")
    return d[key]


def _stage(d: dict, name: str) -> StageConfig:
    _obj(d, name)
    kw = {}
    for f in fields(StageConfig):
        if f.name in d:
            kw[f.name] = d[f.name]
    try:
        st = StageConfig(**kw)
        st.validate(name)
    except ConfigError as e:
        raise _FieldError(e.field if "." in e.field else f"{name}.{e.field}", str(e).split(": ", 1)[-1]) from None
    except TypeError as e:
        raise _FieldError(name, f"is not a stage config ({e})") from None
    return st


# ModelConfig fields every checkpoint has (format version 1); fields added since have defaults that
# describe the older checkpoints (e.g. tie_embeddings = False), so they may be absent.
_V1_MODEL_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "context_length",
                    "rope_theta", "norm_eps")


def _model_config(d) -> ModelConfig:
    _obj(d, "model")
    for f in fields(ModelConfig):
        if f.name not in d and f.name in _V1_MODEL_FIELDS:
            raise _FieldError(f"model.{f.name}", "is missing")
    try:
        return ModelConfig.from_dict(d)
    except ConfigError as e:
        raise _FieldError(f"model.{e.field}", str(e).split(": ", 1)[-1]) from None
    except TypeError as e:
        raise _FieldError("model", f"is not a model config ({e})") from None


def _train_config(d) -> TrainConfig:
    _obj(d, "train")
    for stage in STAGE_NAMES:
        if stage not in d:
            raise _FieldError(f"train.{stage}", "is missing")
    kw = {stage: _stage(d[stage], f"train.{stage}") for stage in STAGE_NAMES}
    flags = {f.name for f in fields(TrainConfig) if isinstance(f.default, bool)}  # e.g. freeze_embeddings
    names = {f.name for f in fields(TrainConfig)} - set(STAGE_NAMES)
    for k in names & d.keys():
        v = d[k]
        if k in flags:
            if not isinstance(v, bool):
                raise _FieldError(f"train.{k}", f"must be true or false, got {_kind(v)}")
        elif not isinstance(v, (int, float)) or isinstance(v, bool):
            raise _FieldError(f"train.{k}", f"must be a number, got {_kind(v)}")
        kw[k] = v
    try:
        return TrainConfig(**kw)
    except ConfigError as e:
        raise _FieldError(e.field if e.field.startswith("train.") else f"train.{e.field}",
                          str(e).split(": ", 1)[-1]) from None


@dataclass(frozen=True)
class CheckpointMeta:
    """What ``config.json`` holds; the one reader (:meth:`read`) and writer (:meth:`to_json`) of it.

    Attributes:
        model: the architecture (vocab_size is the tokenizer's).
        train: the training settings of the run (both stages).
        stage_index: the next stage to run: 0 pretrain, 1 tune, 2 both done.
        stage_step: steps done in that stage.
        adam_step: AdamW updates so far (bias-correction counter).
        tokenizer_hash: sha256 of tokenizer.json's text ("" in version-1 checkpoints).
        dataset_hash: sha256 of the canonical dataset JSON (core.dataset.dataset_hash).
        previous_dataset_hashes: earlier datasets of this run (resumed with ``allow_new_data``).
        last_loss: loss of the last good step in nats/token (NaN before the first one).
        saved: local time of the save, ISO 8601.
        base: for a model fine-tuned from a GGUF file, what its export writes back (keys
            :data:`BASE_META_KEYS`: the base file's path, ``general.*`` keys, context length, name);
            empty for a model trained from scratch.
        app_version: the app that wrote it.
        version: the checkpoint format version (:data:`FORMAT_VERSION` when written by this app).
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

    # ---- derived
    @property
    def done(self) -> bool:
        """Both stages have run all their steps."""
        return self.stage_index >= len(STAGE_NAMES)

    def stage_steps_done(self) -> tuple[int, int]:
        """(pretrain steps done, tune steps done)."""
        pre, tune = self.train.pretrain.steps, self.train.tune.steps
        if self.stage_index == 0:
            return self.stage_step, 0
        if self.stage_index == 1:
            return pre, self.stage_step
        return pre, tune

    def training_summary(self) -> dict:
        """What a GGUF export records of the training (keys without the ``opencl_llm_studio.`` prefix);
        entries without a value (a NaN loss, no date) are left out."""
        pre, tune = self.stage_steps_done()
        values = {
            "training.app_version": self.app_version, "training.date": self.saved or None,
            "training.steps": self.adam_step, "training.pretrain_steps": pre, "training.tune_steps": tune,
            "training.final_loss": self.last_loss if math.isfinite(self.last_loss) else None,
            "training.dataset_sha256": self.dataset_hash or None,
            "training.config": json.dumps(self.train.to_dict(), sort_keys=True),
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
                "saved": self.saved, "base": dict(self.base)}

    def to_json(self) -> str:
        """config.json's text (indented JSON, no NaN literals)."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    # ---- reading
    @classmethod
    def from_dict(cls, d: object, path: str | os.PathLike = "config.json") -> "CheckpointMeta":
        """Validate a parsed config.json.

        Raises:
            CheckpointError: ``"<path>: field 'train.tune' must be an object"`` and the like; another
                format; a newer version.
        """
        try:
            d = _obj(d, "(top level)")
            fmt = d.get("format")
            if fmt != FORMAT:
                raise _FieldError("format", f"is {fmt!r}, expected {FORMAT!r} (not a checkpoint of this app)")
            version = _int(d, "version", minimum=1)
            if version > FORMAT_VERSION:
                raise _FieldError("version", f"is {version}: written by a newer app version (this one reads "
                                  f"up to {FORMAT_VERSION})")
            model = _model_config(d.get("model")) if "model" in d else _missing("model")
            train = _train_config(d.get("train")) if "train" in d else _missing("train")
            stage_index = _int(d, "stage_index", maximum=len(STAGE_NAMES))
            stage_step = _int(d, "stage_step")
            if stage_index == len(STAGE_NAMES) and stage_step:
                raise _FieldError("stage_step", f"must be 0 when both stages are done, got {stage_step}")
            adam_step = _int(d, "adam_step")
            loss = d.get("last_loss")
            if loss is None:
                loss = float("nan")
            elif not isinstance(loss, (int, float)) or isinstance(loss, bool):
                raise _FieldError("last_loss", f"must be a number or null, got {_kind(loss)}")
            prev = d.get("previous_dataset_hashes", [])
            if not isinstance(prev, list) or not all(isinstance(h, str) for h in prev):
                raise _FieldError("previous_dataset_hashes", "must be a list of strings")
            base = d.get("base", {})
            if not isinstance(base, dict):
                raise _FieldError("base", f"must be an object, got {_kind(base)}")
            base = {k: v for k, v in base.items() if k in BASE_META_KEYS}
            return cls(model=model, train=train, stage_index=stage_index, stage_step=stage_step,
                       adam_step=adam_step, tokenizer_hash=_str(d, "tokenizer_hash", ""),
                       dataset_hash=_str(d, "dataset_hash", ""), previous_dataset_hashes=tuple(prev),
                       last_loss=float(loss), saved=_str(d, "saved", ""), base=base, app_version=_str(d, "app_version", ""),
                       version=version)
        except _FieldError as e:
            raise CheckpointError(f"{path}: {e}") from None

    @classmethod
    def from_json(cls, text: str, path: str | os.PathLike = "config.json") -> "CheckpointMeta":
        """Parse and validate config.json's text. Raises CheckpointError (one line)."""
        return cls.from_dict(parse_json(text, path, CheckpointError, "a checkpoint config"), path)

    @classmethod
    def read(cls, folder: str | os.PathLike, dir_fd: int | None = None) -> "CheckpointMeta":
        """Read ``folder/config.json`` (at most 1 MiB); with ``dir_fd`` (an open descriptor of the
        folder, :func:`_pin`) from that folder even if it has been renamed since.

        Raises:
            CheckpointError: no config.json (``not a checkpoint folder``), unreadable or invalid.
        """
        cfg = Path(folder) / "config.json"
        if not _is_file(cfg, dir_fd):
            raise CheckpointError(f"{folder}: not a checkpoint folder (no config.json)")
        return cls.from_json(_read_text(cfg, MAX_CONFIG_BYTES, dir_fd), cfg)


def _missing(name: str):
    raise _FieldError(name, "is missing")


def _pin(folder: Path) -> int | None:
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


def _is_file(path: Path, dir_fd: int | None) -> bool:
    if dir_fd is None:
        return path.is_file()
    try:
        return stat.S_ISREG(os.stat(path.name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _open_binary(path: Path, dir_fd: int | None) -> io.BufferedReader:
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


def _read_bytes(path: Path, limit: int, dir_fd: int | None = None) -> bytes:
    try:
        with _open_binary(path, dir_fd) as fh:
            data = fh.read(limit + 1)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    if len(data) > limit:
        raise CheckpointError(f"{path}: larger than {limit >> 20} MiB; not a file of a checkpoint")
    return data


def _read_text(path: Path, limit: int, dir_fd: int | None = None) -> str:
    try:
        return _read_bytes(path, limit, dir_fd).decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not UTF-8 text (byte {e.start})") from None


# ------------------------------------------------------------------------------------ saving
def _check_finite(what: str, arrays: dict[str, np.ndarray]) -> None:
    for name, a in arrays.items():
        a = np.asarray(a)
        if not np.all(np.isfinite(a)):
            bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            raise NonFiniteError(f"{what} {name!r} has {bad} NaN or infinite values; not saved (the training "
                                 "diverged: lower the learning rate)")


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v, np.float32) for k, v in arrays.items()})
    return buf.getvalue()


def save_checkpoint(directory: str | os.PathLike, weights: dict[str, np.ndarray], optimizer: dict | None,
                    meta: CheckpointMeta, tokenizer: Tokenizer, dataset: Dataset) -> Path:
    """Write a checkpoint folder as one unit (see the module docstring); plain data, no trainer.

    Args:
        directory: the checkpoint folder, created or replaced as a whole.
        weights: ``{gguf tensor name: float32 array}`` matching ``meta.model``.
        optimizer: ``{"m": {name: array}, "v": {name: array}, "step": int}`` or None (a model only:
            it can be chatted with and exported, not resumed).
        meta: the config.json content; its tokenizer and dataset hashes are filled in from
            ``tokenizer`` and ``dataset``, its date now.
        tokenizer, dataset: what the model was trained with.

    Returns:
        The checkpoint folder.

    Raises:
        NonFiniteError: a weight or moment is NaN or infinite (nothing is written).
        CheckpointError: a tensor is missing or has the wrong shape.
        OSError: the disk is full, the folder is not writable... (the previous checkpoint stays).
    """
    d = Path(directory)
    weights = {k: np.asarray(v, np.float32) for k, v in weights.items()}
    shapes = dict(meta.model.param_shapes())
    for name, shape in shapes.items():
        if name not in weights or weights[name].shape != shape:
            raise CheckpointError(f"weights: tensor {name!r} is missing or has the wrong shape (needs {shape})")
    _check_finite("weight", weights)
    files: dict[str, bytes] = {"weights.npz": _npz_bytes(weights)}
    if optimizer is not None:
        arrays = {f"m.{k}": v for k, v in optimizer["m"].items()} | {f"v.{k}": v for k, v in optimizer["v"].items()}
        _check_finite("optimizer moment", arrays)
        files["optimizer.npz"] = _npz_bytes(arrays)
        meta = _replace(meta, adam_step=int(optimizer["step"]))
    tok_json = tokenizer.to_json()
    files["tokenizer.json"] = tok_json.encode("utf-8")
    meta = _replace(meta, tokenizer_hash=hashlib.sha256(files["tokenizer.json"]).hexdigest(),
                    dataset_hash=dataset_hash(dataset), saved=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    app_version=__version__, version=FORMAT_VERSION)
    config_text = meta.to_json()

    def write(tmp: Path) -> None:
        for name, data in files.items():
            atomic_write(tmp / name, data, sync_folder=False)
        save_dataset(dataset, tmp / "dataset.json", sync_folder=False)
        atomic_write(tmp / "config.json", config_text, sync_folder=False)

    return replace_folder(d, write)


def _replace(meta: CheckpointMeta, **kw) -> CheckpointMeta:
    from dataclasses import replace

    return replace(meta, **kw)


def trainer_meta(trainer: Trainer) -> CheckpointMeta:
    """The :class:`CheckpointMeta` of a :class:`core.trainer.Trainer`'s current state."""
    return CheckpointMeta(model=trainer.model_config, train=trainer.train_config, stage_index=trainer.stage_index,
                          stage_step=trainer.stage_step, adam_step=trainer.model.adam_step,
                          dataset_hash=trainer.dataset_hash,
                          previous_dataset_hashes=tuple(getattr(trainer, "previous_dataset_hashes", ())),
                          last_loss=float(trainer.last_loss), base=dict(getattr(trainer, "base_meta", {})))


def save_trainer(trainer: Trainer, directory: str | os.PathLike) -> Path:
    """Convenience: :func:`save_checkpoint` of a Trainer's weights, moments, state, tokenizer and dataset."""
    m = trainer.model
    return save_checkpoint(directory, m.weights(), m.optimizer_state(), trainer_meta(trainer),
                           trainer.tokenizer, trainer.dataset)


# ------------------------------------------------------------------------------------ loading
def _prepare(directory: str | os.PathLike) -> Path:
    """Recover an interrupted save (only when no process, this one included, holds the folder: a holder
    may be saving right now, and recovers by itself before it saves) and return the folder to read."""
    from core.folder_lock import live_holder

    d = Path(directory)
    if live_holder(d, include_self=True) is None:
        recover_folder(d)
    return readable_folder(d)


def _folder_id(d: Path) -> tuple[int, int] | None:
    try:
        st = d.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _moved(d: Path, dir_fd: int | None, before: tuple[int, int] | None) -> bool:
    """Whether the folder read as ``d`` is no longer there under that name (a save swapped it away,
    maybe deleted it): the read is then repeated rather than reported."""
    if dir_fd is not None:
        st = os.fstat(dir_fd)
        return st.st_nlink == 0 or _folder_id(d) != (st.st_dev, st.st_ino)
    return before is not None and _folder_id(d) != before


def load_checkpoint(directory: str | os.PathLike) -> LoadedModel:
    """Read a checkpoint folder's model (not the optimizer).

    Every file comes from one save: the folder is opened once and its files are read through that
    descriptor (``dir_fd``), so a save that swaps the folder meanwhile (another process training into
    it) cannot mix its files in. A read that fails because the folder was swapped away or deleted
    meanwhile is repeated (up to ``READ_ATTEMPTS`` times, waiting a little longer each time). Where
    folders cannot be opened (Windows), a read during which the folder under the name changed is
    repeated instead.

    Raises:
        CheckpointError: not a checkpoint, incomplete, unreadable, damaged, non-finite, or its files do
            not belong together (tokenizer of another model); one line naming the file and field.
    """
    last_error: CheckpointError | None = None
    for attempt in range(READ_ATTEMPTS):
        if attempt:
            time.sleep(min(0.02 * attempt, 0.2))  # let a save in progress finish (a busy machine reads slowly)
        d = _prepare(directory)
        before = _folder_id(d)
        dir_fd = _pin(d) if d.is_dir() else None
        try:
            try:
                loaded = _load_folder(d, Path(directory), dir_fd)
            except CheckpointError as e:
                if _moved(d, dir_fd, before):
                    last_error = e
                    continue
                raise
            if dir_fd is not None or not _moved(d, dir_fd, before):
                return loaded
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
    if last_error is not None and not Path(directory).exists() and backup_path(directory).is_dir():
        raise last_error  # a backup left alone (its writer gone) that cannot be read: say why
    raise CheckpointError(f"{directory}: replaced again and again while being read (a training run saving "
                          "into it?); try again")


def _load_folder(d: Path, directory: Path, dir_fd: int | None = None) -> LoadedModel:
    if d.exists() and not d.is_dir():
        raise CheckpointError(f"{d}: not a checkpoint folder (a file; a .gguf file needs the .gguf extension)"
                              if not _is_gguf(d) else f"{d}: a GGUF file without the .gguf extension; rename "
                              "it to end in .gguf")
    meta = CheckpointMeta.read(d, dir_fd)
    for f in ("weights.npz", "tokenizer.json"):
        if not _is_file(d / f, dir_fd):
            raise CheckpointError(f"{d}: incomplete checkpoint, {f} is missing")
    tok_path = d / "tokenizer.json"
    text = _read_text(tok_path, MAX_TOKENIZER_BYTES, dir_fd)
    if meta.tokenizer_hash and hashlib.sha256(text.encode("utf-8")).hexdigest() != meta.tokenizer_hash:
        raise CheckpointError(f"{tok_path}: does not belong to this checkpoint (its hash differs from "
                              "config.json's tokenizer_hash)")
    try:
        from core.gguf_tokenizer import tokenizer_from_json  # ours, or an imported GGUF file's vocabulary

        tok = tokenizer_from_json(text)
    except Exception as e:  # the tokenizers library raises its own exception types
        raise CheckpointError(f"{tok_path}: unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if tok.vocab_size != meta.model.vocab_size:
        raise CheckpointError(f"{tok_path}: has {tok.vocab_size} tokens, config.json's model.vocab_size is "
                              f"{meta.model.vocab_size} (a tokenizer of another model?)")
    weights = _read_arrays(d / "weights.npz", dir_fd)
    _check_tensors(d / "weights.npz", weights, meta.model)
    _check_loaded_finite(d / "weights.npz", weights)
    return LoadedModel(meta.model, tok, weights, dict(meta.base), directory, meta)


def _is_gguf(p: Path) -> bool:
    try:
        with open(p, "rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


def _check_loaded_finite(path: Path, arrays: dict[str, np.ndarray]) -> None:
    for name, a in arrays.items():
        if not np.all(np.isfinite(a)):
            raise CheckpointError(f"{path}: tensor {name!r} contains NaN or infinite values; the model is broken")


def _read_arrays(path: Path, dir_fd: int | None = None) -> dict[str, np.ndarray]:
    try:
        with _open_binary(path, dir_fd) as fh:
            if os.fstat(fh.fileno()).st_size > MAX_ARRAYS_BYTES:
                raise CheckpointError(f"{path}: larger than {MAX_ARRAYS_BYTES >> 30} GiB")
            with np.load(fh, allow_pickle=False) as z:
                return {k: z[k].astype(np.float32) for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise CheckpointError(f"{path}: unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def _check_tensors(path: Path, arrays: dict[str, np.ndarray], config: ModelConfig) -> None:
    for name, shape in config.param_shapes():
        if name not in arrays:
            raise CheckpointError(f"{path}: tensor {name!r} is missing")
        if arrays[name].shape != shape:
            raise CheckpointError(f"{path}: tensor {name!r} has shape {arrays[name].shape}, the config says {shape}")


def load_model(path: str | os.PathLike) -> LoadedModel:
    """Load a model for chat from a checkpoint folder, a ``.gguf`` file or a Hugging Face folder.

    Raises:
        CheckpointError: unreadable checkpoint; ``core.gguf_io.GGUFError`` for a bad GGUF;
            ``core.hf_io.HFError`` for a bad Hugging Face folder.
        FileNotFoundError: the path does not exist.
    """
    p = Path(path)
    if not p.exists() and not readable_folder(p).exists():
        raise FileNotFoundError(f"{p}: no such file or folder")
    if p.is_file() and (p.suffix.lower() == ".gguf" or _is_gguf(p)):
        from core.gguf_io import import_gguf

        return import_gguf(p)
    from core.hf_io import is_hf_folder, load_hf_model

    if is_hf_folder(p):  # a Hugging Face LlamaForCausalLM folder (core.hf_io)
        return load_hf_model(p)
    return load_checkpoint(p)


def resume_position(meta: CheckpointMeta, train_config: TrainConfig) -> tuple[int, int]:
    """Where a run saved as ``meta`` continues under ``train_config`` (maybe with more steps).

    A finished run (or a finished stage) whose stage gets more steps continues that stage; a finished
    pretrain stage with more pretrain steps continues pretraining if tuning has not begun.

    Returns:
        (stage_index, stage_step).

    Raises:
        CheckpointError: more pretrain steps are asked for after tuning has begun.
    """
    si, ss = meta.stage_index, meta.stage_step
    pre_done, tune_done = meta.stage_steps_done()
    new_pre, new_tune = train_config.pretrain.steps, train_config.tune.steps
    if si >= 1 and new_pre > pre_done and meta.train.pretrain.steps < new_pre:
        if si == 1 and ss == 0:
            return 0, pre_done
        raise CheckpointError(f"--pretrain-steps {new_pre}: the run has already begun tuning after "
                              f"{pre_done} pretrain steps; it can get more tune steps, or start a new run")
    if si == 2 and new_tune > tune_done:
        return 1, tune_done
    return si, ss


def resume_trainer(directory: str | os.PathLike, device: Device, train_config: TrainConfig | None = None,
                   dataset: Dataset | None = None, allow_new_data: bool = False) -> Trainer:
    """Rebuild a :class:`core.trainer.Trainer` from a checkpoint, at the exact step it was saved.

    Args:
        directory: checkpoint folder.
        device: the OpenCL device to continue on.
        train_config: optional new settings (e.g. more steps); defaults to the saved ones. A finished
            stage given more steps continues (:func:`resume_position`).
        dataset: train on this dataset instead of the saved dataset.json; must have the saved hash
            unless ``allow_new_data`` (then the old hash is recorded in ``previous_dataset_hashes``).
        allow_new_data: accept a dataset (given, or a dataset.json edited since the save) whose hash
            differs from config.json's dataset_hash.

    Raises:
        CheckpointError: missing or unreadable optimizer state, dataset or training state; a dataset
            that is not the one the run was trained on (without ``allow_new_data``).
    """
    from core.trainer import Trainer

    loaded = load_checkpoint(directory)
    meta = loaded.checkpoint
    d = readable_folder(directory)
    if not (d / "optimizer.npz").is_file() or not (d / "dataset.json").is_file():
        raise CheckpointError(f"{d}: cannot resume training, optimizer.npz or dataset.json is missing")
    if dataset is None:
        try:
            dataset, problems = load_dataset(d / "dataset.json")
        except (DatasetError, OSError) as e:
            raise CheckpointError(str(e)) from None
        if problems:
            raise CheckpointError(str(problems[0]))
    new_hash = dataset_hash(dataset)
    previous = meta.previous_dataset_hashes
    if meta.dataset_hash and new_hash != meta.dataset_hash:
        if not allow_new_data:
            raise CheckpointError(f"{d / 'dataset.json'}: not the dataset this run was trained on (its hash "
                                  f"{new_hash[:12]} differs from config.json's dataset_hash "
                                  f"{meta.dataset_hash[:12]}); resume with --allow-new-data to continue on it")
        previous = previous + (meta.dataset_hash,)
    tc = train_config or meta.train
    stage_index, stage_step = resume_position(meta, tc)
    arrays = _read_arrays(d / "optimizer.npz")
    moment1 = {k[2:]: a for k, a in arrays.items() if k.startswith("m.")}
    moment2 = {k[2:]: a for k, a in arrays.items() if k.startswith("v.")}
    _check_tensors(d / "optimizer.npz", moment1, loaded.config)
    _check_tensors(d / "optimizer.npz", moment2, loaded.config)
    _check_loaded_finite(d / "optimizer.npz", arrays)
    trainer = Trainer(dataset, loaded.config, tc, device, tokenizer=loaded.tokenizer, weights=loaded.weights)
    trainer.model.load_optimizer_state({"m": moment1, "v": moment2, "step": meta.adam_step})
    trainer.stage_index, trainer.stage_step = stage_index, stage_step
    trainer.last_loss = meta.last_loss
    trainer.previous_dataset_hashes = previous
    trainer.base_meta = dict(meta.base)
    return trainer


__all__ = ["save_checkpoint", "save_trainer", "trainer_meta", "load_checkpoint", "load_model", "resume_trainer",
           "resume_position", "tokenizer_hash", "LoadedModel", "CheckpointMeta", "CheckpointError",
           "NonFiniteError", "Dataset", "FORMAT", "FORMAT_VERSION"]
