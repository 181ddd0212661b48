"""The node cache: checkpoint images on local disk, ready for `runsc restore`.

Layout under the cache root:
    index.sqlite                   (WAL; index.lock guards its creation) entries (key, tuple, size, state, last use), their
                                   chunks (where each chunk lies, for dedup), leases,
                                   reservations of space for downloads in progress
    entries/<key>@<tuple16>@<id>/  one entry: the image files and .thaw-manifest.json
    tmp/<entry>.<pid>-<start>.partial/
                                   an entry being written (never served), named with
                                   its writer (Owner: pid + start time)
    locks/<key>.lock               one filelock per workload key (never deleted)
    trash/                         entries on their way out
    views/<entry>.<rand>.<pid>-<start>/
                                   what one restore from an entry reads through thaw-gofer,
                                   every chunk checked (control/images/served.py)

Rules (docs/store.md): an entry is served only if its index row says `ready`,
and that row is written after the directory was filled, fsynced and renamed
into entries/; anything else found after a crash (a partial whose writer is
gone, a directory without a row) is removed under the key's lock before the
key is served. A partial is written either by a fill (under the key's lock)
or by `runsc checkpoint` (control/images/image.py `staged`: no lock while
runsc writes and the image is published; the lock only to install it), so
recovery leaves the partials of live writers alone. N
pulls of one key take the key's lock in turn: the first downloads, the others
find the entry ready. A lease (pid + start time) pins an entry while runsc
reads it; eviction skips leased entries and reaps leases of dead processes.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

from filelock import FileLock
from filelock import Timeout as LockTimeout

from control import metrics
from control.images import manifest as manifestmod
from control.images import chunk
from control.node.compat import CompatTuple, check
from control.errors import CacheFull, NotFound, Timeout
from control.images.manifest import Manifest
from control.images.transfer import LocalCopy, Sources, read_local
from control.files import Owner, fsync_path, process_start
from control.logfields import fields
from control.images.entry import _PARTIAL, Entry, Lease, _command, partial_owner  # noqa: F401

log = logging.getLogger(__name__)

MANIFEST_FILE = ".thaw-manifest.json"   # a dot-name: no image file can be called that
VIEWS_DIR = "views"                     # control/images/served.py: one directory per verified restore
CORRUPT_REPORT = "corrupt.json"         # in a view: the first chunk thaw-gofer found altered


_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id TEXT PRIMARY KEY, key TEXT NOT NULL, tuple_hash TEXT NOT NULL, tuple TEXT NOT NULL,
    size INTEGER NOT NULL, state TEXT NOT NULL CHECK (state IN ('ready', 'corrupt', 'evicting')),
    created REAL NOT NULL, last_used REAL NOT NULL, snapshot TEXT NOT NULL,
    verified REAL NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS entries_key ON entries(key);
CREATE TABLE IF NOT EXISTS chunks (hash TEXT NOT NULL, entry TEXT NOT NULL, file TEXT NOT NULL,
    offset INTEGER NOT NULL, length INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_hash ON chunks(hash);
CREATE INDEX IF NOT EXISTS chunks_entry ON chunks(entry);
CREATE TABLE IF NOT EXISTS leases (id INTEGER PRIMARY KEY AUTOINCREMENT, entry TEXT NOT NULL,
    pid INTEGER NOT NULL, pid_start TEXT NOT NULL, created REAL NOT NULL, holder TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS reservations (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL,
    bytes INTEGER NOT NULL, pid INTEGER NOT NULL, pid_start TEXT NOT NULL);
"""





class Cache:
    def __init__(self, root: Path, budget_bytes: int, lock_timeout_s: float = 900.0, verify: str = "stat",
                 direct_io: bool = False) -> None:
        self.root = Path(root)
        self.direct_io = direct_io   # fills write fetched pages with O_DIRECT (transfer.fill)
        self.budget = budget_bytes
        self.lock_timeout_s = lock_timeout_s
        self.verify_mode = verify
        for d in ("entries", "tmp", "locks", "trash"):
            (self.root / d).mkdir(parents=True, exist_ok=True, mode=0o700)
        # The cache holds images in plaintext (runsc reads them): only its owner
        # (root, thawd) may enter it (docs/security.md).
        if self.root.stat().st_uid == os.geteuid():
            os.chmod(self.root, 0o700)
        # The index names every entry's keys and chunk hashes: owner-only like the entries
        # (SQLite gives its -wal and -shm files the database's mode), whatever the umask.
        index = self.root / "index.sqlite"
        os.close(os.open(index, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        if index.stat().st_uid == os.geteuid():
            os.chmod(index, 0o600)
        # One process at a time creates the schema and switches the journal
        # to WAL (that switch needs the database to itself).
        with FileLock(self.root / "index.lock", timeout=60, mode=0o600):
            db = sqlite3.connect(self.root / "index.sqlite", timeout=60, isolation_level=None)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(_SCHEMA)
                # Who holds a lease, in words (issue 33: `thaw evict` says why it refuses): a
                # column an index written before it lacks; older thaw leaves it ''.
                if "holder" not in {r[1] for r in db.execute("PRAGMA table_info(leases)")}:
                    db.execute("ALTER TABLE leases ADD COLUMN holder TEXT NOT NULL DEFAULT ''")
                # Indexes made before issue 30 lack `verified` (when every chunk was last hashed).
                if "verified" not in {r[1] for r in db.execute("PRAGMA table_info(entries)")}:
                    db.execute("ALTER TABLE entries ADD COLUMN verified REAL NOT NULL DEFAULT 0")
            finally:
                db.close()

    # -- plumbing -------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.root / "index.sqlite", timeout=60, isolation_level=None)
        db.execute("PRAGMA busy_timeout=60000")
        db.execute("PRAGMA synchronous=FULL")
        return db

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE: writers queue, readers go on)."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    @contextmanager
    def key_lock(self, key: str, timeout_s: float | None = None) -> Iterator[None]:
        """Hold the key's lock file; raises Timeout naming the lock path."""
        # Again, though every entry point (image.pull, stream.open_image, ...) validated it
        # first for its own error: here the key becomes a file name under the cache root,
        # and the cache's public methods do not trust five callers for that (~1 us a call).
        manifestmod.validate_key(key)
        path = self.root / "locks" / f"{key}.lock"
        t = self.lock_timeout_s if timeout_s is None else timeout_s
        lock = FileLock(path, timeout=t, mode=0o600)
        try:
            lock.acquire()
        except LockTimeout:
            raise Timeout(f"waiting for the cache lock {path} (another pull of {key!r})", t,
                          "cache.lock_timeout_s" if timeout_s is None else "the caller's deadline") from None
        try:
            yield
        finally:
            lock.release()

    def entry_path(self, entry_id: str) -> Path:
        return self.root / "entries" / entry_id

    def _row_entry(self, row: tuple, leases: int) -> Entry:
        eid, key, _th, tup, size, state, created, last_used, verified = row
        return Entry(eid, key, CompatTuple.from_dict(json.loads(tup)), size, state, created, last_used,
                     leases, self.entry_path(eid), verified)

    _COLS = "id, key, tuple_hash, tuple, size, state, created, last_used, verified"

    def entries(self, key: str | None = None) -> list[Entry]:
        db = self._connect()
        try:
            q = f"SELECT {self._COLS} FROM entries" + (" WHERE key = ?" if key else "") + " ORDER BY key, created"
            rows = db.execute(q, (key,) if key else ()).fetchall()
            leases = self._live_leases(db)
        finally:
            db.close()
        return [self._row_entry(r, leases.get(r[0], 0)) for r in rows]

    def _live_leases(self, db: sqlite3.Connection) -> dict[str, int]:
        out: dict[str, int] = {}
        for entry, pid, start in db.execute("SELECT entry, pid, pid_start FROM leases").fetchall():
            if Owner(pid, start).alive():
                out[entry] = out.get(entry, 0) + 1
        return out

    def used_bytes(self) -> int:
        db = self._connect()
        try:
            return db.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0]
        finally:
            db.close()

    def manifest_of(self, entry: Entry) -> Manifest:
        return manifestmod.parse((entry.path / MANIFEST_FILE).read_bytes(), str(entry.path / MANIFEST_FILE))

    # -- lookup and leases ------------------------------------------------------------

    def find_locked(self, key: str, node: CompatTuple) -> tuple[Entry | None, list[str]]:
        """A ready entry of `key` this node can restore, and the reasons other entries cannot.
        Precondition: the key's lock is held (or a stale answer is acceptable)."""
        reasons: list[str] = []
        best = None
        for e in self.entries(key):
            if e.state != "ready":
                continue
            bad = check(e.tuple, node)
            if bad:
                reasons.append(f"cached {e.tuple.hash()[:12]}: " + "; ".join(map(str, bad)))
            elif best is None or e.tuple.hash() == node.hash():
                best = e
        return best, reasons

    def lease_holders(self, entry_id: str) -> list[str]:
        """Who holds live leases on an entry, one line each: "pid 812 (thaw serve): parked
        sandbox p-1" (the process's command line, then what it said with Lease.describe)."""
        db = self._connect()
        try:
            rows = db.execute("SELECT pid, pid_start, holder FROM leases WHERE entry = ? ORDER BY id",
                              (entry_id,)).fetchall()
        finally:
            db.close()
        return [f"pid {pid} ({_command(pid)})" + (f": {holder}" if holder else "")
                for pid, start, holder in rows if Owner(pid, start).alive()]

    def lease(self, entry_id: str, hit: bool = False, holder: str = "") -> Lease | None:
        """Pin a ready entry; None if it is not ready (any more). `hit`: the entry was in
        the cache already when its image was asked for (Lease.hit). `holder`: who, in words."""
        with self._tx() as db:
            row = db.execute(f"SELECT {self._COLS} FROM entries WHERE id = ? AND state = 'ready'",
                             (entry_id,)).fetchone()
            if row is None:
                return None
            now = time.time()
            cur = db.execute("INSERT INTO leases (entry, pid, pid_start, created, holder) VALUES (?, ?, ?, ?, ?)",
                             (entry_id, os.getpid(), Owner.me().start, now, holder[:200]))
            db.execute("UPDATE entries SET last_used = ? WHERE id = ?", (now, entry_id))
            lease_id = cur.lastrowid
        return Lease(self, lease_id, self._row_entry(row, 1), hit)

    def check_entry(self, entry: Entry, full: bool | None = None) -> str | None:
        """Why an entry is unusable (None: usable). `full` re-hashes every chunk;
        otherwise each file's size, inode, mtime and ctime are compared with those
        at install (_snapshot), and a report of a restore that read an altered
        chunk (thaw-gofer's, in the entry's views) counts too.

        ctime is the part a writer cannot put back (utime sets it to now; the
        issue-30 reproduction flipped bytes and restored the mtime), but a hard
        link made or removed changes it as well (a streamed restore's directory
        does, once): where the link count differs from the snapshot's, ctime is
        not compared, and only the restore path, the scrub or a full check catch
        what a write with its mtime put back changed."""
        full = self.verify_mode == "full" if full is None else full
        db = self._connect()
        try:
            row = db.execute("SELECT snapshot FROM entries WHERE id = ?", (entry.id,)).fetchone()
        finally:
            db.close()
        if row is None:
            return "not in the index"
        reported = self.corrupt_report(entry.id)
        if reported:
            return reported
        try:
            m = self.manifest_of(entry)
        except (OSError, manifestmod.ManifestError) as e:
            return f"manifest unreadable: {e}"
        snapshot = json.loads(row[0])
        for f in m.files:
            p = entry.path / f.name
            try:
                st = p.stat()
            except OSError:
                return f"{f.name} is missing"
            if st.st_size != f.size:
                return f"{f.name} is {st.st_size} bytes, manifest says {f.size}"
            if not full:
                why = _changed(f.name, snapshot.get(f.name), st)
                if why:
                    return why
            if full:
                for off, c in f.placed():
                    data = read_local(LocalCopy(p, off, entry.id), c.length)
                    if data is None or chunk.sha256(data) != c.hash:
                        return f"{f.name} chunk at offset {off} does not hash to {c.hash[:16]}"
        return None

    def corrupt_report(self, entry_id: str) -> str | None:
        """What a verified restore of the entry reported (thaw-gofer's CORRUPT_REPORT in one
        of its views, control/images/served.py), as a reason; None when none did."""
        for p in (self.root / VIEWS_DIR).glob(f"{entry_id}.*/{CORRUPT_REPORT}"):
            try:
                r = json.loads(p.read_bytes()[:4096])
                return (f"a restore read {r['file']} at {r['offset']} ({r['length']} bytes): it hashes to "
                        f"{str(r['got'])[:16]}, its name is {str(r['chunk'])[:16]}")
            except (OSError, ValueError, KeyError, TypeError):
                return f"a restore reported an altered chunk ({p})"
        return None

    def mark_verified(self, entry_id: str) -> None:
        """Every chunk of the entry was hashed just now and matched: record when, and the
        files' inode data as they are now (the link count may have changed since install)."""
        e = next((x for x in self.entries() if x.id == entry_id), None)
        if e is None:
            return
        snap = _snapshot(e.path, [f.name for f in self.manifest_of(e).files])
        with self._tx() as db:
            db.execute("UPDATE entries SET verified = ?, snapshot = ? WHERE id = ? AND state = 'ready'",
                       (time.time(), json.dumps(snap), entry_id))

    def mark_corrupt(self, entry_id: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE entries SET state = 'corrupt' WHERE id = ? AND state = 'ready'", (entry_id,))
        log.warning("cache entry %s marked corrupt", entry_id,
                    extra=fields(entry=entry_id, key=entry_id.split("@", 1)[0], decision="corrupt"))

    # -- sources for dedup ---------------------------------------------------------------

    def sources(self, hashes: Iterable[str], tenant: str = "") -> Sources:
        """Where the chunks `hashes` lie in this cache (ready entries first, then
        corrupt ones; every copy is hash-checked when read). One index query per
        500 hashes, done here, not per chunk. With `tenant`, only that tenant's
        entries (keys "<tenant>.*") count: dedup stays within a tenant, so how
        fast a pull is says nothing about another tenant's images (issue 13).
        Tenant ids hold no LIKE wildcard (config.TENANT_PATTERN)."""
        want = list(dict.fromkeys(hashes))
        found: dict[str, list[LocalCopy]] = {}
        only = " AND e.key LIKE ?" if tenant else ""
        db = self._connect()
        try:
            for i in range(0, len(want), 500):
                part = want[i:i + 500]
                rows = db.execute(
                    "SELECT c.hash, c.entry, c.file, c.offset FROM chunks c JOIN entries e ON e.id = c.entry "
                    f"WHERE c.hash IN ({','.join('?' * len(part))}) AND e.state IN ('ready', 'corrupt'){only} "
                    "ORDER BY e.state = 'corrupt'", part + ([f"{tenant}.%"] if tenant else [])).fetchall()
                for h, eid, f, off in rows:
                    found.setdefault(h, []).append(LocalCopy(self.entry_path(eid) / f, off, eid))
        finally:
            db.close()
        return lambda h: found.get(h, [])[:3]

    # -- space ---------------------------------------------------------------------------

    def reserve(self, key: str, need: int) -> int:
        """Make room for `need` bytes and reserve them; the reservation id.

        Evicts corrupt entries first, then least recently used ones, never a
        leased one; the key's own entries go last (they may serve as sources).
        """
        if need > self.budget:
            metrics.inc("thaw_cache_full_total")
            raise CacheFull(key, need, self.budget, 0, "the image is larger than the whole cache budget")
        victims: list[str] = []
        with self._tx() as db:
            self._reap_tx(db)
            leased = set(self._live_leases(db))
            used = db.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0]
            used += db.execute("SELECT COALESCE(SUM(bytes), 0) FROM reservations").fetchone()[0]
            cands = db.execute("SELECT id, size FROM entries WHERE state IN ('ready', 'corrupt') "
                               "ORDER BY key = ?, state = 'ready', last_used", (key,)).fetchall()
            in_use = sum(s for i, s in cands if i in leased)
            for eid, size in cands:
                if used + need <= self.budget:
                    break
                if eid in leased:
                    continue
                victims.append(eid)
                used -= size
            if used + need > self.budget:
                metrics.inc("thaw_cache_full_total")
                raise CacheFull(key, need, self.budget, in_use,
                                "entries in use (leased) or downloads in progress hold the rest")
            for eid in victims:
                db.execute("UPDATE entries SET state = 'evicting' WHERE id = ?", (eid,))
            me = os.getpid()
            rid = db.execute("INSERT INTO reservations (key, bytes, pid, pid_start) VALUES (?, ?, ?, ?)",
                             (key, need, me, process_start(me))).lastrowid
        for eid in victims:
            self._remove(eid)
        return rid

    def unreserve(self, rid: int) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM reservations WHERE id = ?", (rid,))

    def _reap_tx(self, db: sqlite3.Connection) -> None:
        """Drop leases and reservations of dead processes (inside a transaction)."""
        for table in ("leases", "reservations"):
            for rid, pid, start in db.execute(f"SELECT id, pid, pid_start FROM {table}").fetchall():
                if not Owner(pid, start).alive():
                    db.execute(f"DELETE FROM {table} WHERE id = ?", (rid,))

    def _remove(self, entry_id: str) -> None:
        """Remove an entry marked 'evicting': out of sight first (rename), then the bytes."""
        src = self.entry_path(entry_id)
        if src.exists():
            dst = self.root / "trash" / f"{entry_id}.{secrets.token_hex(4)}"
            os.rename(src, dst)
            shutil.rmtree(dst, ignore_errors=True)
        with self._tx() as db:
            db.execute("DELETE FROM chunks WHERE entry = ?", (entry_id,))
            db.execute("DELETE FROM entries WHERE id = ? AND state = 'evicting'", (entry_id,))

    def evict(self, entry_id: str) -> bool:
        """Evict one entry unless it is leased; True if it went."""
        with self._tx() as db:
            self._reap_tx(db)
            if entry_id in self._live_leases(db):
                return False
            n = db.execute("UPDATE entries SET state = 'evicting' WHERE id = ? AND state != 'evicting'",
                           (entry_id,)).rowcount
        if n:
            self._remove(entry_id)
        return bool(n)

    # -- install ----------------------------------------------------------------------------

    def new_partial(self, key: str, tuple_hash: str) -> tuple[str, Path]:
        """A new, empty directory for an entry of `key` (entry id, path), named
        with this process as its writer: recovery removes it only once this
        process is gone. The caller removes it if it does not install it."""
        manifestmod.validate_key(key)   # a file name under the cache root (key_lock says why again)
        eid = f"{key}@{tuple_hash[:16]}@{secrets.token_hex(4)}"
        me = Owner.me()
        p = self.root / "tmp" / f"{eid}.{me.pid}-{me.start}{_PARTIAL}"
        p.mkdir(mode=0o700)   # an image is the workload's memory: owner-only whatever the umask (issue 30)
        return eid, p

    def install_locked(self, eid: str, partial: Path, m: Manifest) -> Entry:
        """Make a filled partial directory a ready entry, by rename (no byte is
        copied). Precondition: key lock held, every image file in `partial`
        written and fsynced, and matching `m`."""
        mpath = partial / MANIFEST_FILE
        with open(os.open(mpath, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "wb") as f:
            f.write(m.to_json())
            f.flush()
            os.fsync(f.fileno())
        for f in m.files:   # runsc writes its files 0644 (runsc/sandbox createSaveFiles): owner-only here
            os.chmod(partial / f.name, 0o600, follow_symlinks=False)
        snapshot = _snapshot(partial, [f.name for f in m.files])
        fsync_path(partial)
        final = self.entry_path(eid)
        os.rename(partial, final)
        fsync_path(final.parent)
        self._commit_locked(eid, m, snapshot)
        return self.entries_by_id(eid)

    def _commit_locked(self, eid: str, m: Manifest, snapshot: dict) -> None:
        """The step that makes an entry servable: one transaction adds its row and chunk map."""
        now = time.time()
        with self._tx() as db:
            # verified: every chunk of a new entry was hashed on its way in (a fill or a
            # stream checks each; a published checkpoint's chunks were named by thaw-chunk).
            db.execute("INSERT INTO entries (id, key, tuple_hash, tuple, size, state, created, last_used, snapshot, "
                       "verified) VALUES (?, ?, ?, ?, ?, 'ready', ?, ?, ?, ?)",
                       (eid, m.key, m.tuple_hash, json.dumps(m.tuple.to_dict()), m.size, now, now,
                        json.dumps(snapshot), now))
            rows = []
            seen: set[str] = set()
            for f in m.files:
                for off, c in f.placed():
                    if c.hash not in seen:
                        seen.add(c.hash)
                        rows.append((c.hash, eid, f.name, off, c.length))
            db.executemany("INSERT INTO chunks (hash, entry, file, offset, length) VALUES (?, ?, ?, ?, ?)", rows)

    def entries_by_id(self, eid: str) -> Entry:
        for e in self.entries():
            if e.id == eid:
                return e
        raise NotFound("cache entry", eid)

    # -- recovery -------------------------------------------------------------------------------

    def recover_locked(self, key: str) -> list[str]:
        """Remove what a crash may have left for `key`: partial directories, entry
        directories without an index row, rows whose directory is gone, unfinished
        evictions. Precondition: the key's lock is held. What was removed."""
        removed = []
        for p in (self.root / "tmp").glob(f"{key}@*{_PARTIAL}"):
            owner = partial_owner(p)
            if owner is not None and owner.alive():
                continue   # being written (a checkpoint, in this process or another): not a leftover
            shutil.rmtree(p, ignore_errors=True)
            removed.append(str(p))
        known = {e.id: e for e in self.entries(key)}
        for p in (self.root / "entries").glob(f"{key}@*"):
            if p.name not in known:
                dst = self.root / "trash" / f"{p.name}.{secrets.token_hex(4)}"
                os.rename(p, dst)
                shutil.rmtree(dst, ignore_errors=True)
                removed.append(str(p))
        for e in known.values():
            if e.state == "evicting" or not e.path.is_dir():
                with self._tx() as db:
                    db.execute("UPDATE entries SET state = 'evicting' WHERE id = ?", (e.id,))
                self._remove(e.id)
                removed.append(str(e.path))
        return removed

    def keys(self) -> list[str]:
        names = {p.name[:-len(".lock")] for p in (self.root / "locks").glob("*.lock")}
        names |= {e.key for e in self.entries()}
        # A checkpoint killed before it took its key's lock leaves only a partial.
        names |= {p.name.split("@", 1)[0] for p in (self.root / "tmp").glob(f"*@*{_PARTIAL}")}
        return sorted(names)

    def recover(self, on_busy: Callable[[str], None] | None = None) -> list[str]:
        """recover_locked for every key whose lock is free now (a busy key is being
        pulled, streamed or checkpointed: its owner recovers it). What was removed."""
        removed: list[str] = []
        for key in self.keys():
            try:
                with self.key_lock(key, timeout_s=0):
                    removed += self.recover_locked(key)
            except Timeout:
                if on_busy:
                    on_busy(key)
        return removed

    def gc(self, budget: int | None = None, on_busy: Callable[[str], None] | None = None) -> dict:
        """Recover every key whose lock is free, evict corrupt and over-budget
        entries (never leased ones), empty the trash. A report."""
        removed = self.recover(on_busy)
        evicted: list[str] = []
        with self._tx() as db:
            self._reap_tx(db)
        for e in self.entries():
            if e.state == "corrupt" and self.evict(e.id):
                evicted.append(e.id)
        limit = self.budget if budget is None else budget
        for e in sorted(self.entries(), key=lambda e: e.last_used):
            if self.used_bytes() <= limit:
                break
            if e.state == "ready" and self.evict(e.id):
                evicted.append(e.id)
        for p in (self.root / "trash").iterdir():
            shutil.rmtree(p, ignore_errors=True)
        return {"removed_partial_or_orphan": removed, "evicted": evicted, "used_bytes": self.used_bytes(),
                "budget_bytes": limit}


def _snapshot(directory: Path, names: list[str]) -> dict:
    """What check_entry compares later: per file [mtime_ns, ctime_ns, inode, link count]."""
    out = {}
    for name in names:
        st = (directory / name).stat()
        out[name] = [st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_nlink]
    return out


def _changed(name: str, snap, st: os.stat_result) -> str | None:
    """Why a file's stat differs from its snapshot (None: it does not). Snapshots of
    entries installed before issue 30 hold the mtime alone."""
    if isinstance(snap, int):
        snap = [snap, None, None, None]
    if not isinstance(snap, list) or len(snap) != 4:
        return f"{name}: no record of it at install"
    mtime, ctime, ino, nlink = snap
    if mtime != st.st_mtime_ns:
        return f"{name} was modified after install (mtime changed)"
    if ino is not None and ino != st.st_ino:
        return f"{name} was replaced after install (another inode)"
    if ctime is not None and nlink == st.st_nlink and ctime != st.st_ctime_ns:
        return f"{name} was changed after install (ctime changed, mtime put back)"
    return None
