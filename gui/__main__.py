"""``python -m gui``: start OpenCL LLM Studio."""
import sys

from gui.app import main

if __name__ == "__main__":  # not when a child process (core.child_call) imports the parent's main module
    sys.exit(main())
