"""Follow a kind of object as client-go's informers do: list once, then watch from the list's
resourceVersion. A watch that ends (its timeout, a dropped connection, an API server restart)
resumes from the last resourceVersion seen; only 410 Gone (the server no longer holds that much
history) lists again. So requests and memory grow with changes, not with the fleet: a steady
cluster costs one watch per informer.

Objects are kept slim: `slim` maps each object (a plain dict) to what the program needs of it,
and the raw JSON is never turned into the client's model classes (a 13 KB Node as a model object
costs many times its size). The list is paged (`limit`), so no single response holds the fleet.

    nodes = Informer(lambda **kw: core.list_node(**kw), slim=my_fields)
    nodes.ensure(stop)                    # the first list (raises what the server said), then a
                                          # thread that watches
    nodes.items()                         # the slim objects, by name
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

log = logging.getLogger("superkube-informer")

PAGE = 500  # objects per list page
WATCH_TIMEOUT_S = 300  # the server ends each watch after this long; it is resumed at once


class Gone(Exception):
    """410: the resourceVersion is older than the server's history; list again."""


def key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


class Informer:
    def __init__(
        self,
        lister: Callable[..., Any],
        slim: Callable[[dict[str, Any]], dict[str, Any]] = lambda obj: obj,
        field_selector: str = "",
        label_selector: str = "",
        on_change: Callable[[str, dict[str, Any] | None], None] = lambda name, obj: None,
    ) -> None:
        self.lister = lister
        self.slim = slim
        self.selectors = {
            k: v for k, v in (("field_selector", field_selector), ("label_selector", label_selector)) if v
        }
        self.on_change = on_change
        self.resource_version = ""
        self.lists = 0  # full lists made (1 while all goes well; one more per 410)
        self.watches = 0  # watch requests made
        self.events = 0  # watch events seen
        self._store: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._raw: Any = None  # the watch response being read
        self._refused: Exception | None = None  # the server's refusal of the last watch, if it refused
        self._stop: threading.Event | None = None

    # --- reading --------------------------------------------------------------------------------

    def items(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return dict(self._store)

    def get(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._store.get(name)

    # --- following --------------------------------------------------------------------------------

    def ensure(self, stop: threading.Event) -> None:
        """The first time: list (raising what the server said, for the caller's backoff), then follow
        on a daemon thread. After that: nothing (the thread keeps the store current)."""
        if self._refused is not None:  # the watch is refused (a missing permission): say so every round
            raise self._refused.with_traceback(None)
        if self._thread is not None:
            return
        self._stop = stop
        self.sync()
        self._thread = threading.Thread(target=self.run, args=(stop,), name="informer", daemon=True)
        self._thread.start()

    def sync(self) -> None:
        """List everything (paged) and replace the store; the watch resumes from this list."""
        store: dict[str, dict[str, Any]] = {}
        token = ""
        while True:
            raw = self.lister(limit=PAGE, _continue=token or None, _preload_content=False,
                              _request_timeout=60, **self.selectors)  # fmt: skip
            page = json.loads(raw.data)
            for obj in page.get("items") or []:
                store[key(obj)] = self.slim(obj)
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                version = str(meta.get("resourceVersion") or "")
                break
        with self._lock:
            old, self._store = self._store, store
            self.resource_version = version
        self.lists += 1
        for name in old.keys() - store.keys():
            self.on_change(name, None)
        for name, obj in store.items():
            if old.get(name) != obj:
                self.on_change(name, obj)
        self.synced.set()

    def watch_once(self, timeout_s: int = WATCH_TIMEOUT_S) -> None:
        """One watch from the last resourceVersion, applying each event until the server ends it.
        Raises Gone on 410."""
        self.watches += 1
        raw = self.lister(watch=True, resource_version=self.resource_version, allow_watch_bookmarks=True,
                          timeout_seconds=timeout_s, _preload_content=False, _request_timeout=(10, timeout_s + 30),
                          **self.selectors)  # fmt: skip
        self._raw = raw
        self._refused = None
        if self._stop is not None and self._stop.is_set():  # closed while this watch was being opened
            raw.close()
            return
        done = False
        try:
            for line in _lines(raw):
                self._apply(json.loads(line))
            done = True
        finally:
            self._raw = None
            if not done:
                raw.close()  # a half-read response never goes back to the pool
            raw.release_conn()

    def close(self, wait_s: float = 5.0) -> None:
        """Stop following: end the open watch and let the thread finish (before the process exits, so
        no thread is left inside a read as the interpreter shuts down)."""
        if self._stop is not None:
            self._stop.set()
        raw = self._raw
        if raw is not None:
            with contextlib.suppress(Exception):
                raw.shutdown()  # unblocks the read at once (urllib3 2)
            with contextlib.suppress(Exception):
                raw.close()
        if self._thread is not None:
            self._thread.join(wait_s)

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(obj.get("message", "too old resource version"))
            raise RuntimeError(f"watch error: {obj.get('message', obj)}")
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        self.events += 1
        if kind == "BOOKMARK":
            self.resource_version = version or self.resource_version
            return
        name = key(obj)
        slim = None if kind == "DELETED" else self.slim(dict(obj))
        with self._lock:
            before = self._store.get(name)
            if slim is None:
                self._store.pop(name, None)
            else:
                self._store[name] = slim
            self.resource_version = version or self.resource_version
        if slim != before:  # a kubelet's status heartbeat changes nothing a slim copy keeps: no news
            self.on_change(name, slim)

    def run(self, stop: threading.Event, retry_s: float = 1.0, max_retry_s: float = 30.0) -> None:
        """Follow until `stop`: list when there is no resourceVersion (or on 410), else watch."""
        delay = retry_s
        while not stop.is_set():
            try:
                if not self.resource_version:
                    self.sync()
                self.watch_once()
                delay = retry_s
            except Gone as e:
                log.warning("watch history gone (%s); listing again", e)
                self.resource_version = ""
            except Exception as e:  # a dropped connection, a restart: resume from where it was
                if stop.is_set():
                    return
                if getattr(e, "status", None) == 410:  # Gone said as the response's status, not an event
                    log.warning("watch history gone (410); listing again")
                    self.resource_version = ""
                    continue
                if _refusal(e):  # not a network fault: the store goes stale until it is fixed
                    self._refused = e
                log.warning("watch ended (%s); resuming from %s in %.0f s", str(e).splitlines()[0][:200],
                            self.resource_version or "a new list", delay)  # fmt: skip
                stop.wait(delay)
                delay = min(delay * 2, max_retry_s)


def _refusal(exc: BaseException) -> bool:
    """The server said no (403 and the like), as opposed to being away or asking for patience."""
    status = getattr(exc, "status", None)
    return isinstance(status, int) and 400 <= status < 500 and status not in (408, 410, 429)


def _lines(raw: Any) -> Iterator[bytes]:
    """The newline-separated JSON events of a watch response, as they arrive."""
    pending = b""
    for chunk in raw.stream(64 * 1024, decode_content=True):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield line
    if pending.strip():
        yield pending
