"""Pod addresses for the node helper (compass_dev.devnode): one loopback address per pod.

All of 127.0.0.0/8 is loopback on Linux, so a process binds any address of POD_NETWORK with no
setup. The node itself, and hostNetwork pods, are HOST_IP.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import tempfile
import threading
from pathlib import Path

HOST_IP = "127.0.0.1"  # the node's address: status.hostIP, and the IP of hostNetwork pods
# Where pod IPs come from. Not 127.0.1.x, which Debian's /etc/hosts gives the machine's hostname.
POD_NETWORK = "127.0.2.0/24"
LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")


class PodAddresses:
    """Pod IPs in use, so that no two pods share one: two Nodes in one process, or in two.

    Round robin through a network's host addresses, like the host-local IPAM plugin: an address
    freed by a pod is not handed out again at once, so a stale endpoint never reaches its
    successor. 127.0.0.1 (the node and the API server) is never a pod's. Other processes (a
    second test run, the demo) are kept off an address by a lock file under lock_dir, held while
    the address is in use; the kernel lets go of it when this process dies, however it dies.
    """

    def __init__(self, lock_dir: Path | None = None) -> None:
        self.lock_dir = lock_dir or Path(tempfile.gettempdir()) / "compass-devnode-addresses"
        self._lock = threading.Lock()
        self._used: dict[str, int | None] = {}  # address -> its lock file's descriptor
        self._next: dict[ipaddress.IPv4Network, int] = {}  # network -> the offset to try next

    def allocate(self, network: ipaddress.IPv4Network) -> str:
        """A free address of network, now in use; RuntimeError when every one is taken."""
        if network.prefixlen < 31:  # skip the network and broadcast addresses, as hosts() does
            first, size = 1, network.num_addresses - 2
        else:
            first, size = 0, network.num_addresses
        with self._lock:
            start = self._next.get(network, 0)
            for step in range(size):
                offset = (start + step) % size
                address = str(network.network_address + first + offset)
                if address in self._used or address == HOST_IP:
                    continue
                claimed, descriptor = self._claim(address)
                if claimed:
                    self._used[address] = descriptor
                    self._next[network] = offset + 1
                    return address
        raise RuntimeError(f"no free pod IP left in {network}")

    def release(self, address: str) -> None:
        """Give an address back (unknown ones are ignored)."""
        with self._lock:
            descriptor = self._used.pop(address, None)
        if descriptor is not None:
            os.close(descriptor)  # and with it the lock

    def _claim(self, address: str) -> tuple[bool, int | None]:
        """Whether no other process holds address, and the descriptor that now holds it."""
        try:
            self.lock_dir.mkdir(exist_ok=True)
            descriptor = os.open(self.lock_dir / address, os.O_RDONLY | os.O_CREAT, 0o644)
        except OSError:
            return True, None  # no lock files here: this process's bookkeeping only
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(descriptor)
            return False, None
        return True, descriptor


ADDRESSES = PodAddresses()  # process-wide: every Node allocates here


def loopback_network(cidr: str | None) -> ipaddress.IPv4Network | None:
    """The network pods get addresses from (None: none, every pod is HOST_IP); loopback only."""
    network = ipaddress.IPv4Network(cidr) if cidr else None
    if network is not None and not network.subnet_of(LOOPBACK):
        raise ValueError(f"pod_network {cidr} is not loopback (127.0.0.0/8)")
    return network
