"""A role for tests/vm/limits.sh: does one thing to its own cgroup leaf, then proves the other
role still answers. Runs sealed (node role), as `python -I -u limits-role.py MODE`.

  oom        first run: allocate until the kernel's OOM killer kills the role (memory_max_mb);
             the restart (scratch survives a role restart) asks the engine and prints
             "engine answered 200"
  forkbomb   start threads until pids_max refuses one, print "pids refused after N", then ask
             the engine while holding them
  cpu        two busy processes forever (cpu_max throttles them)
  fill       write /scratch/fill until ENOSPC (scratch_max_mb), print "scratch full after N MiB"
  cache      write /scratch/cache (400 MiB, page cache charged to the leaf), print "cached N MiB",
             then read it again and again (a lower memory_max_mb has it to reclaim)
"""
import os
import sys
import threading
import time
import urllib.request


def ask_engine():
    for _ in range(20):
        try:
            with urllib.request.urlopen("http://127.0.0.1:11434/", timeout=5) as r:
                print(f"engine answered {r.status}", flush=True)
                return
        except OSError as e:
            print(f"engine not answering: {e}", flush=True)
            time.sleep(0.5)


def main(mode):
    if mode == "oom":
        if os.path.exists("/scratch/oomed"):
            ask_engine()
        else:
            open("/scratch/oomed", "w").close()
            print("allocating", flush=True)
            hog = []
            while True:
                hog.append(bytearray(16 << 20))  # zero-filled: every page touched
    elif mode == "forkbomb":
        held = []
        stop = threading.Event()
        try:
            while True:
                t = threading.Thread(target=stop.wait)
                t.start()
                held.append(t)
        except RuntimeError as e:
            print(f"pids refused after {len(held)} threads: {e}", flush=True)
        ask_engine()
    elif mode == "cpu":
        if os.fork() == 0:
            while True:
                pass
        while True:
            pass
    elif mode == "fill":
        n = 0
        try:
            with open("/scratch/fill", "wb") as f:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
                    n += 1
        except OSError as e:
            print(f"scratch full after {n} MiB: {e}", flush=True)
    elif mode == "cache":
        n = 400
        with open("/scratch/cache", "wb") as f:
            for _ in range(n):
                f.write(os.urandom(1 << 20))
        print(f"cached {n} MiB", flush=True)
        while True:
            with open("/scratch/cache", "rb") as f:
                while f.read(1 << 20):
                    pass
            time.sleep(0.5)
    while True:
        time.sleep(1000)


if __name__ == "__main__":
    main(sys.argv[1])
