package system.authz_test

import data.system.authz

# A request as OPA's authorizer describes it: method, path segments, query parameters.
request(method, path) := {"method": method, "path": path, "params": {}}

get(path) := request("GET", path)

post(path) := request("POST", path)

explained(asked, mode) := object.union(asked, {"params": {"explain": [mode]}})

response_path := ["v1", "data", "complyroute", "envoy", "response"]

# Each case's request is allowed; each of its twins differs in one respect and is refused.
allowed_failures(cases) := {name | some name, case in cases; not allowed(case.request)}

denied_failures(cases) := {concat(" / ", [name, twin_name]) |
	some name, case in cases
	some twin_name, twin in case.twins
	allowed(twin)
}

allowed(asked) if authz.allow with input as asked

test_reading_and_queries_allowed if allowed_failures(reading_cases) == set()

test_reading_and_queries_denied if denied_failures(reading_cases) == set()

reading_cases := {
	"reading a document": {
		"request": get(["v1", "data", "complyroute", "index"]),
		"twins": {
			"writing it": request("PUT", ["v1", "data", "complyroute", "index"]),
			"patching it": request("PATCH", ["v1", "data", "complyroute", "index"]),
			"deleting it": request("DELETE", ["v1", "data", "complyroute", "index"]),
			"HEAD, which OPA's router serves as GET": request("HEAD", ["v1", "data", "complyroute", "index"]),
		},
	},
	"a decision without an input": {
		"request": get(["v1", "data", "complyroute", "compliance", "decision"]),
		"twins": {
			"with an input (POST)": post(["v1", "data", "complyroute", "compliance", "decision"]),
			"replacing the policy instead": request("PUT", ["v1", "policies", "complyroute"]),
		},
	},
	"listing the policies": {
		"request": get(["v1", "policies"]),
		"twins": {"deleting one": request("DELETE", ["v1", "policies", "complyroute"])},
	},
	"reading the configuration": {
		"request": get(["v1", "config"]),
		"twins": {"replacing all data": request("PUT", ["v1", "data"])},
	},
}

test_signing_key_allowed if allowed_failures(signing_key_cases) == set()

test_signing_key_denied if denied_failures(signing_key_cases) == set()

signing_key_cases := {
	"reading reference data beside the key": {
		"request": get(["v1", "data", "complyroute", "reference", "purposes"]),
		"twins": {
			"the key's document": get(["v1", "data", "complyroute", "token"]),
			"within it": get(["v1", "data", "complyroute", "token", "jwk", "d"]),
			"the document holding it": get(["v1", "data", "complyroute"]),
			"all data": get(["v1", "data"]),
			"all data, with a trailing slash": get(["v1", "data", ""]),
			"the key, with empty segments": get(["v1", "data", "", "complyroute", "", "token", ""]),
		},
	},
	"the Envoy adapter's answer without an input": {
		"request": get(response_path),
		"twins": {
			"for an input of the caller's choosing (a signed token)": post(response_path),
			"for an input in the query (GET ?input=)": object.union(get(response_path), {"params": {"input": ["{}"]}}),
			"explained in full": explained(get(response_path), "full"),
			"explained for debugging": explained(get(response_path), "debug"),
			"explained, notes only": explained(get(response_path), "notes"),
			"explained, failures only": explained(get(response_path), "fails"),
			"the key by POST": post(["v1", "data", "complyroute", "token"]),
			"all data by POST": post(["v1", "data"]),
		},
	},
	"an explanation turned off": {
		"request": explained(get(["v1", "data", "complyroute", "envoy"]), "off"),
		"twins": {"turned on": explained(get(["v1", "data", "complyroute", "envoy"]), "full")},
	},
	"a document whose name begins like the key's": {
		"request": get(["v1", "data", "complyroute", "tokens"]),
		"twins": {"the key's": get(["v1", "data", "complyroute", "token"])},
	},
	"reading beside the key": {
		"request": get(["v1", "data", "complyroute", "reference"]),
		"twins": {
			"the v0 (webhook) data API beside it": post(["v0", "data", "complyroute", "compliance", "decision"]),
			"the key through it": post(["v0", "data", "complyroute", "token"]),
			"all data through it": post(["v0", "data"]),
		},
	},
	"listing the policies, no query": {
		"request": get(["v1", "policies"]),
		"twins": {
			"an ad-hoc query (GET)": get(["v1", "query"]),
			"an ad-hoc query (POST)": post(["v1", "query"]),
			"a partial evaluation": post(["v1", "compile"]),
			"a partial evaluation of a path (POST)": post(["v1", "compile", "complyroute", "envoy", "response"]),
			"a partial evaluation of a path (GET)": get(["v1", "compile", "complyroute", "envoy", "response"]),
		},
	},
}
