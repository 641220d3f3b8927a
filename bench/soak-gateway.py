"""Soak benchmark gateway (BENCHMARK STAND-IN, not the real frutebox gateway): speaks the gateway
side of frutebox-node's WebSocket protocol to one node and keeps N jobs in flight to it for a
given time, whatever happens to the node meanwhile. Streamed and plain jobs alternate.

One JSON line per event on stdout, times in Unix seconds (the fault log's clock):
- {"ev": "conn", "what": "registered" | "closed", "conn": K, "t": ..., "why": ...}: the node's
  WebSocket, numbered in the order the node registered;
- {"ev": "job", "job", "conn", "stream", "sent", "t", "ok", "error", "latency_ms", "tokens"}:
  one job's outcome. A job fails when the node answers an error frame (its text is "error"),
  when its answer is empty, when no answer comes within --job-timeout, or when the WebSocket it
  was sent on closes before its answer (a reconnected node never answers a job of its old
  connection);
- {"ev": "unsent", "t", "why"}: a send that failed because the connection was closing; the job
  never left the gateway and is sent again once the node is back (not a job);
- {"ev": "end", ...}: totals, once the last job sent has an outcome.
While no node is connected no job is sent. Exits 0 when every job was answered.

    python soak-gateway.py --port P --duration S [--in-flight N] [--node ID] [--job-timeout S]
"""
import argparse
import asyncio
import itertools
import json
import sys
import time

import websockets


def out(**kv):
    print(json.dumps(kv), flush=True)


async def main(a):
    conn_ids = itertools.count(1)
    job_ids = itertools.count(1)
    # The node's live connection: (number, websocket), or None while it has none.
    live = {"conn": None}
    up = asyncio.Event()
    # Jobs sent and not yet answered: job id -> (connection number, future of the outcome).
    pending = {}
    stats = {"sent": 0, "answered": 0, "failed": 0, "unsent": 0}

    def fail_conn(k, why):
        for jid, (c, fut) in list(pending.items()):
            if c == k and not fut.done():
                fut.set_result((False, why, None, time.time()))

    async def handler(ws):
        try:
            reg = json.loads(await asyncio.wait_for(ws.recv(), 10))
        except Exception:
            await ws.close()
            return
        if reg.get("type") != "register" or reg.get("id") != a.node:
            await ws.close()
            return
        k = next(conn_ids)
        old = live["conn"]
        if old is not None:
            # A node that registers again has given up its old connection: what was sent on it
            # will never be answered.
            fail_conn(old[0], f"the node registered again (connection {k}) before answering on connection {old[0]}")
            await old[1].close()
        await ws.send(json.dumps({"type": "registered", "id": a.node, "status": "active"}))
        live["conn"] = (k, ws)
        up.set()
        out(ev="conn", what="registered", conn=k, t=time.time())
        chunks = {}
        why = "closed"
        try:
            async for raw in ws:
                try:
                    msg = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(msg, dict):
                    continue
                typ, jid = msg.get("type"), msg.get("id")
                if typ not in ("chunk", "result", "error") or jid not in pending:
                    continue
                c, fut = pending[jid]
                if c != k or fut.done():
                    continue
                now = time.time()
                if typ == "chunk":
                    chunks[jid] = chunks.get(jid, 0) + 1
                elif typ == "error":
                    fut.set_result((False, str(msg.get("message") or msg.get("error") or msg), None, now))
                elif not msg.get("content"):
                    fut.set_result((False, f"empty answer ({chunks.get(jid, 0)} chunks)", None, now))
                else:
                    fut.set_result((True, None, msg.get("tokens"), now))
        except websockets.exceptions.ConnectionClosed as e:
            why = f"closed ({e})"
        finally:
            if live["conn"] is not None and live["conn"][0] == k:
                live["conn"] = None
                up.clear()
            fail_conn(k, f"the node's WebSocket (connection {k}) closed before the answer")
            out(ev="conn", what="closed", conn=k, t=time.time(), why=why)

    async def one_job(k, ws, stream):
        jid = f"soak-{next(job_ids)}"
        fut = asyncio.get_running_loop().create_future()
        pending[jid] = (k, fut)
        prompt = f"Question {jid}: explain in a few sentences why a sandbox should use more than one independent layer of defence."
        sent = time.time()
        try:
            await ws.send(json.dumps({"type": "job", "id": jid, "model": a.model, "stream": stream,
                                      "messages": [{"role": "user", "content": prompt}]}))
        except websockets.exceptions.ConnectionClosed as e:
            del pending[jid]
            stats["unsent"] += 1
            out(ev="unsent", t=time.time(), why=str(e))
            return False
        stats["sent"] += 1
        try:
            ok, error, tokens, t = await asyncio.wait_for(fut, a.job_timeout)
        except asyncio.TimeoutError:
            ok, error, tokens, t = False, f"no answer within {a.job_timeout:.0f} s", None, time.time()
        del pending[jid]
        stats["answered" if ok else "failed"] += 1
        out(ev="job", job=jid, conn=k, stream=stream, sent=sent, t=t, ok=ok, error=error,
            latency_ms=round((t - sent) * 1000, 1), tokens=tokens)
        return True

    async def worker(i, until):
        stream = bool(i % 2)
        while time.time() < until:
            try:
                await asyncio.wait_for(up.wait(), max(0.01, until - time.time()))
            except asyncio.TimeoutError:
                break
            k, ws = live["conn"]
            if await one_job(k, ws, stream):
                stream = not stream
            else:
                await asyncio.sleep(0.05)

    async with websockets.serve(handler, "127.0.0.1", a.port, max_size=None):
        await asyncio.wait_for(up.wait(), a.connect_timeout)
        t0 = time.time()
        out(ev="start", t=t0, in_flight=a.in_flight, duration_s=a.duration, job_timeout_s=a.job_timeout)
        await asyncio.gather(*(worker(i, t0 + a.duration) for i in range(a.in_flight)))
        out(ev="end", t=time.time(), **stats)
    return 0 if stats["failed"] == 0 else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--duration", type=float, required=True, help="seconds of sending jobs")
    p.add_argument("--in-flight", type=int, default=2, help="jobs in flight at once (frutebox-node takes 4 by default)")
    p.add_argument("--node", default="sealed")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--job-timeout", type=float, default=60)
    p.add_argument("--connect-timeout", type=float, default=300, help="how long to wait for the node's first registration")
    sys.exit(asyncio.run(main(p.parse_args())))
