"""The Grafana dashboard and the example alert rules (``daemon/grafana/``) against a real daemon's
``/metrics``: every metric a panel, a template variable or a rule queries is one the daemon exports after
real traffic (stores, loads, lookups, usage reports) from a tenant, so that neither file can go stale; the
engines' panels query the vLLM connector's ``vllm:tiercache_*`` counters, checked against its stats fields.

Metric names are read from the PromQL expressions: strings, label matchers, ranges and the label lists of
``by`` / ``without`` / ``on`` / ``ignoring`` / ``group_left`` / ``group_right`` are dropped, and what is left
that names no function, keyword or aggregation is a metric. ``up`` is Prometheus's own.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tiercache.connector import TierCacheClient
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.testing.daemon import free_port
from tiercache.testing.plugin import SMALL_DAEMON_ARGS, make_daemon

GRAFANA = Path(__file__).resolve().parents[2] / "daemon" / "grafana"
DASHBOARD = GRAFANA / "tiercache.json"
ALERTS = GRAFANA / "alerts.yml"
BUILTIN = {"up"}
"""Series Prometheus makes itself."""
NOT_METRICS = {
    # aggregations, keywords, binary operators, modifiers
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values",
    "group", "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
    "offset", "inf", "nan",
}  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression queries."""
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for m in _NAME.finditer(text):
        after = text[m.end() :].lstrip()
        if after.startswith("(") or m.group().lower() in NOT_METRICS:
            continue  # a function or a keyword
        if m.start() and (text[m.start() - 1].isdigit() or text[m.start() - 1] == "."):
            continue  # the exponent or unit of a number (1e3)
        names.add(m.group())
    return names


def test_metric_names_are_read_from_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, method) (rate(a_bucket{job=~"$job",x="b c"}[$__rate_interval])))'
        " / ignoring(tier) group_left (sum(rate(b_total[5m])) + c) > 1e3 or up == 0"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c", "up"}


def _dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        text = query.get("query", "") if isinstance(query, dict) else ""
        exprs += [f"{name}" for name in _LABEL_VALUES.findall(text)]
    return exprs


def _rule_queries(rules: dict[str, Any]) -> list[str]:
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def test_dashboard_and_rules_are_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["panels"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs)), panel["title"]
    rules = yaml.safe_load(ALERTS.read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert {
        "TiercacheDaemonDown",
        "TiercacheTierErrors",
        "TiercacheCorruptReads",
        "TiercacheDiskFull",
    } <= alerts
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] and rule["annotations"]["summary"], rule["alert"]


def _traffic(address: str, token: str) -> None:
    """A tenant's stores, loads, lookups and usage reports."""
    layout = KVLayout(2, 2, 64, KVDtype.FLOAT32, chunk_tokens=32, page_tokens=32)
    ns = Namespace(model_id="grafana-test", revision="", layout=layout)
    with TierCacheClient.connect(address, token=token) as client:
        keys = chunk_keys(ns, list(range(4 * 32)))
        grant = client.begin_store(ns, keys)
        assert client.commit_store(ns, grant.ticket_id) == 4
        lease = client.acquire_load(ns, keys)
        assert client.release_load(ns, lease.lease_id)
        assert client.lookup(ns, keys + chunk_keys(ns, list(range(1000, 1032)))).chunks == 4
        client.report_usage(ns, {}, 32)


def _exported(text: str) -> set[str]:
    """Every series name of a scrape (counters' ``_total``, histograms' ``_bucket`` / ``_count`` / ``_sum``)."""
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_metric_the_dashboard_and_rules_query_is_exported(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[tokens]\n"token-of-a" = "team-a"\n')
    tokens.chmod(0o600)
    port = free_port()
    daemon = make_daemon(
        tmp_path,
        [*SMALL_DAEMON_ARGS, "--tokens-file", str(tokens), "--metrics-port", str(port), "--metrics-public"],
    )
    try:
        daemon.start()
        _traffic(daemon.address, "token-of-a")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            exported = _exported(resp.read().decode())
    finally:
        daemon.cleanup()
    assert "tiercache_tenant_tier_chunks" in exported  # the tenants' panels have series
    queries = {
        DASHBOARD.name: _dashboard_queries(json.loads(DASHBOARD.read_text())),
        ALERTS.name: _rule_queries(yaml.safe_load(ALERTS.read_text())),
    }
    for source, exprs in queries.items():
        queried = {n for n in set().union(*(metric_names(e) for e in exprs)) if not n.startswith("vllm:")}
        assert queried, source
        missing = sorted(queried - exported - BUILTIN)
        assert not missing, f"{source} queries metrics the daemon does not export: {missing}"


def test_every_engine_metric_the_dashboard_queries_is_one_the_vllm_connector_exports() -> None:
    """The engines' panels query vLLM's ``/metrics``: ``vllm:tiercache_<field>_total`` for the connector's
    stats fields (a real engine's scrape is checked in ``tests/connector/vllm/test_kv_events.py``)."""
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")
    from tiercache.connector.vllm.stats import FIELDS

    exprs = _dashboard_queries(json.loads(DASHBOARD.read_text()))
    queried = {n for n in set().union(*(metric_names(e) for e in exprs)) if n.startswith("vllm:")}
    assert queried
    assert queried <= {f"vllm:tiercache_{field}_total" for field in FIELDS}
