"""``server.trusted_proxies``: the peers whose ``X-Forwarded-For`` (and ``X-Forwarded-Proto``) are
believed, as uvicorn's ProxyHeadersMiddleware applies them before the app sees a request.

The client address the app sees (``scope["client"]``) is then the first address in
``X-Forwarded-For``, read from the right, that is not itself a trusted proxy; every consumer of it
(the failed-authentication throttle, the key-use audit, the access log) takes it from there. The
per-address connection cap (``gateway.cli.http_protocol``) cannot: it acts on a connection as it
opens, before any request on it is read, and a proxy's connection carries requests of many clients
one after another; it counts the TCP peer, the proxy.

uvicorn takes an entry that is neither an address nor a network as a literal that no peer's address
ever equals (``10.0.0.1/8``, with host bits set, trusts nobody), silently; here it is a config error.
"""

from __future__ import annotations

import ipaddress

ANY = "*"
LOOPBACK = ("127.0.0.1", "::1")  # uvicorn's default (without $FORWARDED_ALLOW_IPS)


def check(entries: list[str]) -> None:
    """Raise ValueError naming the first entry that is not an IP address, a network (CIDR) or a lone ``*``."""
    for i, entry in enumerate(entries):
        if entry == ANY:
            if len(entries) > 1:
                raise ValueError(f"server.trusted_proxies[{i}] is '*', which trusts every peer: give it alone")
            continue
        try:
            ipaddress.ip_network(entry) if "/" in entry else ipaddress.ip_address(entry)
        except ValueError as exc:
            raise ValueError(f"server.trusted_proxies[{i}] is {entry!r}, not an IP address or network "
                             f"({exc})") from None


def forwarded_allow_ips(entries: list[str] | str) -> list[str] | str:
    """uvicorn's ``forwarded_allow_ips`` for ``entries`` (checked; a string is one entry): each IPv4
    entry also in its IPv4-mapped IPv6 form, the address an IPv4 peer has on a socket bound to ``::``."""
    entries = [entries] if isinstance(entries, str) else entries
    if entries == [ANY]:
        return ANY
    mapped = []
    for entry in entries:
        network = ipaddress.ip_network(entry)  # an address is a network of one
        if isinstance(network, ipaddress.IPv4Network):
            mapped.append(f"::ffff:{network.network_address}/{96 + network.prefixlen}")
    return entries + mapped
