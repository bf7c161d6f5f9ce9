"""The whole server's counters and histograms on every worker's ``GET /metrics`` (``--workers N``).

Each worker counts in memory, as with one worker (the request path writes no file, takes no lock,
makes no system call), and publishes its figures to a directory the supervisor made for this server
(``METRICS_DIR_ENV``): one small msgpack file per worker, replaced atomically (write, then rename)
every ``PUBLISH_SECONDS`` off the request path, at each scrape it answers, and when it shuts down.
A scrape adds up the files of every worker the server has had, the scraping worker's fresh.

- A worker that has exited (a rolling restart, a crash) keeps counting with its last figures, so the
  totals never go back. A worker shut down gracefully publishes after its last request; one killed
  loses at most what it counted since its last publish, which a scrape it answered itself may have
  shown. The supervisor folds an exited worker's file into one file of all exited workers'
  figures (``retire_exited``), so the directory holds one file per live worker and one more, however
  often workers are replaced (prometheus_client's multiprocess mode keeps a file per dead worker).
- Successive scrapes never decrease, whichever worker answers: each publishes its own figures before
  reading, so what one scrape showed of a worker is in that worker's file for the next.
- Another worker's figures may lag by up to ``PUBLISH_SECONDS``.
- A series' ``_created`` is its earliest start among the workers.

prometheus_client's multiprocess mode was not used: each increment takes its metric's lock and writes
the value into an mmap'd file, 9.8 µs for one request's record (timeit: the same counters and
histograms as ``GatewayMetrics.observe``, which takes 0.8 µs) against a 0.3 ms budget; here a request
costs the same dictionary increments as with one worker. A scrape reads every file (a few KB each:
one per worker the server has started).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path

import msgspec

from gateway.background import stop_task

METRICS_DIR_ENV = "SWITCHYARD_METRICS_DIR"  # set by the supervisor of several workers
PUBLISH_SECONDS = 1.0
SUFFIX = ".msgpack"
RETIRED = "retired" + SUFFIX  # the exited workers' figures, added up by the supervisor

Labels = tuple[str, ...]
Counts = dict[Labels, list[float]]  # label values -> [count, created]


class Histogram(msgspec.Struct, array_like=True):
    """One series' bucket counts (not cumulative; the last above every bound), sum and start time."""

    counts: list[int]
    total: float
    created: float


class Figures(msgspec.Struct):
    """A worker's counters and histograms by family name, as published."""

    counters: dict[str, Counts]
    histograms: dict[str, dict[Labels, Histogram]]


def merge(all_figures: list[Figures]) -> Figures:
    """The sum of several workers' figures (each series' earliest ``created``)."""
    out = Figures({}, {})
    for figures in all_figures:
        for name, counts in figures.counters.items():
            into = out.counters.setdefault(name, {})
            for labels, (count, created) in counts.items():
                have = into.get(labels)
                into[labels] = [count, created] if have is None else [have[0] + count, min(have[1], created)]
        for name, series in figures.histograms.items():
            hists = out.histograms.setdefault(name, {})
            for labels, h in series.items():
                have_h = hists.get(labels)
                hists[labels] = Histogram(list(h.counts), h.total, h.created) if have_h is None else Histogram(
                    [a + b for a, b in zip(have_h.counts, h.counts, strict=True)], have_h.total + h.total,
                    min(have_h.created, h.created))
    return out


class Retired(msgspec.Struct):
    """The exited workers' figures added up, and the names of the worker files already in them: a
    scrape that still finds one of those (it is removed just after this file is replaced) skips it."""

    figures: Figures
    folded: list[str]


def retire_exited(directory: Path, live_pids: set[int]) -> None:
    """Fold the files of workers no longer running into ``RETIRED`` (the supervisor's, between
    replacing workers). The new ``RETIRED`` replaces the old before the folded files go: a scrape
    reads the workers' files before ``RETIRED``, so it counts each figure once whenever it runs."""
    path = directory / RETIRED
    exited = [e for e in os.scandir(directory) if (pid := _worker_of(e.name)) is not None and pid not in live_pids]
    for entry in exited:
        if not entry.name.endswith(SUFFIX):  # a file a killed worker was writing
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
    exited = [e for e in exited if e.name.endswith(SUFFIX)]
    if not exited:
        return
    retired = _read_retired(path)
    folded = [name for name in retired.folded if (directory / name).exists()]  # left by a supervisor killed here
    figures = [retired.figures]
    for entry in exited:
        if entry.name in folded:
            continue
        with contextlib.suppress(OSError, msgspec.DecodeError):  # one that never published a whole file
            figures.append(msgspec.msgpack.decode(Path(entry.path).read_bytes(), type=Figures))
        folded.append(entry.name)
    tmp = path.with_name(RETIRED + ".tmp")
    tmp.write_bytes(msgspec.msgpack.encode(Retired(merge(figures), folded)))
    os.replace(tmp, path)
    for name in folded:
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()


def _worker_of(name: str) -> int | None:
    """The pid of the worker whose file (or file being written) this is; None for ``RETIRED``."""
    pid = name.split("-", 1)[0]
    return int(pid) if pid.isdigit() and "-" in name else None


def _read_retired(path: Path) -> Retired:
    try:
        return msgspec.msgpack.decode(path.read_bytes(), type=Retired)
    except FileNotFoundError:
        return Retired(Figures({}, {}), [])


class SharedMetrics:
    """This worker's file in the server's metrics directory, and the sum of every worker's."""

    def __init__(self, directory: Path, own: Callable[[], Figures]) -> None:
        self.directory = directory
        # a pid may come back in a later worker: the token keeps an exited worker's file apart
        self.path = directory / f"{os.getpid()}-{secrets.token_hex(4)}{SUFFIX}"
        self._own = own
        self._written = b""
        self._decoder = msgspec.msgpack.Decoder(Figures)
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def from_env(cls, own: Callable[[], Figures]) -> SharedMetrics | None:
        """Sharing, in a worker of a server with several (one worker: ``None``, nothing written)."""
        directory = os.environ.get(METRICS_DIR_ENV)
        return cls(Path(directory), own) if directory else None

    def publish(self) -> None:
        data = msgspec.msgpack.encode(self._own())
        if data == self._written:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)
        self._written = data

    def total(self) -> Figures:
        """Every worker's figures added up: this worker's live ones, the others' latest files."""
        with contextlib.suppress(OSError):  # a directory gone (the server is stopping): this worker's own
            self.publish()
        return merge([self._own(), *self._others()])

    def _others(self) -> list[Figures]:
        """The other workers' latest files, then the exited workers' (read last: see ``retire_exited``)."""
        try:
            entries = [e for e in os.scandir(self.directory)
                       if e.name.endswith(SUFFIX) and e.name not in (self.path.name, RETIRED)]
        except OSError:
            return []
        found: dict[str, Figures] = {}
        for entry in entries:
            try:
                found[entry.name] = self._decoder.decode(Path(entry.path).read_bytes())
            except (OSError, msgspec.DecodeError):  # gone since listed: folded, or the server is stopping
                continue
        try:
            retired = msgspec.msgpack.decode((self.directory / RETIRED).read_bytes(), type=Retired)
        except (OSError, msgspec.DecodeError):
            return list(found.values())
        for name in retired.folded:
            found.pop(name, None)
        return [*found.values(), retired.figures]

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._publish_periodically())

    async def aclose(self) -> None:
        """Stop publishing periodically and publish the last figures (after the worker's last request)."""
        if self._task is None:  # the worker never finished start-up: it counted nothing
            return
        await stop_task(self._task)
        with contextlib.suppress(OSError):
            self.publish()

    async def _publish_periodically(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_SECONDS)
            with contextlib.suppress(OSError):
                self.publish()
