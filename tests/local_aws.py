"""AWS APIs on 127.0.0.1 for the tests: moto's server mode, one per test module."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's server on a free port of 127.0.0.1, stopped on exit; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer  # a second and a half to import: only where a test needs it

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
