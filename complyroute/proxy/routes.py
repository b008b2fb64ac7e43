"""An enforcement point's routes: what a listener takes (a record: POST /process, exactly) and
what it refuses itself, the route of a record OPA decides and of one decided ahead of time, and
the route configurations Envoy reads from files (split_routes), which a reload rewrites."""

from __future__ import annotations

import copy
import json

from complyroute.proxy.contract import RECORD_PATH, REVISION_HEADER, ROUTING_HEADER
from complyroute.proxy.replies import UNDELIVERED_HEADER

EXT_AUTHZ_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute"
EXT_AUTHZ_DISABLED = {"envoy.filters.http.ext_authz": {"@type": EXT_AUTHZ_PER_ROUTE, "disabled": True}}

# What a listener takes, as (header, string match) pairs that both a route's header matchers
# and the compiled engine's matcher tree express: a record is POST /process, exactly (no
# query string, whose escapes the plugin could not parse). A request that matches none of
# REQUEST_FORMS' predicates is answered 404.
A_RECORD = [(":method", {"exact": "POST"}), (":path", {"exact": RECORD_PATH})]
REQUEST_FORMS = [
    # (name, predicates, status): tried in order after A_RECORD.
    ("query-string", [(":method", {"exact": "POST"}), (":path", {"safe_regex": {"regex": r"/process\?.*"}})], 400),
    ("not-post", [(":path", {"safe_regex": {"regex": r"/process(\?.*)?"}})], 405),
]


def refusal_route(name: str, status: int, predicates: list, deciding: bool) -> dict:
    """A route answering `status` from Envoy itself (the local reply mappers write the body)."""
    route = {
        "name": name,
        "match": {"prefix": "/", "headers": [{"name": header, "string_match": match} for header, match in predicates]},
        "direct_response": {"status": status},
    }
    if status == 405:
        route["response_headers_to_add"] = [{"header": {"key": "allow", "value": "POST"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]
    if deciding:  # nothing to decide: OPA is not asked
        route["typed_per_filter_config"] = EXT_AUTHZ_DISABLED
    return route


def refusal_routes(deciding: bool) -> list[dict]:
    """What a listener answers to anything that is not a record, in order, after the record's route."""
    return [refusal_route(name, status, predicates, deciding) for name, predicates, status in REQUEST_FORMS] + [
        refusal_route("not-a-record", 404, [], deciding)
    ]


def record_route(route: dict) -> dict:
    """The route of a record (`route`: its action and settings)."""
    return {"match": {"prefix": "/", "headers": [{"name": h, "string_match": m} for h, m in A_RECORD]}, **route}


# A record that reached no instance is sent again, to another instance of the same compliant set
# (the cluster holds only the set, clusters.py set_cluster): every deciding listener's virtual
# host sets it, for the decision route and every compiled route alike, when the connection failed or
# was refused, or the stream was reset before any byte of the request went out. Never once the
# request was sent: the instance may have taken the record (its replay guard stays the last word
# against a duplicate), and an answer, whatever its status, is the instance's.
RETRY_UNSENT = {
    "retry_on": "connect-failure,refused-stream,reset-before-request",
    "num_retries": 3,
    "retry_host_predicate": [{
        "name": "envoy.retry_host_predicates.previous_hosts",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"},
    }],
    # Least request picks the better of two random instances, and an instance that answers at
    # once (a sidecar's ingress whose service is down: no ejection, it answered) has nothing in
    # flight: 3 picks in 4 land on it in a set of two. previous_hosts turns such a pick down and
    # Envoy picks again, this many times before it takes the pick anyway: at 4, a retry went
    # back to the dead instance one time in four (seen on Kubernetes: three retries spent on it,
    # 503 with its twin up); at 20 (21 picks), once in 400 per retry, once in 70 million for all three.
    "host_selection_retry_max_attempts": 20,
    # At once: the record waits for nothing but another instance (Envoy's default waits 25 ms).
    "retry_back_off": {"base_interval": "0.001s", "max_interval": "0.005s"},
}


def retry_unsent(behind_ingress: bool) -> dict:
    """RETRY_UNSENT, and where the instances are reached through their sidecars' ingresses, also
    an answer of an ingress that could not deliver to its own service (replies.UNDELIVERED_HEADER):
    the record reached the sidecar, not the service."""
    if not behind_ingress:
        return RETRY_UNSENT
    return {**RETRY_UNSENT, "retry_on": RETRY_UNSENT["retry_on"] + ",retriable-headers",
            "retriable_headers": [{"name": UNDELIVERED_HEADER, "present_match": True}]}


def decision_route(hop_timeout: str) -> dict:
    """The route of a record whose hop OPA decides: to the cluster its decision names (the
    compliant set's, or its one instance's)."""
    return record_route({"route": {"cluster_header": ROUTING_HEADER, "timeout": hop_timeout}})


def decided_route(destination: str, hop_timeout: str, revision: str) -> dict:
    """The route of a record whose hop was decided ahead of time: no call to OPA. It names the
    revision of the rule set that decided it, as OPA's answer does on the decision route."""
    return record_route({
        "route": {"cluster": destination, "timeout": hop_timeout},
        "typed_per_filter_config": EXT_AUTHZ_DISABLED,
        "request_headers_to_add": [{"header": {"key": REVISION_HEADER, "value": revision}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}],
    })


ROUTE_CONFIGURATION = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"


def split_routes(envoy: dict, folder: str, version: str = "1", listeners: set[str] | None = None) -> tuple[dict, dict[str, str]]:
    """The route configurations of `listeners` (None: every listener) out of the bootstrap
    `envoy`, into files Envoy reads from `folder` (RDS from the filesystem): returns the
    bootstrap, whose connection managers name their file instead, and the files,
    `<listener>.json` each, as compact JSON discovery responses of `version`. `envoy` itself
    is left as it is.

    Envoy watches `folder` and reads a route configuration again when a file is moved into it,
    so a listener's routes change without a restart and without a dropped request. It reads
    every file of the folder again on any move there: the runtimes move a point's files
    together, in one rename (files.write_folder locally, the kubelet's swap of a ConfigMap
    volume on Kubernetes), not one by one. Each file costs its Envoy an inotify instance, of
    the 128 a user holds by default (fs.inotify.max_user_instances): a deployment splits out
    only the routes that change with the rule set (rule_set_routes).
    """
    bootstrap = copy.deepcopy(envoy)
    files: dict[str, str] = {}
    for listener in bootstrap["static_resources"]["listeners"]:
        if listeners is not None and listener["name"] not in listeners:
            continue
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                manager = network_filter["typed_config"]
                if "route_config" not in manager:
                    continue
                name = f"{listener['name']}.json"
                if name in files:
                    raise ValueError(f"listener {listener['name']} has more than one route configuration")
                route_config = manager["route_config"]
                rds = {
                    "route_config_name": route_config["name"],
                    "config_source": {
                        "path_config_source": {"path": f"{folder}/{name}", "watched_directory": {"path": folder}},
                        "resource_api_version": "V3",
                    },
                }
                # In route_config's place, so the manager's fields keep their order.
                network_filter["typed_config"] = dict(("rds", rds) if key == "route_config" else (key, value) for key, value in manager.items())
                files[name] = json.dumps({"version_info": version, "resources": [{"@type": ROUTE_CONFIGURATION, **route_config}]},
                                         separators=(",", ":"))
    return bootstrap, files


def rule_set_routes(envoy: dict) -> set[str]:
    """The listeners whose routes hold decisions of the rule set: those with the compiled
    engine's matcher tree (its leaves are OPA's answers, and name their revision). Every other
    route configuration is the same whatever the rule set says."""
    return {
        listener["name"]
        for listener in envoy["static_resources"]["listeners"]
        for chain in listener["filter_chains"]
        for network_filter in chain["filters"]
        if any("matcher" in host for host in network_filter["typed_config"].get("route_config", {}).get("virtual_hosts", []))
    }
