"""``python -m memlib``: the memlib command line."""
import sys

from .cli import main

sys.exit(main())
