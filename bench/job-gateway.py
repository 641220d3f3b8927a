"""Job benchmark gateway (BENCHMARK STAND-IN, not the real frutebox gateway): speaks the gateway
side of frutebox-node's WebSocket protocol to two nodes at once, one bare and one sealed, and
sends them the same jobs in alternating order (A B, B A, ...), one job in flight at a time, so a
drift of the shared machine falls on both alike. Per job it prints one JSON line: job latency
(job sent -> result received), for streamed jobs time to first chunk and the gaps between
chunks, and the node's token count. Exits 0 when every job returned content.

    python job-gateway.py --port P --rounds R [--nodes bare,sealed] [--host 127.0.0.1] [--timeout S]
"""
import argparse
import asyncio
import json
import statistics
import sys
import time

import websockets


async def main(a):
    names = a.nodes.split(",")
    nodes, inbox = {}, {n: asyncio.Queue() for n in names}
    all_in = asyncio.Event()

    async def handler(ws):
        reg = json.loads(await ws.recv())
        nid = reg.get("id")
        if reg.get("type") != "register" or nid not in inbox or nid in nodes:
            await ws.close()
            return
        await ws.send(json.dumps({"type": "registered", "id": nid, "status": "active"}))
        nodes[nid] = ws
        if set(nodes) == set(names):
            all_in.set()
        async for raw in ws:
            msg = json.loads(raw)
            if msg.get("type") in ("chunk", "result", "error"):
                inbox[nid].put_nowait((time.perf_counter(), msg))

    async def job(nid, jid, stream, prompt):
        q = inbox[nid]
        t0 = time.perf_counter()
        await nodes[nid].send(json.dumps({"type": "job", "id": jid, "model": a.model, "stream": stream,
                                          "messages": [{"role": "user", "content": prompt}]}))
        chunks = []
        while True:
            t, msg = await q.get()
            if msg.get("id") != jid:
                continue
            if msg["type"] == "chunk":
                chunks.append(t)
            elif msg["type"] == "error":
                raise RuntimeError(f"{nid}: {msg}")
            else:
                gaps = [(b - c) * 1000 for c, b in zip(chunks, chunks[1:])]
                return {"node": nid, "job": jid, "stream": stream, "latency_ms": (t - t0) * 1000,
                        "first_chunk_ms": (chunks[0] - t0) * 1000 if chunks else None,
                        "chunk_gap_ms": statistics.median(gaps) if gaps else None,
                        "chunks": len(chunks), "tokens": msg.get("tokens"),
                        "compute_ms": msg.get("compute_ms"), "content": msg.get("content", "")}

    async with websockets.serve(handler, a.host, a.port, max_size=None):
        await asyncio.wait_for(all_in.wait(), a.timeout)
        ok = True
        for r in range(a.rounds + 1):  # round 0 warms both up and is not printed
            prompt = f"Question {r}: explain in a few sentences why a sandbox should use more than one independent layer of defence."
            order = names if r % 2 == 0 else names[::-1]
            for stream in (True, False):
                for nid in order:
                    res = await asyncio.wait_for(job(nid, f"{nid}-{r}-{int(stream)}", stream, prompt), a.timeout)
                    ok &= bool(res["content"])
                    if r:
                        res["round"] = r
                        print(json.dumps(res), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (a container's bridge: 0.0.0.0)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--nodes", default="bare,sealed")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--timeout", type=float, default=180)
    sys.exit(asyncio.run(main(p.parse_args())))
