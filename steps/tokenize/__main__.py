"""`python3 -m steps.tokenize ARGS` (what steps/run.py tokenize runs in the container)."""

import sys

from steps.tokenize.preprocess import main

sys.exit(main())
