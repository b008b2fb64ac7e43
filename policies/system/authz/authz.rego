# METADATA
# title: OPA's REST API is read-only and keeps the label-token key
# description: >-
#   Every enforcement point's OPA runs with --authorization=basic, which asks this policy
#   about each request to its REST API (a unix socket only the deployment's user opens;
#   health and metrics are on --diagnostic-addr). It reads (GET); nothing may replace the rule set or the data a
#   point decides with (PUT, PATCH, DELETE). The entry's OPA holds the private key it
#   signs label tokens with at data.complyroute.token (policies/complyroute/envoy), so no
#   request may read that document: not by its path or an enclosing one, not by an ad-hoc
#   query, not in an explanation's trace. Nor may a request bring an input, by any method:
#   not a POST's body, not a GET's `input` parameter (OPA's data API reads one, as JSON).
#   The Envoy adapter's answer for an input of the caller's choosing would be a label token
#   signed over labels, request id and digest of the caller's choosing.
package system.authz

# METADATA
# description: What OPA asks about every request to its REST API.
# scope: document
# entrypoint: true
default allow := false

# METADATA
# description: >-
#   Reading a document, a policy, the status or the configuration (GET), but not the key.
allow if {
	input.method == "GET"
	not reads_signing_key
	not brings_input
}

# A GET's `input` query parameter: OPA's data API evaluates the document for it.
brings_input if input.params.input

# input.path: the URL's path segments, unescaped. OPA's data API skips empty segments
# (/v1/data//complyroute/ reads data.complyroute), so they are dropped here too.
segments := [segment | some segment in input.path; segment != ""]

# Where the entry's OPA holds the label-token key.
signing_key := ["complyroute", "token"]

# A data document that holds the key or lies within it: /v1/data, /v1/data/complyroute,
# /v1/data/complyroute/token and below (and the same under v0, the webhook API).
reads_signing_key if {
	segments[0] in {"v0", "v1"}
	segments[1] == "data"
	document := array.slice(segments, 2, count(segments))
	common := min([count(document), count(signing_key)])
	array.slice(document, 0, common) == array.slice(signing_key, 0, common)
}

# An ad-hoc query (/v1/query) or a partial evaluation (/v1/compile) may name any document.
reads_signing_key if {
	segments[0] == "v1"
	segments[1] in {"query", "compile"}
}

# An explanation traces the values a query binds (explain=full or debug show the key where
# the Envoy adapter signs a token); only explain=off is no explanation.
reads_signing_key if {
	some mode in input.params.explain
	mode != "off"
}
