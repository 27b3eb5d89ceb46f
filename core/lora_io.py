"""Writing a LoRA checkpoint's adapters for other programs (core/lora.py has the adapters themselves).

* :func:`export_adapter_gguf`: llama.cpp's adapter GGUF (what ``convert_lora_to_gguf.py`` writes and
  ``llama_adapter_lora_init`` reads, ``--lora FILE`` / llama-cpp-python's ``lora_path``):
  ``general.type`` = ``adapter``, ``adapter.type`` = ``lora``, ``adapter.lora.alpha``; tensors
  ``<base tensor name>.lora_a`` (rank, n_in) and ``.lora_b`` (n_out, rank) in numpy order, F32, rows in the
  base file's order (ours: the engine computes llama.cpp's RoPE pairing, so no permutation); with an
  Ollama Modelfile (``FROM`` the base file, ``ADAPTER`` this one) beside it on request.
* :func:`export_peft`: a PEFT folder (``adapter_config.json``, ``adapter_model.safetensors``) for the
  transformers model of ``core.hf_io.export_hf``: module names from ``core.hf_io.hf_names``, the B rows
  of q_proj / k_proj permuted as that export permutes W (``to_hf_rows``; A's columns are inputs, unchanged).

Both write through ``core.atomic`` (the file or folder appears whole or not at all).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import gguf
import numpy as np

from core import __version__
from core.atomic import atomic_path, atomic_write, is_mark, replace_folder
from core.checkpoint_meta import APP_VERSION_KEY, MODELFILE_HEADER, export_target
from core.loaded import LoadedModel
from core.lora import SUFFIX_A, SUFFIX_B, TARGETS, LoRAConfig, LoRAError, adapter_shapes, base_name

log = logging.getLogger(__name__)

ARCH = "llama"
PEFT_CONFIG, PEFT_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
HF_MODULES = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
              "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}
"""PEFT's ``target_modules`` names of our targets (transformers' LlamaForCausalLM module names)."""


def _adapter_of(loaded: LoadedModel) -> tuple[LoRAConfig, dict[str, np.ndarray]]:
    """The LoRA settings and adapters of a loaded LoRA checkpoint, checked against its config.

    Raises:
        LoRAError: not a LoRA checkpoint, or a tensor missing / of another shape / not finite (named).
    """
    if loaded.lora is None or loaded.adapter is None:
        raise LoRAError(f"{loaded.path}: not a LoRA checkpoint (config.json has no base.lora): export the whole "
                        "model without --adapter")
    for name, shape in adapter_shapes(loaded.config, loaded.lora):
        a = loaded.adapter.get(name)
        if a is None or a.shape != shape or not np.all(np.isfinite(a)):
            raise LoRAError(f"{loaded.path}: adapter tensor {name} is missing, not {shape} or not finite")
    return loaded.lora, loaded.adapter


def export_adapter_gguf(loaded: LoadedModel, out_path: str | os.PathLike, modelfile: bool = False,
                        replace: bool = False) -> tuple[Path, Path | None]:
    """Write a LoRA checkpoint's adapters as llama.cpp's adapter GGUF (see the module docstring).

    Args:
        loaded: ``core.checkpoint.load_checkpoint`` of a LoRA checkpoint (``loaded.lora`` set).
        out_path: the ``.gguf`` file (``.gguf`` appended when missing), replaced atomically.
        modelfile: also write ``<stem>.Modelfile`` (``FROM`` the base file, ``ADAPTER`` this file).
        replace: replace an existing file (and Modelfile) even if this app did not write it (the user said so).

    Returns:
        ``(adapter file, Modelfile or None)``.

    Raises:
        LoRAError: not a LoRA checkpoint / a bad adapter tensor; CheckpointError: the target (or its
        Modelfile) is inside a checkpoint folder or an existing file this app did not write; OSError: not
        writable, disk full (nothing is left behind).
    """
    lora, adapter = _adapter_of(loaded)
    from core.gguf_io import gguf_path

    out = gguf_path(out_path)
    with export_target(out, replace, (loaded.meta or {}).get("base_model"), modelfile):
        names = [n for n, _ in adapter_shapes(loaded.config, lora)]
        with atomic_path(out) as tmp:
            w = gguf.GGUFWriter(tmp, ARCH)
            try:
                w.add_type(gguf.GGUFType.ADAPTER)
                w.add_string(gguf.Keys.Adapter.TYPE, "lora")
                w.add_string(APP_VERSION_KEY, __version__)  # marks the file as ours (check_export_target replaces it)
                w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(lora.alpha))
                w.add_name(f"{(loaded.meta or {}).get('name') or Path(loaded.path).name} LoRA")
                for name in names:
                    w.add_tensor(name, np.ascontiguousarray(adapter[name], np.float32))
                w.write_header_to_file(tmp)
                w.write_kv_data_to_file()
                w.write_tensors_to_file()
            finally:
                w.close()
            _verify_adapter_gguf(tmp, {n: adapter[n] for n in names})
        mf = _write_adapter_modelfile(out, loaded) if modelfile else None
        log.info("lora: wrote %s (%d tensors, rank %d, alpha %g)", out, len(names), lora.rank, lora.alpha)
        return out, mf


def _verify_adapter_gguf(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """The written file reads back with the same keys' values, tensor names, shapes and bits."""
    r = gguf.GGUFReader(path)
    try:
        if r.fields[gguf.Keys.General.TYPE].contents() != "adapter":
            raise LoRAError(f"{path}: general.type does not read back as 'adapter'")
        back = {t.name: np.asarray(t.data).reshape([int(x) for x in reversed(t.shape)]) for t in r.tensors}
        for name, a in arrays.items():
            if name not in back or not np.array_equal(back[name], a):
                raise LoRAError(f"{path}: tensor {name} does not read back as written")
    finally:
        del r


def _write_adapter_modelfile(adapter_path: Path, loaded: LoadedModel) -> Path:
    """``<stem>.Modelfile``: ``FROM`` the base file (absolute path), ``ADAPTER`` the adapter file."""
    from core.gguf_io import ollama_create_command, ollama_name

    base = Path(loaded.meta["base_model"]).resolve()
    lines = [f"{MODELFILE_HEADER}: the base model with the LoRA adapter",
             f"# {ollama_create_command(adapter_path)} && ollama run {ollama_name(adapter_path)}",
             f"FROM {base}", f"ADAPTER ./{adapter_path.name}", "PARAMETER temperature 0",
             "PARAMETER repeat_penalty 1",  # as the merged export's: the app's chat applies none
             f"PARAMETER num_ctx {loaded.config.context_length}"]
    path = adapter_path.with_name(adapter_path.stem + ".Modelfile")
    atomic_write(path, "\n".join(lines) + "\n")
    return path


def peft_tensors(loaded: LoadedModel) -> dict[str, np.ndarray]:
    """``{PEFT state-dict name: float32 array}``: ``base_model.model.<HF module>.lora_A.weight`` (rank, n_in)
    and ``.lora_B.weight`` (n_out, rank), q_proj / k_proj B rows in HF's RoPE layout."""
    from core.hf_io import _rope_heads, hf_names, to_hf_rows

    lora, adapter = _adapter_of(loaded)
    names, heads = hf_names(loaded.config), _rope_heads(loaded.config)
    out = {}
    for name, a in adapter.items():
        base = base_name(name)
        module = "base_model.model." + names[base].removesuffix(".weight")
        if name.endswith(SUFFIX_A):
            out[module + ".lora_A.weight"] = np.ascontiguousarray(a, np.float32)
        elif name.endswith(SUFFIX_B):
            b = to_hf_rows(a, heads[base]) if base in heads else a
            out[module + ".lora_B.weight"] = np.ascontiguousarray(b, np.float32)
    return out


def peft_config(lora: LoRAConfig, base: str | None) -> dict:
    """``adapter_config.json`` of PEFT's LoraConfig: rank, alpha, target modules, no dropout or bias."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank, "lora_alpha": lora.alpha,
            "target_modules": [HF_MODULES[t] for t in lora.targets if t in TARGETS], "lora_dropout": 0.0,
            "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
            "init_lora_weights": True, "inference_mode": True, "modules_to_save": None,
            "base_model_name_or_path": base}


def adapter_beside(out: Path, hf: bool = False) -> Path:
    """Where an adapter goes beside the merged export ``out`` (the Export tab's "Both", ``export --adapter``
    into a folder): ``NAME-lora.gguf``, or for a Hugging Face folder the PEFT folder ``NAME-lora``."""
    return out.with_name(out.name + "-lora") if hf else out.with_name(out.stem + "-lora.gguf")


def export_peft(loaded: LoadedModel, out_folder: str | os.PathLike) -> Path:
    """Write a LoRA checkpoint's adapters as a PEFT folder (see the module docstring), as one unit.

    Raises:
        LoRAError: not a LoRA checkpoint, or the folder holds files other than a PEFT export's;
        CheckpointError: the target is inside a checkpoint folder; OSError: not writable, disk full.
    """
    from safetensors.numpy import save_file

    tensors = peft_tensors(loaded)
    with export_target(out_folder) as out:  # the resolved folder: the one checked and locked is the one written
        if out.exists() and (not out.is_dir() or
                             {n for n in os.listdir(out) if not is_mark(out / n)} - {PEFT_CONFIG, PEFT_WEIGHTS}):
            raise LoRAError(f"{out}: holds files other than a PEFT adapter's; choose a new or empty folder")
        text = json.dumps(peft_config(loaded.lora, (loaded.meta or {}).get("base_model")), indent=2)

        def write(tmp: Path) -> None:
            save_file(tensors, str(tmp / PEFT_WEIGHTS), metadata={"format": "pt"})
            (tmp / PEFT_CONFIG).write_text(text, encoding="utf-8")

        replace_folder(out, write)
        return out


__all__ = ["adapter_beside", "export_adapter_gguf", "export_peft", "peft_tensors", "peft_config", "HF_MODULES"]
