"""OpenCL LLM Studio engine: OpenCL kernels, a llama-architecture model, training, generation, GGUF.

No Qt here: the GUI (``gui/``) and the CLI (``core.cli``) both drive this package.
"""
__version__ = "0.1.0"
