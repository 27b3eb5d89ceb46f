"""GGUF export and import (llama.cpp's ``llama`` architecture), through gguf-py's writer and reader.

The model already computes llama.cpp's ``llama`` graph with ggml's "normal" RoPE (adjacent pairs), its
tensors carry llama.cpp's GGUF names and linear weights are stored (out, in) row-major, as GGUF
stores them. So export writes the arrays as they are: no Q/K permutation, no transposes.

What goes into the file:

- ``general.*``: architecture ``llama``, name, file type (ALL_F32 = 0, MOSTLY_F16 = 1, MOSTLY_Q8_0 = 7).
- ``llama.*``: every hyperparameter llama.cpp reads for ``llama`` (context, widths, heads, RoPE base
  and dimension count, RMSNorm epsilon, vocab size).
- ``tokenizer.*``: ``gpt2`` BPE with pre-tokenizer ``gpt-2`` (llama.cpp's name for the GPT-2 regex our
  ``ByteLevel`` pre-tokenizer uses), tokens, token types (specials CONTROL, the rest NORMAL), merges,
  BOS/EOS/PAD ids, ``add_bos_token`` True and ``add_eos_token`` False, and
  :data:`core.chat_format.CHAT_TEMPLATE`.
- ``opencl_llm_studio.*``: our training facts (steps, final loss, dataset hash, dates, app version).
- Tensors in F32, F16 or Q8_0. 1-D RMSNorm weights stay F32 (as llama.cpp's converter keeps them); a
  matrix whose rows are not a multiple of 32 cannot be Q8_0 and is written F16 instead (or F32 when
  F16 would overflow); :attr:`ExportResult.notes` says which.

Export refuses non-finite weights and inconsistent shapes (:class:`GGUFError`), writes to a temporary
file in the target folder, re-reads it with ``GGUFReader`` and checks every tensor (names, shapes,
types, alignment, bytes, and dequantized values) and every key before it renames the file into place.
"""
from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core import __version__, chat_format
from core.config import ConfigError, ModelConfig

log = logging.getLogger(__name__)

ARCH = "llama"
TOKENIZER_MODEL = "gpt2"
TOKENIZER_PRE = "gpt-2"  # llama.cpp: LLAMA_VOCAB_PRE_TYPE_GPT2, the GPT-2 regex of our ByteLevel pre-tokenizer
META_PREFIX = "opencl_llm_studio."
DATE_KEYS = (META_PREFIX + "export_date", META_PREFIX + "training.date")
"""Keys whose values are dates: they differ between two exports of the same model."""

DTYPES = ("f32", "f16", "q8_0")
Q8_0_BLOCK = 32
F16_MAX = 65504.0


class GGUFError(ValueError):
    """A model cannot be exported to GGUF, or a GGUF file cannot be loaded (with the reason)."""


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
def _gguf():
    try:
        import gguf
    except ImportError as e:  # pragma: no cover - gguf is a hard dependency
        raise GGUFError("the 'gguf' package is not installed (pip install gguf)") from e
    return gguf


def _tensor_order(config: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """Tensors in the order llama.cpp's converter writes them: embedding, blocks, output norm, output."""
    shapes = dict(config.param_shapes())
    names = ["token_embd.weight"]
    for i in range(config.n_layers):
        names += [f"blk.{i}.{s}.weight" for s in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                                  "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")]
    names += ["output_norm.weight"] + ([] if config.tie_embeddings else ["output.weight"])
    assert set(names) == set(shapes), "tensor table out of sync with ModelConfig.param_shapes"
    return [(n, shapes[n]) for n in names]


def _check_model(loaded) -> None:
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
    rows = expected["token_embd.weight"][0]
    if tok.vocab_size != rows or c.vocab_size != rows:
        raise GGUFError(f"vocabulary size mismatch: the tokenizer has {tok.vocab_size} tokens, the configuration "
                        f"says {c.vocab_size}, the embedding has {rows} rows")
    for n in expected:
        a = np.asarray(w[n])
        if not np.all(np.isfinite(a)):
            bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
            raise GGUFError(f"tensor {n} contains {bad} NaN or infinite values; the model is broken "
                            "(training diverged?) and is not exported")


def _encode_tensor(name: str, w: np.ndarray, dtype: str, notes: list[str]):
    """Return (array to write, ggml type). Q8_0 arrays are uint8 blocks in gguf-py's byte shape."""
    gguf = _gguf()
    T = gguf.GGMLQuantizationType
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim == 1 or dtype == "f32":
        return w, T.F32
    if dtype == "q8_0":
        if w.shape[-1] % Q8_0_BLOCK == 0:
            return gguf.quants.quantize(w, T.Q8_0), T.Q8_0
        why = f"rows of {w.shape[-1]} values are not a multiple of {Q8_0_BLOCK}"
        if np.abs(w).max(initial=0.0) <= F16_MAX:
            notes.append(f"{name}: written as F16, not Q8_0 ({why})")
            return w.astype(np.float16), T.F16
        notes.append(f"{name}: written as F32, not Q8_0 ({why}, and values exceed the F16 range)")
        return w, T.F32
    # f16
    if np.abs(w).max(initial=0.0) > F16_MAX:
        notes.append(f"{name}: written as F32, not F16 (values exceed the F16 range)")
        return w, T.F32
    return w.astype(np.float16), T.F16


def _meta_value(v: Any):
    """A Python value as (value, GGUFValueType) for a key of our namespace."""
    T = _gguf().GGUFValueType
    if isinstance(v, bool):
        return v, T.BOOL
    if isinstance(v, (int, np.integer)):
        return int(v), T.INT64
    if isinstance(v, (float, np.floating)):
        return float(v), T.FLOAT64
    if isinstance(v, str):
        return v, T.STRING
    return json.dumps(v, sort_keys=True, ensure_ascii=False, default=str), T.STRING


def _training_facts(loaded, training_meta: dict | None) -> dict[str, Any]:
    """Our namespaced keys (full names) from the model's metadata, plus ``training_meta``."""
    meta = loaded.meta or {}
    facts: dict[str, Any] = {}
    if isinstance(meta.get("gguf_studio_keys"), dict):  # a GGUF read back by import_gguf
        facts.update(meta["gguf_studio_keys"])
    else:  # a checkpoint (core.checkpoint)
        train = meta.get("train") or {}
        si, ss = int(meta.get("stage_index", 0) or 0), int(meta.get("stage_step", 0) or 0)
        pre = (train.get("pretrain") or {}).get("steps", 0)
        tune = (train.get("tune") or {}).get("steps", 0)
        values = {
            "training.app_version": meta.get("app_version"),
            "training.date": meta.get("saved"),
            "training.steps": meta.get("adam_step"),
            "training.pretrain_steps": ss if si == 0 else pre,
            "training.tune_steps": 0 if si == 0 else (ss if si == 1 else tune),
            "training.final_loss": meta.get("last_loss"),
            "training.dataset_sha256": meta.get("dataset_hash"),
            "training.config": json.dumps(train, sort_keys=True) if train else None,
        }
        for k, v in values.items():
            if v is None or (isinstance(v, float) and not math.isfinite(v)):
                continue
            facts[META_PREFIX + k] = v
    for k, v in (training_meta or {}).items():
        if v is None:
            continue
        key = k if k.startswith(META_PREFIX) else META_PREFIX + k
        facts[key] = v
    facts[META_PREFIX + "app_version"] = __version__
    facts[META_PREFIX + "export_date"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return facts


def _field_value(f) -> Any:
    """The Python value of a GGUFReader field (works with old gguf-py versions without ``contents``)."""
    T = _gguf().GGUFValueType
    main = f.types[0]
    if main == T.ARRAY:
        if f.types[-1] == T.STRING:
            return [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]
        return [v for i in f.data for v in f.parts[i].tolist()]
    if main == T.STRING:
        return bytes(f.parts[-1]).decode("utf-8")
    return f.parts[-1].tolist()[0]


def _f32_to_float(v: float) -> float:
    """The shortest decimal that rounds to the same float32 (1e-5 read back as 1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(v)))


def _fields(reader) -> dict[str, tuple[Any, int]]:
    """{key: (value, main GGUFValueType)} of every key/value field (not the GGUF.* header pseudo-fields)."""
    return {k: (_field_value(f), int(f.types[0])) for k, f in reader.fields.items() if not k.startswith("GGUF.")}


_SCALAR = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}


def read_fields(path: str | os.PathLike) -> dict[str, Any]:
    """``{key: value}`` of every key/value field of a GGUF file (arrays as lists, bools as bool).

    Reads only the header and the key/value section, with ``struct`` and ``numpy.frombuffer``: much
    faster than ``GGUFReader`` for vocabularies of 100k+ strings (format: ggml's docs/gguf.md, v2/v3).

    Raises:
        GGUFError: the file is missing, not GGUF, or its key/value section is truncated.
    """
    import struct

    p = Path(path)
    if not p.is_file():
        raise GGUFError(f"{p}: no such file")
    with open(p, "rb") as fh:
        import mmap

        try:
            buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:
            raise GGUFError(f"{p}: not a readable GGUF file (empty)") from None
    try:
        if buf[:4] != b"GGUF":
            raise GGUFError(f"{p}: not a GGUF file (no GGUF magic)")
        version, _n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise GGUFError(f"{p}: GGUF version {version} is not supported (2 or 3)")
        off = 24

        def string(o: int) -> tuple[str, int]:
            (n,) = struct.unpack_from("<Q", buf, o)
            o += 8
            return buf[o:o + n].decode("utf-8", "replace"), o + n

        def value(vtype: int, o: int) -> tuple[Any, int]:
            if vtype == 8:
                return string(o)
            if vtype == 9:
                etype, n = struct.unpack_from("<IQ", buf, o)
                o += 12
                if etype == 8:
                    out = []
                    for _ in range(n):
                        s_, o = string(o)
                        out.append(s_)
                    return out, o
                if etype not in _SCALAR:
                    raise GGUFError(f"{p}: array of type {etype} is not supported")
                dt = np.dtype(_SCALAR[etype])
                arr = np.frombuffer(buf, dt, n, o)
                vals = arr.astype(bool).tolist() if etype == 7 else arr.tolist()
                return vals, o + n * dt.itemsize
            if vtype not in _SCALAR:
                raise GGUFError(f"{p}: value type {vtype} is not supported")
            dt = np.dtype(_SCALAR[vtype])
            v = np.frombuffer(buf, dt, 1, o)[0].item()
            return (bool(v) if vtype == 7 else v), o + dt.itemsize

        out: dict[str, Any] = {}
        for _ in range(n_kv):
            key, off = string(off)
            (vtype,) = struct.unpack_from("<I", buf, off)
            out[key], off = value(vtype, off + 4)
        return out
    except (struct.error, ValueError, IndexError) as e:
        raise GGUFError(f"{p}: truncated or damaged GGUF key/value section ({e})") from None
    finally:
        buf.close()


# ---------------------------------------------------------------------------------------- export
def export_gguf(loaded, out_path: str | os.PathLike, dtype: str = "f32", modelfile: bool = False,
                name: str | None = None, training_meta: dict | None = None) -> ExportResult:
    """Write a model as a GGUF file for llama.cpp, Ollama and LM Studio.

    Args:
        loaded: a :class:`core.checkpoint.LoadedModel` (from a checkpoint or a GGUF).
        out_path: the ``.gguf`` file to write (replaced atomically if it exists).
        dtype: ``"f32"``, ``"f16"`` or ``"q8_0"`` for the matrices (norm weights stay F32).
        modelfile: also write an Ollama Modelfile ``<stem>.Modelfile`` next to the file.
        name: ``general.name``; default: the GGUF's own name when ``loaded`` came from one, else the
            file name without extension.
        training_meta: extra facts to store, ``{key: value}``; keys get the ``opencl_llm_studio.`` prefix.

    Returns:
        :class:`ExportResult` with the path, size in bytes, Modelfile path and notes.

    Raises:
        GGUFError: unknown dtype, non-finite weights, vocabulary/shape mismatch, a tokenizer without
            merges, or a written file that does not read back identically (nothing is left behind).
        OSError: the folder is not writable, the disk is full (nothing is left behind).
    """
    gguf = _gguf()
    T = gguf.GGMLQuantizationType
    if dtype not in DTYPES:
        raise GGUFError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    out = Path(out_path)
    if out.suffix.lower() != ".gguf":
        out = out.with_name(out.name + ".gguf")
    if not out.parent.is_dir():
        raise GGUFError(f"{out.parent}: folder does not exist")
    _check_model(loaded)
    c, tok = loaded.config, loaded.tokenizer

    tokens, merges = tok.tokens(), tok.merges()
    if not merges:
        raise GGUFError("the tokenizer has no merges (its vocabulary is only bytes); llama.cpp cannot load a "
                        "BPE vocabulary without merges — train on more text or with a larger vocabulary")
    specials = set(tok.special_ids())
    types = [gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL for i in range(len(tokens))]

    notes: list[str] = []
    plan = []  # (name, numpy shape, array written, ggml type, original float32)
    for tname, shape in _tensor_order(c):
        w = np.asarray(loaded.weights[tname], np.float32).reshape(shape)
        data, qtype = _encode_tensor(tname, w, dtype, notes)
        plan.append((tname, shape, data, qtype, w))
    for n in notes:
        log.warning("%s", n)

    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[dtype]
    if name is None:
        name = (loaded.meta or {}).get("name") if (loaded.meta or {}).get("format") == "gguf" else None
    name = name or out.stem
    facts = _training_facts(loaded, training_meta)

    try:
        fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    except OSError as e:
        raise OSError(e.errno, f"cannot write into {out.parent}: {e.strerror}") from None
    os.close(fd)
    tmp = Path(tmp_name)
    writer = None
    try:
        writer = gguf.GGUFWriter(tmp, ARCH)
        # Steps in gguf-py's fixed order: keys and tensors, then header, key/values, tensor data.
        hp = [("general.name", name, writer.add_name),
              ("general.file_type", int(file_type), writer.add_file_type),
              (f"{ARCH}.vocab_size", c.vocab_size, writer.add_vocab_size),
              (f"{ARCH}.context_length", c.context_length, writer.add_context_length),
              (f"{ARCH}.embedding_length", c.d_model, writer.add_embedding_length),
              (f"{ARCH}.block_count", c.n_layers, writer.add_block_count),
              (f"{ARCH}.feed_forward_length", c.ffn_dim, writer.add_feed_forward_length),
              (f"{ARCH}.attention.head_count", c.n_heads, writer.add_head_count),
              (f"{ARCH}.attention.head_count_kv", c.n_kv_heads, writer.add_head_count_kv),
              (f"{ARCH}.rope.dimension_count", c.head_dim, writer.add_rope_dimension_count),
              (f"{ARCH}.rope.freq_base", float(c.rope_theta), writer.add_rope_freq_base),
              (f"{ARCH}.attention.layer_norm_rms_epsilon", float(c.norm_eps), writer.add_layer_norm_rms_eps)]
        if dtype == "q8_0":
            hp.append(("general.quantization_version", gguf.GGML_QUANT_VERSION, writer.add_quantization_version))
        for key, value, add in hp:
            log.info("gguf: %s = %r", key, value)
            add(value)
        log.info("gguf: tokenizer %s/%s, %d tokens, %d merges", TOKENIZER_MODEL, TOKENIZER_PRE, len(tokens), len(merges))
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
            writer.add_tensor(tname, data, raw_dtype=qtype if qtype == T.Q8_0 else None)
        expected_kv = {k: (v.value, int(v.type)) for k, v in writer.kv_data[0].items()}
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        writer = None
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        _verify(tmp, plan, expected_kv)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a model file should be readable as usual
        os.replace(tmp, out)
    except BaseException:
        if writer is not None:
            writer.close()
        try:
            tmp.unlink()
        except OSError:
            pass
        raise

    mf = _write_modelfile(out, c) if modelfile else None
    size = out.stat().st_size
    log.info("gguf: wrote %s (%d bytes, %s)", out, size, dtype)
    return ExportResult(out, size, mf, tuple(notes))


def _verify(path: Path, plan, expected_kv: dict[str, tuple[Any, int]]) -> None:
    """Re-read ``path`` and compare it with what was meant to be written; raise GGUFError if it differs."""
    gguf = _gguf()
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
                same = [int(x) if not isinstance(x, str) else x for x in value] == list(gv)
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
            else:  # Q8_0: error at most half a step (amax / 127 / 2) per block of 32, plus the fp16 scale
                amax = np.abs(w.reshape(-1, Q8_0_BLOCK)).max(axis=1, keepdims=True)
                err = np.abs(back.reshape(-1, Q8_0_BLOCK) - w.reshape(-1, Q8_0_BLOCK))
                ok = bool(np.all(err <= amax / 127.0 * 0.51 + 1e-3 * amax + 1e-8))
            if not ok:
                raise GGUFError(f"verification failed: {name} does not dequantize to the model's weights")
    finally:
        del reader  # release the memory map before the file is renamed


def _write_modelfile(gguf_path: Path, config: ModelConfig) -> Path:
    """Write ``<stem>.Modelfile`` for ``ollama create NAME -f <stem>.Modelfile`` (atomically)."""
    from core.dataset import atomic_write_text

    template = chat_format.OLLAMA_TEMPLATE
    if '"""' in template:  # pragma: no cover - a constant; guards a future edit
        raise GGUFError("the Ollama template contains triple quotes")
    lines = [
        "# Ollama Modelfile written by OpenCL LLM Studio",
        f"# ollama create my-model -f {gguf_path.stem}.Modelfile && ollama run my-model",
        f"FROM ./{gguf_path.name}",
        f'TEMPLATE """{template}"""',
        *[f'PARAMETER stop "{s}"' for s in (chat_format.EOS_TOKEN, "User:")],
        "PARAMETER temperature 0",
        "PARAMETER repeat_penalty 1",
        f"PARAMETER num_ctx {config.context_length}",
    ]
    path = gguf_path.with_name(gguf_path.stem + ".Modelfile")
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------------------------- import
def import_gguf(path: str | os.PathLike):
    """Load a GGUF file written by this app (``llama`` architecture, ``gpt2``/``gpt-2`` BPE vocabulary).

    Returns:
        :class:`core.checkpoint.LoadedModel` with float32 weights (dequantized from F16/Q8_0) and
        ``meta``: ``format`` "gguf", ``name``, ``file_type``, ``tensor_types``, ``chat_template``,
        ``gguf_studio_keys`` (our ``opencl_llm_studio.*`` keys), and ``dataset_hash`` / ``last_loss`` /
        ``app_version`` when the file has them.

    Raises:
        GGUFError: not a GGUF file, another architecture, a tokenizer or tensor type we do not
            support, missing keys or tensors, inconsistent shapes.
    """
    gguf = _gguf()
    from core.checkpoint import LoadedModel
    from core.tokenizer import Tokenizer

    p = Path(path)
    if not p.is_file():
        raise GGUFError(f"{p}: no such file")
    try:
        reader = gguf.GGUFReader(p)
        kv = _fields(reader)
    except Exception as e:
        raise GGUFError(f"{p}: not a readable GGUF file ({e})") from None

    def get(key: str, default: Any = ..., kind: type | tuple = (int, float)) -> Any:
        if key not in kv:
            if default is ...:
                raise GGUFError(f"{p}: required key {key} is missing")
            return default
        v = kv[key][0]
        if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
            raise GGUFError(f"{p}: key {key} has an unsupported value {str(v)[:60]!r}")
        return v

    arch = get("general.architecture", kind=str)
    if arch != ARCH:
        raise GGUFError(f"{p}: architecture {arch!r} is not supported; this app runs only '{ARCH}' models "
                        "(GGUF files it exported itself)")
    tok_model = get("tokenizer.ggml.model", kind=str)
    tok_pre = get("tokenizer.ggml.pre", "", kind=str)
    # Another pre-tokenizer (or none, which llama.cpp treats as "default") splits text differently.
    if tok_model != TOKENIZER_MODEL or tok_pre != TOKENIZER_PRE:
        raise GGUFError(f"{p}: tokenizer {tok_model!r}/{tok_pre!r} is not supported; this app reads only "
                        f"byte-level BPE with the GPT-2 pre-tokenizer ('{TOKENIZER_MODEL}'/'{TOKENIZER_PRE}')")
    for key in (f"{ARCH}.rope.scaling.type",):
        if key in kv and kv[key][0] not in ("none", ""):
            raise GGUFError(f"{p}: {key} = {kv[key][0]!r} is not supported")
    n_heads = get(f"{ARCH}.attention.head_count", kind=int)
    try:
        config = ModelConfig(
            vocab_size=len(get("tokenizer.ggml.tokens", kind=list)),
            d_model=get(f"{ARCH}.embedding_length", kind=int),
            n_layers=get(f"{ARCH}.block_count", kind=int),
            n_heads=n_heads,
            n_kv_heads=get(f"{ARCH}.attention.head_count_kv", n_heads, kind=int),
            ffn_dim=get(f"{ARCH}.feed_forward_length", kind=int),
            context_length=get(f"{ARCH}.context_length", kind=int),
            rope_theta=_f32_to_float(get(f"{ARCH}.rope.freq_base", 10000.0)),
            norm_eps=_f32_to_float(get(f"{ARCH}.attention.layer_norm_rms_epsilon")),
        )
    except ConfigError as e:
        raise GGUFError(f"{p}: unsupported hyperparameters ({e})") from None
    for key in (f"{ARCH}.rope.dimension_count", f"{ARCH}.attention.key_length", f"{ARCH}.attention.value_length"):
        if key in kv and get(key, kind=int) != config.head_dim:
            raise GGUFError(f"{p}: {key} = {kv[key][0]} differs from head_dim {config.head_dim}; not supported")

    tokens = get("tokenizer.ggml.tokens", kind=list)
    merges = get("tokenizer.ggml.merges", [], kind=list)
    try:
        tok = Tokenizer.from_vocab(tokens, merges)
    except ValueError as e:
        raise GGUFError(f"{p}: its vocabulary cannot be used ({e}); only GGUF files exported by OpenCL LLM "
                        f"Studio (with {', '.join(chat_format.SPECIAL_TOKENS)}) can be loaded") from None
    for key, ours in (("tokenizer.ggml.bos_token_id", tok.bos_id), ("tokenizer.ggml.eos_token_id", tok.eos_id)):
        if key in kv and get(key, kind=int) != ours:
            raise GGUFError(f"{p}: {key} = {kv[key][0]} is not the id of the app's special token ({ours})")

    shapes = dict(config.param_shapes())
    weights: dict[str, np.ndarray] = {}
    tensor_types: dict[str, str] = {}
    for t in reader.tensors:
        if t.name not in shapes:
            raise GGUFError(f"{p}: tensor {t.name!r} is not part of this app's llama model; not supported")
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        if shape != shapes[t.name]:
            raise GGUFError(f"{p}: tensor {t.name} has shape {shape}, expected {shapes[t.name]}")
        try:
            w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        except (NotImplementedError, KeyError, ValueError) as e:
            raise GGUFError(f"{p}: tensor {t.name} has type {t.tensor_type.name}, which cannot be read ({e})") from None
        weights[t.name] = np.array(w, dtype=np.float32).reshape(shape)  # a copy, detached from the memory map
        tensor_types[t.name] = t.tensor_type.name
    if "output.weight" not in weights and "token_embd.weight" in weights:
        weights["output.weight"] = weights["token_embd.weight"].copy()  # tied embeddings, as llama.cpp does
        tensor_types["output.weight"] = "tied to token_embd.weight"
    missing = [n for n in shapes if n not in weights]
    if missing:
        raise GGUFError(f"{p}: tensors {missing[:4]} are missing")
    for n, w in weights.items():
        if not np.all(np.isfinite(w)):
            raise GGUFError(f"{p}: tensor {n} contains NaN or infinite values")
    del reader

    studio = {k: v for k, (v, _t) in kv.items() if k.startswith(META_PREFIX)}
    meta = {
        "format": "gguf",
        "name": kv.get("general.name", (p.stem, 0))[0],
        "file_type": kv.get("general.file_type", (None, 0))[0],
        "tensor_types": tensor_types,
        "chat_template": kv.get("tokenizer.chat_template", (None, 0))[0],
        "gguf_studio_keys": studio,
    }
    for ours, key in (("dataset_hash", "training.dataset_sha256"), ("last_loss", "training.final_loss"),
                      ("app_version", "training.app_version"), ("adam_step", "training.steps"),
                      ("saved", "training.date")):
        if META_PREFIX + key in studio:
            meta[ours] = studio[META_PREFIX + key]
    return LoadedModel(config, tok, weights, meta, p)


__all__ = ["GGUFError", "ExportResult", "export_gguf", "import_gguf", "META_PREFIX", "DATE_KEYS"]
