"""Entry point: ``python -m asp_scheduler`` (also the ``asp-schedule`` console script)."""

import sys

from asp_scheduler.cli import main

if __name__ == "__main__":
    sys.exit(main())
