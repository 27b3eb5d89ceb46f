"""GGUF export (llama.cpp's ``llama`` architecture), through gguf-py's writer and reader. The import
side lives in :mod:`core.gguf_import` (``import_gguf``, ``read_fields`` and ``GGUFError`` are re-exported).

The model already computes llama.cpp's ``llama`` graph with ggml's "normal" RoPE (adjacent pairs), its
tensors carry llama.cpp's GGUF names and linear weights are stored (out, in) row-major, as GGUF
stores them. So export writes the arrays as they are: no Q/K permutation, no transposes.

What goes into the file:

- ``general.*``: architecture ``llama``, name, file type (ALL_F32 = 0, MOSTLY_F16 = 1, MOSTLY_Q4_0 = 2,
  MOSTLY_Q8_0 = 7).
- ``llama.*``: every hyperparameter llama.cpp reads for ``llama`` (context, widths, heads, RoPE base
  and dimension count, RMSNorm epsilon, vocab size).
- ``tokenizer.*``: ``gpt2`` BPE with pre-tokenizer ``gpt-2`` (llama.cpp's name for the GPT-2 regex our
  ``ByteLevel`` pre-tokenizer uses), tokens, token types (specials CONTROL, the rest NORMAL), merges,
  BOS/EOS/PAD ids, ``add_bos_token`` True and ``add_eos_token`` False, and
  :data:`core.chat_format.CHAT_TEMPLATE`. A model imported from another file (its tokenizer a
  :class:`core.gguf_tokenizer.GGUFTokenizer`) gets that file's tokenizer keys, chat template, text
  ``general.*`` keys and ``context_length`` back; tied embeddings are written without ``output.weight``.
- ``opencl_llm_studio.*``: our training facts (steps, final loss, dataset hash, dates, app version).
- Tensors in F32, F16, Q8_0 or Q4_0. 1-D RMSNorm weights stay F32 (as llama.cpp's converter keeps them);
  a matrix whose rows are not a multiple of 32 cannot be Q8_0/Q4_0 and is written F16 instead (or F32 when
  F16 would overflow), and one with weights beyond what the type's F16 block scale represents
  (:data:`QUANT_MAX`) is written F32; :attr:`ExportResult.notes` says which.

Export refuses non-finite weights and inconsistent shapes (:class:`GGUFError`), writes to a temporary
file in the target folder, re-reads it with ``GGUFReader`` and checks every tensor (names, shapes,
types, alignment, bytes, and dequantized values) and every key before it renames the file into place.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from core import __version__, chat_format
from core.atomic import atomic_path, atomic_write, temp_files_of
from core.checkpoint_meta import APP_VERSION_KEY, MODELFILE_HEADER, export_target
from core.config import ModelConfig, tensor_name
from core.gguf_import import (ARCH, META_PREFIX, TOKENIZER_MODEL, TOKENIZER_PRE, GGUFError,  # noqa: F401
                              import_gguf, read_fields)  # the import side, re-exported
from core.loaded import LoadedModel

log = logging.getLogger(__name__)

DTYPES = ("f32", "f16", "q8_0", "q4_0")
Q8_0_BLOCK = 32
F16_MAX = 65504.0


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_gguf` wrote.

    Attributes:
        path: the ``.gguf`` file.
        size_bytes: its size.
        modelfile: the Ollama Modelfile next to it, or None.
        notes: tensors written at another type than asked for, and why (also logged).
    """

    path: Path
    size_bytes: int
    modelfile: Path | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


# ---------------------------------------------------------------------------------------- helpers
QUANT_MAX = {gguf.GGMLQuantizationType.Q8_0: F16_MAX * 127,  # d = amax / 127 is stored as F16
             gguf.GGMLQuantizationType.Q4_0: F16_MAX * 8}  # d = max / -8 (ggml's quantize_row_q4_0)
"""Largest |weight| a block of each quantized type represents: beyond it the F16 scale is infinite."""


def _check_model(loaded: LoadedModel) -> None:
    """Raise GGUFError for anything that would make a broken or inconsistent file."""
    c, tok, w = loaded.config, loaded.tokenizer, loaded.weights
    expected = dict(c.param_shapes())
    missing = [n for n in expected if n not in w]
    if missing:
        raise GGUFError(f"the model lacks the tensors {missing[:4]}{' ...' if len(missing) > 4 else ''}")
    extra = [n for n in w if n not in expected]
    if extra:
        raise GGUFError(f"unexpected tensors {extra[:4]} for this configuration")
    for n, shape in expected.items():
        if tuple(np.shape(w[n])) != shape:
            raise GGUFError(f"tensor {n} has shape {tuple(np.shape(w[n]))}, the configuration needs {shape}")
    rows = expected[tensor_name(gguf.MODEL_TENSOR.TOKEN_EMBD)][0]
    if tok.vocab_size != rows or c.vocab_size != rows:
        raise GGUFError(f"vocabulary size mismatch: the tokenizer has {tok.vocab_size} tokens, the configuration "
                        f"says {c.vocab_size}, the embedding has {rows} rows")
    for n in expected:
        a = np.asarray(w[n])
        if not np.all(np.isfinite(a)):
            bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
            raise GGUFError(f"tensor {n} contains {bad} NaN or infinite values; the model is broken "
                            "(training diverged?) and is not exported")


def _encode_tensor(name: str, w: np.ndarray, dtype: str, notes: list[str]) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """Return (array to write, ggml type). Q8_0 arrays are uint8 blocks in gguf-py's byte shape."""
    T = gguf.GGMLQuantizationType
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim == 1 or dtype == "f32":
        return w, T.F32
    if dtype in ("q8_0", "q4_0"):
        qt = T.Q8_0 if dtype == "q8_0" else T.Q4_0
        amax = float(np.abs(w).max(initial=0.0))
        limit = QUANT_MAX[qt]
        if w.shape[-1] % Q8_0_BLOCK == 0 and amax <= limit:  # Q4_0 has blocks of 32 too
            return gguf.quants.quantize(w, qt), qt
        if w.shape[-1] % Q8_0_BLOCK == 0:  # its fp16 block scale would overflow to infinity
            notes.append(f"{name}: written as F32, not {qt.name} (values up to {amax:.3g} exceed the "
                         f"{limit:.3g} that {qt.name}'s F16 block scale represents)")
            return w, T.F32
        why = f"rows of {w.shape[-1]} values are not a multiple of {Q8_0_BLOCK}"
        if np.abs(w).max(initial=0.0) <= F16_MAX:
            notes.append(f"{name}: written as F16, not {qt.name} ({why})")
            return w.astype(np.float16), T.F16
        notes.append(f"{name}: written as F32, not {qt.name} ({why}, and values exceed the F16 range)")
        return w, T.F32
    # f16
    if np.abs(w).max(initial=0.0) > F16_MAX:
        notes.append(f"{name}: written as F32, not F16 (values exceed the F16 range)")
        return w, T.F32
    return w.astype(np.float16), T.F16


def _meta_value(v: Any) -> tuple[Any, gguf.GGUFValueType]:
    """A Python value as (value, GGUFValueType) for a key of our namespace."""
    T = gguf.GGUFValueType
    if isinstance(v, bool):
        return v, T.BOOL
    if isinstance(v, (int, np.integer)):
        return int(v), T.INT64
    if isinstance(v, (float, np.floating)):
        return float(v), T.FLOAT64
    if isinstance(v, str):
        return v, T.STRING
    return json.dumps(v, sort_keys=True, ensure_ascii=False, default=str), T.STRING


def _training_facts(loaded: LoadedModel, training_meta: dict | None) -> dict[str, Any]:
    """Our namespaced keys (full names) from the model's metadata, plus ``training_meta``."""
    meta = loaded.meta or {}
    facts: dict[str, Any] = {}
    if isinstance(meta.get("gguf_studio_keys"), dict):  # a GGUF read back by import_gguf
        facts.update(meta["gguf_studio_keys"])
    elif getattr(loaded, "checkpoint", None) is not None:  # a checkpoint: its CheckpointMeta
        facts.update({META_PREFIX + k: v for k, v in loaded.checkpoint.training_summary().items()})
    for k, v in (training_meta or {}).items():
        if v is None:
            continue
        key = k if k.startswith(META_PREFIX) else META_PREFIX + k
        facts[key] = v
    facts[APP_VERSION_KEY] = __version__
    facts[META_PREFIX + "export_date"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return facts


def _fields(reader: gguf.GGUFReader) -> dict[str, tuple[Any, int]]:
    """{key: (value, main GGUFValueType)} of every key/value field (not the GGUF.* header pseudo-fields)."""
    return {k: (f.contents(), int(f.types[0])) for k, f in reader.fields.items() if not k.startswith("GGUF.")}


# ---------------------------------------------------------------------------------------- export
def export_gguf(loaded: LoadedModel, out_path: str | os.PathLike, dtype: str = "f32", modelfile: bool = False,
                name: str | None = None, training_meta: dict | None = None, replace: bool = False) -> ExportResult:
    """Write a model as a GGUF file for llama.cpp, Ollama and LM Studio.

    Args:
        loaded: a :class:`core.loaded.LoadedModel` (from a checkpoint or a GGUF).
        out_path: the ``.gguf`` file to write (replaced atomically if it exists).
        dtype: ``"f32"``, ``"f16"``, ``"q8_0"`` or ``"q4_0"`` for the matrices (norm weights stay F32).
        modelfile: also write an Ollama Modelfile ``<stem>.Modelfile`` next to the file.
        name: ``general.name``; default: the GGUF's own name when ``loaded`` came from one, else the
            file name without extension.
        training_meta: extra facts to store, ``{key: value}``; keys get the ``opencl_llm_studio.`` prefix.
        replace: replace an existing file (and Modelfile) even if this app did not write it (the user said so).

    Returns:
        :class:`ExportResult` with the path, size in bytes, Modelfile path and notes.

    Raises:
        GGUFError: unknown dtype, non-finite weights, vocabulary/shape mismatch, a tokenizer without
            merges, or a written file that does not read back identically (nothing is left behind).
        OSError: the folder is not writable, the disk is full (nothing is left behind).
        CheckpointError: the target (or its Modelfile) is inside a checkpoint folder, an existing file this
            app did not write, or held by another live process, e.g. another export to it
            (core.checkpoint_meta.export_target).
    """
    if dtype not in DTYPES:
        raise GGUFError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    out = gguf_path(out_path)
    with export_target(out, replace, (loaded.meta or {}).get("base_model"), modelfile):
        _check_model(loaded)
        foreign, vocab = _vocabulary(loaded.tokenizer)
        notes: list[str] = []
        plan = []  # (name, numpy shape, array written, ggml type, original float32)
        for tname, shape in loaded.config.gguf_tensors():  # llama.cpp's converter order
            w = np.asarray(loaded.weights[tname], np.float32).reshape(shape)
            data, qtype = _encode_tensor(tname, w, dtype, notes)
            plan.append((tname, shape, data, qtype, w))
        for n in notes:
            log.warning("%s", n)
        if name is None:
            name = (loaded.meta or {}).get("name") if (loaded.meta or {}).get("format") == "gguf" else None
        hp = _hyperparameters(loaded, dtype, name or out.stem)
        facts = _training_facts(loaded, training_meta)
        _write_atomically(out, lambda tmp: _write_file(tmp, hp, loaded, foreign, vocab, facts, plan))
        mf = _write_modelfile(out, loaded.config, ours=foreign is None) if modelfile else None
        size = out.stat().st_size
        log.info("gguf: wrote %s (%d bytes, %s)", out, size, dtype)
        return ExportResult(out, size, mf, tuple(notes))


def gguf_path(out_path: str | os.PathLike) -> Path:
    """The file an export to ``out_path`` writes: ``out_path`` with ``.gguf`` appended unless it ends so
    ("model" and "v1.0" -> "model.gguf", "v1.0.gguf"); its Modelfile is ``<that stem>.Modelfile``."""
    out = Path(out_path)
    return out if out.suffix.lower() == ".gguf" else out.with_name(out.name + ".gguf")


def _vocabulary(tok) -> tuple[Any, tuple[list, list, list]]:
    """(the imported file's GGUFVocab or None, (tokens, token types, merges)) of the tokenizer.

    Raises:
        GGUFError: one of our tokenizers without merges (llama.cpp cannot load that vocabulary).
    """
    foreign = getattr(tok, "vocab", None)  # a core.gguf_tokenizer.GGUFTokenizer: the imported file's vocabulary
    tokens, merges = tok.tokens(), tok.merges()
    if not merges and foreign is None:
        raise GGUFError("the tokenizer has no merges (its vocabulary is only bytes); llama.cpp cannot load a "
                        "BPE vocabulary without merges — train on more text or with a larger vocabulary")
    if foreign is not None:
        types = list(foreign.types)
    else:
        specials = set(tok.special_ids())
        types = [gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL for i in range(len(tokens))]
    return foreign, (tokens, types, merges)


def _hyperparameters(loaded: LoadedModel, dtype: str, name: str) -> list[tuple[str, Any, str]]:
    """``[(gguf key, value, GGUFWriter method)]`` of the model's settings, in the writer's order."""
    c = loaded.config
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[dtype]
    K, arch = gguf.Keys, lambda key: key.format(arch=ARCH)
    context_length = int((loaded.meta or {}).get("gguf_context_length") or c.context_length)
    hp = [(K.General.NAME, name, "add_name"), (K.General.FILE_TYPE, int(file_type), "add_file_type"),
          (arch(K.LLM.VOCAB_SIZE), c.vocab_size, "add_vocab_size"),
          (arch(K.LLM.CONTEXT_LENGTH), context_length, "add_context_length"),
          (arch(K.LLM.EMBEDDING_LENGTH), c.d_model, "add_embedding_length"),
          (arch(K.LLM.BLOCK_COUNT), c.n_layers, "add_block_count"),
          (arch(K.LLM.FEED_FORWARD_LENGTH), c.ffn_dim, "add_feed_forward_length"),
          (arch(K.Attention.HEAD_COUNT), c.n_heads, "add_head_count"),
          (arch(K.Attention.HEAD_COUNT_KV), c.n_kv_heads, "add_head_count_kv"),
          (arch(K.Rope.DIMENSION_COUNT), c.head_dim, "add_rope_dimension_count"),
          (arch(K.Rope.FREQ_BASE), float(c.rope_theta), "add_rope_freq_base"),
          (arch(K.Attention.LAYERNORM_RMS_EPS), float(c.norm_eps), "add_layer_norm_rms_eps")]
    if dtype in ("q8_0", "q4_0"):
        hp.append((K.General.QUANTIZATION_VERSION, gguf.GGML_QUANT_VERSION, "add_quantization_version"))
    return hp


def _disk_full(e: OSError) -> bool:
    """numpy's tofile reports a full disk as "4096 requested and 3016 written" (no errno)."""
    return e.errno == errno.ENOSPC or " requested and " in str(e)


def _write_atomically(out: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` into a temporary file renamed to ``out`` when it returns (core.atomic.atomic_path),
    after removing what a killed export of this file left. A full disk or an unwritable folder is
    one OSError naming the file; nothing is left behind."""
    for stale in temp_files_of(out):
        try:
            stale.unlink()
        except OSError:
            pass
    stack = ExitStack()
    try:
        tmp = stack.enter_context(atomic_path(out))
    except OSError as e:
        if _disk_full(e):
            raise OSError(errno.ENOSPC, f"cannot write {out}: the disk is full (nothing was written)") from None
        raise OSError(e.errno, f"cannot write into {out.parent}: {e.strerror}") from None
    try:
        with stack:  # renamed into place when the file reads back as written
            write(tmp)
    except OSError as e:
        if _disk_full(e):
            raise OSError(errno.ENOSPC, f"cannot write {out}: the disk is full (nothing was written)") from None
        raise


def _write_file(tmp: Path, hp: list[tuple[str, Any, str]], loaded: LoadedModel, foreign,
                vocab: tuple[list[str], list, list[str]], facts: dict[str, Any], plan: list) -> None:
    """Write the GGUF file ``tmp`` with gguf-py's writer, in its fixed order (keys and tensors, then
    header, key/values, tensor data), and read it back (:func:`_verify`).

    ``hp``: ``(gguf.Keys name, value, writer method)`` of each hyperparameter; ``foreign``: an imported
    file's ``GGUFVocab`` or None for ours; ``vocab``: our (tokens, token types, merges).
    """
    T = gguf.GGMLQuantizationType
    tok = loaded.tokenizer
    tokens, types, merges = vocab
    writer = gguf.GGUFWriter(tmp, ARCH)
    try:
        for key, value, add in hp:
            log.info("gguf: %s = %r", key, value)
            getattr(writer, add)(value)
        for key, value in ((loaded.meta or {}).get("gguf_general") or {}).items():
            writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY if isinstance(value, list)
                                 else gguf.GGUFValueType.STRING, sub_type=gguf.GGUFValueType.STRING
                                 if isinstance(value, list) else None)
        if foreign is not None:  # the imported file's own tokenizer, written back as it came
            _write_vocab(writer, foreign)
        else:
            log.info("gguf: tokenizer %s/%s, %d tokens, %d merges", TOKENIZER_MODEL, TOKENIZER_PRE, len(tokens),
                     len(merges))
            writer.add_tokenizer_model(TOKENIZER_MODEL)
            writer.add_tokenizer_pre(TOKENIZER_PRE)
            writer.add_token_list(tokens)
            writer.add_token_types(types)
            writer.add_token_merges(merges)
            writer.add_bos_token_id(tok.bos_id)
            writer.add_eos_token_id(tok.eos_id)
            writer.add_pad_token_id(tok.pad_id)
            writer.add_add_bos_token(True)
            writer.add_add_eos_token(False)
            writer.add_chat_template(chat_format.CHAT_TEMPLATE)
        for key, value in facts.items():
            v, vt = _meta_value(value)
            log.info("gguf: %s = %r", key, v)
            writer.add_key_value(key, v, vt)
        for tname, _shape, data, qtype, _w in plan:
            writer.add_tensor(tname, data, raw_dtype=qtype if qtype in (T.Q8_0, T.Q4_0) else None)
        expected_kv = {k: (v.value, int(v.type)) for k, v in writer.kv_data[0].items()}
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    _verify(tmp, plan, expected_kv)


def _write_vocab(writer, v) -> None:
    """Write a :class:`core.gguf_tokenizer.GGUFVocab` (an imported file's tokenizer keys)."""
    log.info("gguf: tokenizer %s/%s, %d tokens, %d merges (from the imported file)", v.model, v.pre,
             len(v.tokens), len(v.merges))
    writer.add_tokenizer_model(v.model)
    if v.pre:
        writer.add_tokenizer_pre(v.pre)
    writer.add_token_list(list(v.tokens))
    writer.add_token_types(list(v.types))
    if v.scores:
        writer.add_token_scores(list(v.scores))
    if v.merges:
        writer.add_token_merges(list(v.merges))
    for value, add in ((v.bos_id, writer.add_bos_token_id), (v.eos_id, writer.add_eos_token_id),
                       (v.unk_id, writer.add_unk_token_id), (v.pad_id, writer.add_pad_token_id)):
        if value is not None:
            add(value)
    writer.add_add_bos_token(v.add_bos)
    writer.add_add_eos_token(v.add_eos)
    writer.add_add_space_prefix(v.add_space_prefix)
    if v.chat_template:
        writer.add_chat_template(v.chat_template)


def _verify(path: Path, plan, expected_kv: dict[str, tuple[Any, int]]) -> None:
    """Re-read ``path`` and compare it with what was meant to be written; raise GGUFError if it differs."""
    T = gguf.GGMLQuantizationType
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:
        raise GGUFError(f"the written file does not read back as GGUF ({e})") from e
    try:
        got_kv = _fields(reader)
        for key, (value, vtype) in expected_kv.items():
            if key not in got_kv:
                raise GGUFError(f"verification failed: key {key} missing in the written file")
            gv, gt = got_kv[key]
            if gt != vtype:
                raise GGUFError(f"verification failed: key {key} has type {gt}, expected {vtype}")
            if vtype == int(gguf.GGUFValueType.FLOAT32):
                same = np.float32(gv) == np.float32(value)
            elif isinstance(value, (list, tuple)):
                same = [x if isinstance(x, str) else float(np.float32(x)) if isinstance(x, float) else int(x)
                        for x in value] == list(gv)
            else:
                same = gv == value
            if not same:
                raise GGUFError(f"verification failed: key {key} reads back as {str(gv)[:80]!r}")
        if len(reader.tensors) != len(plan):
            raise GGUFError(f"verification failed: {len(reader.tensors)} tensors in the file, expected {len(plan)}")
        if reader.data_offset % reader.alignment:
            raise GGUFError("verification failed: tensor data section is not aligned")
        for t, (name, shape, data, qtype, w) in zip(reader.tensors, plan):
            if t.name != name:
                raise GGUFError(f"verification failed: tensor {t.name!r} where {name!r} was expected")
            if tuple(int(x) for x in reversed(t.shape.tolist())) != tuple(shape):
                raise GGUFError(f"verification failed: {name} has shape {tuple(reversed(t.shape.tolist()))}, expected {shape}")
            if t.tensor_type != qtype:
                raise GGUFError(f"verification failed: {name} has type {t.tensor_type.name}, expected {qtype.name}")
            if t.data_offset % reader.alignment:
                raise GGUFError(f"verification failed: {name} is not aligned to {reader.alignment} bytes")
            raw = np.asarray(t.data)
            if raw.tobytes() != np.ascontiguousarray(data).tobytes():
                raise GGUFError(f"verification failed: the bytes of {name} differ from what was written")
            back = gguf.quants.dequantize(raw, qtype).reshape(shape).astype(np.float32)
            if qtype == T.F32:
                ok = np.array_equal(back, w)
            elif qtype == T.F16:
                ok = np.allclose(back, w, rtol=1e-3, atol=1e-7)
            else:  # Q8_0: at most half a step (amax / 127 / 2) per block of 32, plus the fp16 scale;
                # Q4_0 (ggml's quantize_row_q4_0: scale amax / 8, 16 levels): at most one step amax / 8
                amax = np.abs(w.reshape(-1, Q8_0_BLOCK)).max(axis=1, keepdims=True)
                err = np.abs(back.reshape(-1, Q8_0_BLOCK) - w.reshape(-1, Q8_0_BLOCK))
                step = amax / 127.0 * 0.51 if qtype == T.Q8_0 else amax / 8.0 * 1.01
                ok = bool(np.all(err <= step + 1e-3 * amax + 1e-8))
            if not ok:
                diff = np.abs(back.astype(np.float64) - w)
                at = int(np.nanargmax(np.where(np.isfinite(diff), diff, np.inf)))
                raise GGUFError(f"verification failed: {name} ({qtype.name}) does not dequantize to the model's "
                                f"weights: value {at} is {float(w.flat[at]):.6g}, reads back as "
                                f"{float(back.flat[at]):.6g}")
    finally:
        del reader  # release the memory map before the file is renamed


def ollama_name(gguf_path: str | Path) -> str:
    """The model name suggested for ``ollama create NAME`` — by the Modelfile's comment, the CLI and the
    Export tab alike: the file's stem in lower case, accents taken off ("modèle été" -> "modele-ete"), other
    characters than ASCII letters, digits, ``-``, ``_`` and ``.`` replaced by ``-``, beginning with a letter or
    digit, no ``..``, at most 80 characters ("Brindle wick.gguf" -> "brindle-wick"; "mymodel" when fewer than
    2 are left). Ollama's rule for a name's model part: ``isValidPart`` in its ``types/model/name.go``."""
    import re
    import unicodedata

    stem = unicodedata.normalize("NFKD", Path(gguf_path).stem.lower())
    stem = "".join(ch for ch in stem if not unicodedata.combining(ch))
    name = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "-_.") else "-" for ch in stem)
    name = re.sub(r"\.{2,}", ".", name).lstrip("-_.")[:80]
    return name if len(name) >= 2 else "mymodel"


def ollama_create_command(gguf_path: str | Path) -> str:
    """``ollama create NAME -f STEM.Modelfile`` for the Modelfile written next to ``gguf_path`` (shell-quoted)."""
    import shlex

    return f"ollama create {ollama_name(gguf_path)} -f {shlex.quote(Path(gguf_path).stem + '.Modelfile')}"


def _write_modelfile(gguf_path: Path, config: ModelConfig, ours: bool = True) -> Path:
    """Write ``<stem>.Modelfile`` for ``ollama create NAME -f <stem>.Modelfile`` (atomically).

    ``ours=False`` (an imported model with its own chat template): no TEMPLATE or stop lines, Ollama
    reads the template from the GGUF file."""
    template = chat_format.OLLAMA_TEMPLATE
    if '"""' in template:  # pragma: no cover - a constant; guards a future edit
        raise GGUFError("the Ollama template contains triple quotes")
    lines = [
        MODELFILE_HEADER,
        f"# {ollama_create_command(gguf_path)} && ollama run {ollama_name(gguf_path)}",
        f"FROM ./{gguf_path.name}",
        *([f'TEMPLATE """{template}"""'] if ours else []),
        *([f'PARAMETER stop "{s}"' for s in (chat_format.EOS_TOKEN, "User:")] if ours else []),
        "PARAMETER temperature 0",
        "PARAMETER repeat_penalty 1",
        f"PARAMETER num_ctx {config.context_length}",
    ]
    path = gguf_path.with_name(gguf_path.stem + ".Modelfile")
    atomic_write(path, "\n".join(lines) + "\n")
    return path


__all__ = ["GGUFError", "ExportResult", "export_gguf", "gguf_path", "import_gguf", "read_fields", "META_PREFIX"]
