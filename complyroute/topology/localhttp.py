"""HTTP over a unix domain socket: how the control plane reads what listens on no port.

An enforcement point's Envoy admin interface and its OPA's REST API, diagnostics and decision
port are unix sockets in a folder only the point's own processes can open (topology/plan.py,
Endpoint.unix): no peer, and no local process of another user, can connect to them. Their
URLs are `http+unix://<the socket's path, percent-encoded><request path>`, which this module
reads with the standard library's HTTP client over an AF_UNIX connection.
"""

from __future__ import annotations

import http.client
import socket
import urllib.parse

SCHEME = "http+unix"


def url(path: str) -> str:
    """The base URL of the HTTP server on the unix socket `path`."""
    return f"{SCHEME}://{urllib.parse.quote(path, safe='')}"


def is_local(address: str) -> bool:
    return address.startswith(f"{SCHEME}://")


class UnixConnection(http.client.HTTPConnection):
    """An HTTP/1.1 connection whose transport is the unix socket `path`."""

    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def request(address: str, method: str = "GET", timeout: float = 2.0, body: bytes | None = None) -> tuple[int, bytes]:
    """(status, body) of one request to an http+unix URL; OSError when nothing answers."""
    parts = urllib.parse.urlsplit(address)
    if parts.scheme != SCHEME:
        raise ValueError(f"not an {SCHEME} URL: {address!r}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = UnixConnection(urllib.parse.unquote(parts.netloc), timeout)
    try:
        connection.request(method, target, body=body)
        answer = connection.getresponse()
        return answer.status, answer.read()
    except http.client.HTTPException as error:
        raise OSError(f"{address}: {error}") from error
    finally:
        connection.close()
