"""A real S3-compatible server for tests: moto_server on loopback, plus a TCP relay to cut (fixtures registered in tests/conftest.py).

- `moto_server` (session): one `moto_server -H 127.0.0.1 -p PORT` subprocess, started once (it takes
  about a second), with `.stop()` / `.start()` to kill it and bring it back on the same port. Moto
  keeps its state in memory, so a restart comes back empty.
- `s3` (per test): dummy credentials and AWS_ENDPOINT_URL in the environment, a fresh bucket, and a
  plain boto3 client for looking behind the store's back.
- `s3_proxy` (per test): a loopback TCP relay in front of the server. `.down()` closes its port and
  resets open connections, `.up()` reopens it: a real network outage, while the server (and its
  state) lives on, so a test can look at what a failure left visible afterwards.
- `store` (per test): the same suite against both backends, ["local", "s3"].
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from tests.ports import free_port

# A distinctive fake secret, so tests can check that it never shows in errors, logs or reprs.
SECRET = "fake-secret-0123456789-do-not-print"


def _kill(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class MotoServer:
    """A `moto_server` subprocess on a fixed loopback port."""

    def __init__(self, log_path: Path):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._log_path = log_path
        self._proc: subprocess.Popen | None = None
        self.client = None  # S3Env.client()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        assert not self.running
        binary = Path(sys.executable).parent / "moto_server"
        with open(self._log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [str(binary), "-H", "127.0.0.1", "-p", str(self.port)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                log_tail = self._log_path.read_text()[-2000:]
                raise RuntimeError(f"moto_server exited with {self._proc.returncode}: {log_tail}")
            try:
                # http.client, not urllib: no proxy settings can reroute a loopback probe.
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
                conn.request("GET", "/")
                if conn.getresponse().status == 200:
                    conn.close()
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"moto_server did not answer on {self.endpoint} within 30 s")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


class S3Env:
    """One test's view of the server: its bucket, its endpoint, and stop()/start() of the server."""

    def __init__(self, server: MotoServer):
        self.server = server
        self.endpoint = server.endpoint
        self.bucket = f"test-{uuid.uuid4().hex[:12]}"
        self.secret = SECRET
        self.create_bucket()

    def client(self):
        """A plain boto3 client straight to the server (cached: building one costs ~0.2 s)."""
        if self.server.client is None:
            import boto3

            self.server.client = boto3.session.Session().client(
                "s3", endpoint_url=self.endpoint, region_name="us-east-1",
                aws_access_key_id="testing-key-id", aws_secret_access_key=SECRET,
            )
        return self.server.client

    def create_bucket(self) -> None:
        self.client().create_bucket(Bucket=self.bucket)

    def stop(self) -> None:
        """Kill the server process (connections are refused until start())."""
        self.server.stop()

    def start(self) -> None:
        """Restart the server on the same port; moto's state is lost, so the bucket is made again, empty."""
        self.server.start()
        self.create_bucket()


class TcpProxy:
    """A loopback TCP relay to `target_port`; down()/up() make the server unreachable and back."""

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.blocked: bytes | None = None
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.up()

    def up(self) -> None:
        assert self._listener is None
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(0.05)  # lets the accept loop notice down() promptly
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Close the port (new connections are refused) and reset every open connection."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            _kill(conn)

    def block(self, pattern: bytes | None) -> None:
        """Reset any connection whose client sends `pattern` (before it reaches the server); None: stop."""
        self.blocked = pattern

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                _kill(client)
                continue
            with self._lock:
                self._conns |= {client, upstream}
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        tail = b""  # the pattern may straddle two reads
        try:
            while chunk := src.recv(1 << 16):
                if from_client and self.blocked and self.blocked in tail + chunk:
                    break
                tail = chunk[-256:]
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            with self._lock:
                self._conns -= {src, dst}
            _kill(src)
            _kill(dst)


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto_server.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3(moto_server, monkeypatch) -> S3Env:
    """Dummy credentials and the endpoint in the environment, as a deployment would set them."""
    if not moto_server.running:  # a previous test stopped it and failed before restarting it
        moto_server.start()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    env = S3Env(moto_server)
    yield env
    if not moto_server.running:
        moto_server.start()


@pytest.fixture
def s3_proxy(s3) -> TcpProxy:
    proxy = TcpProxy(s3.server.port)
    yield proxy
    proxy.down()


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    from storage.factory import open_store

    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    s3 = request.getfixturevalue("s3")
    # Endpoint, region and credentials all come from the environment.
    return open_store(f"s3://{s3.bucket}/root/prefix")
