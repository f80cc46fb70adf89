"""Serve a model in the foreground: `python -m pipeline.local.endpoint --model-data M --name N [--state-file F]`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from pipeline.local.endpoint.app import EndpointStartError
from pipeline.local.endpoint.handler import LOG
from pipeline.local.endpoint.process import MODULE, serve


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and serve until Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}", description="A local real-time endpoint: SageMaker's serving contract over HTTP."
    )
    parser.add_argument("--model-data", type=Path, required=True, help="model.tar.gz or an untarred model folder")
    parser.add_argument("--name", required=True, help="endpoint name (the EndpointName of invoke_endpoint)")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model-version", help="label recorded in the state file, e.g. the model package version")
    parser.add_argument("--state-file", type=Path, help="JSON file recording pid, port and version while serving")
    parser.add_argument("--environment", type=json.loads, default={}, help="the model's container environment (JSON)")
    parser.add_argument("--alerts-file", type=Path, help="JSON lines file that a worker restart is alerted in")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        serve(
            args.model_data,
            args.name,
            args.port,
            args.host,
            version=args.model_version,
            state_file=args.state_file,
            on_ready=lambda url: print(f"endpoint {args.name} at {url}", flush=True),
            environment=args.environment,
            alerts_file=args.alerts_file,
        )
    except EndpointStartError as error:
        LOG.warning("endpoint %s did not start", args.name, exc_info=True)
        sys.exit(f"error: {error}")  # the last line of the log: start_background reports it


if __name__ == "__main__":
    main()
