"""``python -m gui``: start OpenCL LLM Studio."""
import sys

from gui.app import main

sys.exit(main())
