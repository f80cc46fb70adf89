"""The deploy Lambda and the model lifecycle it runs (also called directly by the CLI and the local account)."""
