"""STAND-IN GATEWAY for the sealnode demo and tests. Not the real frutebox gateway.

Runs on the host, outside the cell, and speaks just enough of the gateway side of
frutebox-node's WebSocket protocol (JSON frames: the node sends `register`; we answer
`registered`, send one plain `job` and one streamed `job`; the node answers `chunk`s and
`result`s) to prove a job's round trip through sealnode's declared egress. Prints what it
receives, exits 0 once both results arrived with content, non-zero on error or timeout.

    python standin-gateway.py --port 18765 [--host 127.0.0.1] [--model standin] [--timeout 90]
                              [--verdict-file FILE] [--tee-challenge NONCE]

Both jobs are sent at once: the node works on them concurrently, as it does for a gateway.

--verdict-file FILE: once the verdict is known, write it to FILE (`ok`, or the error) and keep
serving, the node's connection open, until SIGTERM or SIGINT; then exit with the verdict. A
caller (scripts/demo) stops the node first, so it never sees its gateway go away: without
this, the gateway's exit makes the node reconnect to a closed port (sealnode warns
`egress connect failed ... ECONNREFUSED`, the node logs `disconnected`).

--tee-challenge NONCE: the `registered` frame carries it as `tee_challenge` (the confidential
lane's challenge); the verdict then also needs the node's `attestation` frame, with evidence
in both `cpu_tee` and `gpu_tee` and the challenge's first 16 characters echoed. Printed as
`gateway: <- attestation cpu_tee=... gpu_tee=...`.
"""
import argparse
import asyncio
import json
import signal
import sys

import websockets


async def serve(port, model, timeout, host="127.0.0.1", verdict_file=None, tee_challenge=None):
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    stop = asyncio.Event()
    if verdict_file:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

    async def finish(ws, verdict):
        if not done.done():
            done.set_result(verdict)
        if verdict_file:
            # Holding: the connection stays open until the node goes (or we are stopped).
            await ws.wait_closed()

    async def handler(ws):
        reg = json.loads(await ws.recv())
        if reg.get("type") != "register":
            await finish(ws, f"first frame was {reg.get('type')!r}, not register")
            return
        print(f"gateway: node {reg['id']!r} registered (models {reg['models']}, "
              f"{reg['compute_type']}, {reg['cpu_cores']} cores)", flush=True)
        registered = {"type": "registered", "id": reg["id"], "status": "active"}
        if tee_challenge:
            registered["tee_challenge"] = tee_challenge
        await ws.send(json.dumps(registered))
        attested = [] if tee_challenge else None
        jobs = {
            "job-plain": {"type": "job", "id": "job-plain", "model": model,
                          "messages": [{"role": "user", "content": "What is a sealed node?"}]},
            "job-stream": {"type": "job", "id": "job-stream", "model": model, "stream": True,
                           "messages": [{"role": "user", "content": "Stream me an answer."}]},
        }
        for j in jobs.values():
            print(f"gateway: -> {j['id']} ({'streamed' if j.get('stream') else 'plain'}): {j['messages'][0]['content']}", flush=True)
            await ws.send(json.dumps(j))
        chunks, results = {}, {}

        async def complete():
            # Both results in (and the attestation, when one was asked for): the verdict.
            if set(results) != set(jobs) or attested == []:
                return False
            ok = all(r["content"] for r in results.values()) and \
                "".join(chunks.get("job-stream", [])) == results["job-stream"]["content"]
            await finish(ws, None if ok else f"bad results: {results} chunks: {chunks}")
            return True

        async for raw in ws:
            msg = json.loads(raw)
            kind = msg.get("type")
            if kind == "chunk":
                chunks.setdefault(msg["id"], []).append(msg["text"])
            elif kind == "result":
                results[msg["id"]] = msg
                streamed = "".join(chunks.get(msg["id"], []))
                print(f"gateway: <- {msg['id']} result: {msg['content']!r}"
                      + (f" (streamed as {len(chunks.get(msg['id'], []))} chunks: {streamed!r})" if streamed else "")
                      + f" backend={msg.get('backend')}", flush=True)
                if await complete():
                    return
            elif kind == "attestation":
                print(f"gateway: <- attestation cpu_tee={msg.get('cpu_tee')} gpu_tee={msg.get('gpu_tee')} "
                      f"echo={msg.get('challenge_echo')}", flush=True)
                if attested is None:
                    await finish(ws, "an attestation frame nobody asked for")
                    return
                if not (msg.get("cpu_tee") and msg.get("gpu_tee")) or msg.get("challenge_echo") != tee_challenge[:16]:
                    await finish(ws, f"bad attestation frame: {msg}")
                    return
                attested.append(msg)
                if await complete():
                    return
            elif kind == "error":
                await finish(ws, f"node reported an error: {msg}")
                return

    async with websockets.serve(handler, host, port):
        print(f"gateway: listening on {host}:{port}", flush=True)
        stopped = asyncio.ensure_future(stop.wait())
        first, _ = await asyncio.wait({done, stopped}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if done in first:
            err = done.result()
        elif stopped in first:
            err = "stopped before both results arrived"
        else:
            err = f"no results within {timeout}s"
        if err:
            print(f"gateway: FAILED: {err}", flush=True)
        else:
            print("gateway: job round trip complete", flush=True)
        if verdict_file:
            with open(verdict_file, "w") as f:
                f.write(f"{err}\n" if err else "ok\n")
            await stop.wait()
        stopped.cancel()
    return 1 if err else 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=18765)
    p.add_argument("--model", default="standin")
    p.add_argument("--timeout", type=float, default=90)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (tests: a non-loopback one)")
    p.add_argument("--verdict-file", help="write the verdict here, then keep serving until SIGTERM")
    p.add_argument("--tee-challenge", help="send this challenge in `registered` and require the node's attestation")
    a = p.parse_args()
    sys.exit(asyncio.run(serve(a.port, a.model, a.timeout, a.host, a.verdict_file,
                               a.tee_challenge)))


if __name__ == "__main__":
    main()
