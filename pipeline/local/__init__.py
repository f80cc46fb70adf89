"""The pipeline on this machine, from the same definition JSON: the local stand-in for an AWS account.

`backend` implements pipeline.backend's protocol; `runner` interprets the definition (`execution` its record and
state, `cache` step caching, `jobs` processing and training jobs under the container contract, `orphans` stops
the job processes of a command that died); `storage` is the
account's folder (S3, executions, pipelines, registry, endpoint state); `registry` the SQLite model registry;
`services` the registry and deploy calls the steps make; `endpoint/` the HTTP endpoint; `cost` prices a local run.
"""
