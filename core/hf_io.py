"""Hugging Face ``transformers`` checkpoints in and out (``LlamaForCausalLM`` folders), without torch.

A folder written by :func:`export_hf` loads with ``AutoModelForCausalLM.from_pretrained(FOLDER)`` and
``AutoTokenizer.from_pretrained(FOLDER)``, so ``accelerate``, ``torchrun``/FSDP, DeepSpeed and the
fine-tuning tools can continue training it (docs/scale-out.md); :func:`load_hf` reads such a folder
back, also after ``save_pretrained``, into our in-memory form.

    FOLDER/config.json              LlamaConfig: widths, heads, rope_theta, rms_norm_eps, tie_word_embeddings
    FOLDER/model.safetensors        float32 weights under HF names (safetensors numpy API)
    FOLDER/tokenizer.json           the model's `tokenizers` BPE (core/hf_tokenizer.py): ours, with a post-processor
                                    that prepends <|bos|>, or an imported GGUF file's vocabulary as llama.cpp
                                    tokenizes it (its special tokens, BOS/EOS as its add_bos_token/add_eos_token)
    FOLDER/tokenizer_config.json    special tokens and the chat template (core.chat_format.CHAT_TEMPLATE, or the
                                    GGUF file's tokenizer.chat_template)
    FOLDER/special_tokens_map.json  bos/eos/pad (unk) token texts
    FOLDER/generation_config.json   bos/eos/pad ids, greedy by default

The one real difference: HF's llama applies RoPE to the two *halves* of each head (``rotate_half``:
element ``i`` pairs with ``i + head_dim/2``), our kernels and ggml's normal RoPE to *adjacent pairs*
(``2i``, ``2i+1``), both with angle ``pos * theta**(-2i/head_dim)``. So the rows of each head of
Q and K are permuted on the way out (:func:`to_hf_rows`) and back (:func:`from_hf_rows`, which is
llama.cpp's ``LlamaModel.permute`` in ``convert_hf_to_gguf.py``). A permutation of rows is exact:
ours -> HF -> ours gives the same bits.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from gguf import MODEL_TENSOR

from core import __version__, chat_format
from core.atomic import is_mark, replace_folder
from core.checkpoint_meta import export_target, has_our_weights
from core.config import ConfigError, ModelConfig, tensor_name
from core.gguf_tokenizer import GGUFTokenizer
from core.hf_tokenizer import (HFError, check_tokenizer_file, folder_chat_template, probe_texts, read_tokenizer,
                               tokenizer_files)
from core.loaded import LoadedModel

if TYPE_CHECKING:
    from core.tokenizer import Tokenizer

log = logging.getLogger(__name__)

ARCHITECTURE = "LlamaForCausalLM"
MODEL_TYPE = "llama"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"  # sharded weights, as save_pretrained writes large models
STUDIO_KEY = "opencl_llm_studio"  # our block in config.json (app version, export date)
FILES = ("config.json", WEIGHTS_FILE, "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
         "generation_config.json")


# ---------------------------------------------------------------------------------------- names
def hf_names(config: ModelConfig) -> dict[str, str]:
    """``{our GGUF tensor name: HF LlamaForCausalLM state-dict name}`` for every parameter of ``config``."""
    T = MODEL_TENSOR
    m = {tensor_name(T.TOKEN_EMBD): "model.embed_tokens.weight", tensor_name(T.OUTPUT_NORM): "model.norm.weight"}
    if not config.tie_embeddings:
        m[tensor_name(T.OUTPUT)] = "lm_head.weight"
    per_layer = {T.ATTN_NORM: "input_layernorm", T.ATTN_Q: "self_attn.q_proj", T.ATTN_K: "self_attn.k_proj",
                 T.ATTN_V: "self_attn.v_proj", T.ATTN_OUT: "self_attn.o_proj",
                 T.FFN_NORM: "post_attention_layernorm", T.FFN_GATE: "mlp.gate_proj", T.FFN_UP: "mlp.up_proj",
                 T.FFN_DOWN: "mlp.down_proj"}
    for i in range(config.n_layers):
        for ours, theirs in per_layer.items():
            m[tensor_name(ours, i)] = f"model.layers.{i}.{theirs}.weight"
    return m


def _rope_heads(config: ModelConfig) -> dict[str, int]:
    """``{name of each layer's Q and K weight: its head count}``: the rows the RoPE layouts differ in."""
    T = MODEL_TENSOR
    return {tensor_name(t, i): n for i in range(config.n_layers)
            for t, n in ((T.ATTN_Q, config.n_heads), (T.ATTN_K, config.n_kv_heads))}


def to_hf_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder the rows of a Q or K projection from adjacent RoPE pairs (ours) to halves (HF).

    Args:
        w: float (n_heads * head_dim, d_model), rows of head ``h`` at ``h*head_dim .. (h+1)*head_dim``.
        n_heads: heads in ``w`` (``n_heads`` for Q, ``n_kv_heads`` for K).

    Returns:
        The same shape; row ``h*hd + a*hd/2 + i`` (HF) is our row ``h*hd + 2i + a``, a in {0, 1}.
    """
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def from_hf_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The inverse of :func:`to_hf_rows` (llama.cpp ``convert_hf_to_gguf.py``, ``LlamaModel.permute``)."""
    rows, cols = w.shape
    return w.reshape(n_heads, 2, rows // n_heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


# ---------------------------------------------------------------------------------------- export
def hf_config(config: ModelConfig, bos_id: int, eos_id: int, pad_id: int) -> dict[str, Any]:
    """The ``config.json`` dict of a ``LlamaConfig`` that computes what ``config`` computes.

    ``rope_theta`` is written both at the top (transformers 4.x) and in ``rope_parameters``
    (transformers 5.x); both read it from either place.
    """
    return {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
        "vocab_size": config.vocab_size, "hidden_size": config.d_model, "intermediate_size": config.ffn_dim,
        "num_hidden_layers": config.n_layers, "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads, "head_dim": config.head_dim, "hidden_act": "silu",
        "max_position_embeddings": config.context_length, "rms_norm_eps": float(config.norm_eps),
        "rope_theta": float(config.rope_theta),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(config.rope_theta)},
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "pretraining_tp": 1,
        "tie_word_embeddings": bool(config.tie_embeddings), "initializer_range": 0.02, "use_cache": True,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id, "torch_dtype": "float32",
    }


def _prepare_target(out: Path) -> None:
    """Refuse to replace a folder that holds anything but an earlier export (user files are never lost)."""
    if out.exists() and not out.is_dir():
        raise HFError(f"{out}: exists and is not a folder")
    if out.is_dir():
        foreign = [p.name for p in out.iterdir() if p.name not in FILES and not is_mark(p)]
        if foreign:
            raise HFError(f"{out}: the folder is not empty ({foreign[0]} ...); choose a new or empty folder")


def export_hf(model: LoadedModel, out_folder: str | os.PathLike) -> Path:
    """Write a model as a Hugging Face ``LlamaForCausalLM`` folder (see the module docstring).

    Args:
        model: what :func:`core.checkpoint.load_model` read (a checkpoint folder, ``.gguf`` file or
            HF folder).
        out_folder: the folder to write; it must not exist, be empty, or hold only an earlier export
            (which is then replaced).

    Returns:
        The folder. Weights are float32; Q and K rows are permuted to HF's RoPE layout.

    Raises:
        HFError: the model is inconsistent or has non-finite weights, the folder holds other files,
            or the written folder does not read back to the same bits (nothing is left behind).
        OSError: not writable, disk full: one line naming the file (nothing is left behind).
        CheckpointError: the target is inside a checkpoint folder (core.checkpoint_meta.check_export_target).
    """
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    from core.gguf_io import GGUFError, _check_model

    loaded = model
    try:
        _check_model(loaded)  # the same checks as the GGUF export: names, shapes, vocabulary, finite values
    except GGUFError as e:
        raise HFError(str(e)) from None
    c, tok = loaded.config, loaded.tokenizer
    # never a checkpoint folder (or one inside it), nor one another export writes; the resolved folder, the one
    # checked and locked, is the one written
    with export_target(out_folder) as out:
        _prepare_target(out)

        tensors = _hf_tensors(loaded)
        try:
            texts = _hf_texts(c, tok)
        except HFError as e:  # a vocabulary a tokenizer.json cannot hold (named by its GGUF key)
            raise HFError(f"{loaded.path}: {e}") from None

        def write(tmp: Path) -> None:
            try:
                # "pt": what transformers expects
                save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
            except SafetensorError as e:  # its Rust I/O errors come as this one type, with the OS error in the text
                raise _write_error(out / WEIGHTS_FILE, str(e)) from None
            for name, text in texts.items():
                try:
                    (tmp / name).write_text(text, encoding="utf-8")
                except OSError as e:
                    raise _write_error(out / name, e.strerror or str(e), e.errno) from None
            _verify(tmp, loaded)

        try:
            replace_folder(out, write)  # an earlier export (checked above) is replaced as one unit
        except OSError as e:
            if e.filename is None and len(e.args) == 2 and str(out) in str(e.strerror):
                raise  # already one line naming the file
            raise _write_error(out, e.strerror or str(e), e.errno) from None
        log.info("hf: wrote %s (%d tensors)", out, len(tensors))
        return out


def _hf_tensors(loaded: LoadedModel) -> dict[str, np.ndarray]:
    """{HF name: contiguous float32 weights}, Q and K rows permuted to HF's rotate_half layout."""
    tensors = {}
    heads = _rope_heads(loaded.config)
    for ours, theirs in hf_names(loaded.config).items():
        w = np.ascontiguousarray(loaded.weights[ours], dtype=np.float32)
        if ours in heads:
            w = to_hf_rows(w, heads[ours])
        tensors[theirs] = np.ascontiguousarray(w)
    return tensors


def _hf_texts(c: ModelConfig, tok) -> dict[str, str]:
    """{file name: text} of the export's JSON files: config.json (with our app's version and the
    date), generation_config.json and the tokenizer's files."""
    texts = {"config.json": hf_config(c, tok.bos_id, tok.eos_id, tok.pad_id)}
    texts["config.json"][STUDIO_KEY] = {"app_version": __version__,
                                        "export_date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    texts["generation_config.json"] = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id,
                                       "pad_token_id": tok.pad_id, "do_sample": False,
                                       "max_length": c.context_length}
    return {k: json.dumps(v, indent=2) for k, v in texts.items()} | tokenizer_files(tok, c.context_length)


def _write_error(path: Path, why: str, code: int | None = None) -> OSError:
    """A one-line OSError naming ``path``: "the disk is full" for ENOSPC (also when only the text says it)."""
    full = code == errno.ENOSPC or "No space left" in why or "os error 28" in why
    if full:
        return OSError(errno.ENOSPC, f"cannot write {path}: the disk is full (nothing was written)")
    return OSError(code or errno.EIO, f"cannot write {path}: {' '.join(why.split())} (nothing was written)")


def _same_tokenizer(a, b) -> bool:
    """Same kind, tokens, special ids, merge ranks and ids of the probe texts (core.hf_tokenizer)."""
    if type(a) is not type(b) or a.tokens() != b.tokens() or (a.bos_id, a.eos_id) != (b.bos_id, b.eos_id):
        return False
    if isinstance(a, GGUFTokenizer):  # the merges its pipeline applies, BOS/EOS as the file says
        if a.bpe_merges() != b.bpe_merges() or (a.add_bos, a.add_eos) != (b.add_bos, b.add_eos):
            return False
    elif a.merges() != b.merges():
        return False
    return all(a.encode(t, parse_special=True) == b.encode(t, parse_special=True) for t in probe_texts(b))


def _verify(folder: Path, loaded) -> None:
    """Read the written folder back; raise HFError unless config, tokenizer and every tensor's bits match."""
    config, weights, tok = load_hf(folder)
    if config != loaded.config:
        raise HFError(f"verification failed: {folder / 'config.json'} reads back as {config}")
    ours, path = loaded.tokenizer, folder / "tokenizer.json"
    check_tokenizer_file(path, ours)  # the file in tokenizers: our ids on probe texts and special tokens
    if not _same_tokenizer(tok, ours):
        raise HFError(f"verification failed: {path} reads back with another vocabulary")
    for name, _shape in config.param_shapes():
        a, b = np.asarray(loaded.weights[name], np.float32), weights[name]
        if a.shape != b.shape or a.tobytes() != b.tobytes():
            raise HFError(f"verification failed: tensor {name} does not read back bit-identical")


# ---------------------------------------------------------------------------------------- import
def is_hf_folder(path: str | os.PathLike) -> bool:
    """True for a folder with a ``config.json`` and HF safetensors weights (and no weights file of our
    checkpoints)."""
    p = Path(path)
    return (p.is_dir() and (p / "config.json").is_file() and not has_our_weights(p)
            and ((p / WEIGHTS_FILE).is_file() or (p / INDEX_FILE).is_file()))


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise HFError(f"{path}: missing")
    try:
        d = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HFError(f"{path}: unreadable ({e})") from None
    if not isinstance(d, dict):
        raise HFError(f"{path}: not a JSON object")
    return d


def _config_from_hf(path: Path, hf: dict) -> ModelConfig:
    """A ModelConfig from a llama ``config.json``; HFError naming the field for what we do not compute."""
    def bad(field: str, why: str = "is not supported") -> HFError:
        return HFError(f"{path}: {field} = {json.dumps(hf.get(field))[:80]} {why}; this app computes plain "
                       f"llama models only")

    archs = hf.get("architectures") or [ARCHITECTURE]
    if archs != [ARCHITECTURE]:
        raise bad("architectures", f"is not supported (only {ARCHITECTURE!r})")
    if hf.get("model_type") != MODEL_TYPE:
        raise bad("model_type", f"is not supported (only {MODEL_TYPE!r})")
    for field, ok in (("rope_scaling", None), ("attention_bias", False), ("mlp_bias", False),
                      ("hidden_act", "silu"), ("sliding_window", None)):
        if hf.get(field, ok) != ok:
            raise bad(field)
    rope = hf.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise bad("rope_parameters")
    if rope.get("rope_type", "default") != "default" or set(rope) - {"rope_type", "rope_theta"}:
        raise bad("rope_parameters", "is not supported (only rope_type 'default', no scaling)")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    names = {"vocab_size": "vocab_size", "d_model": "hidden_size", "n_layers": "num_hidden_layers",
             "n_heads": "num_attention_heads", "ffn_dim": "intermediate_size",
             "context_length": "max_position_embeddings", "norm_eps": "rms_norm_eps"}
    for f in names.values():
        if f not in hf:
            raise HFError(f"{path}: required field {f} is missing")
    kw = {ours: hf[f] for ours, f in names.items()}
    kw["n_kv_heads"] = hf.get("num_key_value_heads") or hf["num_attention_heads"]
    kw["rope_theta"] = theta
    kw["tie_embeddings"] = hf.get("tie_word_embeddings", False)  # LlamaConfig's default
    ours_to_hf = dict(names, n_kv_heads="num_key_value_heads", rope_theta="rope_theta",
                      tie_embeddings="tie_word_embeddings")
    try:
        config = ModelConfig(**kw)
    except ConfigError as e:
        raise HFError(f"{path}: {ours_to_hf.get(e.field, e.field)}: {str(e).split(': ', 1)[-1]}") from None
    head_dim = hf.get("head_dim")
    if head_dim is not None and head_dim != config.head_dim:
        raise bad("head_dim", f"is not supported (must be hidden_size / num_attention_heads = {config.head_dim})")
    return config


def _shard(folder: Path, name: str) -> Path:
    """The weight file ``name`` of the index: a regular file inside ``folder`` once links are resolved.

    Raises:
        HFError: a name leading outside the folder (``../../etc/passwd``, an absolute path, a link out),
            or one that is missing or not a regular file (a FIFO would block the read forever).
    """
    where = f"{folder / INDEX_FILE}: weight_map"
    root = folder.resolve()
    path = (folder / name).resolve()
    if not path.is_relative_to(root) or path == root:
        raise HFError(f"{where} names {name!r}, which is outside the folder")
    if not path.exists():
        raise HFError(f"{where} names {name!r}, which does not exist")
    if not stat.S_ISREG(path.stat().st_mode):
        raise HFError(f"{where} names {name!r}, which is not a regular file")
    return path


def _weight_files(folder: Path) -> list[Path]:
    if (folder / INDEX_FILE).is_file():
        index = _read_json(folder / INDEX_FILE).get("weight_map")
        if not isinstance(index, dict):
            raise HFError(f"{folder / INDEX_FILE}: weight_map is missing")
        return [_shard(folder, f) for f in sorted(set(map(str, index.values())))]
    if not (folder / WEIGHTS_FILE).is_file():
        raise HFError(f"{folder}: no {WEIGHTS_FILE} (weights saved as .bin need torch; save with "
                      "safe_serialization=True)")
    return [folder / WEIGHTS_FILE]


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as float32 (F32, F16, F64 through the package; BF16 by hand,
    since numpy has no bfloat16: its bits are the upper half of a float32)."""
    from safetensors import safe_open

    out = {}
    bf16 = False
    try:
        with safe_open(str(path), framework="np") as f:
            for name in f.keys():
                dtype = f.get_slice(name).get_dtype()
                if dtype == "BF16":
                    bf16 = True
                    continue
                if dtype not in ("F32", "F16", "F64"):
                    raise HFError(f"{path}: tensor {name} has dtype {dtype}, which is not supported")
                out[name] = np.asarray(f.get_tensor(name), dtype=np.float32)
        if not bf16:
            return out
        raw = path.read_bytes()
        n = int.from_bytes(raw[:8], "little")  # safetensors format: u64 header length, JSON header, data
        header = json.loads(raw[8:8 + n])
        for name, info in header.items():
            if name != "__metadata__" and info["dtype"] == "BF16":
                a, b = info["data_offsets"]
                bits = np.frombuffer(raw, np.uint16, (b - a) // 2, 8 + n + a).astype(np.uint32) << 16
                out[name] = bits.view(np.float32).reshape(info["shape"]).copy()
    except HFError:
        raise
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise HFError(f"{path}: unreadable safetensors file ({e})") from None
    return out


def load_hf(folder: str | os.PathLike) -> tuple[ModelConfig, dict[str, np.ndarray], Tokenizer | GGUFTokenizer]:
    """Read a Hugging Face ``LlamaForCausalLM`` folder (ours, or after ``save_pretrained``).

    Returns:
        ``(ModelConfig, {GGUF tensor name: float32 array}, core.tokenizer.Tokenizer)``, as the GGUF
        import gives them; Q and K rows are permuted back to our RoPE layout (bit-exact).

    Raises:
        HFError: a missing or unreadable file, or something this app does not compute (another
            architecture, rope scaling, biases, another activation or tokenizer, missing or extra
            tensors, non-finite values); the message names the file and the field or tensor.
    """
    d = Path(folder)
    if not d.is_dir():
        raise HFError(f"{d}: not a folder")
    config = _config_from_hf(d / "config.json", _read_json(d / "config.json"))
    tc = d / "tokenizer_config.json"
    tok = read_tokenizer(d, _read_json(d / "tokenizer.json"), _read_json(tc) if tc.is_file() else {})
    if tok.vocab_size != config.vocab_size:
        raise HFError(f"{d / 'config.json'}: vocab_size = {config.vocab_size} differs from the tokenizer's "
                      f"{tok.vocab_size} tokens (a padded embedding is not supported)")
    hf = {}
    for f in _weight_files(d):
        hf |= _read_safetensors(f)
    names = hf_names(config)
    if config.tie_embeddings and "lm_head.weight" in hf:  # save_pretrained may keep the tied copy
        if not np.array_equal(hf["lm_head.weight"], hf.get("model.embed_tokens.weight")):
            raise HFError(f"{d}: tie_word_embeddings is true but lm_head.weight differs from the embedding")
        del hf["lm_head.weight"]
    extra = [n for n in hf if n not in names.values() and not n.endswith("rotary_emb.inv_freq")]
    if extra:
        raise HFError(f"{d}: tensor {extra[0]} is not part of a plain llama model; not supported")
    shapes, heads = dict(config.param_shapes()), _rope_heads(config)
    weights = {}
    for ours, theirs in names.items():
        if theirs not in hf:
            raise HFError(f"{d}: tensor {theirs} is missing")
        w = hf[theirs]
        if w.shape != shapes[ours]:
            raise HFError(f"{d}: tensor {theirs} has shape {w.shape}, config.json needs {shapes[ours]}")
        if not np.all(np.isfinite(w)):
            raise HFError(f"{d}: tensor {theirs} contains NaN or infinite values")
        if ours in heads:
            w = from_hf_rows(w, heads[ours])
        weights[ours] = np.ascontiguousarray(w, dtype=np.float32)
    return config, weights, tok


def load_hf_model(folder: str | os.PathLike) -> LoadedModel:
    """:func:`load_hf` as a :class:`core.loaded.LoadedModel` (for chat and export).

    ``meta``: ``format`` "hf", ``name`` (the folder name), ``chat_template`` (the folder's, or None).
    Raises HFError as :func:`load_hf` does.
    """

    d = Path(folder)
    config, weights, tok = load_hf(d)
    if isinstance(tok, GGUFTokenizer):  # a GGUF vocabulary: its own template, as the file it came from
        template = tok.chat_template
    else:
        tc = d / "tokenizer_config.json"
        template = folder_chat_template(d, _read_json(tc) if tc.is_file() else {})
        if template is not None and template != chat_format.CHAT_TEMPLATE:
            log.warning("%s: its chat template differs from this app's chat format; chat uses the app's format", d)
    return LoadedModel(config, tok, weights, {"format": "hf", "name": d.name, "chat_template": template}, d)


__all__ = ["HFError", "export_hf", "load_hf", "load_hf_model", "is_hf_folder", "hf_names", "hf_config",
           "to_hf_rows", "from_hf_rows"]
