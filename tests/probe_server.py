"""A protocol-compatible stand-in for an SGLang server (``--enable-return-hidden-states``) on
127.0.0.1, serving a fixture model with transformers, for ``probe --main-url`` tests.

Implements ``GET /health``, ``GET /get_model_info`` and ``POST /generate`` with ``input_ids``,
``sampling_params.{temperature (0 only), max_new_tokens}`` and ``return_hidden_states``; the reply
carries ``output_ids`` and ``meta_info.hidden_states`` in SGLang's layout (first entry: the prompt's
rows, then one row per decode step, the last generated token has none). This is a test double of
the wire format, named as such; it is not SGLang.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch


class _Handler(BaseHTTPRequestHandler):
    server_version = "probe-test-server/1"

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def _send(self, code: int, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, {})
        elif self.path == "/get_model_info":
            self._send(200, {"model_path": self.server.model_path, "is_generation": True})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        if self.path != "/generate":
            self._send(404, {"error": "not found"})
            return
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        params = req.get("sampling_params", {})
        if params.get("temperature", 1.0) != 0:
            self._send(400, {"error": "test server only does greedy"})
            return
        model, eos = self.server.model, self.server.eos
        with self.server.lock, torch.no_grad():
            ids = torch.tensor([req["input_ids"]])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=int(params.get("max_new_tokens", 16)), pad_token_id=eos)
            output_ids = out[0, ids.shape[1]:].tolist()
            meta = {"prompt_tokens": ids.shape[1], "completion_tokens": len(output_ids)}
            if req.get("return_hidden_states"):
                full = out[:, :-1]
                h = model.get_decoder()(input_ids=full).last_hidden_state[0]
                p = ids.shape[1]
                if self.server.shift_hidden:  # an off-by-one server: row t holds h_{t+1}
                    h = torch.cat([h[1:], h[-1:]], dim=0)
                meta["hidden_states"] = [h[:p].tolist()] + [row.tolist() for row in h[p:]]
        self._send(200, {"text": "", "output_ids": output_ids, "meta_info": meta})


class ProbeTestServer:
    def __init__(self, model_path: str, shift_hidden: bool = False) -> None:
        from ckptinspect.probe import loader
        from ckptinspect.probe.heads import find_spec

        config = loader.read_config(model_path)
        spec = find_spec(config)
        model = loader.load_main_model(model_path, config, main_model_type=spec.main_model_type,
                                       device_map={"": "cpu"}, dtype=torch.float32, trust_remote_code=False)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.model, self.httpd.model_path, self.httpd.lock = model, model_path, threading.Lock()
        self.httpd.eos = config.get("eos_token_id")
        self.httpd.shift_hidden = shift_hidden
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "ProbeTestServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
