"""edgemem never talks to a network: every model is a file on disk, nothing is downloaded at run
time and nothing is reported anywhere.

`OFFLINE_ENV` is applied when `edgemem` is imported (forced, not defaulted: a user's
`HF_HUB_OFFLINE=0` does not switch the hub clients back on inside edgemem). `block_network()`
turns any attempt to open an internet socket or resolve a host name into an error and records it:
the tests run the CLI under it (and inside an `unshare -n` namespace where one can be made).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",  # huggingface_hub: no downloads, no HEAD requests for updates
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",  # never read a token to send
    "DO_NOT_TRACK": "1",
}


def apply_offline_env() -> None:
    """Set OFFLINE_ENV in this process (and its children); if huggingface_hub was imported before
    edgemem, its constants are already read: switch them too."""
    os.environ.update(OFFLINE_ENV)
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True  # type: ignore[attr-defined]
        constants.HF_HUB_DISABLE_TELEMETRY = True  # type: ignore[attr-defined]


class NetworkBlocked(OSError):
    """An internet connection or host name lookup was attempted while the network is blocked."""


_INTERNET = (socket.AF_INET, socket.AF_INET6)


def block_network(record: Callable[[str], None] | None = None, log: Path | None = None) -> None:
    """From now on, in this process: connecting an internet socket, sending to one and resolving a
    host name raise NetworkBlocked; each attempt is reported to `record` and appended to `log`.
    Local (AF_UNIX) sockets keep working."""

    def report(what: str) -> None:
        if record is not None:
            record(what)
        if log is not None:
            with open(log, "a") as handle:
                handle.write(f"{os.getpid()} {what}\n")

    def refuse(what: str) -> NetworkBlocked:
        report(what)
        return NetworkBlocked(f"edgemem is offline: blocked {what}")

    original_connect, original_connect_ex = socket.socket.connect, socket.socket.connect_ex
    original_sendto = socket.socket.sendto

    def connect(self: socket.socket, address: object) -> None:
        if self.family in _INTERNET:
            raise refuse(f"connect {address!r}")
        return original_connect(self, address)

    def connect_ex(self: socket.socket, address: object) -> int:
        if self.family in _INTERNET:
            raise refuse(f"connect_ex {address!r}")
        return original_connect_ex(self, address)

    def sendto(self: socket.socket, data: bytes, *args: object) -> int:
        if self.family in _INTERNET:
            raise refuse(f"sendto {args[-1]!r}")
        return original_sendto(self, data, *args)  # type: ignore[arg-type]

    def getaddrinfo(host: object, *args: object, **kwargs: object) -> list:
        raise refuse(f"getaddrinfo {host!r}")

    def gethostbyname(host: object) -> str:
        raise refuse(f"gethostbyname {host!r}")

    def create_connection(address: object, *args: object, **kwargs: object) -> socket.socket:
        raise refuse(f"create_connection {address!r}")

    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
    socket.socket.sendto = sendto  # type: ignore[method-assign]
    socket.getaddrinfo = getaddrinfo  # type: ignore[assignment]
    socket.gethostbyname = gethostbyname  # type: ignore[assignment]
    socket.create_connection = create_connection  # type: ignore[assignment]
