"""`python3 -m steps.evaluation ARGS` (what steps/run.py evaluation runs in the container)."""

import sys

from steps.evaluation.evaluate import main

sys.exit(main())
