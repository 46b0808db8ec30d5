"""`python -m app.cli`, the same as the `eslab` console script."""

import sys

from app.cli import main

sys.exit(main())
