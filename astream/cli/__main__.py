import sys

from astream.cli import main

sys.exit(main())
