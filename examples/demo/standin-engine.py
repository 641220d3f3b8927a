"""STAND-IN ENGINE for the sealnode demo and tests. Not Ollama, not a model.

It speaks the part of Ollama's HTTP API that frutebox-node uses (POST /api/chat, plain JSON
or NDJSON streaming; GET / answers "Ollama is running" like Ollama does, for sealnode's HTTP
readiness check) and answers deterministically, so a job can travel
gateway -> node -> engine -> node -> gateway on a machine without a GPU or model weights.
It runs inside sealnode's engine sandbox (stdlib only, no network beyond its own port).

    python standin-engine.py [--port 11434]
"""
import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def answer(messages):
    last = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
    return f"Hello from the sealed stand-in engine. You asked: {last}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, fmt, *args):  # keep the supervisor's log readable
        pass

    def do_GET(self):
        body = b"Ollama is running (sealnode stand-in)"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        if self.path != "/api/chat":
            self.send_error(404)
            return
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        text = answer(req.get("messages", []))
        model = req.get("model", "standin")
        counts = {"prompt_eval_count": sum(len(m.get("content", "")) for m in req.get("messages", [])) // 4,
                  "eval_count": len(text) // 4}
        if req.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.end_headers()
            words = text.split(" ")
            for i, w in enumerate(words):
                piece = w if i == 0 else " " + w
                line = {"model": model, "message": {"role": "assistant", "content": piece}, "done": False}
                self.wfile.write((json.dumps(line) + "\n").encode())
                self.wfile.flush()
            done = {"model": model, "message": {"role": "assistant", "content": ""}, "done": True, **counts}
            self.wfile.write((json.dumps(done) + "\n").encode())
        else:
            body = json.dumps({"model": model, "message": {"role": "assistant", "content": text},
                               "done": True, **counts}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=11434)
    a = p.parse_args()
    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
