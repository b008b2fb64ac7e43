# METADATA
# title: NAME compliance
# description: |
#   The rule set NAME: a record goes only to instances in its own region. Its
#   exclusions and the names they read; the entrypoint (decision), the label
#   and record checks and the helpers are the platform's (platform.rego, which
#   the control plane adds beside this file). Contract: docs/architecture.md
#   (section "Policy"); how to write rules: policies/README.md.
package complyroute.compliance

# --- exclusions (status 451 when every candidate is excluded) -----------------

# METADATA
# title: Residency
# description: a record goes only to instances in the region its label names.
# custom:
#   code: REGION_MISMATCH
#   message: the instance is outside the record's region
exclusions contains exclusion(rego.metadata.rule(), id, detail) if {
	some id, candidate in candidates
	where := object.get(candidate, "region", "no region")
	where != label.region
	detail := sprintf("%s is in %s; the record's region is %s", [id, where, label.region])
}
