"""Prometheus text -> samples, snapshots and counter deltas.

Counters are read as deltas over a window (field notes: vLLM's periodic log lines exist
only briefly after traffic; counters do not lie about when they were read).  A metric that
is absent is reported as absent (``None``), never as a silent zero, and a counter that went
backwards means the server restarted mid-window: that is flagged, not a negative delta.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from servebook import http

Labels = tuple[tuple[str, str], ...]


class ScrapeError(Exception):
    """The endpoint did not give a Prometheus document."""


def parse(text: str) -> dict[str, dict[Labels, float]]:
    """Sample name -> {sorted label pairs: value}.  ``_created`` samples are dropped:
    they are timestamps, never quantities."""
    out: dict[str, dict[Labels, float]] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:
        raise ScrapeError(f"not Prometheus text: {e}") from None
    for fam in families:
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = float(s.value)
    return out


@dataclass(frozen=True)
class Snapshot:
    url: str
    taken_at: float
    samples: Mapping[str, Mapping[Labels, float]] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        return name in self.samples

    def label_sets(self, name: str) -> list[dict[str, str]]:
        return [dict(lbls) for lbls in self.samples.get(name, {})]

    def value(self, name: str, **labels: str) -> float | None:
        """Sum of the samples called ``name`` whose labels include ``labels``; ``None`` when
        the metric is absent altogether."""
        series = self.samples.get(name)
        if series is None:
            return None
        want = set(labels.items())
        return sum(v for lbls, v in series.items() if want <= set(lbls))


def snapshot_from_text(text: str, url: str = "", taken_at: float | None = None) -> Snapshot:
    return Snapshot(
        url=url, taken_at=time.time() if taken_at is None else taken_at, samples=parse(text)
    )


def scrape(base_url: str, *, timeout: float = 5.0) -> Snapshot:
    url = base_url.rstrip("/") + "/metrics"
    try:
        resp = http.get(url, timeout=timeout)
    except http.HTTPError as e:
        raise ScrapeError(str(e)) from None
    if resp.status != 200:
        raise ScrapeError(f"GET {url}: HTTP {resp.status}")
    return snapshot_from_text(resp.text, url=url)


# A role with several replicas (Pods behind one Service) is one set of counters: each
# replica's series carries this label, so a value (and a delta) sums every replica.
REPLICA_LABEL = "servebook_replica"


def scrape_replicas(base_urls: Sequence[str], *, timeout: float = 5.0) -> Snapshot:
    """One role's counters over all its replicas (``ScrapeError`` when any cannot be read:
    a sum over some replicas is not the role's)."""
    if len(base_urls) == 1:
        return scrape(base_urls[0], timeout=timeout)
    return merge_replicas([scrape(u, timeout=timeout) for u in base_urls])


def scrape_roles(
    urls: Mapping[str, str | tuple[str, ...]], timeout: float = 5.0
) -> dict[str, Snapshot | str]:
    """Every role's /metrics (summed over its replicas when it names several URLs); a role
    that cannot be read is asked once more, and gets its errors instead when that fails
    too.  One slow answer (an engine whose cores the load fills: a 5 s timeout missed at a
    load average of 10 on 2 cores) lost the point's evidence, so the point; read again it
    is the counters a little after the edge, which the point records
    (``window.scrape_*_lag_ms``)."""
    out: dict[str, Snapshot | str] = {}
    for role, url in urls.items():
        replicas = (url,) if isinstance(url, str) else url
        errors = []
        for _ in range(2):
            try:
                out[role] = scrape_replicas(replicas, timeout=timeout)
                break
            except ScrapeError as e:
                errors.append(str(e))
        else:
            out[role] = "; asked again: ".join(errors)
    return out


def merge_replicas(snaps: Sequence[Snapshot]) -> Snapshot:
    """Several replicas' snapshots as one role's: each series tagged with its replica's
    index (``REPLICA_LABEL``), so a value sums them and ``split_replicas`` undoes it."""
    samples: dict[str, dict[Labels, float]] = {}
    for i, snap in enumerate(snaps):
        for name, series in snap.samples.items():
            for labels, value in series.items():
                tagged = tuple(sorted((*labels, (REPLICA_LABEL, str(i)))))
                samples.setdefault(name, {})[tagged] = value
    return Snapshot(
        url=" + ".join(s.url for s in snaps),
        taken_at=min(s.taken_at for s in snaps),
        samples=samples,
    )


def split_replicas(snap: Snapshot) -> list[Snapshot]:
    """The replicas a ``scrape_replicas`` snapshot sums, each as its own snapshot (the
    replica label removed), in the order they were scraped; one replica: ``[snap]``."""
    by_replica: dict[int, dict[str, dict[Labels, float]]] = {}
    for name, series in snap.samples.items():
        for labels, value in series.items():
            tag = dict(labels).get(REPLICA_LABEL)
            if tag is None:
                return [snap]
            rest = tuple(kv for kv in labels if kv[0] != REPLICA_LABEL)
            by_replica.setdefault(int(tag), {}).setdefault(name, {})[rest] = value
    if not by_replica:
        return [snap]
    urls = snap.url.split(" + ")
    n = max(len(urls), max(by_replica) + 1)
    return [
        Snapshot(
            url=urls[i] if len(urls) == n else snap.url,
            taken_at=snap.taken_at,
            samples=by_replica.get(i, {}),
        )
        for i in range(n)
    ]


@dataclass(frozen=True)
class Delta:
    name: str
    value: float | None  # None: the metric is absent from one of the snapshots
    reset: bool = False  # the counter went backwards: the server restarted in the window

    @property
    def usable(self) -> bool:
        return self.value is not None and not self.reset


def delta(before: Snapshot, after: Snapshot, name: str, **labels: str) -> Delta:
    a, b = before.value(name, **labels), after.value(name, **labels)
    if a is None or b is None:
        return Delta(name, None)
    if b < a:
        return Delta(name, None, reset=True)
    return Delta(name, b - a)
