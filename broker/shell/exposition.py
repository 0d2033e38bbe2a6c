"""Prometheus' text exposition format, our own: what a broker node's ``/metrics`` is written with
(``broker.shell.metrics``), and a NameServer's (``namesrv.metrics``), so that neither process
loads a metrics library.

Owns the kinds of series a node exports and how they print: counters with labels (``Counter``),
histograms with fixed buckets (``Histogram``), the gauge and counter families a collector builds
at each scrape (``GaugeMetricFamily``, ``CounterMetricFamily``), and a registry that prints them
in the order registered (``generate_latest``). The names and signatures used are
``prometheus_client``'s, and so is the text, series for series: a counter ``x`` prints as
``x_total``, then an ``x_created`` gauge family (each child's creation time, Unix seconds); a
histogram as cumulative ``_bucket`` series (``le`` up to ``+Inf``), ``_count`` and ``_sum``,
then ``_created``; labels sorted by name; label values with backslash, double quote and newline
escaped, HELP text with backslash and newline escaped; numbers as Go prints them (``_number``).
Counting happens on the node's event loop thread only: nothing here takes a lock.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterable, Sequence

__all__ = ["CONTENT_TYPE_LATEST", "Collector", "CollectorRegistry", "Counter",
           "CounterMetricFamily", "GaugeMetricFamily", "Histogram", "Metric", "generate_latest"]

CONTENT_TYPE_LATEST = "text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[tuple[str, str], ...]  # (name, value) sorted by name


def _number(value: float) -> str:
    """``value`` as Go's ``strconv.FormatFloat(v, 'g')`` would read it back: Python's repr, with
    an exponent past six integer digits, ``+Inf``/``-Inf``/``NaN`` spelled Prometheus' way."""
    value = float(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:  # 1234567.0 -> 1.234567e+06
        digits = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{digits}e+{dot - 1:02d}"
    return text


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _label_text(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape_value(v)}"' for k, v in labels) + "}"


def _labels(names: Sequence[str], values: Sequence[object]) -> Labels:
    if len(values) != len(names):
        raise ValueError(f"{len(values)} label values for the labels {tuple(names)}")
    return tuple(sorted(zip(names, (str(v) for v in values))))


class Metric:
    """One family: a name, its HELP text, its TYPE, and its samples (name, labels, value)."""

    __slots__ = ("name", "documentation", "type", "samples")

    def __init__(self, name: str, documentation: str, kind: str) -> None:
        self.name = name
        self.documentation = documentation
        self.type = kind
        self.samples: list[tuple[str, Labels, float]] = []

    def render(self, out: list[str]) -> None:
        """Append this family's lines, as ``prometheus_client.generate_latest`` prints them."""
        shown = f"{self.name}_total" if self.type == "counter" else self.name
        help_text = _escape_help(self.documentation)
        out.append(f"# HELP {shown} {help_text}\n# TYPE {shown} {self.type}\n")
        created = f"{self.name}_created"
        late: list[str] = []
        for name, labels, value in self.samples:
            line = f"{name}{_label_text(labels)} {_number(value)}\n"
            (late if name == created else out).append(line)
        if late:  # the creation times: a gauge family of their own, after the family
            out.append(f"# HELP {created} {help_text}\n# TYPE {created} gauge\n")
            out.extend(late)


class GaugeMetricFamily(Metric):
    """Gauges read at scrape time: ``add_metric(label values, value)`` per series."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, documentation, "gauge")
        self._names = tuple(labels)

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self.samples.append((self.name, _labels(self._names, labels), value))


class CounterMetricFamily(Metric):
    """Counters read at scrape time (a ``_total`` each, no creation time)."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name.removesuffix("_total"), documentation, "counter")
        self._names = tuple(labels)

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self.samples.append((f"{self.name}_total", _labels(self._names, labels), value))


class Collector:
    """What a registry asks for its families at each scrape."""

    def collect(self) -> Iterable[Metric]:
        raise NotImplementedError

    def describe(self) -> Iterable[Metric]:
        return []


class CollectorRegistry(Collector):
    """The collectors of one node, printed in the order registered."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        self._collectors.append(collector)

    def collect(self) -> Iterable[Metric]:
        for collector in self._collectors:
            yield from collector.collect()


class _CounterChild:
    __slots__ = ("value", "created_s")

    def __init__(self) -> None:
        self.value = 0.0
        self.created_s = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"a counter only goes up: inc({amount})")
        self.value += amount


class _HistogramChild:
    __slots__ = ("bounds", "counts", "sum", "created_s")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is +Inf's
        self.sum = 0.0
        self.created_s = time.time()

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # (le: value <= bound)
        self.sum += value


class _Labelled(Collector):
    """A family of children, one per label values, made on first use and kept."""

    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry | None) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[Labels, _CounterChild | _HistogramChild] = {}
        if registry is not None:
            registry.register(self)

    def _child(self, values: Sequence[object]) -> _CounterChild | _HistogramChild:
        key = _labels(self.labelnames, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new()
        return child

    def _new(self) -> _CounterChild | _HistogramChild:
        raise NotImplementedError

    def collect(self) -> Iterable[Metric]:
        family = Metric(self.name, self.documentation, self.kind)
        for labels, child in self._children.items():
            self._samples(family.samples, labels, child)
        return [family]

    def _samples(self, out: list[tuple[str, Labels, float]], labels: Labels,
                 child: _CounterChild | _HistogramChild) -> None:
        raise NotImplementedError


class Counter(_Labelled):
    """A counter family counted as things happen: ``labels(*values).inc(amount)``."""

    kind = "counter"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 registry: CollectorRegistry | None = None) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames, registry)
        if not self.labelnames:  # (there at 0 from the start, as prometheus_client's is)
            self._child(())

    def inc(self, amount: float = 1.0) -> None:
        """A counter without labels counts up (one with labels: ``labels(...).inc``)."""
        self.labels().inc(amount)

    def labels(self, *values: object) -> _CounterChild:
        child = self._child(values)
        assert isinstance(child, _CounterChild)
        return child

    def _new(self) -> _CounterChild:
        return _CounterChild()

    def _samples(self, out: list[tuple[str, Labels, float]], labels: Labels,
                 child: _CounterChild | _HistogramChild) -> None:
        assert isinstance(child, _CounterChild)
        out.append((f"{self.name}_total", labels, child.value))
        out.append((f"{self.name}_created", labels, child.created_s))


class Histogram(_Labelled):
    """A histogram family: ``labels(*values).observe(seconds)`` into ``buckets`` (upper bounds,
    ascending; ``+Inf`` is added)."""

    kind = "histogram"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 registry: CollectorRegistry | None = None,
                 buckets: Sequence[float] = ()) -> None:
        bounds = tuple(float(b) for b in buckets if not math.isinf(b))
        if not bounds or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram {name}: buckets must be ascending and distinct")
        if "le" in labelnames:
            raise ValueError(f"histogram {name}: 'le' is the buckets' label")
        self.bounds = bounds
        super().__init__(name, documentation, labelnames, registry)

    def labels(self, *values: object) -> _HistogramChild:
        child = self._child(values)
        assert isinstance(child, _HistogramChild)
        return child

    def _new(self) -> _HistogramChild:
        return _HistogramChild(self.bounds)

    def _samples(self, out: list[tuple[str, Labels, float]], labels: Labels,
                 child: _CounterChild | _HistogramChild) -> None:
        assert isinstance(child, _HistogramChild)
        running = 0
        for bound, count in zip((*self.bounds, math.inf), child.counts):
            running += count
            out.append((f"{self.name}_bucket", tuple(sorted((*labels, ("le", _number(bound))))),
                        running))
        out.append((f"{self.name}_count", labels, running))
        out.append((f"{self.name}_sum", labels, child.sum))
        out.append((f"{self.name}_created", labels, child.created_s))


def generate_latest(registry: Collector) -> bytes:
    """Every family of ``registry`` in the text format."""
    out: list[str] = []
    for family in registry.collect():
        family.render(out)
    return "".join(out).encode("utf-8")
