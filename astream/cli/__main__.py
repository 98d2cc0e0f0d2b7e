import sys

from astream.cli import main

# Guarded: spawned worker processes of `astream convert` import the main module again.
if __name__ == "__main__":
    sys.exit(main())
