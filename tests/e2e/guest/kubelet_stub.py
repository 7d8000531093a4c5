#!/usr/bin/python3
"""Stand-in for the kubelet's read-only API: GET /pods serves the pods file (a v1 PodList).

The file is re-read on every request, so scenarios change what the "kubelet" reports by
rewriting it (memqos_e2e.write_pods does that atomically). If <pods-file>.status exists and holds
an HTTP status code, every /pods request is answered with that code and an empty body, so
scenarios can simulate a failing kubelet. GET /healthz answers "ok".
"""
import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

EMPTY = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods-file", required=True)
    ap.add_argument("--address", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=10255)
    args = ap.parse_args()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code, body=b"", ctype="application/json"):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self):
            path = self.path.split("?", 1)[0].rstrip("/")
            if path == "/healthz":
                return self._send(200, b"ok", "text/plain")
            if path != "/pods":
                return self._send(404, b"not found", "text/plain")
            try:
                with open(args.pods_file + ".status") as f:
                    return self._send(int(f.read().strip() or 500))
            except FileNotFoundError:
                pass
            try:
                with open(args.pods_file, "rb") as f:
                    body = f.read()
            except FileNotFoundError:
                body = json.dumps(EMPTY).encode()
            self._send(200, body)

        do_HEAD = do_GET

        def log_message(self, fmt, *a):
            print("kubelet-stub: " + fmt % a, flush=True)

    os.makedirs(os.path.dirname(os.path.abspath(args.pods_file)), exist_ok=True)
    server = ThreadingHTTPServer((args.address, args.port), Handler)
    print(f"kubelet-stub: serving {args.pods_file} on {args.address}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
