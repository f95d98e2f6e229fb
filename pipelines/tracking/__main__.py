"""``python -m pipelines.tracking sync --root DIR [--tracking-uri URI]`` (see `pipelines.tracking.cli`)."""

import sys

from pipelines.tracking.cli import main

if __name__ == "__main__":
    sys.exit(main())
