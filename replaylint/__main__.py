"""``python -m replaylint``."""

import sys

from replaylint.cli import main

sys.exit(main())
