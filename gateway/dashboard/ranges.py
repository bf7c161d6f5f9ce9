"""The time range a dashboard shows: a preset (last hour / day / 7 days / 30 days) or custom dates,
its bucket size, and the viewer's time zone.

Charts draw exactly ``[start, end)`` and one point per bucket in ``buckets()``, zeros included, so
a day of data fills a day's axis and a quiet hour shows as zero rather than as a gap.
Day buckets start at local midnight in ``tz``; hour buckets are UTC hours (the rollups' grain),
which are local hours everywhere but in zones with a half-hour offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gateway.errors import ParameterError

Bucket = Literal["minute", "hour", "day"]
PRESETS = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7), "30d": timedelta(days=30)}
MAX_RANGE = timedelta(days=400)
MAX_MINUTE_RANGE = timedelta(hours=6)
EDGE = timedelta(days=2)  # how far from the calendar's ends (years 1 and 9999) a range must stay
CALENDAR = "dates must lie between 0001-01-04 and 9999-12-28"


@dataclass(frozen=True)
class Range:
    start: datetime  # inclusive, on a bucket boundary
    end: datetime  # exclusive
    bucket: Bucket = "hour"
    tz: tzinfo = field(default=UTC)

    @classmethod
    def parse(cls, start: str | None, end: str | None, bucket: str | None, now: datetime | None = None, *,
              preset: str | None = None, tz: str | None = None) -> Range:
        """A preset, or ISO dates / timestamps (a bare date is local midnight in ``tz``; a bare end
        date includes that day); default: the last 7 days. Raises ParameterError naming the parameter."""
        zone = _zone(tz)
        now = now or datetime.now(UTC)
        if bucket not in (None, "", "minute", "hour", "day"):
            raise ParameterError("bucket must be 'minute', 'hour' or 'day'", param="bucket")
        if preset:
            if preset not in PRESETS:
                raise ParameterError(f"range must be one of {', '.join(PRESETS)} (or give start and end)",
                                     param="range")
            e, s = now, now - PRESETS[preset]
        else:
            e = _parse(end, "end", zone) if end else now
            if end and _is_date(end):  # a bare end date includes that day, to the next local midnight
                try:
                    e = _next(e, "day", zone)
                except OverflowError:
                    raise ParameterError(f"end is out of range: {CALENDAR}", param="end") from None
            s = _parse(start, "start", zone) if start else _shift(e, -timedelta(days=7), "end")
        _inside_calendar(s, "start")
        _inside_calendar(e, "end")
        if s >= e:
            raise ParameterError("start must be before end", param="start")
        if e - s > MAX_RANGE:
            raise ParameterError("start: the range may span at most 400 days", param="start")
        chosen: Bucket = bucket or _auto_bucket(e - s)  # type: ignore[assignment]
        if chosen == "minute" and e - s > MAX_MINUTE_RANGE:
            raise ParameterError("bucket 'minute' is for ranges of at most 6 hours", param="bucket")
        return cls(floor(s, chosen, zone), e, chosen, zone)

    def floor(self, t: datetime) -> datetime:
        return floor(t, self.bucket, self.tz)

    def buckets(self) -> list[datetime]:
        """Every bucket's start from the one holding ``start`` up to ``end``."""
        out, t = [], self.floor(self.start)
        while t < self.end:
            out.append(t)
            t = _next(t, self.bucket, self.tz)
        return out

    @property
    def tz_name(self) -> str:
        return getattr(self.tz, "key", None) or "UTC"


def _shift(t: datetime, by: timedelta, param: str) -> datetime:
    try:
        return t + by
    except OverflowError:
        raise ParameterError(f"{param} is out of range: {CALENDAR}", param=param) from None


def _inside_calendar(t: datetime, param: str) -> None:
    """Bucket arithmetic (a day or an hour past either end, in any time zone) must stay within
    Python's calendar: a time within two days of either end of it is refused, naming ``param``."""
    _shift(t, -EDGE, param)
    _shift(t, EDGE, param)


def _auto_bucket(span: timedelta) -> Bucket:
    if span <= timedelta(hours=3):
        return "minute"
    return "hour" if span <= timedelta(days=2) else "day"


def floor(t: datetime, bucket: Bucket, tz: tzinfo) -> datetime:
    t = t.astimezone(UTC)
    if bucket == "minute":
        return t.replace(second=0, microsecond=0)
    if bucket == "hour":
        return t.replace(minute=0, second=0, microsecond=0)
    return _midnight(t.astimezone(tz).date(), tz)


def _next(t: datetime, bucket: Bucket, tz: tzinfo) -> datetime:
    if bucket == "minute":
        return t + timedelta(minutes=1)
    if bucket == "hour":
        return t + timedelta(hours=1)
    return _midnight(t.astimezone(tz).date() + timedelta(days=1), tz)


def _midnight(day: date, tz: tzinfo) -> datetime:
    return datetime.combine(day, time(), tzinfo=tz).astimezone(UTC)


def _is_date(text: str) -> bool:
    """Whether ``text`` is a bare date, in any form ``date.fromisoformat`` reads (``2026-01-31``,
    ``20260131``), as the usage report reads an end date."""
    try:
        date.fromisoformat(text.strip())
    except ValueError:
        return False
    return True


def _zone(name: str | None) -> tzinfo:
    if not name or name == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ParameterError(f"tz must be an IANA time zone such as 'Europe/Paris', got {name[:40]!r}",
                             param="tz") from None


def _parse(text: str, param: str, zone: tzinfo) -> datetime:
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ParameterError(f"{param} must be an ISO date or timestamp, got {text[:40]!r}", param=param) from None
    try:
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=zone).astimezone(UTC)
    except OverflowError:
        raise ParameterError(f"{param} is out of range: {CALENDAR}", param=param) from None
