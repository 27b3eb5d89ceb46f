"""Checkpoints: a folder with everything needed to chat with a model or resume its training exactly.

    DIR/config.json      format marker, model and training config, stage/step, adam step,
                         dataset hash, last loss, app version  (written last: it marks completeness)
    DIR/weights.npz      every weight under its GGUF tensor name, float32
    DIR/optimizer.npz    AdamW moments m.<name>, v.<name>
    DIR/tokenizer.json   the `tokenizers` BPE
    DIR/dataset.json     the dataset the model was trained on

Every file is written to a temporary name in DIR and renamed, so an interrupted save never leaves
a half-written file under a real name.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core import __version__
from core.config import ModelConfig, TrainConfig
from core.dataset import Dataset, load_dataset, save_dataset
from core.tokenizer import Tokenizer

FORMAT = "opencl-llm-studio-checkpoint"
BASE_META_KEYS = ("base_model", "gguf_general", "gguf_context_length", "name")
"""Checkpoint keys of a model fine-tuned from a GGUF file (``Trainer.base_meta``): what the export
writes back (general.* keys, the file's context length, its name)."""


class CheckpointError(ValueError):
    """A checkpoint folder is missing, incomplete or of another format."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def save_checkpoint(trainer, directory: str | os.PathLike) -> Path:
    """Save a :class:`core.trainer.Trainer`'s full state into ``directory`` (created if needed).

    Returns:
        The checkpoint folder.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    m = trainer.model
    weights = m.weights()
    opt = m.optimizer_state()
    _atomic_write(d / "weights.npz", lambda fh: np.savez(fh, **weights))
    arrays = {f"m.{k}": v for k, v in opt["m"].items()} | {f"v.{k}": v for k, v in opt["v"].items()}
    _atomic_write(d / "optimizer.npz", lambda fh: np.savez(fh, **arrays))
    _atomic_write(d / "tokenizer.json", lambda fh: fh.write(trainer.tokenizer.to_json().encode("utf-8")))
    save_dataset(trainer.dataset, d / "dataset.json")
    meta = {
        "format": FORMAT, "version": 1, "app_version": __version__,
        "model": trainer.model_config.to_dict(), "train": trainer.train_config.to_dict(),
        "stage_index": trainer.stage_index, "stage_step": trainer.stage_step, "adam_step": opt["step"],
        "dataset_hash": trainer.dataset_hash, "last_loss": trainer.last_loss,
        "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **getattr(trainer, "base_meta", {}),  # a fine-tuned GGUF import: its file's keys for the export
    }
    _atomic_write(d / "config.json", lambda fh: fh.write(json.dumps(meta, indent=2).encode("utf-8")))
    return d


@dataclass
class LoadedModel:
    """A model read from disk: config, tokenizer, weights, and whatever metadata came with it."""

    config: ModelConfig
    tokenizer: Tokenizer
    weights: dict[str, np.ndarray]
    meta: dict
    path: Path


def _read_meta(d: Path) -> dict:
    cfg = d / "config.json"
    if not cfg.is_file():
        raise CheckpointError(f"{d}: not a checkpoint folder (no config.json)")
    try:
        meta = json.loads(cfg.read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg}: unreadable ({e})") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{cfg}: format is {meta.get('format')!r}, expected {FORMAT!r}")
    for f in ("weights.npz", "tokenizer.json"):
        if not (d / f).is_file():
            raise CheckpointError(f"{d}: incomplete checkpoint, {f} is missing")
    return meta


def load_checkpoint(directory: str | os.PathLike) -> LoadedModel:
    """Read a checkpoint folder's model (not the optimizer).

    Raises:
        CheckpointError: not a checkpoint, incomplete, unreadable, or its tensors do not match its
            config; the message names the file.
    """
    d = Path(directory)
    meta = _read_meta(d)
    try:
        config = ModelConfig.from_dict(meta["model"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{d / 'config.json'}: bad or missing model config ({e})") from None
    try:
        from core.gguf_tokenizer import tokenizer_from_json  # ours, or an imported GGUF file's vocabulary

        tok = tokenizer_from_json((d / "tokenizer.json").read_text("utf-8"))
    except Exception as e:  # the tokenizers library raises its own exception types
        raise CheckpointError(f"{d / 'tokenizer.json'}: unreadable ({e})") from None
    weights = _read_arrays(d / "weights.npz")
    _check_tensors(d / "weights.npz", weights, config)
    return LoadedModel(config, tok, weights, meta, d)


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k].astype(np.float32) for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"{path}: unreadable ({e})") from None


def _check_tensors(path: Path, arrays: dict[str, np.ndarray], config: ModelConfig) -> None:
    for name, shape in config.param_shapes():
        if name not in arrays:
            raise CheckpointError(f"{path}: tensor {name!r} is missing")
        if arrays[name].shape != shape:
            raise CheckpointError(f"{path}: tensor {name!r} has shape {arrays[name].shape}, the config says {shape}")


def load_model(path: str | os.PathLike) -> LoadedModel:
    """Load a model for chat from a checkpoint folder or a ``.gguf`` file.

    Raises:
        CheckpointError: unreadable checkpoint; ``core.gguf_io.GGUFError`` for a bad GGUF.
        FileNotFoundError: the path does not exist.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or folder")
    if p.is_file() and p.suffix.lower() == ".gguf":
        from core.gguf_io import import_gguf

        return import_gguf(p)
    return load_checkpoint(p)


def resume_trainer(directory: str | os.PathLike, device, train_config: TrainConfig | None = None):
    """Rebuild a :class:`core.trainer.Trainer` from a checkpoint, at the exact step it was saved.

    Args:
        directory: checkpoint folder.
        device: the OpenCL device to continue on.
        train_config: optional new settings (e.g. more steps); defaults to the saved ones.

    Raises:
        CheckpointError: missing or unreadable optimizer state, dataset or training state.
    """
    from core.trainer import Trainer

    d = Path(directory)
    loaded = load_checkpoint(d)
    if not (d / "optimizer.npz").is_file() or not (d / "dataset.json").is_file():
        raise CheckpointError(f"{d}: cannot resume training, optimizer.npz or dataset.json is missing")
    dataset, problems = load_dataset(d / "dataset.json")
    if problems:
        raise CheckpointError(f"{d / 'dataset.json'}: {problems[0]}")
    try:
        tc = train_config or TrainConfig.from_dict(loaded.meta["train"])
        stage_index, stage_step = int(loaded.meta["stage_index"]), int(loaded.meta["stage_step"])
        adam_step = int(loaded.meta["adam_step"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{d / 'config.json'}: cannot resume, training state missing or bad ({e})") from None
    arrays = _read_arrays(d / "optimizer.npz")
    moment1 = {k[2:]: a for k, a in arrays.items() if k.startswith("m.")}
    moment2 = {k[2:]: a for k, a in arrays.items() if k.startswith("v.")}
    _check_tensors(d / "optimizer.npz", moment1, loaded.config)
    _check_tensors(d / "optimizer.npz", moment2, loaded.config)
    trainer = Trainer(dataset, loaded.config, tc, device, tokenizer=loaded.tokenizer, weights=loaded.weights)
    trainer.model.load_optimizer_state({"m": moment1, "v": moment2, "step": adam_step})
    trainer.stage_index, trainer.stage_step = stage_index, stage_step
    trainer.last_loss = float(loaded.meta.get("last_loss", float("nan")))
    trainer.base_meta = {k: v for k, v in loaded.meta.items() if k in BASE_META_KEYS}
    return trainer


__all__ = ["save_checkpoint", "load_checkpoint", "load_model", "resume_trainer", "LoadedModel",
           "CheckpointError", "Dataset"]
