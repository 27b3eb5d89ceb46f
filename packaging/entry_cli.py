"""Frozen entry point of ``opencl-llm`` (the command-line executable of the PyInstaller bundle).

Same commands as the pip-installed ``opencl-llm`` (:func:`core.cli.main`). ``opencl-llm --self-test``
runs the GUI's self-test (it uses core only, no window): on Windows the GUI executable is built
without a console and cannot print, so this is the way to see the self-test's output there.
"""
from __future__ import annotations

import sys


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["--self-test"]:
        from core.selftest import run_self_test

        return run_self_test()
    from core.cli import main as cli_main

    return int(cli_main(argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
