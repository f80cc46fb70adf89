"""Code that runs in AWS (the processing containers, the deploy Lambda): one package per deployable, and the
contract they share with pipeline/."""
