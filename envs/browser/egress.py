"""Which hosts an episode's pages may reach: the task's own site, loopback, and what the config allows.

    env_config:
      allowed_hosts: [shop.example, "*.cdn.example", 10.0.0.0/8]   # or ["*"]: any public host

An episode may reach the host of its start URL, this machine's loopback (served sites and MiniWoB
pages live there), and the hosts `allowed_hosts` names: host names (shell patterns, `*.cdn.example`),
IP addresses, or networks (`10.0.0.0/8`). `*` allows every public host, but a host whose address is
private, link-local, loopback or otherwise not public (this machine's other interfaces, the cloud
metadata address 169.254.169.254, the office network) stays blocked unless an entry names that
address or network. Everything else is blocked: navigations, sub-resources, fetches, web sockets.
"""

from __future__ import annotations

import asyncio
import fnmatch
import ipaddress
import socket
from typing import Sequence
from urllib.parse import urlsplit

ALWAYS = ("localhost",)
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
OPEN_SCHEMES = frozenset({"data", "blob", "about", "javascript"})  # never leave the page
RESOLVE_TIMEOUT_S = 2.0
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _address(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _public(address: Address) -> bool:
    return address.is_global and not address.is_multicast


class Egress:
    """The hosts one episode may reach; `check(url)` says why a URL is blocked (None: allowed)."""

    def __init__(self, allowed: Sequence[str], start_urls: Sequence[str] = ()) -> None:
        self.patterns: list[str] = list(ALWAYS)
        self.networks: list[Network] = list(LOOPBACK)
        for entry in allowed:
            entry = entry.strip().lower()
            try:
                self.networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                if not entry:
                    raise ValueError("env_config.allowed_hosts: an empty entry") from None
                self.patterns.append(entry)
        for url in start_urls:
            host = (urlsplit(url).hostname or "").lower()
            if host:
                address = _address(host)
                if address is not None:
                    self.networks.append(ipaddress.ip_network(address))
                else:
                    self.patterns.append(host)
        self._resolved: dict[str, str | None] = {}

    def _named(self, host: str) -> bool:
        """Whether an entry names this host itself (not only `*`)."""
        return any(p != "*" and fnmatch.fnmatchcase(host, p) for p in self.patterns)

    async def check(self, url: str) -> str | None:
        """Why `url` may not be reached (one line), or None where it may."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme in OPEN_SCHEMES:
            return None
        if scheme not in ("http", "https", "ws", "wss"):
            return f"{scheme or 'this'}: URLs are not reachable from the browser environment"
        host = (parts.hostname or "").lower()
        address = _address(host)
        if address is not None:
            if any(address in n for n in self.networks if n.version == address.version):
                return None
            if "*" in self.patterns and _public(address):
                return None
            return f"{host} is not an allowed host of this task (env_config.allowed_hosts)"
        if self._named(host):
            return None
        if "*" not in self.patterns:
            return f"{host} is not an allowed host of this task (env_config.allowed_hosts)"
        if host not in self._resolved:
            self._resolved[host] = await self._private_address(host)
        private = self._resolved[host]
        return None if private is None else \
            f"{host} resolves to {private}, not a public address (name it or its network in env_config.allowed_hosts)"

    async def _private_address(self, host: str) -> str | None:
        """An address of `host` that is not public and not allowed by a network entry (None: all fine)."""
        try:
            infos = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(host, None), RESOLVE_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError, UnicodeError):
            return None  # not resolvable: the browser cannot reach it either
        for info in infos:
            if info[0] not in (socket.AF_INET, socket.AF_INET6):
                continue
            address = _address(str(info[4][0]).split("%")[0])
            if address is not None and not _public(address) \
                    and not any(address in n for n in self.networks if n.version == address.version):
                return str(address)
        return None
