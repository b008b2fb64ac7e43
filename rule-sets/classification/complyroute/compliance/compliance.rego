# METADATA
# title: classification compliance
# description: |
#   A data-classification regime. Decides, for one hop of a request, which
#   instance of the next step may receive a record: an instance needs a
#   clearance at least as high as the record's classification, must retain
#   records as long as the record's retention label says, must not process a
#   minor's record for marketing, and must not be quarantined. Its labels
#   (reference data `labels`): classification (x-data-classification,
#   required) and retention (x-data-retention, optional). Its exclusions and
#   the names they read; the entrypoint (decision), the label and record
#   checks and the helpers are the platform's (platform.rego, which the
#   control plane adds beside this file). Contract: docs/architecture.md
#   (section "Policy"), as for the shipped rule set.
package complyroute.compliance

# The record's classification (its reference entry, with its level), when known.
classification := reference.classifications[label.classification]

# The record's retention, when labelled with a known one.
retention := label.retention if reference.retentions[label.retention]

# The record's subject is a minor: the body's subject_age is a number under adult_age. The
# one read of the body beyond its type: it makes every decision OPA's, with the body (no
# precomputed table can enumerate it), as intended.
adult_age := 18

subject_is_minor if {
	age := input.record.subject_age
	is_number(age)
	age < adult_age
}

# --- exclusions (status 451 when every candidate is excluded) -----------------

# METADATA
# title: Clearance
# description: |
#   An instance receives a record only if its clearance (catalog attribute
#   `clearance`; "public" when it has none) is at least the record's
#   classification level.
# custom:
#   code: CLEARANCE_INSUFFICIENT
#   message: the instance's clearance is below the record's classification
exclusions contains exclusion(rego.metadata.rule(), id, detail) if {
	some id, candidate in candidates
	candidate.clearance.level < classification.level
	detail := sprintf("%s holds clearance %s; the record is %s", [id, candidate.clearance.name, label.classification])
}

# METADATA
# title: Retention
# description: |
#   A record labelled with a retention goes only to instances whose catalog
#   attribute `retains` lists it. A record without the label goes anywhere.
# custom:
#   code: RETENTION_UNSUPPORTED
#   message: the instance does not retain records as the record's retention requires
exclusions contains exclusion(rego.metadata.rule(), id, detail) if {
	retention # first: `not` below would hold for an undefined retention
	some id, candidate in candidates
	not candidate.retains[retention]
	retained := listed(object.keys(candidate.retains))
	detail := sprintf("%s retains %s; the record's retention is %s", [id, retained, retention])
}

# METADATA
# title: Minors and marketing
# description: |
#   A record whose subject is a minor (record.subject_age a number under 18)
#   never goes to an instance that processes for marketing (catalog attribute
#   `purposes`). The one rule that reads the record's body.
# custom:
#   code: MINOR_TO_MARKETING
#   message: the record's subject is a minor and the instance processes for marketing
exclusions contains exclusion(rego.metadata.rule(), id, detail) if {
	subject_is_minor
	some id, candidate in candidates
	candidate.purposes.marketing
	purposes := listed(object.keys(candidate.purposes))
	detail := sprintf("%s processes for %s; subject_age is under %d", [id, purposes, adult_age])
}

# METADATA
# title: Quarantine
# description: |
#   An instance whose catalog attribute `quarantined` holds "yes" receives
#   nothing, whatever the labels say. The rule that reads no label.
# custom:
#   code: INSTANCE_QUARANTINED
#   message: the instance is quarantined and receives no record
exclusions contains exclusion(rego.metadata.rule(), id, detail) if {
	some id, candidate in candidates
	candidate.quarantined
	detail := sprintf("%s is quarantined", [id])
}
