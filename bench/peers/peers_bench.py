#!/usr/bin/env python3
"""bench/peers: Strata beside Redis and Mooncake Store, the same work for each, in one run.

Every side gets the same workload: put then get of distinct keys (one block per call) for each
block size and client count, over a working set larger than the CPU caches. Sides alternate
within each repetition (the order rotates from one repetition to the next) so a noisy machine
hurts all of them alike; the table shows medians over repetitions, beside the ceilings measured
in the same run (ucx_perftest tag_bw per link, memcpy of the working set).

Sides (client in brackets):
  strata/tcp   stratad with UCX_TLS=tcp,self   [C++ libstrata: peers_client]
  strata/shm   stratad with UCX_TLS=shm,self   [C++ libstrata: peers_client]
  redis/tcp    redis-server on 127.0.0.1       [C hiredis: peers_client]
  redis/unix   redis-server's unix socket      [C hiredis: peers_client]
  mooncake/tcp mooncake_master + a mooncake_client holding the memory, protocol=tcp
               [Python: MooncakeDistributedStore.put_from / get_into on registered buffers]
  strata-py/tcp  stratad with UCX_TLS=tcp,self  [Python package strata, publish/fetch on
               registered numpy buffers], the row Mooncake's Python client compares against.

Run it through run.sh, which makes the venv (mooncake, numpy, matplotlib) and finds the build.
"""
import argparse
import importlib.metadata
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = [64 << 10, 1 << 20, 8 << 20]
SMOKE_SIZES = [64 << 10, 1 << 20]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def human(size):
    return f"{size >> 20}MiB" if size >= 1 << 20 else f"{size >> 10}KiB"


class Server:
    """A child process with its output in a log file; terminated (then killed) on close."""

    def __init__(self, args, log, env=None):
        self.log = log
        with open(log, "wb") as f:
            self.p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT,
                                      env={**os.environ, **(env or {})},
                                      start_new_session=True)

    def alive(self):
        return self.p.poll() is None

    def tail(self):
        with open(self.log, "rb") as f:
            return f.read()[-3000:].decode(errors="replace")

    def close(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


class ServerExited(RuntimeError):
    """A server quit while starting; a port taken between free_port() and its bind is one cause."""


def wait_for(pred, what, server, seconds=30):
    end = time.time() + seconds
    while time.time() < end:
        if pred():
            return
        if not server.alive():
            raise ServerExited(f"{what} exited while starting:\n{server.tail()}")
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not start in {seconds} s:\n{server.tail()}")


def start_on_free_ports(start, *args, tries=3):
    """Runs start(*args) again with fresh ports when a server exits while starting: free_port()
    only probes, and a test running beside this one (ctest -j2) may bind the port first."""
    for attempt in range(1, tries + 1):
        try:
            return start(*args)
        except ServerExited as e:
            if attempt == tries:
                raise
            print(f"retrying with fresh ports: {str(e).splitlines()[0]}", file=sys.stderr)


def port_open(port):
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
        return True
    except OSError:
        return False


# --- servers -------------------------------------------------------------------------------

def start_stratad(a, tls, tmp):
    ready = os.path.join(tmp, "ready.json")
    # Host tier twice the working set: puts never wait on eviction.
    cap = f"{max(64, 2 * a.ws_bytes >> 20)}MiB"
    s = Server([a.stratad, "--data-dir", os.path.join(tmp, "data"), "--host-capacity", cap,
                "--log-level", "warn", "--listen", "127.0.0.1:0", "--ready-file", ready],
               os.path.join(tmp, "stratad.log"), {"UCX_TLS": tls})

    def ep():
        try:
            with open(ready) as f:
                return json.load(f).get("endpoint")
        except (OSError, ValueError):
            return None
    wait_for(ep, "stratad", s)
    return [s], {"endpoint": ep()}


def start_redis(a, tmp):
    port = free_port()
    sock = os.path.join(tmp, "redis.sock")
    # No persistence, no eviction: an in-memory store like the others.
    s = Server(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--unixsocket", sock,
                "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
                "--dir", tmp, "--protected-mode", "no", "--loglevel", "warning"],
               os.path.join(tmp, "redis.log"))
    try:
        wait_for(lambda: port_open(port) and os.path.exists(sock), "redis-server", s)
    except RuntimeError:
        s.close()
        raise
    return [s], {"port": port, "socket": sock}


def start_mooncake(a, tmp):
    rpc, meta, metrics, holder_port = free_port(), free_port(), free_port(), free_port()
    # Loopback only: Mooncake's transfer engine otherwise picks the first active interface.
    env = {"MC_TCP_BIND_ADDRESS": "127.0.0.1"}
    master = Server([os.path.join(a.venv, "bin", "mooncake_master"), f"--rpc_port={rpc}",
                     "--rpc_address=127.0.0.1",
                     "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
                     f"--http_metadata_server_port={meta}", "--metrics_host=127.0.0.1",
                     f"--metrics_port={metrics}"],
                    os.path.join(tmp, "mooncake_master.log"), env)
    try:
        # The admin server binds the metrics port last; the master exits if that bind fails.
        wait_for(lambda: all(port_open(p) for p in (rpc, meta, metrics)), "mooncake_master",
                 master)
    except RuntimeError:
        master.close()
        raise
    metadata = f"http://127.0.0.1:{meta}/metadata"
    # The memory holder: a standalone Mooncake client owning the global segment, the
    # counterpart of stratad's host tier and redis-server's heap; benchmark clients mount none,
    # so every put and get crosses the tcp transport to it.
    holder = Server([os.path.join(a.venv, "bin", "mooncake_client"), "--host=127.0.0.1",
                     f"--port={holder_port}",
                     f"--global_segment_size={max(64, 2 * a.ws_bytes >> 20)}MB",
                     f"--master_server_address=127.0.0.1:{rpc}", f"--metadata_server={metadata}",
                     "--protocol=tcp"], os.path.join(tmp, "mooncake_client.log"), env)
    try:
        wait_for(lambda: port_open(holder_port), "mooncake_client", holder)
    except RuntimeError:
        holder.close()
        master.close()
        raise
    time.sleep(0.5)  # its segment is mounted right after its port opens
    for s, what in ((master, "mooncake_master"), (holder, "mooncake_client")):
        if not s.alive():
            holder.close()
            master.close()
            raise ServerExited(f"{what} exited while starting:\n{s.tail()}")
    return [master, holder], {"master": f"127.0.0.1:{rpc}", "metadata": metadata, "env": env}


# --- Python clients ------------------------------------------------------------------------

def py_worker(kind, conn, size, keys, idx, barrier, queue, tls):
    """One Python client process: put `keys` blocks, then get them, timing each call."""
    os.environ["UCX_TLS"] = tls
    os.environ.update(conn.get("env", {}))
    import numpy as np
    try:
        rng = np.random.default_rng(size * 131 + idx)
        src = rng.integers(0, 256, keys * size, dtype=np.uint8)
        dst = np.zeros_like(src)
        if kind == "mooncake":
            from mooncake.store import MooncakeDistributedStore
            st = MooncakeDistributedStore()
            # No global segment of its own (the holder has the memory); a small local buffer,
            # unused by put_from/get_into, which move straight from/to registered memory.
            if st.setup("127.0.0.1", conn["metadata"], 0, 16 << 20, "tcp", "",
                        conn["master"]) != 0:
                raise RuntimeError("mooncake setup failed")
            if st.register_buffer(src.ctypes.data, src.nbytes) or \
                    st.register_buffer(dst.ctypes.data, dst.nbytes):
                raise RuntimeError("mooncake register_buffer failed")
            names = [f"peers:{size}:{idx}:{k}" for k in range(keys)]
            sp, dp = src.ctypes.data, dst.ctypes.data

            def put(k):
                return st.put_from(names[k], sp + k * size, size) == 0

            def get(k):
                return st.get_into(names[k], dp + k * size, size) == size

            def clear():
                st.batch_remove(names, True)
                st.close()
        else:
            import strata
            c = strata.Client(conn["endpoint"], client_name="peers_bench_py")
            ns = c.open_namespace("peers-bench", num_layers=1, num_kv_heads=1, head_dim=64,
                                  dtype="fp16", tokens_per_block=16, tenant="bench")
            c.register_buffer(src)
            c.register_buffer(dst)
            toks = rng.integers(0, 2**32, (keys, 16), dtype=np.uint32)
            tokens = [toks[k] for k in range(keys)]
            srcs = [src[k * size:(k + 1) * size] for k in range(keys)]
            dsts = [dst[k * size:(k + 1) * size] for k in range(keys)]
            ids = [None] * keys

            def put(k):
                r = c.publish(ns, tokens[k], [srcs[k]])
                ids[k] = r.ids[0]
                return r.stored == 1

            def get(k):
                return c.fetch(ns, [ids[k]], [dsts[k]]).fetched == 1

            def clear():
                c.evict(ns, ids, force=True)
                c.unregister_buffer(src)
                c.unregister_buffer(dst)
                c.close()
        out = {}
        for op, fn in (("put", put), ("get", get)):
            lat = []
            barrier.wait()
            t0 = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
            for k in range(keys):
                a = time.perf_counter()
                if not fn(k):
                    raise RuntimeError(f"{kind} {op} of key {k} failed")
                lat.append((time.perf_counter() - a) * 1e6)
            out[op] = (t0, time.perf_counter(), lat)
        ok = bool(np.array_equal(src, dst))
        clear()
        queue.put((idx, ok, out, None))
    except Exception as e:  # reported by the parent, which then fails the run
        barrier.abort()
        queue.put((idx, False, None, repr(e)))


def percentile(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * (len(v) - 1) + 0.5))] if v else 0.0


def run_python_side(kind, conn, a, tls, link):
    ctx = mp.get_context("spawn")  # fresh interpreters: no UCX or Mooncake state across a fork
    rows = []
    for size in a.sizes:
        for nc in a.clients:
            keys = max(1, a.ws_bytes // size // nc)
            barrier, queue = ctx.Barrier(nc), ctx.Queue()
            procs = [ctx.Process(target=py_worker,
                                 args=(kind, conn, size, keys, i, barrier, queue, tls))
                     for i in range(nc)]
            for p in procs:
                p.start()
            res = [queue.get(timeout=600) for _ in procs]
            for p in procs:
                p.join(60)
            errs = [r[3] for r in res if r[3]]
            if errs or not all(r[1] for r in res):
                raise RuntimeError(f"{kind}: {errs or 'got bytes differ from put bytes'}")
            for op in ("put", "get"):
                t0 = min(r[2][op][0] for r in res)
                t1 = max(r[2][op][1] for r in res)
                lat = [x for r in res for x in r[2][op][2]]
                rows.append({"system": "strata" if kind == "strata" else kind,
                             "client": "python", "link": link, "op": op, "size": size,
                             "clients": nc, "ops": len(lat),
                             "gbps": len(lat) * size / (t1 - t0) / 1e9,
                             "p50_us": percentile(lat, 0.5), "p99_us": percentile(lat, 0.99)})
    return rows


# --- C++ clients ---------------------------------------------------------------------------

def run_cxx(a, args, tls):
    cmd = [a.peers_client, "--sizes", ",".join(map(str, a.sizes)),
           "--clients", ",".join(map(str, a.clients)), "--ws-bytes", str(a.ws_bytes),
           "--tls", tls] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200,
                       env={**os.environ, "UCX_TLS": tls})
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


# --- sides ---------------------------------------------------------------------------------

TCP, SHM = "tcp,self", "shm,self"


def side_strata_cxx(link, tls):
    def run(a, tmp):
        servers, conn = start_stratad(a, tls, tmp)
        try:
            return run_cxx(a, ["--system", "strata", "--endpoint", conn["endpoint"],
                               "--link", link, "--min-get-ms", str(a.min_get_ms),
                               "--min-put-ms", str(a.min_put_ms)], tls)
        finally:
            for s in servers:
                s.close()
    return run


def side_redis_cxx(link):
    def run(a, tmp):
        servers, conn = start_on_free_ports(start_redis, a, tmp)
        where = (["--redis-port", str(conn["port"])] if link == "tcp"
                 else ["--redis-socket", conn["socket"]])
        try:
            return run_cxx(a, ["--system", "redis", "--link", link,
                               "--min-get-ms", str(a.min_get_ms),
                               "--min-put-ms", str(a.min_put_ms)] + where, TCP)
        finally:
            for s in servers:
                s.close()
    return run


def side_strata_py(a, tmp):
    servers, conn = start_stratad(a, TCP, tmp)
    try:
        return run_python_side("strata", conn, a, TCP, "tcp")
    finally:
        for s in servers:
            s.close()


def side_mooncake_py(a, tmp):
    servers, conn = start_on_free_ports(start_mooncake, a, tmp)
    try:
        return run_python_side("mooncake", conn, a, TCP, "tcp")
    finally:
        for s in servers:
            s.close()


SIDES = [
    ("strata c++ tcp", side_strata_cxx("tcp", TCP)),
    ("redis c++ tcp", side_redis_cxx("tcp")),
    ("strata python tcp", side_strata_py),
    ("mooncake python tcp", side_mooncake_py),
    ("strata c++ shm", side_strata_cxx("shm", SHM)),
    ("redis c++ unix", side_redis_cxx("unix")),
]


def versions(a):
    v = {}
    try:
        v["strata"] = subprocess.run([a.stratad, "--version"], capture_output=True,
                                     text=True).stdout.strip()
        git = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)),
                              "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        v["strata"] += f" (git {git.stdout.strip()})" if git.returncode == 0 else ""
    except OSError:
        pass
    v["redis"] = subprocess.run(["redis-server", "--version"], capture_output=True,
                                text=True).stdout.split(" sha=")[0].strip()
    for pkg in ("mooncake-transfer-engine-non-cuda",):
        try:
            v["mooncake"] = f"{pkg} {importlib.metadata.version(pkg)}"
        except importlib.metadata.PackageNotFoundError:
            v["mooncake"] = "absent"
    q = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libhiredis-dev"],
                       capture_output=True, text=True)
    v["hiredis"] = q.stdout.strip() or "?"
    return v


# --- report --------------------------------------------------------------------------------

def median_of(runs, key):
    vals = [r[key] for r in runs]
    return statistics.median(vals) if vals else None


def build_table(all_rows, baselines, a):
    """Rows of the ratio table: one per (link, op, size, clients), medians over repetitions."""
    def pick(system, client, link, op, size, nc):
        return [r for r in all_rows if (r["system"], r["client"], r["link"], r["op"], r["size"],
                                        r["clients"]) == (system, client, link, op, size, nc)]
    table = []
    for link, rlink in (("tcp", "tcp"), ("shm", "unix")):
        for op in ("put", "get"):
            for size in a.sizes:
                for nc in a.clients:
                    row = {"link": link, "op": op, "size": size, "clients": nc}
                    for name, (system, client, l) in {
                            "strata": ("strata", "c++", link),
                            "redis": ("redis", "c++", rlink),
                            "strata_py": ("strata", "python", link),
                            "mooncake": ("mooncake", "python", link)}.items():
                        runs = pick(system, client, l, op, size, nc)
                        row[name] = {k: median_of(runs, k) for k in ("gbps", "p50_us", "p99_us")} \
                            if runs else None
                        row[name + "_reps"] = [r["gbps"] for r in runs]
                    tb = [b["gbps"] for b in baselines
                          if b.get("baseline") == "tag_bw" and b["link"] == link
                          and b["size"] == size]
                    row["tag_bw_gbps"] = statistics.median(tb) if tb else None
                    mc = [b["gbps"] for b in baselines if b.get("baseline") == "memcpy"]
                    row["memcpy_gbps"] = statistics.median(mc) if mc else None

                    def ratio(x, y):
                        return row[x]["gbps"] / row[y]["gbps"] \
                            if row[x] and row[y] and row[y]["gbps"] else None
                    row["strata_over_redis"] = ratio("strata", "redis")
                    row["strata_py_over_mooncake"] = ratio("strata_py", "mooncake")
                    table.append(row)
    return table


def fmt(x, spec):
    return format(x, spec) if x is not None else "-"


def print_table(table, ver, a, out):
    w = out.write
    w(f"# bench/peers: {a.reps} repetition(s), working set {a.ws_bytes >> 20} MiB per size and "
      f"client count, sides alternating; C++ get passes at least {a.min_get_ms:g} ms, "
      f"put rounds at least {a.min_put_ms:g} ms\n")
    w("# versions: " + "; ".join(f"{k} {v}" for k, v in ver.items()) + "\n")
    w("# GB/s (p50/p99 us of one call) medians; S/R = Strata C++ / Redis hiredis; "
      "Spy/M = Strata Python / Mooncake Python; link shm: Strata over UCX shm vs Redis over its "
      "unix socket\n")
    hdr = (f"{'link':4} {'op':3} {'block':6} {'cl':>2} | {'strata':>6} {'p50':>7} {'p99':>7} | "
           f"{'redis':>6} {'p50':>7} {'p99':>7} | {'S/R':>5} | {'str-py':>6} {'p50':>7} | "
           f"{'mooncake':>8} {'p50':>7} {'p99':>7} | {'Spy/M':>5} | {'tag_bw':>6} {'memcpy':>6}")
    w(hdr + "\n" + "-" * len(hdr) + "\n")
    for r in table:
        def cols(name, p99=True):
            d = r[name]
            if not d:
                return ["-", "-"] + (["-"] if p99 else [])
            c = [fmt(d["gbps"], ".2f"), fmt(d["p50_us"], ".0f")]
            return c + [fmt(d["p99_us"], ".0f")] if p99 else c
        s, rd, sp, m = cols("strata"), cols("redis"), cols("strata_py", False), cols("mooncake")
        w(f"{r['link']:4} {r['op']:3} {human(r['size']):6} {r['clients']:>2} | "
          f"{s[0]:>6} {s[1]:>7} {s[2]:>7} | {rd[0]:>6} {rd[1]:>7} {rd[2]:>7} | "
          f"{fmt(r['strata_over_redis'], '.2f'):>5} | {sp[0]:>6} {sp[1]:>7} | "
          f"{m[0]:>8} {m[1]:>7} {m[2]:>7} | {fmt(r['strata_py_over_mooncake'], '.2f'):>5} | "
          f"{fmt(r['tag_bw_gbps'], '.2f'):>6} {fmt(r['memcpy_gbps'], '.2f'):>6}\n")
    w("\n# every repetition, GB/s in repetition order (strata | redis | strata-py | mooncake)\n")
    for r in table:
        reps = " | ".join(",".join(f"{x:.2f}" for x in r[n + "_reps"]) or "-"
                          for n in ("strata", "redis", "strata_py", "mooncake"))
        w(f"{r['link']:4} {r['op']:3} {human(r['size']):6} {r['clients']:>2}  {reps}\n")


def write_chart(table, path, a):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 1, figsize=(13, 8.5))
    series = {"tcp": [("strata", "Strata (C++)"), ("redis", "Redis (hiredis)"),
                      ("strata_py", "Strata (Python)"), ("mooncake", "Mooncake (Python)")],
              "shm": [("strata", "Strata (C++, UCX shm)"), ("redis", "Redis (hiredis, unix)")]}
    for ax, link in zip(axes, ("tcp", "shm")):
        rows = [r for r in table if r["link"] == link]
        labels = [f"{r['op']} {human(r['size'])}\n{r['clients']} cl" for r in rows]
        width = 0.8 / len(series[link])
        for i, (key, name) in enumerate(series[link]):
            ax.bar([x + i * width for x in range(len(rows))],
                   [(r[key] or {}).get("gbps") or 0 for r in rows], width, label=name)
        tb = [r["tag_bw_gbps"] or 0 for r in rows]
        ax.plot([x + 0.4 - width / 2 for x in range(len(rows))], tb, "k_", markersize=18,
                label="ucx_perftest tag_bw")
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))], labels, fontsize=7)
        ax.set_ylabel("GB/s (median)")
        ax.set_title(f"link {link}" + (" (Redis over its unix socket)" if link == "shm" else ""))
        ax.legend(fontsize=7, ncol=5)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"bench/peers: put/get of distinct blocks, {a.ws_bytes >> 20} MiB working set, "
                 f"median of {a.reps}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition (CI)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ws-mib", type=int, default=256)
    ap.add_argument("--clients", default="1,4")
    ap.add_argument("--min-get-ms", dest="min_get_ms", type=float, default=300,
                    help="C++ sides: each get pass repeats the working set until it ran this long")
    ap.add_argument("--min-put-ms", dest="min_put_ms", type=float, default=300,
                    help="C++ sides: the working set is put again (the last round removed, "
                         "untimed) until the put rounds ran this long")
    ap.add_argument("--sides", default="", help="comma list of side names (default: all)")
    ap.add_argument("--stratad", required=True)
    ap.add_argument("--peers-client", dest="peers_client", required=True)
    ap.add_argument("--venv", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--png", required=True)
    ap.add_argument("--table", help="also write the table here")
    a = ap.parse_args()
    a.sizes = SMOKE_SIZES if a.smoke else SIZES
    if a.smoke:
        a.reps, a.ws_mib, a.min_get_ms, a.min_put_ms = 1, 8, 0, 20  # two put rounds or more
    a.ws_bytes = a.ws_mib << 20
    a.clients = [int(x) for x in a.clients.split(",")]
    sides = [s for s in SIDES if not a.sides or s[0] in a.sides.split(",")]
    ver = versions(a)
    all_rows, baselines = [], []
    for rep in range(a.reps):
        # Baselines first in each repetition, then the sides in an order rotated by one.
        for link, tls in (("tcp", TCP), ("shm", SHM)):
            base = run_cxx(a, ["--system", "baseline", "--link", link], tls)
            for b in base:
                b["rep"] = rep
            baselines += base
        order = sides[rep % len(sides):] + sides[:rep % len(sides)]
        for name, fn in order:
            tmp = tempfile.mkdtemp(prefix="strata-peers-")
            try:
                t0 = time.time()
                rows = fn(a, tmp)
                print(f"rep {rep + 1}/{a.reps}: {name} done in {time.time() - t0:.1f} s",
                      file=sys.stderr, flush=True)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            for r in rows:
                r["rep"] = rep
            all_rows += rows
    table = build_table(all_rows, baselines, a)
    print_table(table, ver, a, sys.stdout)
    if a.table:
        with open(a.table, "w") as f:
            print_table(table, ver, a, f)
    with open(a.json, "w") as f:
        json.dump({"versions": ver, "reps": a.reps, "ws_bytes": a.ws_bytes, "sizes": a.sizes,
                   "clients": a.clients, "table": table, "rows": all_rows,
                   "baselines": baselines}, f, indent=1)
    write_chart(table, a.png, a)
    print(f"\nwrote {a.json} and {a.png}", file=sys.stderr)


if __name__ == "__main__":
    main()
