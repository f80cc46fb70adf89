"""`python -m pipeline` runs the CLI."""

from pipeline.cli import main

main()
