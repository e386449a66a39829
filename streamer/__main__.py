"""``python -m streamer`` is ``render-node``."""

import sys

from streamer.cli import main

sys.exit(main())
