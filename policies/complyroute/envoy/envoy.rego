# METADATA
# title: complyroute Envoy adapter
# description: |
#   Adapts the opa-envoy-plugin ext_authz input to the direct input of
#   data.complyroute.compliance.decision, and the decision to the plugin's
#   result object. The plugin queries data.complyroute.envoy.response by path
#   (its "path" setting: complyroute/envoy/response) and runs with
#   skip-request-body-parse, so the body arrives as a raw string.
#
#   Most hops are allowed, and most are decided by a lookup: `response` first
#   tries the quick path (see there), the compliance policy's own answers
#   precomputed, and only when that does not apply asks the compliance policy,
#   which decides and explains every other case.
#
#   The sender is the verified peer when Envoy names one (mutual TLS:
#   attributes.source.principal), else the route's contextExtensions.sender
#   (see `sender`). At the entry (contextExtensions.label_token "issue") an
#   allowed answer carries a signed label token (see `response`).
#
#   Labels: the headers the label schema names (compliance.label_schema; the
#   shipped rule set's x-data-region, x-data-category, x-data-consent).
#
#   Result: allowed, {"allowed": true, "headers": {x-complyroute-destination,
#   and every label header}} with the labels rewritten to their canonical form
#   (one trimmed value; a multiple label's values sorted, each once, joined
#   with ","), plus "request_headers_to_remove" naming the header of every
#   label without values, plus x-complyroute-labels and
#   x-complyroute-digest at the entry; denied, {"allowed": false,
#   "http_status", "headers": {"content-type"}, "body"}. The plugin sends
#   `headers` as HeaderValueOptions without append, which ext_authz applies
#   as overwriting every value the request had, so later enforcement points
#   see exactly the canonical labels.
package complyroute.envoy

import data.complyroute.compliance

http_request := object.get(input, ["attributes", "request", "http"], {})

# Envoy hands headers over with lowercase keys; repeated headers arrive joined with commas.
headers := object.get(http_request, "headers", {})

# The route's context_extensions. opa-envoy-plugin (v3 API) builds its input with
# the protobuf JSON names, so the key is "contextExtensions"; the snake_case key
# (v2 API, hand-written inputs) is accepted too.
# (References rather than object.get(input, ...), which costs the quick path more.)
default context_extensions := {}

context_extensions := extensions if {
	extensions := input.attributes.contextExtensions
} else := input.attributes.context_extensions

# The labels by name, from the headers the label schema names (compliance.label_schema).
labels[name] := headers[spec.header] if some name, spec in compliance.label_schema

# The label headers in the schema's order (by label name): the quick path's table is keyed
# by their values in this order.
label_header_order := [spec.header | some spec in compliance.label_schema]

# The step comes from the route (contextExtensions.step) when set, else from the sender's header.
step := context_extensions.step if {
	context_extensions.step != ""
} else := headers["x-complyroute-step"]

# --- the sender -------------------------------------------------------------------

# With mutual TLS, Envoy hands over the URI SAN of the peer's verified certificate:
# spiffe://complyroute/service/<instance> for an instance, spiffe://complyroute/point/<name>
# for an enforcement point, spiffe://complyroute/control for the control plane. Absent or
# empty where the peer is not authenticated: clients at the entry (outside the mesh), and
# every listener when mutual TLS is off.
default peer_principal := ""

peer_principal := input.attributes.source.principal

instance_identity_prefix := "spiffe://complyroute/service/"

# The instance the verified peer's identity names; undefined for any other identity.
peer_instance := id if {
	is_string(peer_principal)
	startswith(peer_principal, instance_identity_prefix)
	id := trim_prefix(peer_principal, instance_identity_prefix)
	id != ""
}

# The sender the compliance policy is told, and the quick path looks up:
# - when Envoy names a verified peer (principal non-empty), the instance it names, provided
#   the route names no sender or that one (else SENDER_MISMATCH, see adapter_violations);
#   none when the peer is no instance (a point, the control plane, another form), so that
#   the compliance policy's SENDER_UNKNOWN applies;
# - else the route's sender (contextExtensions.sender), as without mutual TLS.
# The quick path evaluates it on every hop: the common cases come first, by lookups (the
# prefix as a literal there: a rule reference costs allocations), then the general ones.
sender := id if {
	# Mutual TLS: the route's sender is the verified peer.
	id := input.attributes.contextExtensions.sender
	input.attributes.source.principal == concat("", ["spiffe://complyroute/service/", id])
	id != ""
} else := id if {
	# No verified peer: a client at the entry, or mutual TLS off.
	id := input.attributes.contextExtensions.sender
	not input.attributes.source.principal
} else := id if {
	peer_principal == ""
	id := context_extensions.sender
} else := peer_instance if {
	object.get(context_extensions, "sender", "") in {"", peer_instance}
}

# The route names a sender (a listener serves one), and the verified peer is another instance.
sender_mismatch if {
	listener_sender := context_extensions.sender
	listener_sender != ""
	listener_sender != peer_instance
}

# Record-level denials of the adapter's own (status 400), before the compliance policy is
# asked: the same shape as the compliance policy's record_violations.

# METADATA
# title: Sender mismatch
# description: |
#   A listener that names its sender (contextExtensions.sender) takes records from that
#   instance only; a verified peer identity naming another instance is refused.
# custom:
#   code: SENDER_MISMATCH
#   message: the listener's sender and the verified peer identity differ
adapter_violations contains compliance.violation(rego.metadata.rule(), detail) if {
	sender_mismatch
	detail := sprintf("the listener serves %s, the peer's certificate names %s", [
		json.marshal(context_extensions.sender),
		json.marshal(peer_principal),
	])
}

# Only the fields that are present: an absent field stays absent in the direct input.
present_fields["sender"] := sender

present_fields["step"] := step

present_fields["request_id"] := headers["x-request-id"]

present_fields["record"] := json.unmarshal(http_request.body) if json.is_valid(http_request.body)

compliance_input := object.union({"labels": labels}, present_fields)

# The compliance policy is written against the direct input; `with` evaluates
# it once per request against the adapted input (no loop, so the caching
# concern of with-outside-test-context does not apply).
decision := compliance.denial(400, "INPUT_INVALID", "input rejected", adapter_violations) if {
	count(adapter_violations) > 0
} else := result if {
	# regal ignore:with-outside-test-context
	result := compliance.decision with input as compliance_input
}

# Asked for an allowed hop only, so its labels have one region and one category.
canonical_labels := result if {
	# regal ignore:with-outside-test-context
	result := compliance.canonical_labels with input as compliance_input
}

default request_id := null

request_id := headers["x-request-id"]

# Envoy carries a denial's status as envoy.type.v3.StatusCode, an enum without 451
# (Unavailable For Legal Reasons); given 451, Envoy rejects the answer and fails closed
# with 503. So a compliance denial travels from OPA to Envoy as 403, and the enforcement
# point's local reply mapper (complyroute/proxy/replies.py) turns an ext_authz 403 back
# into 451, leaving this body as it is.
wire_status(status) := 403 if {
	status == 451
} else := status

# An allowed hop carries its labels on in their canonical form (compliance.canonical_labels),
# so that later enforcement points can match them exactly. opa-envoy-plugin sends `headers`
# as HeaderValueOptions without append, which ext_authz applies as overwriting every value
# the request had; a label without values (canonical "") loses its header.
label_headers[spec.header] := value if {
	some name, spec in compliance.label_schema
	value := canonical_labels[name]
	value != ""
}

headers_removed := [spec.header | some name, spec in compliance.label_schema; canonical_labels[name] == ""]

allowed_response := {"allowed": true, "headers": headers_to_set} if {
	count(headers_removed) == 0
} else := {"allowed": true, "headers": headers_to_set, "request_headers_to_remove": headers_removed}

headers_to_set := object.union(label_headers, {
	"x-complyroute-destination": routed(decision.destinations, set_clusters),
	"x-complyroute-revision": revision,
})

# --- where an allowed hop goes: the compliant set ------------------------------------

# The decision names every instance that may receive the record, in preference tiers
# (compliance: "destinations"). Envoy routes the hop to the cluster the routing header names
# (x-complyroute-destination): for a set of several instances, the set's own cluster, whose
# endpoints are the set's instances, one priority per tier (complyroute/proxy/envoy.py): Envoy
# balances across the first tier's healthy instances, fails over inside the set, and nowhere
# else. A set of one instance is that instance's cluster.
#
# The clusters are made at deploy for the sets the rule set gives over the point's decision
# space (complyroute/engines/precompute.py), and listed in
# data.complyroute_quick_path.set_clusters. A set without a cluster here (one only a record
# outside the decision space gets, or one a reload brought) goes to the first instance of its
# first tier: inside the set still, without balancing or failover. Without the list (opa eval of
# the rule set alone, policy-diff) every set is named as it is.
default set_clusters := null

set_clusters := data.complyroute_quick_path.set_clusters

# routed(tiers, clusters): the cluster name the routing header carries.
routed(tiers, clusters) := name if {
	name := set_name(tiers)
	has_cluster(name, tiers, clusters)
} else := tiers[0][0]

# A set's name: its tiers in order, each tier's ids joined with ",", the tiers with "|".
set_name(tiers) := concat("|", [concat(",", tier) | some tier in tiers])

# The instances a routing header's cluster name holds.
set_members(name) := {id | some tier in split(name, "|"); some id in split(tier, ",")}

has_cluster(_, tiers, _) if {
	count(tiers) == 1
	count(tiers[0]) == 1
}

has_cluster(_, _, null)

has_cluster(name, _, clusters) if name in clusters

# The revision of the rule set that decides: every allowed hop carries it on to the receiving
# service (x-complyroute-revision: its path entry and audit line name it), every denial names
# it. The control plane writes it into each point's bundle (complyroute/policy/bundles.py);
# "unversioned" where no bundle is loaded (opa eval of the rule set alone, unit tests).
default revision := "unversioned"

revision := data.complyroute.revision

# METADATA
# title: Plugin result
# description: |
#   The entrypoint opa-envoy-plugin queries: `answer`, the same at every listener,
#   and at the entry, whose route asks for a label token (contextExtensions.label_token
#   "issue"; the snake_case context_extensions as for sender and step), that answer
#   with the token when it allows the hop (`token_answer`). Every other listener gets
#   `answer` itself after two lookups, as it did before label tokens (the compiled
#   engine's decision space relies on that: it asks for non-entry listeners).
# entrypoint: true
response := token_answer if {
	input.attributes.contextExtensions.label_token == "issue"
} else := token_answer if {
	input.attributes.context_extensions.label_token == "issue"
	not input.attributes.contextExtensions
} else := answer

# METADATA
# title: Answer
# description: |
#   Most hops are allowed, and most are answered by the quick path
#   (`quick_answer`), a lookup in the point's precomputed table; everything
#   else is the compliance policy's, with its reasons.
answer := quick_answer if {
	quick_answer
} else := allowed_response if {
	decision.allowed == true
} else := denial_response(decision, request_id)

# METADATA
# title: Quick path
# description: |
#   The answer the compliance policy gave ahead of time, looked up in
#   data.complyroute_quick_path.table: sender -> step -> the value of each label header
#   in label_header_order (NUL for an absent one), one level each -> {"destination"},
#   keyed as data.complyroute_quick_path.keys says (table_keys, written beside it).
#   The control plane writes the table at deploy and at reload
#   by evaluating this adapter's full path, and so the compliance entrypoint,
#   over the point's decision space (complyroute/engines/precompute.py): only
#   labellings the rule set allows without rewriting a label, and only when no
#   rule the decision depends on reads what was not enumerated (the record
#   beyond its being a JSON object, the request id, the clock, another
#   non-deterministic built-in). Before a point takes a table, the control
#   plane checks over its decision space that this rule answers exactly the
#   table's labellings, as the full path does. It applies when the labels are
#   as the table has them (canonical: the form every point that allowed a hop
#   writes), the body is a JSON object, the route pins the step and the sender
#   is known (the verified peer, else the route's, see `sender`); a point
#   without a table or its keys never takes it.
quick_answer := quick_answer_of(
	input.attributes, sender,
	data.complyroute_quick_path.table, data.complyroute_quick_path.keys, revision,
)

# The quick path as a function of the check request's attributes, the sender, the table, how
# it is keyed (table_keys) and the revision, so that the control plane's check of it
# (decision_space.rego `quick`) calls it directly, without replacing the input of every rule
# for each labelling.
quick_answer_of(attributes, from, table, keys, revision_of_rules) := response if {
	checked := attributes.request.http
	json.is_valid(checked.body)
	startswith(checked.body, "{")
	given := [object.get(checked.headers, header, keys.absent) | some header in keys.headers]
	entry := object.get(table[from][attributes.contextExtensions.step], given, null)

	# The labels as they came (the table holds canonical labellings only), the absent ones removed.
	present := {header: given[i] | some i, header in keys.headers; given[i] != keys.absent}
	removed := [header | some i, header in keys.headers; given[i] == keys.absent]
	decided := {"x-complyroute-destination": entry.destination, "x-complyroute-revision": revision_of_rules}
	response := quick_response(present, removed, decided)
}

# How the table is keyed: a level per label header in label_header_order, and for an absent
# header NUL, which no HTTP header value can hold (Envoy refuses it), so that a header sent
# empty is never taken for an absent one. The control plane writes it beside the table
# (data.complyroute_quick_path.keys), where quick_answer reads it: derived here from the label
# schema on every decision, it took about 30 of the 72 µs of an allowed hop's (opa bench). Its
# check of the quick path takes a point's table only with these keys (quick_path.rego); a
# point without keys in its data never takes the quick path.
table_keys := {"headers": label_header_order, "absent": "\u0000"}

quick_response(present, removed, decided) := {"allowed": true, "headers": object.union(present, decided)} if {
	count(removed) == 0
} else := {"allowed": true, "headers": object.union(present, decided), "request_headers_to_remove": removed}

# The denial's code and revision go to Envoy as dynamic metadata too, which its access log
# line and its counters name (complyroute/proxy/envoy.py ACCESS_LOG_FIELDS): Envoy does not
# read the body.
denial_response(refusal, id) := {
	"allowed": false,
	"http_status": wire_status(refusal.status),
	"headers": {"content-type": "application/json"},
	"dynamic_metadata": {"code": refusal.code, "revision": revision},
	"body": json.marshal({
		"code": refusal.code,
		"message": refusal.message,
		"request_id": id,
		"revision": revision,
		"reasons": refusal.reasons,
	}),
}

# --- the label token, issued at the entry --------------------------------------------

# An allowed answer carries the token and the digest of the body it signs; a denial goes
# as it is, without them; an allowed hop whose token cannot be issued is refused (fail
# closed: no record leaves the entry unsigned).
token_answer := result if {
	answer.allowed == true
	result := object.union(answer, {"headers": label_token_headers})
} else := denial_response(token_denial, request_id) if {
	answer.allowed == true
} else := answer

label_token_headers := {"x-complyroute-labels": label_token, "x-complyroute-digest": body_digest}

# The digest of the record's bytes as they arrived: the first service checks the bytes it
# receives against it.
body_digest := concat("", ["sha256:", crypto.sha256(http_request.body)])

# A compact JWS (ES256) signed with data.complyroute.token ({"issuer", "kid", "jwk": a
# private EC P-256 JWK, "lifetime_seconds"}), which only the entry's OPA loads (the control
# plane writes it; Regal cannot resolve data that no Rego defines). A complete rule: built
# once per evaluation (its signature is randomised, so each evaluation gives another token
# for the same claims). No rule's value holds the key: OPA's REST API can read any rule's
# value (system.authz refuses the data paths that hold the key).
# regal ignore:unresolved-reference
label_token := signed(data.complyroute.token, label_token_claims)

signed(key, claims) := io.jwt.encode_sign(
	{"alg": "ES256", "typ": "JWT", "kid": key.kid},
	object.union(claims, {"iss": key.issuer, "exp": claims.iat + key.lifetime_seconds}),
	key.jwk,
)

# The claims the entry vouches for, but the issuer's and the expiry: the request id the
# entry's Envoy assigned, the digest of the body, the labels the answer sets, canonical (no
# consent claim for a record without consent values), and where the token may be used.
label_token_claims := object.union(
	{
		"iat": floor(time.now_ns() / 1000000000),
		"rid": headers["x-request-id"],
		"digest": body_digest,
		"aud": token_audience,
	},
	label_claims,
)

# The deciding listeners that may take the token (each one's jwt_authn requires its own
# audience, complyroute/trust/identity.py): the listeners of the instances this answer may send
# the record to (every instance of the set it routes to), and those of every later step of the
# chain but the last, whose instances the points before them choose. So a token taken from one
# record's first hop verifies at no listener of a first-step instance outside its set.
# data.complyroute.token.audience: {"first_hop": the prefix of an instance's audience,
# "later_steps": [an audience per later step]}; without it no token is issued
# (LABEL_TOKEN_UNAVAILABLE).
token_audience := array.concat(first_hop_audiences, audience.later_steps)

first_hop_audiences := [concat("", [audience.first_hop, id]) |
	some id in sort(set_members(answer.headers["x-complyroute-destination"]))
]

# regal ignore:unresolved-reference
audience := data.complyroute.token.audience

# A claim per label, named as the label (the control plane refuses a schema whose label names
# a registered claim: iss, exp, iat, rid, digest, aud).
label_claims[name] := answer.headers[spec.header] if some name, spec in compliance.label_schema

# Status 503: the record is fine, the entry is not (a deployment without the key is a
# misconfiguration), as when no decision can be had at all. 503 is in ext_authz's
# StatusCode enum (451 is not, see wire_status), and every enforcement point's local reply
# mapper answers an ext_authz 5xx as DECISION_UNAVAILABLE, replacing this body: the client
# gets the same 503 as when OPA cannot be reached, and the code and detail below stay in
# OPA's decision log.
token_denial := compliance.denial(503, "LABEL_TOKEN_UNAVAILABLE", "the record was not let in", token_failures)

# METADATA
# title: Label token unavailable
# description: |
#   The entry signs every record it lets in. Without its key (data.complyroute.token
#   missing or unusable) or without the request id the token names (x-request-id, which
#   the entry's Envoy assigns to every request), the record does not leave the entry.
# custom:
#   code: LABEL_TOKEN_UNAVAILABLE
#   message: the entry cannot issue the record's label token
token_failures contains compliance.violation(rego.metadata.rule(), token_failure_detail) if not label_token

default token_failure_detail := "data.complyroute.token is not loaded here or holds no usable ES256 key"

token_failure_detail := "the request has no x-request-id" if not headers["x-request-id"]
