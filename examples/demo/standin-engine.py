"""STAND-IN ENGINE for the sealnode demo and tests. Not Ollama, not a model.

It speaks the part of Ollama's HTTP API that frutebox-node uses (POST /api/chat, plain JSON
or NDJSON streaming; GET / answers "Ollama is running" like Ollama does, for sealnode's HTTP
readiness check) and answers deterministically, so a job can travel
gateway -> node -> engine -> node -> gateway on a machine without a GPU or model weights.
It runs inside sealnode's engine sandbox (stdlib only, no network beyond its own port).

    python standin-engine.py [--port 11434] [--ollama-shape]

With --ollama-shape it also has Ollama's process shape: the server on --port spawns a runner
child (this script again, with --runner) that listens on a random loopback port, the way
`ollama serve` starts `ollama runner --port N`, and proxies every chat request to it. Still a
stand-in: no model, the same deterministic answers.
"""
import argparse
import http.client
import json
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RUNNER_PORT = None


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
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if RUNNER_PORT is not None:
            return self.proxy(body)
        req = json.loads(body or b"{}")
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


    def proxy(self, body):
        """Ollama's shape: the server hands the request to its runner on loopback."""
        c = http.client.HTTPConnection("127.0.0.1", RUNNER_PORT, timeout=60)
        c.request("POST", "/api/chat", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        self.send_response(r.status)
        for k in ("Content-Type", "Content-Length"):
            if r.getheader(k):
                self.send_header(k, r.getheader(k))
        self.end_headers()
        while True:
            chunk = r.readline()
            if not chunk:
                break
            self.wfile.write(chunk)
            self.wfile.flush()
        c.close()


def main():
    global RUNNER_PORT
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=11434)
    p.add_argument("--ollama-shape", action="store_true")
    p.add_argument("--runner", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.runner:
        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        print(f"RUNNER-PORT {srv.server_address[1]}", flush=True)
        srv.serve_forever()
        return
    if a.ollama_shape:
        runner = subprocess.Popen([sys.executable, "-I", "-u", __file__, "--runner"], stdout=subprocess.PIPE, text=True)
        line = runner.stdout.readline().split()
        RUNNER_PORT = int(line[1])
        print(f"stand-in runner on 127.0.0.1:{RUNNER_PORT} (pid {runner.pid})", flush=True)
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    # One line on stdout, as a real engine logs its start (sealnode re-emits it tagged).
    print(f"stand-in engine listening on 127.0.0.1:{a.port}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
