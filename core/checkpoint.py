"""Checkpoints: a folder with everything needed to chat with a model or resume its training exactly.

    DIR/config.json      :class:`CheckpointMeta`: format and version, model and training config,
                         stage/step, adam step, tokenizer and dataset hashes, last loss, app version
    DIR/weights.npz      every weight under its GGUF tensor name, float32 (but those read from a base file)
    DIR/optimizer.npz    AdamW moments m.<name>, v.<name> (of the same tensors)
    DIR/tokenizer.json   the `tokenizers` BPE
    DIR/dataset.json     the dataset the model was trained on
    DIR/.opencl-llm-checkpoint  the marker: this folder is a checkpoint of ours (format version 3)

A save writes only into a new or empty folder or one of our checkpoints, and refuses a folder that holds
any file it does not write (:func:`core.checkpoint_meta.check_output_folder`, which the CLI and the app
also call before training starts). config.json records the sha256 of weights.npz and optimizer.npz, so
files copied in from another run are refused when read; the architecture in config.json must match
the tensors exactly.

A checkpoint is one unit, like an SQLite commit (:func:`core.atomic.replace_folder`): it is written
completely into a temporary sibling folder, fsynced, and swapped in by rename, keeping the previous
checkpoint as ``.DIR.bak`` until the swap is done. A reader sees the old or the new checkpoint, never a
mix; what an interrupted save left is finished or removed by the next save or load.

:class:`core.checkpoint_meta.CheckpointMeta` is the one reader and writer of ``config.json``: everything
else uses its typed fields. It validates what it reads into a one-line :class:`CheckpointError` naming the
file and field.
A fine-tune does not copy what its base file holds: a LoRA checkpoint's weights.npz holds only the
adapters, and a full fine-tune's leaves out the tensors frozen since the base (``--freeze-embeddings``:
``token_embd.weight``, config.json's ``base.from_base``). Both name the base file by path and sha256
(``base.base_model``, ``base.base_sha256``); a load reads the rest from it (:func:`load_base_file`) and
refuses, in one line naming the field, a base file that is missing or has changed.

Format versions 1 (written before the atomic swap, without a tokenizer hash) and 2 (without file hashes
and marker) still load and resume; their next save writes version 3.

Nothing non-finite is saved: :func:`save_checkpoint` refuses NaN or infinite weights or moments.
"""
from __future__ import annotations

import hashlib
import io
import os
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from gguf import MODEL_TENSOR

from core import __version__
from core.atomic import atomic_write, backup_path, readable_folder, recover_folder, replace_folder
from core.checkpoint_meta import (CONFIG_FILE, DATASET_FILE, FORMAT, FORMAT_VERSION, MARKER, OPTIMIZER_FILE,
                                  TOKENIZER_FILE, WEIGHTS_FILE, CheckpointError,
                                  CheckpointMeta, check_export_target, check_output_folder, dataset_path,
                                  is_checkpoint_folder, is_file, open_binary, pin_folder, read_text)
from core.config import ModelConfig, TrainConfig, replace, tensor_name
from core.dataset import Dataset, DatasetError, dataset_hash, load_dataset, save_dataset
from core.loaded import LoadedModel
from core.tokenizer import Tokenizer

if TYPE_CHECKING:
    from core.device import Device
    from core.trainer import Trainer

MAX_TOKENIZER_BYTES = 64 << 20
MAX_ARRAYS_BYTES = 8 << 30
READ_ATTEMPTS = 12
"""Reads of a folder that a save keeps swapping before load_checkpoint gives up (one line: try again)."""


class NonFiniteError(CheckpointError):
    """Weights or optimizer moments contain NaN or infinite values; such a model is never saved."""


def tokenizer_hash(tokenizer: Tokenizer) -> str:
    """sha256 hex digest of the tokenizer's JSON text (ties a tokenizer.json to its weights)."""
    return hashlib.sha256(tokenizer.to_json().encode("utf-8")).hexdigest()


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
        CheckpointError: a tensor is missing, has the wrong shape or is not one of the model's; the
            folder is not ours or holds files a save does not write (:func:`check_output_folder`).
        OSError: the disk is full, the folder is not writable... (the previous checkpoint stays).
    """
    d = check_output_folder(directory)
    weights = {k: np.asarray(v, np.float32) for k, v in weights.items()}
    shapes = dict(tensor_shapes(meta))
    for name, shape in shapes.items():
        if name not in weights or weights[name].shape != shape:
            raise CheckpointError(f"weights: tensor {name!r} is missing or has the wrong shape (needs {shape})")
    extra = sorted(set(weights) - set(shapes))
    if extra:
        raise CheckpointError(f"weights: tensor {extra[0]!r} is not one of the model's tensors (model.n_layers "
                              f"{meta.model.n_layers})")
    _check_finite("weight", weights)
    files: dict[str, bytes] = {WEIGHTS_FILE: _npz_bytes(weights)}
    if optimizer is not None:
        arrays = {f"m.{k}": v for k, v in optimizer["m"].items()} | {f"v.{k}": v for k, v in optimizer["v"].items()}
        _check_finite("optimizer moment", arrays)
        files[OPTIMIZER_FILE] = _npz_bytes(arrays)
        meta = replace(meta, adam_step=int(optimizer["step"]))
    tok_json = tokenizer.to_json()
    files[TOKENIZER_FILE] = tok_json.encode("utf-8")
    files[MARKER] = f"{FORMAT}\n".encode("utf-8")
    sha = {name: hashlib.sha256(files[name]).hexdigest() if name in files else "" for name in (WEIGHTS_FILE, OPTIMIZER_FILE)}
    meta = replace(meta, tokenizer_hash=hashlib.sha256(files[TOKENIZER_FILE]).hexdigest(),
                    weights_sha256=sha[WEIGHTS_FILE], optimizer_sha256=sha[OPTIMIZER_FILE],
                    dataset_hash=dataset_hash(dataset), saved=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    app_version=__version__, version=FORMAT_VERSION)
    config_text = meta.to_json()

    def write(tmp: Path) -> None:
        for name, data in files.items():
            atomic_write(tmp / name, data, sync_folder=False)
        save_dataset(dataset, tmp / DATASET_FILE, sync_folder=False)
        atomic_write(tmp / CONFIG_FILE, config_text, sync_folder=False)

    return replace_folder(d, write)


def tensor_shapes(meta: CheckpointMeta) -> list[tuple[str, tuple[int, ...]]]:
    """The tensors of a checkpoint's weights.npz (and moments): the model's but those read from the base
    file (``meta.from_base``), or a LoRA checkpoint's adapters (``core.lora.adapter_shapes``)."""
    if meta.lora is None:
        return [(n, s) for n, s in meta.model.param_shapes() if n not in meta.from_base]
    from core.lora import adapter_shapes

    return adapter_shapes(meta.model, meta.lora)


def trainer_meta(trainer: Trainer) -> CheckpointMeta:
    """The :class:`CheckpointMeta` of a :class:`core.trainer.Trainer`'s current state. Its ``from_base``
    keeps only the trainer's frozen tensors: one trained since (a run resumed without
    ``freeze_embeddings``) is no longer the base's, is saved, and stays saved by every later save."""
    base = dict(trainer.base_meta)
    if "from_base" in base:
        base["from_base"] = [n for n in base["from_base"] if n in trainer.model.frozen]
        if not base["from_base"] or trainer.model.lora:
            del base["from_base"]
    return CheckpointMeta(model=trainer.model_config, train=trainer.train_config, stage_index=trainer.stage_index,
                          stage_step=trainer.stage_step, adam_step=trainer.model.adam_step,
                          dataset_hash=trainer.dataset_hash,
                          previous_dataset_hashes=tuple(trainer.previous_dataset_hashes),
                          last_loss=float(trainer.last_loss), base=base, stages_run=tuple(trainer.stages_run))


def save_trainer(trainer: Trainer, directory: str | os.PathLike) -> Path:
    """Convenience: :func:`save_checkpoint` of a Trainer's weights, moments, state, tokenizer and dataset
    (of a fine-tune, only what its base file does not hold: LoRA's adapters, a full fine-tune's tensors but
    its ``base_meta["from_base"]``)."""
    m = trainer.model
    meta = trainer_meta(trainer)
    weights = m.adapter_weights() if m.lora else m.weights()  # LoRA: only the adapters (the base is a file)
    state = m.optimizer_state()
    for name in meta.from_base:  # frozen since the base: the base file holds the weight, its moments are zeros
        del weights[name], state["m"][name], state["v"][name]
    return save_checkpoint(directory, weights, state, meta, trainer.tokenizer, trainer.dataset)


def from_base_meta(base_meta: dict, frozen: tuple[str, ...]) -> dict:
    """``base_meta`` of a full fine-tune (``core.finetune.load_base``) with what lets its checkpoints leave
    out its ``frozen`` tensors, which stay the base's: their names (``from_base``) and the base file's
    sha256 (``base_sha256``, checked by every load). Unchanged when nothing is frozen or the base is no
    GGUF file (a checkpoint or Hugging Face folder: every tensor is saved).

    Raises:
        OSError: the base file cannot be read.
    """
    p = Path(base_meta.get("base_model") or "")
    if not frozen or not p.is_file() or not _is_gguf(p):
        return dict(base_meta)
    return dict(base_meta) | {"from_base": list(frozen), "base_sha256": file_sha256(p)}


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


def _moved(d: Path, directory: Path, dir_fd: int | None, before: tuple[int, int] | None) -> bool:
    """Whether the folder read as ``d`` is no longer there under that name (a save swapped it away,
    maybe deleted it), or was the backup ``.NAME.bak`` of a save under way (which deletes it file by
    file right after its swap), or was missing when the read began and is there now (then read by path,
    maybe across two saves): the read is then repeated rather than reported."""
    if d != directory:
        return True
    if dir_fd is not None:
        st = os.fstat(dir_fd)
        return st.st_nlink == 0 or _folder_id(d) != (st.st_dev, st.st_ino)
    return _folder_id(d) != before  # also a folder that was missing when the read began and is there now


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
        dir_fd = pin_folder(d) if d.is_dir() else None
        try:
            try:
                loaded = _load_folder(d, Path(directory), dir_fd)
            except CheckpointError as e:
                if _moved(d, Path(directory), dir_fd, before):
                    last_error = e
                    continue
                raise
            if dir_fd is not None or _folder_id(d) == before:  # without a descriptor: the same folder throughout
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
    for f in (WEIGHTS_FILE, TOKENIZER_FILE):
        if not is_file(d / f, dir_fd):
            raise CheckpointError(f"{d}: incomplete checkpoint, {f} is missing")
    tok_path = d / TOKENIZER_FILE
    text = read_text(tok_path, MAX_TOKENIZER_BYTES, dir_fd)
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
    path = d / WEIGHTS_FILE
    weights, digest = _read_arrays(path, dir_fd, _npz_limit(meta.model, 1))
    if meta.lora is None:
        _check_architecture(d, weights, meta.model)
    _check_tensors(path, weights, meta.model, tensor_shapes(meta))
    _check_hash(path, digest, meta.weights_sha256, "weights_sha256")
    _check_loaded_finite(path, weights)
    if meta.lora is not None or meta.from_base:
        return _with_base(d, meta, tok, weights, directory)
    return LoadedModel(meta.model, tok, weights, dict(meta.base), directory, meta)


def _with_base(d: Path, meta: CheckpointMeta, tok, stored: dict[str, np.ndarray], directory: Path) -> LoadedModel:
    """The model of a checkpoint that keeps part of it in its base file (sha256 checked: config.json's
    ``base.base_sha256``): LoRA's base with the adapters ``stored`` merged in, both kept apart
    (``LoadedModel.base_weights`` / ``.adapter``); a full fine-tune's ``stored`` tensors with its
    ``from_base`` ones read from the file."""
    from core.lora import merge

    base = load_base_file(meta.base["base_model"], meta.base["base_sha256"], d / CONFIG_FILE,
                          None if meta.lora else meta.from_base)
    if replace(base.config, context_length=meta.model.context_length) != meta.model:
        raise CheckpointError(f"{d / 'config.json'}: field 'model' does not describe the base file "
                              f"{meta.base['base_model']} (a checkpoint of another base)")
    if meta.lora is None:
        weights = {n: stored[n] if n in stored else base.weights[n] for n, _ in meta.model.param_shapes()}
        return LoadedModel(meta.model, tok, weights, dict(meta.base), directory, meta)
    merged = merge(base.weights, stored, meta.lora)
    return LoadedModel(meta.model, tok, merged, dict(meta.base), directory, meta, lora=meta.lora, adapter=stored,
                       base_weights=base.weights, quantized=base.quantized)


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 (hex) of a file's bytes (a fine-tune's checkpoint's reference to its base file)."""
    with open(path, "rb") as fh:
        return _file_sha256(fh)


def load_base_file(path: str, sha256: str, config_path: Path, tensors: tuple[str, ...] | None = None) -> LoadedModel:
    """The GGUF base file of a checkpoint (LoRA's, or a full fine-tune's with ``base.from_base``; only
    ``tensors`` dequantized when given), refused (one line naming ``config_path``'s field) when it is
    missing or its sha256 is not the one recorded at training.

    Raises:
        CheckpointError: the file cannot be read or has changed; ``core.gguf_io.GGUFError`` when it is
            no longer a model this engine reads.
    """
    from core.gguf_io import import_gguf

    p = Path(path)
    needs = "the adapters' base" if tensors is None else ", ".join(tensors)
    try:
        digest = file_sha256(p)
    except OSError as e:
        raise CheckpointError(f"{config_path}: field 'base.base_model': the base file {p} cannot be read "
                              f"({e.strerror or e}); the checkpoint reads {needs} from it") from None
    if digest != sha256:
        raise CheckpointError(f"{config_path}: field 'base.base_sha256': the base file {p} has changed since "
                              f"training (its sha256 differs); the checkpoint reads {needs} from it, so put the "
                              "original file back there")
    return import_gguf(p, tensors)


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


def _npz_limit(config: ModelConfig, copies: int) -> int:
    """Most unpacked bytes an .npz of ``copies`` float32 copies of the model's tensors may hold (headers
    and float64 files of other tools allowed for)."""
    return 2 * copies * 4 * config.n_params() + (1 << 20)


def _file_sha256(fh) -> str:
    h = hashlib.sha256()
    for block in iter(lambda: fh.read(1 << 20), b""):
        h.update(block)
    fh.seek(0)
    return h.hexdigest()


def _read_arrays(path: Path, dir_fd: int | None = None, limit: int = MAX_ARRAYS_BYTES) -> tuple[dict[str, np.ndarray], str]:
    """The arrays of an .npz file as float32, and the file's sha256 (hex; :func:`_check_hash` compares
    it with config.json's once the arrays are known to be the model's, so that a damaged file is named
    for its damage). Every way the file can be damaged is one CheckpointError (a file that is no zip
    archive, a member that is no real-valued array, sizes beyond ``MAX_ARRAYS_BYTES`` packed or beyond
    ``limit`` unpacked (a zip bomb), a header claiming more than memory holds)."""
    try:
        with open_binary(path, dir_fd) as fh:
            if os.fstat(fh.fileno()).st_size > MAX_ARRAYS_BYTES:
                raise CheckpointError(f"{path}: larger than {MAX_ARRAYS_BYTES >> 30} GiB")
            digest = _file_sha256(fh)
            if not zipfile.is_zipfile(fh):
                raise CheckpointError(f"{path}: unreadable (not a NumPy .npz archive)")
            fh.seek(0)
            with zipfile.ZipFile(fh) as zf:
                unpacked = sum(info.file_size for info in zf.infolist())
            if unpacked > min(limit, MAX_ARRAYS_BYTES):  # a zip bomb, or another model's file
                raise CheckpointError(f"{path}: unpacks to {unpacked / 2**20:,.1f} MiB, more than the "
                                      f"{min(limit, MAX_ARRAYS_BYTES) / 2**20:,.1f} MiB its model's tensors need")
            fh.seek(0)
            out = {}
            with np.load(fh, allow_pickle=False) as z:
                for k in z.files:
                    a = z[k]
                    if not isinstance(a, np.ndarray):
                        raise CheckpointError(f"{path}: member {k!r} is not a NumPy array")
                    if a.dtype.kind not in "fiu":
                        raise CheckpointError(f"{path}: tensor {k!r} has dtype {a.dtype}, not a real number type")
                    out[k] = a.astype(np.float32)
            return out, digest
    except CheckpointError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError, TypeError, MemoryError) as e:
        raise CheckpointError(f"{path}: unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def _check_hash(path: Path, digest: str, expected: str, field_name: str) -> None:
    """A file of another save (copied in from another run of the same shape) is refused: its sha256 must
    be config.json's ``field_name`` (not checked when that is empty: checkpoints before version 3)."""
    if expected and digest != expected:
        raise CheckpointError(f"{path}: does not belong to this checkpoint (its sha256 differs from config.json's "
                              f"{field_name}; copied from another run?)")


def _check_tensors(path: Path, arrays: dict[str, np.ndarray], config: ModelConfig,
                   shapes: list[tuple[str, tuple[int, ...]]] | None = None) -> None:
    """Exactly the model's tensors (or ``shapes``: a LoRA checkpoint's adapters), in their shapes (an
    extra tensor is refused: never dropped)."""
    shapes = config.param_shapes() if shapes is None else shapes
    for name, shape in shapes:
        if name not in arrays:
            raise CheckpointError(f"{path}: tensor {name!r} is missing")
        if arrays[name].shape != shape:
            raise CheckpointError(f"{path}: tensor {name!r} has shape {arrays[name].shape}, the config says {shape}")
    extra = sorted(set(arrays) - {name for name, _ in shapes})
    if extra:
        raise CheckpointError(f"{path}: tensor {extra[0]!r} is not one of the model's tensors (config.json's model "
                              f"has {config.n_layers} layers); refused rather than dropped")


def _check_architecture(d: Path, weights: dict[str, np.ndarray], config: ModelConfig) -> None:
    """config.json's model must describe weights.npz exactly: the field that differs is named (an edited
    n_layers would otherwise run, and save, a truncated model)."""
    T = MODEL_TENSOR
    layers = {int(k.split(".")[1]) for k in weights if k.startswith("blk.") and k.split(".")[1].isdigit()}
    embd = weights.get(tensor_name(T.TOKEN_EMBD))
    gate = weights.get(tensor_name(T.FFN_GATE, 0))
    k0 = weights.get(tensor_name(T.ATTN_K, 0))
    found = {"n_layers": len(layers) if layers == set(range(len(layers))) else None,
             "tie_embeddings": tensor_name(T.OUTPUT) not in weights,
             "d_model": embd.shape[1] if embd is not None and embd.ndim == 2 else None,
             "vocab_size": embd.shape[0] if embd is not None and embd.ndim == 2 else None,
             "ffn_dim": gate.shape[0] if gate is not None and gate.ndim == 2 else None,
             "n_kv_heads": k0.shape[0] // config.head_dim if k0 is not None and k0.ndim == 2 else None}
    for name, value in found.items():
        if value is not None and value != getattr(config, name):
            raise CheckpointError(f"{d / 'config.json'}: field 'model.{name}' is {getattr(config, name)!r}, but "
                                  f"weights.npz holds a model with {name} {value!r}; refused (the config must "
                                  "match the weights)")


def load_model(path: str | os.PathLike) -> LoadedModel:
    """Load a model for chat from a checkpoint folder, a ``.gguf`` file or a Hugging Face folder.

    Raises:
        CheckpointError: unreadable checkpoint; ``core.gguf_io.GGUFError`` for a bad GGUF;
            ``core.hf_io.HFError`` for a bad Hugging Face folder.
        FileNotFoundError: the path does not exist.
    """
    p = Path(path)
    if not p.exists() and not readable_folder(p).exists():
        from core.checkpoint_meta import not_saved_yet

        raise FileNotFoundError(not_saved_yet(p) or f"{p}: no such file or folder")  # (a first run not saved yet)
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
    new_pre, new_tune = train_config.pretrain.steps, train_config.dialogues.steps
    if si >= 1 and new_pre > pre_done and meta.train.pretrain.steps < new_pre:
        if si == 1 and ss == 0:
            return 0, pre_done
        ran = meta.stage_steps_run()[0]
        raise CheckpointError(f"--pretrain-steps {new_pre}: the run has already begun tuning after "
                              f"{ran} pretrain steps; it can get more tune steps, or start a new run")
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
    if not (d / OPTIMIZER_FILE).is_file() or not dataset_path(d).is_file():
        raise CheckpointError(f"{d}: cannot resume training, {OPTIMIZER_FILE} or {DATASET_FILE} is missing")
    dataset, previous = _resume_dataset(d, meta, dataset, allow_new_data)
    tc = train_config or meta.train
    stage_index, stage_step = resume_position(meta, tc)
    moment1, moment2 = _read_moments(d / OPTIMIZER_FILE, meta, loaded.config)
    base = loaded.base_weights if loaded.lora else loaded.weights
    trainer = Trainer(dataset, loaded.config, tc, device, tokenizer=loaded.tokenizer, weights=base,
                      lora=loaded.lora, adapter=loaded.adapter, quantized=loaded.quantized)
    trainer.model.load_optimizer_state({"m": moment1, "v": moment2, "step": meta.adam_step})
    trainer.stage_index, trainer.stage_step = stage_index, stage_step
    trainer.stages_run = list(meta.stages_run)
    trainer.last_loss = meta.last_loss
    trainer.previous_dataset_hashes = previous
    trainer.base_meta = dict(meta.base)
    return trainer


def _resume_dataset(d: Path, meta: CheckpointMeta, dataset: Dataset | None,
                    allow_new_data: bool) -> tuple[Dataset, tuple[str, ...]]:
    """The dataset a resumed run trains on (``dataset``, else the saved one) and its previous dataset
    hashes; CheckpointError for an unreadable one, or another one without ``allow_new_data``."""
    if dataset is None:
        try:
            dataset, problems = load_dataset(dataset_path(d))
        except (DatasetError, OSError) as e:
            raise CheckpointError(str(e)) from None
        if problems:
            raise CheckpointError(str(problems[0]))
    new_hash = dataset_hash(dataset)
    previous = meta.previous_dataset_hashes
    if meta.dataset_hash and new_hash != meta.dataset_hash:
        if not allow_new_data:
            raise CheckpointError(f"{dataset_path(d)}: not the dataset this run was trained on (its hash "
                                  f"{new_hash[:12]} differs from config.json's dataset_hash "
                                  f"{meta.dataset_hash[:12]}); resume with --allow-new-data to continue on it")
        previous = previous + (meta.dataset_hash,)
    return dataset, previous


def _read_moments(path: Path, meta: CheckpointMeta, config: ModelConfig) -> tuple[dict, dict]:
    """The AdamW moments (m, v) of optimizer.npz, each ``{tensor name: float32 array}``, checked against
    the model's tensors, config.json's optimizer_sha256 and for finiteness (CheckpointError)."""
    if meta.version >= 3 and not meta.optimizer_sha256:
        raise CheckpointError(f"{path}: not written with this checkpoint (config.json has no "
                              "optimizer_sha256: it was saved as a model only)")
    arrays, digest = _read_arrays(path, limit=_npz_limit(config, 2))
    moment1 = {k[2:]: a for k, a in arrays.items() if k.startswith("m.")}
    moment2 = {k[2:]: a for k, a in arrays.items() if k.startswith("v.")}
    other = sorted(k for k in arrays if k[:2] not in ("m.", "v."))
    if other:
        raise CheckpointError(f"{path}: member {other[0]!r} is not an AdamW moment (m.NAME, v.NAME)")
    _check_tensors(path, moment1, config, tensor_shapes(meta))
    _check_tensors(path, moment2, config, tensor_shapes(meta))
    _check_hash(path, digest, meta.optimizer_sha256, "optimizer_sha256")
    _check_loaded_finite(path, arrays)
    for name, shape in config.param_shapes():  # frozen since the base: AdamW never moved them (zeros)
        if name in meta.from_base:
            moment1[name], moment2[name] = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    return moment1, moment2


__all__ = ["check_output_folder", "check_export_target", "is_checkpoint_folder", "MARKER", "save_checkpoint", "save_trainer", "trainer_meta", "load_checkpoint", "load_model", "resume_trainer",
           "from_base_meta", "load_base_file", "file_sha256",
           "resume_position", "tokenizer_hash", "LoadedModel", "CheckpointMeta", "CheckpointError",
           "NonFiniteError", "Dataset", "FORMAT", "FORMAT_VERSION"]
