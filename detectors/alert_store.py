"""The watcher's memory and its delivery queue: which boundaries were alerted, and which alerts a sink
has not accepted yet.

``AlertState`` is a SQLite file. An alert is recorded (one row, unique on lineage id + boundary
step + verdict) together with one pending delivery per sink, in one transaction, *before* anything
is sent; a delivery is marked done in its own transaction after the sink accepted it. So a watcher
killed at any point and restarted never records a boundary twice (the row exists) nor loses one (a
delivery that had not completed is still pending). Delivery is therefore at least once: a kill
between "the webhook answered 200" and "marked delivered" sends that alert again, with the same
``X-Klwatch-Alert-Key`` header, so the receiver can drop it.

``deliver`` sends what is due: the webhooks in parallel (one thread each, so a slow one holds up no
other), a few inline attempts per delivery (``klwatch.alerts.post_webhook``), then a backoff
persisted in the file, so a receiver that is down is retried across passes and restarts without
being hammered, until the retries are spent (``DeliveryConfig.max_attempts``, ``give_up_after``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from .alerts import Alert, Delivery, alert_line, backoff_delay, post_webhook, slack_payload
from .redact import redact_url, scrub


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
    created_at: float = 0.0
    """When the alert was recorded: the start of its deliveries' time to give up."""


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


_LOCK_BYTE = 0x7FFF0000
"""The byte of the state file a watcher locks: one SQLite never locks (its lock bytes are the 512
from 0x40000000), so the watcher's lock and SQLite's own never meet."""


def _lock_state_file(path: Path) -> int:
    """Open (or create) the state file and lock it for the watcher's life; returns the descriptor.

    The lock is on the file itself, so it follows the file's identity (device and inode): a second
    watcher reaching it through a symlink or a hard link is refused, which a lock file named after
    the path given could not do."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        _lock_byte(fd)
    except OSError:
        os.close(fd)
        where = f"{path} (a link to {os.path.realpath(path)})" if os.path.islink(path) else str(path)
        raise StateLocked(f"another klwatch watch is using {where}") from None
    return fd


def _lock_byte(fd: int) -> None:
    """An exclusive, non-blocking lock on ``_LOCK_BYTE``; OSError when another holder has it.

    Linux: an open-file-description lock (``F_OFD_SETLK``), which nothing else this process opens or
    closes on the file can drop, and which a second opener in the same process also meets. Elsewhere
    a POSIX record lock. Not ``flock``: on BSD/macOS, NFS and SMB it is an fcntl lock in disguise and
    would fight SQLite's own. Without ``fcntl`` (Windows) SQLite's locking is all there is."""
    try:
        import fcntl
    except ImportError:
        return
    ofd = getattr(fcntl, "F_OFD_SETLK", None)
    if ofd is not None and struct.calcsize("P") == 8:  # struct flock: short, short, off_t, off_t, pid_t
        fcntl.fcntl(fd, ofd, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, _LOCK_BYTE, 1, 0))
        return
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _LOCK_BYTE, os.SEEK_SET)


class AlertState:
    """The watcher's SQLite memory: which boundaries were alerted, and which deliveries are pending.

    Every change is one transaction (``synchronous=FULL``), so a SIGKILL leaves either the whole
    change or none of it. A lock on the state file itself (``_lock_state_file``) keeps two watchers
    from sharing it, however they reach it (a symlink, a hard link); the kernel drops it when the
    process dies, however it dies.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock_state_file(self.path)
        try:
            self.db = sqlite3.connect(str(self.path), isolation_level=None, timeout=30.0)
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(_SCHEMA)
            self.db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('schema', 'klwatch.watch-state/1')")
            columns = {row[1] for row in self.db.execute("PRAGMA table_info(deliveries)")}
            if "abandoned_at" not in columns:  # a state file written before deliveries could be given up
                self.db.execute("ALTER TABLE deliveries ADD COLUMN abandoned_at REAL")
        except BaseException:
            os.close(self._lock_fd)
            raise

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
        os.close(self._lock_fd)

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
        q = ("SELECT d.alert_id, a.alert, d.sink, d.attempts, a.created_at FROM deliveries d "
             "JOIN alerts a ON a.id = d.alert_id WHERE d.status = 'pending' AND d.abandoned_at IS NULL" +
             ("" if now is None else " AND d.next_attempt_at <= ?") + " ORDER BY d.alert_id, d.sink")
        rows = self.db.execute(q, () if now is None else (now,)).fetchall()
        return [PendingDelivery(r[0], Alert.from_json(r[1]), r[2], r[3], r[4]) for r in rows]

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

    def abandon(self, d: PendingDelivery, *, attempts: int, error: str, now: float) -> None:
        """Never try this delivery again (its retries are spent, or its URL is unusable); the row stays
        as the record of what was not delivered. ``error`` must already be scrubbed of secrets."""
        with self._tx() as db:
            db.execute("UPDATE deliveries SET attempts=attempts+?, last_error=?, abandoned_at=? "
                       "WHERE alert_id=? AND sink=?", (attempts, error, now, d.alert_id, d.sink_id))

    def abandon_unusable(self, *, now: float) -> int:
        """Drop pending deliveries to a webhook whose URL could not even be parsed when it was given
        (an older watcher took it; its label is then ``***``): no watcher can ever deliver them, and
        an older one crashed on them at every restart. Returns how many."""
        with self._tx() as db:
            cur = db.execute("UPDATE deliveries SET abandoned_at=?, last_error='webhook URL unusable' "
                             "WHERE status='pending' AND abandoned_at IS NULL AND sink != 'stdout' "
                             "AND sink_label NOT LIKE 'http://%' AND sink_label NOT LIKE 'https://%'", (now,))
            return cur.rowcount

    def pending_elsewhere(self, sink_ids: set[str]) -> int:
        """Pending deliveries for sinks not in ``sink_ids`` (a webhook left off this time)."""
        rows = self.db.execute("SELECT sink FROM deliveries WHERE status='pending' AND abandoned_at IS NULL").fetchall()
        return sum(1 for (sink,) in rows if sink not in sink_ids)

    def pending(self) -> list[tuple[str, str, int, str | None]]:
        """(alert key, sink label, attempts, last error) of every undelivered alert still being tried."""
        rows = self.db.execute("SELECT a.alert, d.sink_label, d.attempts, d.last_error FROM deliveries d "
                               "JOIN alerts a ON a.id = d.alert_id WHERE d.status='pending' AND d.abandoned_at IS NULL "
                               "ORDER BY d.alert_id, d.sink").fetchall()
        return [(Alert.from_json(r[0]).key, r[1], r[2], r[3]) for r in rows]


@dataclass(frozen=True)
class DeliveryConfig:
    """How hard to try: inline attempts per delivery, then a persisted backoff between passes, up to
    a bound in attempts and in time after which the delivery is given up (with a warning)."""

    attempts: int = 3
    backoff: float = 0.5
    retry_base: float = 5.0
    retry_cap: float = 300.0
    timeout: float = 10.0
    max_attempts: int = 100
    """Attempts per delivery, all passes and restarts together (~2 h of a watcher's 5-minute backoff)."""
    give_up_after: float = 24 * 3600.0
    """Seconds after the alert was recorded past which a failing delivery is not tried again."""


def deliver(state: AlertState, sinks: list[Sink], *, dashboard_url: str | None, out: TextIO,
            config: DeliveryConfig, respect_backoff: bool, warn: Callable[[str], None]) -> tuple[int, int]:
    """Send every due pending delivery to its sink; returns (delivered, failed).

    stdout first, then the webhooks in parallel, one thread each (a slow webhook holds up none of the
    others), each recorded as soon as its sink answers. A failure is told to ``warn`` (the command's
    console) and stays pending with its next attempt pushed back, until its retries are spent."""
    by_id = {s.id: s for s in sinks}
    now = time.time()
    delivered = failed = 0
    queues: dict[str, list[PendingDelivery]] = {}
    for d in state.due(now=now if respect_backoff else None):
        sink = by_id.get(d.sink_id)
        if sink is None:
            continue  # a webhook not given this time: stays pending for a watcher that has it
        if sink.url is None:
            out.write(alert_line(d.alert, dashboard_url=dashboard_url) + "\n")
            out.flush()
            state.mark_delivered(d, attempts=1, now=time.time())
            delivered += 1
        else:
            queues.setdefault(sink.id, []).append(d)
    for d, res in _post_in_parallel(queues, by_id, dashboard_url=dashboard_url, config=config):
        if res.ok:
            state.mark_delivered(d, attempts=res.attempts, now=time.time())
            delivered += 1
        else:
            failed += 1
            _record_failure(state, d, res, sink=by_id[d.sink_id], config=config, warn=warn)
    return delivered, failed


def _post_in_parallel(queues: dict[str, list[PendingDelivery]], by_id: dict[str, Sink], *, dashboard_url: str | None,
                      config: DeliveryConfig) -> Iterator[tuple[PendingDelivery, Delivery]]:
    """One thread per webhook, posting its alerts in order; the results as they come, so the caller
    records each the moment its sink answered. Threads are daemons: a watcher told to stop is not held
    by a webhook that hangs."""
    results: queue.Queue[tuple[PendingDelivery, Delivery]] = queue.Queue()

    def post_all(sink: Sink, todo: list[PendingDelivery]) -> None:
        for d in todo:
            try:
                res = post_webhook(str(sink.url), slack_payload(d.alert, dashboard_url=dashboard_url), key=d.alert.key,
                                   attempts=config.attempts, backoff=config.backoff, timeout=config.timeout)
            except Exception as exc:  # post_webhook never raises; should it, the result must still come back
                res = Delivery(ok=False, attempts=1, error=f"{type(exc).__name__} while posting")
            results.put((d, res))

    for sink_id, todo in queues.items():
        threading.Thread(target=post_all, args=(by_id[sink_id], todo), daemon=True, name=f"klwatch-{sink_id}").start()
    for _ in range(sum(len(todo) for todo in queues.values())):
        yield results.get()


def _record_failure(state: AlertState, d: PendingDelivery, res: Delivery, *, sink: Sink, config: DeliveryConfig,
                    warn: Callable[[str], None]) -> None:
    """Back off and retry later, or give the delivery up when its URL is unusable or its attempts or
    time are spent; either way the person at the console is told, with no secret in the message."""
    now = time.time()
    total = d.attempts + res.attempts
    error = scrub(res.error or "failed", [sink.url or ""])
    what = f"alert for {d.alert.run} step {d.alert.step} not delivered to {sink.label} ({error}); {total} attempt(s)"
    if res.permanent or total >= config.max_attempts or now - d.created_at >= config.give_up_after:
        state.abandon(d, attempts=res.attempts, error=error, now=now)
        warn(f"{what}, given up (it stays recorded in the state file)")
        return
    state.mark_failed(d, attempts=res.attempts, error=error,
                      next_at=now + backoff_delay(total, base=config.retry_base, cap=config.retry_cap))
    warn(f"{what}, will retry")
