"""Entry point of a node agent process: ``python -m astream._coord FD`` (started by launch.start_agent)."""

import sys

from astream._coord.launch import agent_main

sys.exit(agent_main(sys.argv))
