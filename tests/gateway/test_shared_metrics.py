"""Workers' metrics added up through the server's directory (``gateway.telemetry.shared_metrics``),
in one process: two ``GatewayMetrics`` stand for two workers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.contracts import UsageRecord
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.shared_metrics import METRICS_DIR_ENV, RETIRED, retire_exited


def _record(latency_ms: float) -> UsageRecord:
    return UsageRecord(request_id="r", key_id="k", tenant_id="t", model="echo", deployment="d", provider="openai",
                       endpoint="chat.completions", started_at=0.0, status=200, prompt_tokens=3,
                       completion_tokens=5, latency_ms=latency_ms)


def _samples(metrics: GatewayMetrics) -> dict[str, float]:
    """The model ``echo``'s samples by name (``name/kind`` for tokens; the 0.1 s bucket only)."""
    text = metrics.render().decode()
    return {s.name + "/" * ("kind" in s.labels) + s.labels.get("kind", ""): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.labels.get("model") == "echo" and s.labels.get("le") in (None, "0.1")}


def test_one_worker_shares_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(METRICS_DIR_ENV, raising=False)
    assert GatewayMetrics().shared is None


def test_a_scrape_adds_up_every_workers_figures_taking_the_earliest_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(METRICS_DIR_ENV, str(tmp_path))
    one, two = GatewayMetrics(), GatewayMetrics()
    for ms in (50.0, 50.0, 2000.0):
        one.observe(_record(ms))
    two.observe(_record(80.0))
    two.observe(_record(500.0))
    assert _samples(one)["switchyard_requests_total"] == 3  # two has not published yet
    assert two.shared is not None
    two.shared.publish()
    mine = _samples(one)
    assert mine["switchyard_requests_total"] == 5
    assert (mine["switchyard_tokens_total/prompt"], mine["switchyard_tokens_total/completion"]) == (15, 25)
    assert mine["switchyard_request_latency_seconds_count"] == 5
    assert mine["switchyard_request_latency_seconds_bucket"] == 3  # le=0.1: 50, 50 and 80 ms
    assert mine["switchyard_request_latency_seconds_sum"] == pytest.approx(2.68)
    assert mine["switchyard_requests_created"] == one.figures().counters["switchyard_requests"][("echo",
                                                  "chat.completions", "200")][1]  # one started first
    assert _samples(two)["switchyard_requests_total"] == 5  # one published as it answered its scrape
    assert len(list(tmp_path.iterdir())) == 2


def test_exited_workers_files_are_folded_into_one_and_count_on_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(METRICS_DIR_ENV, str(tmp_path))
    live, exited = GatewayMetrics(), GatewayMetrics()
    live.observe(_record(50.0))
    for _ in range(4):
        exited.observe(_record(80.0))
    assert exited.shared is not None and live.shared is not None
    exited.shared.publish()
    dead = tmp_path / "999999999-0badf00d.msgpack"  # as an exited worker (its pid gone) left it
    exited.shared.path.rename(dead)
    (tmp_path / "999999999-0badf00d.msgpack.tmp").write_bytes(b"half a file")  # it was killed mid-write
    assert _samples(live)["switchyard_requests_total"] == 5

    retire_exited(tmp_path, {os.getpid()})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.shared.path.name, RETIRED])
    assert _samples(live)["switchyard_requests_total"] == 5
    assert _samples(live)["switchyard_request_latency_seconds_count"] == 5

    # a supervisor killed between replacing RETIRED and removing the folded file: counted once
    retired = (tmp_path / RETIRED).read_bytes()
    live.shared.path.with_name("999999998-0badf00d.msgpack").write_bytes(b"")  # an unreadable one: folded as nothing
    exited.shared.path = dead
    exited.shared._written = b""
    exited.shared.publish()  # the folded file, back as it was
    assert _samples(live)["switchyard_requests_total"] == 5
    retire_exited(tmp_path, {os.getpid()})  # the next fold removes it without adding it again
    assert not dead.exists() and (tmp_path / RETIRED).read_bytes() != retired
    assert _samples(live)["switchyard_requests_total"] == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.shared.path.name, RETIRED])
