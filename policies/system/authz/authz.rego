# METADATA
# title: OPA's REST API is read-only
# description: >-
#   Every enforcement point's OPA runs with --authorization=basic, which asks this policy
#   about each request to its REST API (on loopback only; health and metrics are on
#   --diagnostic-addr). Queries read (GET, and POST with an input); nothing may replace
#   the rule set or the data a point decides with (PUT, PATCH, DELETE).
package system.authz

# METADATA
# description: What OPA asks about every request to its REST API.
# scope: document
# entrypoint: true
default allow := false

# METADATA
# description: Reading a document, a policy, the health or the configuration.
allow if input.method == "GET"

# METADATA
# description: A query with an input (POST /v1/data/<path>, POST /v1/query, POST /v1/compile) writes nothing.
allow if input.method == "POST"
