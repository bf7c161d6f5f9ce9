"""backends.output_cap: the client's limit wins; else the gateway's cap, within the room left."""

from backends.output_cap import capped_output, output_limit


def test_output_limit() -> None:
    assert output_limit(None) is None and output_limit(None, 5) is None  # no cap set: no limit
    with capped_output(1024):
        assert output_limit(7) == 7 and output_limit(5000, 10) == 5000  # the client's own limit stands
        assert output_limit(None) == 1024 and output_limit(None, 300) == 300 and output_limit(None, 0) == 1
    with capped_output(None):
        assert output_limit(None, 300) is None
