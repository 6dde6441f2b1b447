"""Fixtures: a real stratad on an ephemeral loopback port (STRATAD_BIN names the binary)."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest


class Daemon:
    def __init__(self, config: str = "host_tier:\n  capacity: 64MiB\n", extra_args=()):
        binary = os.environ.get("STRATAD_BIN") or shutil.which("stratad")
        if not binary:
            pytest.skip("STRATAD_BIN is not set and no stratad is on PATH")
        self.dir = tempfile.mkdtemp(prefix="strata-pytest-")
        config_path = os.path.join(self.dir, "stratad.yaml")
        with open(config_path, "w") as f:
            f.write(config)
        self.ready = os.path.join(self.dir, "ready.json")
        self.log_path = os.path.join(self.dir, "stratad.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [binary, "--config", config_path, "--listen", "127.0.0.1:0", "--data-dir",
             os.path.join(self.dir, "data"), "--ready-file", self.ready, *extra_args],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        self.endpoint = None
        self.info = {}
        while time.monotonic() < deadline:
            if os.path.exists(self.ready):
                try:
                    with open(self.ready) as f:
                        self.info = json.load(f)
                    self.endpoint = self.info["endpoint"]
                    break
                except (ValueError, KeyError):
                    pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if self.endpoint is None:
            self.stop()
            raise RuntimeError("stratad did not start:\n" + self.log())

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def pause(self):
        """Stops the daemon and returns once every one of its threads is stopped: the signal
        is delivered asynchronously, and a thread still running may answer one more call."""
        self.proc.send_signal(signal.SIGSTOP)
        tasks = f"/proc/{self.proc.pid}/task"
        deadline = time.time() + 5
        while time.time() < deadline:
            states = []
            for tid in os.listdir(tasks):
                try:
                    with open(f"{tasks}/{tid}/stat") as f:
                        states.append(f.read().rsplit(")", 1)[1].split()[0])
                except OSError:
                    pass  # a thread that just ended
            if states and all(st in ("T", "t") for st in states):
                return
            time.sleep(0.001)
        raise RuntimeError("stratad did not stop within 5 s of SIGSTOP")

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def daemon():
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture
def gpu_stand_in_client():
    """A client of a daemon whose GPU tier is host memory standing in for the device."""
    import strata
    d = Daemon("host_tier:\n  capacity: 64MiB\n"
               "gpu:\n  capacity: 4MiB\n  memory: host-stand-in\n")
    try:
        with strata.Client(d.endpoint, quiet=True) as c:
            yield c
    finally:
        d.stop()


@pytest.fixture
def client(daemon):
    import strata
    c = strata.Client(daemon.endpoint, rpc_timeout=5.0)
    yield c
    c.close()


SMALL = dict(num_layers=2, num_kv_heads=1, head_dim=64, dtype="bf16", tokens_per_block=16)
SMALL_BLOCK_BYTES = 2 * 2 * 1 * 64 * 2 * 16
