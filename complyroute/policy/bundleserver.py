"""The bundle server: serves each enforcement point's OPA bundle (bundles.py) from a folder.

OPA's bundle plugin asks for its bundle with the ETag it holds (If-None-Match) and, once the
server has said it can (Content-Type application/vnd.openpolicyagent.bundles), with
`Prefer: wait=<seconds>`: long polling. The server then holds the request until the bundle's
bytes change or the wait is over (304), so a bundle written by `make reload-policy` reaches
every OPA within a watch interval, and idle OPAs cost one open request each.

With mutual TLS, only the deployment's parts connect: a point's OPA gets its own bundle
only (the identity in its certificate names the point), the control plane /health. Without
it (a manifest's `security.mtls: false`), the server listens on loopback in plain HTTP, as
every other part then does.

Python's standard HTTP server: the protocol is plain GETs of files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import ssl
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# Standard library only, and spiffe.py: on Kubernetes this module runs from the official Python
# image, mounted from a ConfigMap beside spiffe.py (runtime/kubernetes/render.py, Renderer.bundle_server).
from complyroute.trust import spiffe

LONG_POLLING = "application/vnd.openpolicyagent.bundles"
BUNDLE_PATH = re.compile(r"^/bundles/([A-Za-z0-9._-]+)\.tar\.gz$")
# How often the folder is looked at for new bundles; a reload's propagation waits up to this.
WATCH_INTERVAL = 0.02
# A look is one stat of the folder: a bundle arrives by a rename into it (files.write_whole; on
# Kubernetes the kubelet renames the projected volume's ..data link), which changes the folder's
# mtime. Its files are read when that changed, for RECENT_NS after it did (the mtime ticks
# coarsely: a second rename within one tick leaves it as it was), and every FULL_SCAN_INTERVAL
# whatever it says. Reading them on every look cost the idle server 8-9 ms of CPU a second
# here, a stat alone 3-3.5 (mostly the wake-up).
RECENT_NS = 1_000_000_000
FULL_SCAN_INTERVAL = 1.0
# The longest wait a request may ask for (OPA asks its long_polling_timeout_seconds).
MAX_WAIT = 300


class Bundles:
    """The folder's bundles as last read (name -> (etag, bytes)), and a condition that is
    notified whenever one changes."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.changed = threading.Condition()
        self._seen: dict[str, tuple[float, int]] = {}
        self._bundles: dict[str, tuple[str, bytes]] = {}
        self.scan()

    def scan(self) -> None:
        updated = {}
        for path in self.folder.glob("*.tar.gz"):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            name = path.name.removesuffix(".tar.gz")
            if self._seen.get(name) != (stat.st_mtime_ns, stat.st_ino):
                content = path.read_bytes()
                updated[name] = ((stat.st_mtime_ns, stat.st_ino), (f'"{hashlib.sha256(content).hexdigest()[:32]}"', content))
        if updated:
            with self.changed:
                for name, (seen, bundle) in updated.items():
                    self._seen[name] = seen
                    self._bundles[name] = bundle
                self.changed.notify_all()

    def watch(self) -> None:
        seen, scanned = None, time.monotonic()
        while True:
            time.sleep(WATCH_INTERVAL)
            try:
                stat = os.stat(self.folder)
                folder = (stat.st_mtime_ns, stat.st_ino)
                recent = time.time_ns() - stat.st_mtime_ns < RECENT_NS
            except OSError:
                folder, recent = None, True
            if folder != seen or recent or time.monotonic() - scanned >= FULL_SCAN_INTERVAL:
                seen, scanned = folder, time.monotonic()
                self.scan()

    def get(self, name: str, etag: str | None, wait: float) -> tuple[str, bytes] | None:
        """The bundle, once its ETag differs from `etag` (at once, or within `wait` seconds);
        None when it has not changed by then, or does not exist."""
        deadline = time.monotonic() + wait
        with self.changed:
            while True:
                bundle = self._bundles.get(name)
                if bundle and bundle[0] != etag:
                    return bundle
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(left)


def prefer_wait(header: str | None) -> float:
    """The seconds of a `Prefer: ...;wait=N` header (0 without one)."""
    for preference in (header or "").split(";"):
        key, _, value = preference.strip().partition("=")
        if key.lower() == "wait" and value.isdigit():
            return min(float(value), MAX_WAIT)
    return 0.0


def peer_identity(connection) -> str | None:
    """The URI SAN of a verified client certificate (None on plain HTTP)."""
    if not isinstance(connection, ssl.SSLSocket):
        return None
    names = (connection.getpeercert() or {}).get("subjectAltName", ())
    return next((value for kind, value in names if kind == "URI"), None)


def handler(bundles: Bundles, tls: bool):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "complyroute-bundles"
        # A connection idle (or sending) this long between requests is closed.
        timeout = MAX_WAIT + 30

        def log_message(self, format, *args):  # one line per request would be noise
            pass

        def answer(self, status: int, body: bytes, content_type: str, headers: dict | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def refuse(self, status: HTTPStatus, code: str, message: str) -> None:
            self.answer(status, json.dumps({"code": code, "message": message}).encode(), "application/json")

        def do_GET(self):
            peer = peer_identity(self.connection)
            if self.path == "/health":
                if tls and peer != spiffe.CONTROL:
                    return self.refuse(HTTPStatus.FORBIDDEN, "PEER_NOT_ALLOWED", "only the control plane asks for /health")
                return self.answer(200, b'{"status":"ok"}', "application/json")
            match = BUNDLE_PATH.match(self.path)
            if not match:
                return self.refuse(HTTPStatus.NOT_FOUND, "NOT_FOUND", "bundles are at /bundles/<point>.tar.gz")
            name = match.group(1)
            if tls and peer != spiffe.spiffe_id("point", name):
                return self.refuse(HTTPStatus.FORBIDDEN, "PEER_NOT_ALLOWED", "a point reads its own bundle only")
            wait = prefer_wait(self.headers.get("Prefer"))
            bundle = bundles.get(name, self.headers.get("If-None-Match"), wait)
            if bundle is None:
                if self.headers.get("If-None-Match") is None:
                    return self.refuse(HTTPStatus.NOT_FOUND, "NOT_FOUND", f"no bundle for {name}")
                self.send_response(304)
                self.send_header("ETag", self.headers["If-None-Match"])
                self.send_header("Content-Length", "0")
                return self.end_headers()
            etag, content = bundle
            # Answering in the long-polling type tells OPA this server holds requests.
            self.answer(200, content, LONG_POLLING, {"ETag": etag})

        def do_POST(self):
            self.refuse(HTTPStatus.METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED", "the bundle server only serves GET")

        do_PUT = do_DELETE = do_PATCH = do_POST

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # How long a connecting client may take over its TLS handshake.
    HANDSHAKE_TIMEOUT = 5.0

    def __init__(self, address: tuple[str, int], handler_class, context: ssl.SSLContext | None):
        super().__init__(address, handler_class)
        self.context = context

    def finish_request(self, request, client_address):
        # The handshake runs in the connection's own thread: a client that connects and says
        # nothing holds that thread until the timeout, not the server's accept loop.
        if self.context is not None:
            request.settimeout(self.HANDSHAKE_TIMEOUT)
            try:
                request = self.context.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):
                request.close()
                return
        super().finish_request(request, client_address)


def serve(folder: Path, address: str, port: int, cert: str | None = None, key: str | None = None, ca: str | None = None) -> None:
    bundles = Bundles(folder)
    context = None
    if cert is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_cert_chain(cert, key)
        context.load_verify_locations(ca)
    server = Server((address, port), handler(bundles, tls=context is not None), context)
    threading.Thread(target=bundles.watch, daemon=True).start()
    server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m complyroute.policy.bundleserver", description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--ca")
    args = parser.parse_args(argv)
    serve(args.folder, args.address, args.port, args.cert, args.key, args.ca)


if __name__ == "__main__":
    main()
