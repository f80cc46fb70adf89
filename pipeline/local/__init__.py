"""Local runner: executes the pipeline definition on this machine (storage, jobs, registry, endpoint)."""
