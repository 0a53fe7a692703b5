"""A real local HTTP server on a free loopback port, answering from a table (path -> status, JSON; for a POST a
callable JSON is called with the request's JSON body)."""
from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def serve(routes: dict, require_bearer: str | None = None):
    seen: list[tuple[str, str | None]] = []

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            auth = self.headers.get("Authorization")
            seen.append((self.path, auth))
            if require_bearer and auth != f"Bearer {require_bearer}":
                return self._send(401, {"error": "unauthorized"})
            status, body = routes.get(self.path, (404, {"error": "not found"}))
            if callable(body):
                body = body()
            self._send(status, body)

        def do_POST(self):  # a route's callable gets the request's JSON body
            sent = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
            seen.append((self.path, self.headers.get("Authorization")))
            status, body = routes.get(self.path, (404, {"error": "not found"}))
            if callable(body):
                body = body(sent)
            self._send(status, body)

        def _send(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()
        srv.server_close()
