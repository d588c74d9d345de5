"""An inference server on 127.0.0.1 that answers the probe's ``--engine`` (vLLM's OpenAI API: ``/v1/models``,
``/version``, ``/metrics``, ``/v1/completions``) and ``--main-url`` (SGLang's ``/generate``) requests with
hostile answers, one mode per server:

- ``metrics-endless``: ``/metrics`` is a ``200`` without Content-Length that never ends (1 MiB pieces of
  counter lines);
- ``metrics-drip``: ``/metrics`` (status line, headers, body) goes out one byte per second;
- ``metrics-nan`` / ``metrics-inf``: the draft counters are ``NaN`` / ``+Inf``;
- ``position-huge`` / ``position-bad``: a ``position`` label of 100,000 digits / ``"abc"``;
- ``models-deep``: ``/v1/models`` is JSON nested 100,000 levels deep;
- ``completion-endless``: ``/v1/completions`` streams without end (normal ``/metrics``);
- ``generate-endless``: ``/generate`` streams without end (``--main-url``);
- ``refuse``: every request is ``500`` with a body that quotes the request's ``Authorization`` header.

Everything else answers like a vLLM 0.32 server with MTP (K = 1) would.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

NORMAL_METRICS = (b"# HELP vllm:spec_decode_num_drafts_total drafts\n"
                  b'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
                  b'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 10.0\n'
                  b'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7.0\n')


class _Listener(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64


class HostileEngine:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.requests: list[str] = []
        self._httpd: _Listener | None = None

    @property
    def port(self) -> int:
        assert self._httpd is not None
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "HostileEngine":
        handler = type("Handler", (_Handler,), {"engine": self})
        self._httpd = _Listener(("127.0.0.1", 0), handler)
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    engine: HostileEngine
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:
        self._route()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self._route()

    def _route(self) -> None:
        self.engine.requests.append(self.path)
        mode, path = self.engine.mode, self.path.split("?")[0]
        try:
            if mode == "refuse":
                return self._send(500, f"refused; you sent {self.headers.get('Authorization')}".encode())
            if path == "/v1/models":
                if mode == "models-deep":
                    return self._send(200, b"[" * 100_000 + b"]" * 100_000)
                return self._json({"object": "list", "data": [{"id": "m", "owned_by": "vllm"}]})
            if path == "/version":
                return self._json({"version": "0.32.0"})
            if path == "/metrics":
                return self._metrics(mode)
            if path in ("/v1/completions", "/generate") and mode.endswith("endless"):
                return self._endless(b'{"choices": [{"token_ids": [' + b"1, " * (1 << 18))
            if path == "/v1/completions":
                return self._json({"choices": [{"token_ids": [1, 2, 3]}],
                                   "metrics": {"speculative_decoding": {"num_spec_tokens": 1,
                                                                        "per_step_accepted": [1, 0],
                                                                        "per_step_drafted": [1, 1]}}})
            self._send(404, b"not found")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _metrics(self, mode: str) -> None:
        if mode == "metrics-endless":
            return self._endless(NORMAL_METRICS * 4096)
        if mode == "metrics-drip":
            return self._drip(NORMAL_METRICS)
        body = NORMAL_METRICS
        if mode in ("metrics-nan", "metrics-inf"):
            body = body.replace(b"} 10.0", b"} NaN" if mode == "metrics-nan" else b"} +Inf")
        if mode == "position-huge":
            body = body.replace(b'position="0"', b'position="' + b"9" * 100_000 + b'"')
        if mode == "position-bad":
            body = body.replace(b'position="0"', b'position="abc"')
        self._send(200, body, "text/plain; version=0.0.4")

    def _json(self, value: Any) -> None:
        self._send(200, json.dumps(value).encode())

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _endless(self, piece: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        while True:
            self.wfile.write(piece)

    def _drip(self, body: bytes) -> None:
        head = (f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        for i in range(len(head + body)):
            self.wfile.write((head + body)[i:i + 1])
            self.wfile.flush()
            time.sleep(1.0)
