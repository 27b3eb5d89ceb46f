"""Reading GGUF files: any ``llama``-architecture model (ours or from elsewhere) to float32 weights.

- Key/values and tensor infos are parsed with ``struct`` and ``numpy.frombuffer`` (ggml
  ``docs/gguf.md``, versions 2 and 3); tensor data is memory-mapped and dequantized to float32 with
  ``gguf.quants.dequantize`` (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants, ...).
- Hyperparameters: every key llama.cpp's ``llama`` architecture reads (``gguf.Keys`` names). What the
  engine does not compute — another architecture, RoPE scaling, experts, a logit / embedding /
  residual scale, a RoPE dimension or key/value length other than ``head_dim``, per-layer sizes that
  differ — is refused with the key named.
- No ``output.weight`` tensor: the output projection is tied to ``token_embd.weight``
  (``ModelConfig.tie_embeddings``), as llama.cpp does.
- Tokenizer: a file exported by this app keeps our :class:`core.tokenizer.Tokenizer` (and chat format);
  any other gets a :class:`core.gguf_tokenizer.GGUFTokenizer` from its ``tokenizer.ggml.*`` keys.
- Context: a model trained for more than the engine's 8192 tokens is run with 8192 (noted in
  ``meta["notes"]``); the export writes the file's own ``context_length`` back.
"""
from __future__ import annotations

import logging
import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import gguf
import numpy as np
from gguf import Keys

from core.checkpoint_meta import META_PREFIX, TrainingKeys
from core.config import ConfigError, ModelConfig, tensor_name
from core.loaded import LoadedModel
from core.quant_base import KEPT, RawBase

if TYPE_CHECKING:
    from core.gguf_tokenizer import GGUFVocab

log = logging.getLogger(__name__)

ARCH = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA]  # "llama"
TOKENIZER_MODEL = "gpt2"  # the values (not keys) of Keys.Tokenizer.MODEL / PRE that our exports write:
TOKENIZER_PRE = "gpt-2"  # llama.cpp: LLAMA_VOCAB_PRE_TYPE_GPT2, the GPT-2 regex of our ByteLevel pre-tokenizer
# llama.cpp's LLM_KV_ROPE_SCALE_LINEAR, an older spelling of linear RoPE scaling that gguf.Keys lacks
ROPE_SCALE_LINEAR = "{arch}.rope.scale_linear"
MAX_CONTEXT = 8192


class GGUFError(ValueError):
    """A model cannot be exported to GGUF, or a GGUF file cannot be loaded (with the reason)."""


_SCALAR = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
           12: "<f8"}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: ``shape`` in numpy order (rows first), ggml type, absolute offset."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int


def read_gguf(path: str | os.PathLike, tensors: bool = True) -> tuple[dict[str, Any], dict[str, int], list[TensorInfo]]:
    """Parse a GGUF file's header: ``(values, value types, tensor infos)``.

    ``values`` maps each key to a Python value (arrays as lists, bools as bool); ``value types`` to its
    ``GGUFValueType`` number (for an array: 9). Tensor offsets are absolute file offsets.

    Raises:
        GGUFError: missing file, not GGUF, an unsupported version, a truncated header, a key or tensor
        name twice, a ``general.alignment`` that is not a positive power-of-two integer, or a tensor
        offset off that alignment (llama.cpp refuses each).
    """
    p = Path(path)
    if not p.is_file():
        raise GGUFError(f"{p}: no such file")
    with open(p, "rb") as fh:
        try:
            buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:
            raise GGUFError(f"{p}: not a readable GGUF file (empty)") from None
    try:
        if buf[:4] != b"GGUF":
            raise GGUFError(f"{p}: not a readable GGUF file (no GGUF magic)")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise GGUFError(f"{p}: GGUF version {version} is not supported (2 or 3)")
        h = _Header(p, buf)
        values, types, off = h.key_values(24, n_kv)
        align = _alignment(p, values, types)
        infos = h.tensor_infos(off, n_tensors, align) if tensors else []
        return values, types, infos
    except (struct.error, ValueError, IndexError, OverflowError) as e:
        if isinstance(e, GGUFError):
            raise
        raise GGUFError(f"{p}: not a readable GGUF file (truncated or damaged header: {e})") from None
    finally:
        buf.close()


class _Header:
    """The fields of a GGUF header in ``buf`` (little-endian), each read at an offset and returned
    with the offset after it. ``path`` names the file in errors."""

    def __init__(self, path: Path, buf):
        self.path, self.buf = path, buf

    def string(self, o: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", self.buf, o)
        o += 8
        if o + n > len(self.buf):
            raise ValueError("string past the end of the file")
        return self.buf[o:o + n].decode("utf-8", "replace"), o + n

    def value(self, vtype: int, o: int) -> tuple[Any, int]:
        """A value of GGUFValueType ``vtype``: arrays as lists, bools as bool."""
        if vtype == 8:
            return self.string(o)
        if vtype == 9:
            return self.array(o)
        if vtype not in _SCALAR:
            raise GGUFError(f"{self.path}: value type {vtype} is not supported")
        dt = np.dtype(_SCALAR[vtype])
        v = np.frombuffer(self.buf, dt, 1, o)[0].item()
        return (bool(v) if vtype == 7 else v), o + dt.itemsize

    def array(self, o: int) -> tuple[list, int]:
        etype, n = struct.unpack_from("<IQ", self.buf, o)
        o += 12
        if etype == 8:
            out = []
            for _ in range(n):
                s_, o = self.string(o)
                out.append(s_)
            return out, o
        if etype not in _SCALAR:
            raise GGUFError(f"{self.path}: an array of value type {etype} is not supported")
        dt = np.dtype(_SCALAR[etype])
        arr = np.frombuffer(self.buf, dt, n, o)
        return (arr.astype(bool).tolist() if etype == 7 else arr.tolist()), o + n * dt.itemsize

    def key_values(self, off: int, n_kv: int) -> tuple[dict[str, Any], dict[str, int], int]:
        """``n_kv`` key/value pairs from ``off``: (values, value types, offset after them)."""
        values: dict[str, Any] = {}
        types: dict[str, int] = {}
        for _ in range(n_kv):
            key, off = self.string(off)
            if key in values:  # llama.cpp: "duplicate key"
                raise GGUFError(f"{self.path}: key {key} appears twice (a damaged or hand-made file)")
            (vtype,) = struct.unpack_from("<I", self.buf, off)
            values[key], off = self.value(vtype, off + 4)
            types[key] = vtype
        return values, types, off

    def tensor_infos(self, off: int, n_tensors: int, align: int) -> list[TensorInfo]:
        """``n_tensors`` tensor infos from ``off``, offsets made absolute (the data starts at the
        next multiple of ``align``); a name twice, an offset off the alignment or data past the end
        of the file is a GGUFError."""
        buf, p, raw = self.buf, self.path, []
        for _ in range(n_tensors):
            name, off = self.string(off)
            (n_dims,) = struct.unpack_from("<I", buf, off)
            dims = struct.unpack_from(f"<{n_dims}Q", buf, off + 4)
            ttype, toff = struct.unpack_from("<IQ", buf, off + 4 + 8 * n_dims)
            off += 4 + 8 * n_dims + 12
            raw.append((name, tuple(int(d) for d in reversed(dims)), int(ttype), int(toff)))
        seen: set[str] = set()
        for name, _, _, toff in raw:  # llama.cpp refuses both
            if name in seen:
                raise GGUFError(f"{p}: tensor {name} appears twice (a damaged or hand-made file)")
            seen.add(name)
            if toff % align:
                raise GGUFError(f"{p}: tensor {name} starts at offset {toff}, not a multiple of "
                                f"{Keys.General.ALIGNMENT} = {align}")
        start, infos = -(-off // align) * align, []
        for name, shape, ttype, toff in raw:
            try:
                block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ttype)]
            except (ValueError, KeyError):
                block, type_size = 1, 0  # unknown type: refused when the tensor is read
            nbytes = math.prod(shape) // block * type_size
            if start + toff + nbytes > len(buf):
                raise GGUFError(f"{p}: tensor {name} extends past the end of the file (truncated download?)")
            infos.append(TensorInfo(name, shape, ttype, start + toff, nbytes))
        return infos


DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT
_INT_TYPES = {0, 1, 2, 3, 4, 5, 10, 11}  # GGUFValueType's integer scalars


def _alignment(path: Path, values: dict[str, Any], types: dict[str, int]) -> int:
    """``general.alignment``: a positive power-of-two integer scalar, as llama.cpp's gguf.cpp requires.

    Raises:
        GGUFError: another type, zero, negative or not a power of two (the key named).
    """
    key = Keys.General.ALIGNMENT
    if key not in values:
        return DEFAULT_ALIGNMENT
    v = values[key]
    if types[key] not in _INT_TYPES:
        raise GGUFError(f"{path}: {key} must be an integer (it is {_TYPE_NAMES.get(types[key], 'another type')})")
    if v <= 0 or v & (v - 1):
        raise GGUFError(f"{path}: {key} = {v} is not a positive power of 2")
    return int(v)


_TYPE_NAMES = {6: "a float", 7: "a bool", 8: "a string", 9: "an array", 12: "a float"}


def read_fields(path: str | os.PathLike) -> dict[str, Any]:
    """``{key: value}`` of every key/value field of a GGUF file (see :func:`read_gguf`). Raises GGUFError."""
    return read_gguf(path, tensors=False)[0]


def dequantize(path: str | os.PathLike, info: TensorInfo) -> np.ndarray:
    """One tensor as a float32 array of ``info.shape`` (a copy, not a view of the file).

    Raises:
        GGUFError: a tensor type ``gguf.quants`` cannot dequantize (named).
    """
    try:
        qtype = gguf.GGMLQuantizationType(info.ggml_type)
    except ValueError:
        raise GGUFError(f"{path}: tensor {info.name} has the unknown ggml type {info.ggml_type}") from None
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if info.shape[-1] % block:
        raise GGUFError(f"{path}: tensor {info.name} rows of {info.shape[-1]} are not whole {qtype.name} blocks")
    raw = np.memmap(path, np.uint8, "r", info.offset, (info.nbytes,))
    rows = math.prod(info.shape[:-1])
    data = np.asarray(raw).reshape(rows, info.shape[-1] // block * type_size)
    try:
        w = gguf.quants.dequantize(data, qtype)
    except (NotImplementedError, KeyError, ValueError, TypeError) as e:
        raise GGUFError(f"{path}: tensor {info.name} has type {qtype.name}, which cannot be read ({e})") from None
    out = np.array(w, dtype=np.float32).reshape(info.shape)
    del raw
    return out


# ----------------------------------------------------------------------------- hyperparameters
def _keys(arch: str):
    K = gguf.Keys
    f = lambda k: k.format(arch=arch)  # noqa: E731
    return K, f


def model_config(kv: dict[str, Any], source: str, n_tokens: int) -> tuple[ModelConfig, list[str]]:
    """The :class:`ModelConfig` of a ``llama`` GGUF file's keys, and notes (e.g. a shortened context).

    Raises:
        GGUFError: another architecture, a missing required key, or a key whose value the engine
            does not compute (named, with its value).
    """
    K, f = _keys(ARCH)
    _check_architecture(kv, source)
    _refuse_unsupported(kv, source)
    get = _KeyReader(kv, source)
    L, A, R = K.LLM, K.Attention, K.Rope
    n_heads = get(A.HEAD_COUNT, kind=int)
    ctx = get(L.CONTEXT_LENGTH, kind=int)
    notes = []
    if ctx > MAX_CONTEXT:
        notes.append(f"{f(L.CONTEXT_LENGTH)} = {ctx}: the engine runs at most {MAX_CONTEXT} tokens, "
                     f"so the model is used with a context of {MAX_CONTEXT}")
    vocab = get(L.VOCAB_SIZE, n_tokens, kind=int)
    if vocab != n_tokens:
        raise GGUFError(f"{source}: {f(L.VOCAB_SIZE)} = {vocab} differs from the {n_tokens} tokens of "
                        f"{gguf.Keys.Tokenizer.LIST}")
    try:
        config = ModelConfig(
            vocab_size=n_tokens,
            d_model=get(L.EMBEDDING_LENGTH, kind=int),
            n_layers=get(L.BLOCK_COUNT, kind=int),
            n_heads=n_heads,
            n_kv_heads=get(A.HEAD_COUNT_KV, n_heads, kind=int),
            ffn_dim=get(L.FEED_FORWARD_LENGTH, kind=int),
            context_length=min(ctx, MAX_CONTEXT),
            rope_theta=_f32_to_float(get(R.FREQ_BASE, 10000.0)),
            norm_eps=_f32_to_float(get(A.LAYERNORM_RMS_EPS)),
        )
    except ConfigError as e:
        raise GGUFError(f"{source}: unsupported hyperparameters ({e})") from None
    for key in (R.DIMENSION_COUNT, A.KEY_LENGTH, A.VALUE_LENGTH):
        if f(key) in kv and get(key, kind=int) != config.head_dim:
            raise GGUFError(f"{source}: {f(key)} = {kv[f(key)]} differs from head_dim {config.head_dim} "
                            f"({f(L.EMBEDDING_LENGTH)} / {f(A.HEAD_COUNT)}); not supported")
    return config, notes


def _check_architecture(kv: dict[str, Any], source: str) -> None:
    """``general.architecture`` is present and ``llama`` (else a GGUFError naming the key)."""
    key = gguf.Keys.General.ARCHITECTURE
    arch = kv.get(key)
    if arch is None:
        raise GGUFError(f"{source}: required key {key} is missing")
    if arch != ARCH:
        raise GGUFError(f"{source}: architecture {arch!r} is not supported; this app runs '{ARCH}' models only "
                        f"({key})")


def _refuse_unsupported(kv: dict[str, Any], source: str) -> None:
    """What the engine does not compute (RoPE scaling, experts, logit/embedding scales, ...): a
    GGUFError naming the key unless its value is the neutral one (linear RoPE scaling by 1 passes)."""
    K, f = _keys(ARCH)
    L, A, R = K.LLM, K.Attention, K.Rope
    neutral = [(R.SCALING_TYPE, ("none", "")), (R.SCALING_FACTOR, (0.0, 1.0)), (R.SCALING_ATTN_FACTOR, (0.0, 1.0)),
               (ROPE_SCALE_LINEAR, (0.0, 1.0)), (L.EXPERT_COUNT, (0,)), (L.EXPERT_USED_COUNT, (0,)),
               (L.LOGIT_SCALE, (0.0, 1.0)), (L.EMBEDDING_SCALE, (0.0, 1.0)), (L.RESIDUAL_SCALE, (0.0, 1.0)),
               (A.SCALE, (0.0,)), (A.SLIDING_WINDOW, (0,)), (A.CAUSAL, (True,)), (A.CLAMP_KQV, (0.0,)),
               (L.ATTN_LOGIT_SOFTCAPPING, (0.0,)), (L.FINAL_LOGIT_SOFTCAPPING, (0.0,)), (L.POOLING_TYPE, (0,)),
               (A.MAX_ALIBI_BIAS, (0.0,))]
    for key, ok in neutral:
        key = f(key)
        if key in kv and kv[key] not in ok:
            if key == f(R.SCALING_TYPE) and kv[key] == "linear" and kv.get(f(R.SCALING_FACTOR), 1.0) in (0.0, 1.0):
                continue  # linear scaling by 1 changes nothing
            raise GGUFError(f"{source}: {key} = {kv[key]!r} is not supported (the engine computes plain "
                            "llama attention and RoPE)")


class _KeyReader:
    """``get(key, default=..., kind=(int, float))``: the value of the llama key ``key`` (``{arch}``
    filled in) of the type ``kind``; a per-layer array must hold one value. A missing key without
    a default, another type, or layers that differ: a GGUFError naming the key."""

    def __init__(self, kv: dict[str, Any], source: str):
        self.kv, self.source = kv, source

    def __call__(self, key: str, default: Any = ..., kind: type | tuple = (int, float)) -> Any:
        key, source = key.format(arch=ARCH), self.source
        if key not in self.kv:
            if default is ...:
                raise GGUFError(f"{source}: required key {key} is missing")
            return default
        v = self.kv[key]
        if isinstance(v, list) and kind != list:  # llama.cpp allows per-layer arrays; we need one value
            if not v or any(x != v[0] for x in v):
                raise GGUFError(f"{source}: {key} differs between layers ({str(v)[:60]}); not supported")
            v = v[0]
        if not isinstance(v, kind) or (isinstance(v, bool) and kind is not bool):
            raise GGUFError(f"{source}: key {key} has an unsupported value {str(v)[:60]!r}")
        return v


def read_config(path: str | os.PathLike) -> tuple[ModelConfig, list[str], dict[str, Any]]:
    """``(config, notes, key/values)`` of a llama GGUF file from its header only (no tensor data is
    read): for showing a file's architecture before it is loaded. ``tie_embeddings`` is set when the
    file has no ``output.weight``.

    Raises:
        GGUFError: as :func:`model_config` (the file cannot be used; the key is named).
    """
    kv, _types, infos = read_gguf(path)
    config, notes = model_config(kv, str(path), len(kv.get(Keys.Tokenizer.LIST) or []))
    tied = tensor_name(gguf.MODEL_TENSOR.OUTPUT) not in {t.name for t in infos}
    return ModelConfig(**{**config.to_dict(), "tie_embeddings": tied}), notes, kv


def _f32_to_float(v: float) -> float:
    """The shortest decimal that rounds to the same float32 (1e-5 read back as 1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(v)))


def _is_ours(kv: dict[str, Any]) -> bool:
    """A file this app exported: our GPT-2 vocabulary with <|bos|>/<|eos|>/<|pad|> as its BOS/EOS/PAD."""
    from core.chat_format import BOS_TOKEN, EOS_TOKEN

    T = Keys.Tokenizer
    tokens = kv.get(T.LIST) or []
    bos, eos = kv.get(T.BOS_ID), kv.get(T.EOS_ID)
    return (kv.get(T.MODEL) == TOKENIZER_MODEL and kv.get(T.PRE) == TOKENIZER_PRE
            and isinstance(bos, int) and isinstance(eos, int) and 0 <= bos < len(tokens) and 0 <= eos < len(tokens)
            and tokens[bos] == BOS_TOKEN and tokens[eos] == EOS_TOKEN)


def _tokenizer(kv: dict[str, Any], source: str):
    from core.gguf_tokenizer import GGUFTokenizer, GGUFVocab

    if _is_ours(kv):
        from core.tokenizer import Tokenizer

        if not kv.get(Keys.Tokenizer.MERGES):  # a gpt2 BPE without merges would split every word into bytes
            raise GGUFError(f"{source}: key {Keys.Tokenizer.MERGES} is missing; a '{TOKENIZER_MODEL}' BPE vocabulary "
                            "cannot be used without its merges")
        try:
            return Tokenizer.from_vocab(kv[Keys.Tokenizer.LIST], kv.get(Keys.Tokenizer.MERGES) or [])
        except ValueError as e:
            raise GGUFError(f"{source}: its vocabulary cannot be used ({e})") from None
    try:
        return GGUFTokenizer(GGUFVocab.from_fields(kv, source), source)
    except ValueError as e:
        msg = str(e)
        raise GGUFError(msg if msg.startswith(source) else f"{source}: {msg}") from None


# ----------------------------------------------------------------------------- import
def import_gguf(path: str | os.PathLike, tensors: Collection[str] | None = None) -> LoadedModel:
    """Load any ``llama``-architecture GGUF file as float32 weights (with ``tensors``: only those are
    dequantized into ``weights``, e.g. what a checkpoint reads back from its base file; every tensor is
    still checked against the config).

    Returns:
        :class:`core.loaded.LoadedModel`: config (``tie_embeddings`` when the file has no
        ``output.weight``), tokenizer (:class:`core.tokenizer.Tokenizer` for our own exports, else
        :class:`core.gguf_tokenizer.GGUFTokenizer`), float32 weights, and ``meta``: ``format`` "gguf",
        ``name``, ``file_type``, ``tensor_types`` (ggml type per tensor), ``chat_template``,
        ``gguf_studio_keys`` (our ``opencl_llm_studio.*`` keys), ``gguf_general`` (the file's other
        ``general.*`` text keys, written back on export), ``gguf_context_length``, ``notes``, and
        ``dataset_hash`` / ``last_loss`` / ``app_version`` when the file has them.

    Raises:
        GGUFError: not a GGUF file, another architecture, a tokenizer, key, tensor or tensor type the
            engine does not support (named), missing keys or tensors, inconsistent shapes, NaN/inf.
    """
    p = Path(path)
    kv, _types, infos = read_gguf(p)
    source = str(p)
    G = Keys.General
    if G.ARCHITECTURE not in kv:
        raise GGUFError(f"{source}: required key {G.ARCHITECTURE} is missing")
    if kv[G.ARCHITECTURE] != ARCH:  # before the tokenizer: the clearer reason
        model_config(kv, source, 0)
    if kv.get(G.TYPE) == "adapter":  # llama.cpp's LoRA adapter file (ours: core.lora_io), not a model
        raise GGUFError(f"{source}: a LoRA adapter ({G.TYPE} 'adapter'), not a model: llama.cpp loads it with "
                        "--lora on its base model; chat with or export the run folder that wrote it")
    tokens = kv.get(Keys.Tokenizer.LIST)
    if not isinstance(tokens, list) or not tokens:
        raise GGUFError(f"{source}: required key {Keys.Tokenizer.LIST} is missing")
    config, notes = model_config(kv, source, len(tokens))
    tok = _tokenizer(kv, source)

    by_name = {t.name: t for t in infos}
    tied = tensor_name(gguf.MODEL_TENSOR.OUTPUT) not in by_name
    config = ModelConfig(**{**config.to_dict(), "tie_embeddings": tied})
    shapes = dict(config.param_shapes())
    _check_tensors(source, infos, shapes)
    weights, tensor_types = _read_weights(p, by_name, shapes, tensors)
    if tied:
        notes.append(f"no {tensor_name(gguf.MODEL_TENSOR.OUTPUT)}: the output projection is tied to "
                     f"{tensor_name(gguf.MODEL_TENSOR.TOKEN_EMBD)}")
    for n in notes:
        log.info("gguf import: %s", n)
    meta = _import_meta(kv, p, tensor_types, notes)
    return LoadedModel(config, tok, weights, meta, p, quantized=_raw_base(p, by_name, tensor_types))


def _check_tensors(source: str, infos: list[TensorInfo], shapes: dict[str, tuple[int, ...]]) -> None:
    """Every tensor of the file is one of the model's, of its shape, and none is missing (GGUFError)."""
    for t in infos:
        if t.name not in shapes:
            raise GGUFError(f"{source}: tensor {t.name!r} is not part of the llama model this engine computes; "
                            "not supported")
        if t.shape != shapes[t.name]:
            raise GGUFError(f"{source}: tensor {t.name} has shape {t.shape}, expected {shapes[t.name]}")
    names = {t.name for t in infos}
    missing = [n for n in shapes if n not in names]
    if missing:
        raise GGUFError(f"{source}: tensors {missing[:4]} are missing")


def _read_weights(p: Path, by_name: dict[str, TensorInfo], shapes: dict[str, tuple[int, ...]],
                  only: Collection[str] | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """({name: float32 weights} of the tensors in ``only`` (None: all), {name: ggml type name} of all) in
    ``shapes``' order; NaN/inf is a GGUFError."""
    weights: dict[str, np.ndarray] = {}
    tensor_types: dict[str, str] = {}
    for name in shapes:
        info = by_name[name]
        if only is None or name in only:
            w = dequantize(p, info)
            if not np.all(np.isfinite(w)):
                raise GGUFError(f"{p}: tensor {name} contains NaN or infinite values")
            weights[name] = w
        tensor_types[name] = _type_name(info)
    return weights, tensor_types


def _type_name(info: TensorInfo) -> str:
    """The ggml type name of a tensor ("Q8_0"), or its number as text for a type gguf-py does not know."""
    try:
        return gguf.GGMLQuantizationType(info.ggml_type).name
    except ValueError:
        return str(info.ggml_type)


def read_tensor_types(path: str | os.PathLike) -> dict[str, str]:
    """``{tensor name: ggml type name}`` of a GGUF file from its header only (no tensor data is read), as
    :func:`import_gguf`'s ``meta["tensor_types"]`` names them: for the memory a LoRA run's base needs in
    its file's formats before the file is loaded (core.estimates.training_memory_bytes).

    Raises:
        GGUFError: the header cannot be read (the file is named).
    """
    _kv, _types, infos = read_gguf(path)
    return {t.name: _type_name(t) for t in infos}


def _import_meta(kv: dict[str, Any], p: Path, tensor_types: dict[str, str], notes: list[str]) -> dict[str, Any]:
    """``LoadedModel.meta`` of an imported file (see :func:`import_gguf`)."""
    G = Keys.General
    studio = {k: v for k, v in kv.items() if k.startswith(META_PREFIX)}
    own = {G.ARCHITECTURE, G.NAME, G.FILE_TYPE, G.QUANTIZATION_VERSION, G.ALIGNMENT}
    general_prefix = G.NAME.split(".")[0] + "."  # "general."
    general = {k: v for k, v in kv.items() if k.startswith(general_prefix) and k not in own
               and (isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)))}
    meta = {
        "format": "gguf",
        "name": kv.get(G.NAME, p.stem),
        "file_type": kv.get(G.FILE_TYPE),
        "tensor_types": tensor_types,
        "chat_template": kv.get(Keys.Tokenizer.CHAT_TEMPLATE),
        "gguf_studio_keys": studio,
        "gguf_general": general,
        "gguf_context_length": kv.get(Keys.LLM.CONTEXT_LENGTH.format(arch=ARCH)),
        "notes": notes,
    }
    k = TrainingKeys
    for ours, key in (("dataset_hash", k.DATASET_SHA256), ("last_loss", k.FINAL_LOSS), ("app_version", k.APP_VERSION),
                      ("adam_step", k.STEPS), ("saved", k.DATE)):
        if META_PREFIX + key in studio:
            meta[ours] = studio[META_PREFIX + key]
    return meta


def _raw_base(path: Path, by_name: dict[str, TensorInfo], tensor_types: dict[str, str]) -> RawBase:
    """The file's 2-D tensors of a type :mod:`core.kernels.qmatmul` reads, as their stored bytes
    (memory-mapped, read-only; a LoRA model keeps them so on the device: core.quant_base)."""
    raw = {n: np.memmap(path, np.uint8, "r", t.offset, (t.nbytes,)) for n, t in by_name.items()
           if len(t.shape) == 2 and tensor_types.get(n) in {q.name for q in KEPT}}
    return RawBase(dict(tensor_types), raw)


def check_tokenizer(kv: dict[str, Any], source: str) -> None:
    """Refuse, before loading, a file whose tokenizer the engine cannot run; a ``gpt2`` BPE vocabulary
    with the ``gpt-2`` pre-tokenizer (ours) passes.

    Raises:
        UnsupportedTokenizer, ValueError: see :meth:`core.gguf_tokenizer.GGUFVocab.from_fields` (the key named).
    """
    T = Keys.Tokenizer
    if kv.get(T.LIST) and kv.get(T.MODEL) == TOKENIZER_MODEL and kv.get(T.PRE) == TOKENIZER_PRE:
        return
    from core.gguf_tokenizer import GGUFVocab

    GGUFVocab.from_fields(kv, source)


def read_vocab(path: str | os.PathLike) -> GGUFVocab:
    """:class:`core.gguf_tokenizer.GGUFVocab` of a GGUF file (reads only the key/value section's tokenizer keys).

    Raises:
        UnsupportedTokenizer, ValueError: see :meth:`GGUFVocab.from_fields`; OSError if unreadable.
    """
    from core.gguf_tokenizer import GGUFVocab

    return GGUFVocab.from_fields(read_fields(path), str(path))


__all__ = ["ARCH", "META_PREFIX", "TOKENIZER_MODEL", "TOKENIZER_PRE", "GGUFError", "TensorInfo", "read_gguf", "read_fields", "read_vocab", "read_config", "read_tensor_types", "dequantize", "model_config",
           "check_tokenizer",
           "import_gguf"]
