"""Test-wide settings: offline, fake AWS credentials, and no connection leaves the machine."""

from __future__ import annotations

import ipaddress
import os
import socket
import sys

import pytest

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "SAGEMAKER_VALIDATE_ROLE": "false",
}
os.environ.update(OFFLINE_ENV)
# The tests start about 200 Python processes: each reads the project's compiled modules instead of compiling them
# anew (a machine that sets PYTHONDONTWRITEBYTECODE, as the build machines do, would compile them every time).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# More processes than cores (the workers, their steps, endpoints and torchrun ranks): OpenMP threads that wait for
# work sleep instead of spinning, so that they leave the cores to the processes that have work. A whole local run
# beside two busy loops took 98 s of CPU with the default (spinning) policy and 72 s with this one.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
for var in (
    "AWS_PROFILE",
    "AWS_ENDPOINT_URL",
    "TRAINIUM_PIPELINE_REGION",
    "TRAINIUM_PIPELINE_ROLE_ARN",
    "TRAINIUM_PIPELINE_BUCKET",
):
    os.environ.pop(var, None)



def _share_botocore_data_loader() -> None:
    """Every botocore session of the test process reads AWS's service models through one loader, which keeps what
    it parsed: the tests make hundreds of sessions (moto's, the SDK's, the CLI's), and parsing SageMaker's model
    anew costs each about 0.1 s. The models are read-only data; nothing else is shared."""
    try:  # the image environments (XLA, serving compat) have no botocore
        import botocore.loaders
        import botocore.session
    except ImportError:
        return
    loader = botocore.loaders.create_loader()

    def register(session: botocore.session.Session) -> None:
        session._components.lazy_register_component("data_loader", lambda: loader)

    botocore.session.Session._register_data_loader = register


_share_botocore_data_loader()
BLOCKED: list[object] = []
_connect = socket.socket.connect


def _is_local(address: object) -> bool:
    if not isinstance(address, tuple):
        return True  # AF_UNIX and friends
    host = str(address[0])
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _guarded_connect(self: socket.socket, address: object) -> None:
    if not _is_local(address):
        BLOCKED.append(address)
        raise ConnectionRefusedError(f"tests make no network calls (blocked connect to {address})")
    return _connect(self, address)


socket.socket.connect = _guarded_connect  # type: ignore[method-assign]


IMAGE_TESTS = {"test_images.py", "test_train_xla.py", "test_serving_compat.py"}  # CI runs them in the image venvs


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A slow test (a whole local run, a torchrun launch) or an image venv's (pip installs, XLA compiles, beside the
    slow set in CI) may take up to 10 minutes before it counts as hung."""
    for item in items:
        slow = item.get_closest_marker("slow") or item.path.name in IMAGE_TESTS
        if slow and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(600))


@pytest.fixture(scope="session", autouse=True)
def no_endpoint_outlives_the_tests(tmp_path_factory: pytest.TempPathFactory):
    """Stops the detached local endpoints that tests started under their temporary folders (a failed test may
    leave one behind; it would hold its port after the session)."""
    yield
    try:  # the image environments (XLA, serving compat) start no endpoint and lack the project's packages
        import psutil

        from pipeline.local.endpoint.process import MODULE
    except ImportError:
        return
    base = str(tmp_path_factory.getbasetemp())
    for process in psutil.process_iter(["cmdline"]):
        command = process.info["cmdline"] or []
        if MODULE in command and any(arg.startswith(base) for arg in command):
            process.terminate()


@pytest.fixture
def no_network():
    """Fails the test if anything tried to connect beyond loopback while it ran."""
    BLOCKED.clear()
    yield
    assert not BLOCKED, f"network calls attempted: {BLOCKED}"


@pytest.fixture(scope="module")
def no_network_module():
    """Like `no_network`, for module-scoped fixtures."""
    BLOCKED.clear()
    yield
    assert not BLOCKED, f"network calls attempted: {BLOCKED}"


@pytest.fixture(scope="module")
def moto_session(no_network_module):
    """One moto session and one `Aws` for a module (a new session costs ~1 s); tests call `mock.reset()`."""
    from moto import mock_aws

    from pipeline.sagemaker.aws import Aws

    with mock_aws() as mock:
        yield mock, Aws("us-east-1")
