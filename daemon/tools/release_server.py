"""A release server for the fleet demo and tests: Python's http.server over a directory, in a thread,
on a free loopback port (it ignores Range, as a plain on-site server might; the fetcher's own
tests run nginx for Range and ETag). `requests` lists every path asked for."""

from __future__ import annotations

import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_LOOPBACK = "127.0.0.1"


class _Handler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's name)
        self.server.requests.append(self.path)


class ReleaseServer:
    def __init__(self, root: Path):
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.httpd = ThreadingHTTPServer((_LOOPBACK, 0), partial(_Handler, directory=str(root)))
        self.httpd.requests = []
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="release-server", daemon=True)
        self.thread.start()

    @property
    def requests(self) -> list[str]:
        return self.httpd.requests

    def url(self, path: str) -> str:
        return f"http://{_LOOPBACK}:{self.httpd.server_port}/{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "ReleaseServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
