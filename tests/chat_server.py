"""A real chat-completions endpoint on 127.0.0.1 for tests of API opponents (OpenAI-compatible shape)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Reply = tuple[int, dict] | tuple[int, dict, dict[str, str]]  # (HTTP status, JSON body[, extra headers])


@dataclass
class ChatServer:
    """A chat-completions endpoint whose replies come from `behaviour(request_number, headers, body)`; every
    request (a POST, or the GET a client may turn a redirected POST into) is recorded with its method."""

    url: str
    behaviour: Callable[[int, dict, dict], Reply] | None = None
    requests: list[dict] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    """Records each request on the server's ChatServer and answers with its behaviour's (status, JSON body)."""

    def do_POST(self) -> None:
        self._answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

    def do_GET(self) -> None:
        self._answer({})

    def _answer(self, body: dict) -> None:
        chat: ChatServer = self.server.chat
        chat.requests.append({"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body})
        status, payload, *extra = chat.behaviour(len(chat.requests), dict(self.headers), body)
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (extra[0] if extra else {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client timed out and hung up
            pass

    def log_message(self, *args) -> None:
        """Keep the test output quiet."""


@contextlib.contextmanager
def serve(behaviour: Callable[[int, dict, dict], Reply] | None = None) -> Iterator[ChatServer]:
    """A ThreadingHTTPServer on a free port of 127.0.0.1, serving in a daemon thread until the block ends."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.chat = ChatServer(url=f"http://127.0.0.1:{httpd.server_address[1]}/v1", behaviour=behaviour)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd.chat
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def completion(content: str) -> dict:
    """A chat-completions response body carrying `content`."""
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
