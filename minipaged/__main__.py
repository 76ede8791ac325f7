# GENERATED from chapters/17_openai_server.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/17_openai_server.md § minipaged serve
"""``python -m minipaged serve MODEL``."""

import sys

from minipaged.entrypoints.cli import main

if __name__ == "__main__" and __package__:  # `python -m minipaged`, not a notebook's cell
    sys.exit(main())
