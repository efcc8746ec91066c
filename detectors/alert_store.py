"""The watcher's memory and its delivery queue: which boundaries were alerted, and which alerts a sink
has not accepted yet.

``AlertState`` is a SQLite file. An alert is recorded (one row, unique on lineage id + boundary
step + verdict) together with one pending delivery per sink, in one transaction, *before* anything
is sent; a delivery is marked done in its own transaction after the sink accepted it. So a watcher
killed at any point and restarted neither re-alerts a boundary (the row exists) nor loses one (a
delivery that had not completed is still pending). The one window left is a kill between "the
webhook answered 200" and "marked delivered": that alert is sent again, with the same
``X-Klwatch-Alert-Key`` header so the receiver can drop it.

``deliver`` sends what is due: a few inline attempts per delivery (``klwatch.alerts.post_webhook``),
then a backoff persisted in the file, so a receiver that is down is retried across passes and
restarts without being hammered.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from .alerts import Alert, alert_line, backoff_delay, post_webhook, redact_url, scrub, slack_payload


@dataclass(frozen=True)
class Sink:
    """Where alerts go. ``id`` is stable across restarts and holds no secret (a hash of the URL)."""

    id: str
    label: str
    url: str | None = None

    @staticmethod
    def stdout() -> "Sink":
        """The console sink: every watcher has it, so its deliveries never wait for another one."""
        return Sink("stdout", "stdout")

    @staticmethod
    def webhook(url: str) -> "Sink":
        """A webhook sink known by a hash of its URL, so the state file never holds the secret."""
        return Sink("webhook:" + hashlib.sha256(url.encode()).hexdigest()[:16], redact_url(url), url)


@dataclass
class PendingDelivery:
    """One alert not yet accepted by one sink, as read back from the state file."""

    alert_id: int
    alert: Alert
    sink_id: str
    attempts: int


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY,
    lineage_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    verdict TEXT NOT NULL,
    run TEXT NOT NULL,
    source TEXT NOT NULL,
    alert TEXT NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (lineage_id, step, verdict)
);
CREATE TABLE IF NOT EXISTS deliveries (
    alert_id INTEGER NOT NULL REFERENCES alerts(id),
    sink TEXT NOT NULL,
    sink_label TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'delivered')),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL DEFAULT 0,
    last_error TEXT,
    delivered_at REAL,
    PRIMARY KEY (alert_id, sink)
);
"""


class StateLocked(RuntimeError):
    """Another watcher holds the state file."""


class AlertState:
    """The watcher's SQLite memory: which boundaries were alerted, and which deliveries are pending.

    Every change is one transaction (``synchronous=FULL``), so a SIGKILL leaves either the whole
    change or none of it. An exclusive ``flock`` on ``STATE.lock`` keeps two watchers from sharing a
    file (the kernel drops it when the process dies, however it dies).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = self._take_lock(Path(str(self.path) + ".lock"))
        self.db = sqlite3.connect(str(self.path), isolation_level=None, timeout=30.0)
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)
        self.db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('schema', 'klwatch.watch-state/1')")

    @staticmethod
    def _take_lock(path: Path) -> Any:
        """An exclusive ``flock`` held for the watcher's life (None where the platform has no flock)."""
        try:
            import fcntl
        except ImportError:  # no flock on this platform: rely on SQLite's own locking
            return None
        fh = open(path, "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            raise StateLocked(f"another klwatch watch is using {path.with_suffix('')}") from None
        return fh

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: the whole change or, on any error or kill, none of it."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def close(self) -> None:
        """Close the database, then release the lock for the next watcher."""
        self.db.close()
        if self._lock is not None:
            self._lock.close()

    def record(self, alert: Alert, sinks: list[Sink], *, now: float) -> bool:
        """Remember a new alert with a pending delivery per sink; False when it was already known."""
        with self._tx() as db:
            cur = db.execute("INSERT OR IGNORE INTO alerts(lineage_id, step, verdict, run, source, alert, created_at) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (alert.lineage_id, alert.step, alert.verdict, alert.run, alert.source, alert.to_json(), now))
            if cur.rowcount == 0:
                return False
            alert_id = cur.lastrowid
            db.executemany("INSERT INTO deliveries(alert_id, sink, sink_label, status) VALUES (?, ?, ?, 'pending')",
                           [(alert_id, s.id, s.label) for s in sinks])
        return True

    def due(self, *, now: float | None) -> list[PendingDelivery]:
        """Pending deliveries whose backoff has run out (all pending ones when ``now`` is None)."""
        q = ("SELECT d.alert_id, a.alert, d.sink, d.attempts FROM deliveries d JOIN alerts a ON a.id = d.alert_id "
             "WHERE d.status = 'pending'" + ("" if now is None else " AND d.next_attempt_at <= ?") +
             " ORDER BY d.alert_id, d.sink")
        rows = self.db.execute(q, () if now is None else (now,)).fetchall()
        return [PendingDelivery(r[0], Alert.from_json(r[1]), r[2], r[3]) for r in rows]

    def mark_delivered(self, d: PendingDelivery, *, attempts: int, now: float) -> None:
        """The sink accepted it: never sent to that sink again."""
        with self._tx() as db:
            db.execute("UPDATE deliveries SET status='delivered', attempts=attempts+?, delivered_at=?, last_error=NULL "
                       "WHERE alert_id=? AND sink=?", (attempts, now, d.alert_id, d.sink_id))

    def mark_failed(self, d: PendingDelivery, *, attempts: int, error: str, next_at: float) -> None:
        """Still pending, not before ``next_at``; ``error`` must already be scrubbed of secrets."""
        with self._tx() as db:
            db.execute("UPDATE deliveries SET attempts=attempts+?, last_error=?, next_attempt_at=? "
                       "WHERE alert_id=? AND sink=?", (attempts, error, next_at, d.alert_id, d.sink_id))

    def pending_elsewhere(self, sink_ids: set[str]) -> int:
        """Pending deliveries for sinks not in ``sink_ids`` (a webhook left off this time)."""
        rows = self.db.execute("SELECT sink FROM deliveries WHERE status='pending'").fetchall()
        return sum(1 for (sink,) in rows if sink not in sink_ids)

    def pending(self) -> list[tuple[str, str, int, str | None]]:
        """(alert key, sink label, attempts, last error) of every undelivered alert."""
        rows = self.db.execute("SELECT a.lineage_id, a.step, a.verdict, d.sink_label, d.attempts, d.last_error "
                               "FROM deliveries d JOIN alerts a ON a.id = d.alert_id WHERE d.status='pending'").fetchall()
        return [(f"{r[0]}@{r[1]}:{r[2]}", r[3], r[4], r[5]) for r in rows]


@dataclass(frozen=True)
class DeliveryConfig:
    """How hard to try: inline attempts per delivery, then a persisted backoff between passes."""

    attempts: int = 3
    backoff: float = 0.5
    retry_base: float = 5.0
    retry_cap: float = 300.0
    timeout: float = 10.0


def deliver(state: AlertState, sinks: list[Sink], *, dashboard_url: str | None, out: TextIO,
            config: DeliveryConfig, respect_backoff: bool, warn: Callable[[str], None]) -> tuple[int, int]:
    """Send every due pending delivery to its sink; returns (delivered, failed).

    A failure is told to ``warn`` (the command's console) and stays pending with its next attempt
    pushed back, so one dead receiver never blocks the others nor loses an alert."""
    by_id = {s.id: s for s in sinks}
    secrets = [s.url for s in sinks if s.url]
    delivered = failed = 0
    for d in state.due(now=time.time() if respect_backoff else None):
        sink = by_id.get(d.sink_id)
        if sink is None:
            continue  # a webhook not given this time: stays pending for a watcher that has it
        if sink.url is None:
            out.write(alert_line(d.alert, dashboard_url=dashboard_url) + "\n")
            out.flush()
            state.mark_delivered(d, attempts=1, now=time.time())
            delivered += 1
            continue
        res = post_webhook(sink.url, slack_payload(d.alert, dashboard_url=dashboard_url), key=d.alert.key,
                           attempts=config.attempts, backoff=config.backoff, timeout=config.timeout)
        if res.ok:
            state.mark_delivered(d, attempts=res.attempts, now=time.time())
            delivered += 1
        else:
            failed += 1
            total = d.attempts + res.attempts
            error = scrub(res.error or "failed", secrets)
            state.mark_failed(d, attempts=res.attempts, error=error,
                              next_at=time.time() + backoff_delay(total, base=config.retry_base, cap=config.retry_cap))
            warn(f"alert for {d.alert.run} step {d.alert.step} not delivered to {sink.label} "
                 f"({error}); {total} attempt(s), will retry")
    return delivered, failed
