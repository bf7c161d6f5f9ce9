"""backends.call.CallContext: the client's limit wins; else the gateway's cap, within the room left;
the tenant travels to engine nodes as headers and back."""

from backends.call import CallContext, CallingTenant, forwarded_tenant


def test_output_limit() -> None:
    none = CallContext()
    assert none.output_limit(None) is None and none.output_limit(None, 5) is None  # no cap set: no limit
    capped = CallContext(output_cap=1024)
    assert capped.output_limit(7) == 7 and capped.output_limit(5000, 10) == 5000  # the client's own limit stands
    assert capped.output_limit(None) == 1024 and capped.output_limit(None, 300) == 300
    assert capped.output_limit(None, 0) == 1
    assert CallContext(output_cap=None).output_limit(None, 300) is None


def test_tenant_headers_round_trip() -> None:
    assert CallContext().tenant_headers() == {}
    headers = CallContext(tenant=CallingTenant.of("acme", 2.5)).tenant_headers()
    assert forwarded_tenant(headers) == CallingTenant("acme", 2.5)
    assert CallingTenant.of(None) is None and CallingTenant.of("t", 0).weight == 1.0  # type: ignore[union-attr]
    assert forwarded_tenant({}) is None
