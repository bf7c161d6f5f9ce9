"""backends.call.CallContext: the client's limit wins; else the gateway's cap, within the room left;
the tenant travels to engine nodes as headers and back."""

from backends.call import (
    MAX_WEIGHT,
    MIN_WEIGHT,
    TENANT_HEADER,
    WEIGHT_HEADER,
    CallContext,
    CallingTenant,
    forwarded_tenant,
)


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


def test_every_weight_the_admin_api_allows_reaches_an_engine_node_as_it_is() -> None:
    for weight in (MIN_WEIGHT, 0.5, 2.5, MAX_WEIGHT):  # the largest was read as 1.0 on the node
        headers = CallContext(tenant=CallingTenant.of("acme", weight)).tenant_headers()
        assert forwarded_tenant(headers) == CallingTenant("acme", weight)
    # beyond the bounds: held within them (a tiny weight would make the engine's virtual time infinite)
    assert CallingTenant.of("t", 5e-324) == CallingTenant("t", MIN_WEIGHT)
    assert forwarded_tenant({TENANT_HEADER: "t", WEIGHT_HEADER: "1e300"}) == CallingTenant("t", MAX_WEIGHT)
    for junk in ("nan", "inf", "-2", "0", "x"):
        assert forwarded_tenant({TENANT_HEADER: "t", WEIGHT_HEADER: junk}) == CallingTenant("t", 1.0)
