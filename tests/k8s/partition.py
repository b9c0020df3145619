"""A TCP proxy in front of the API server that the test can cut: a network partition between one
process and the API server, everything else (Triton, its metrics) still reachable."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import yaml

CHUNK = 65536


class PartitionableProxy:
    """Forwards 127.0.0.1:port to the upstream port until cut(); while cut, live connections are
    reset and new ones closed at once, as when a node loses its route to the control plane."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.cut_off = threading.Event()
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def cut(self) -> None:
        """Partition: drop every connection, accept none."""
        self.cut_off.set()
        with self.lock:
            for sock in self.open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            self.open.clear()

    def heal(self) -> None:
        """Forward again."""
        self.cut_off.clear()

    def close(self) -> None:
        self.cut()
        self.listener.close()

    def kubeconfig(self, original: Path, path: Path) -> Path:
        """A copy of ``original`` whose server is this proxy (the serving certificate names
        127.0.0.1, so TLS is verified as before)."""
        config = yaml.safe_load(original.read_text(encoding="utf-8"))
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        return path

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            if self.cut_off.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self.lock:
                self.open.update((client, upstream))
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(source, target), name="proxy-pump", daemon=True
                ).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while not self.cut_off.is_set() and (data := source.recv(CHUNK)):
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with self.lock:
                self.open.discard(source)
                self.open.discard(target)
