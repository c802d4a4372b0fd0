"""`python -m extproc` is the `extproc` command."""

import sys

from extproc.cli import main

if __name__ == "__main__":
    sys.exit(main())
