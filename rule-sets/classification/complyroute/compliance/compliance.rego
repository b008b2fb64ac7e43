# METADATA
# title: classification compliance
# description: |
#   A data-classification regime. Decides, for one hop of a request, which
#   instance of the next step may receive a record: an instance needs a
#   clearance at least as high as the record's classification, must retain
#   records as long as the record's retention label says, must not process a
#   minor's record for marketing, and must not be quarantined.
#   Contract: docs/architecture.md (section "Policy"), as for the shipped rule set.
#
#   Two kinds of rules feed the decision:
#   - record_violations: the input itself is unusable (labels missing, unknown
#     or contradictory, record malformed, sender or step unknown). Any of them
#     denies the hop with status 400, whatever else holds.
#   - exclusions: one candidate instance of the step may not receive this
#     record. The hop is denied with status 451 only when every candidate is
#     excluded.
#
#   Every rule of either kind reads its code and message from its own METADATA
#   (custom.code, custom.message) through rego.metadata.rule().
package complyroute.compliance

import data.complyroute.record

# METADATA
# title: Routing decision
# description: |
#   The one entrypoint, data.complyroute.compliance.decision.
#
#   Input (direct form):
#     labels      object of raw header values by label name, as the label
#                 schema (reference data `labels`) declares them:
#                 classification (x-data-classification, required) and
#                 retention (x-data-retention, optional); a missing key or an
#                 empty string is a missing label
#     record      the parsed body, must be a JSON object (absent when the
#                 body was not JSON); subject_age, when a number, is read
#     sender      id of the sending instance or gateway (catalog)
#     step        the step the record goes to next
#     request_id  correlation id (not used by the rules)
#   Data: data.complyroute.reference and data.complyroute.index (the
#   enforcement point's catalog, indexed: package complyroute.indexing).
#
#   Output:
#     allowed:  {"allowed": true, "status": 200, "destinations": tiers, "reasons": []}
#               tiers = the candidates nobody excluded, in preference tiers: a
#               list of non-empty lists of ids, each sorted. First those in the
#               sender's region, then the others. Every instance of every tier
#               may receive the record; the enforcement point balances across
#               the first tier's healthy instances and moves to the next tier
#               only when none is up (docs/architecture.md, "Compliant sets").
#     denied:   {"allowed": false, "status": 400 | 451, "code", "message", "reasons"}
#               status 400 when any record_violations, else 451 (every
#               candidate excluded). reasons = [{code, message, instance?}]
#               sorted by code, then instance, then message. code = the code
#               all reasons share, else INPUT_INVALID (400) or
#               NO_COMPLIANT_INSTANCE (451).
# entrypoint: true
decision := denial(400, "INPUT_INVALID", "input rejected", record_violations) if {
	count(record_violations) > 0
} else := {"allowed": true, "status": 200, "destinations": destinations, "reasons": []} if {
	count(allowed_ids) > 0
} else := denial(451, "NO_COMPLIANT_INSTANCE", no_instance_summary, exclusions)

# --- data ---------------------------------------------------------------------

reference := data.complyroute.reference

# The enforcement point's catalog, indexed (package complyroute.indexing).
default index := {}

index := data.complyroute.index

# The sender: an instance or a gateway of the catalog.
sender_entry := index.senders[input.sender]

sender_region := sender_entry.region

# Candidates: the instances of the requested step, by id.
default candidates := {}

candidates := index.steps[input.step]

# --- labels -------------------------------------------------------------------

# The label schema (data.complyroute.reference.labels): label name -> {
#   "header":     the HTTP header that carries it (lowercase; the audit line and the label
#                 token name it by its label name)
#   "values":     the reference document whose keys are its known values
#   "multiple":   true when it holds a set of values, comma-separated (default false: one value)
#   "required":   true when every record must carry it (default false)
#   "subsets_of": for a multiple label, the catalog attribute of instances whose values bound
#                 the sets precomputed ahead of time (complyroute/engines/precompute.py)
# }. This rule set declares classification (required) and retention (optional), both
# single-valued; the label rules below read the schema only, whatever labels it holds.
label_schema := reference.labels

single_valued_labels contains name if {
	some name, spec in label_schema
	not spec.multiple
}

# label_values[name]: the set of non-empty, trimmed comma-separated values.
label_values[name] := values if {
	some name, _ in label_schema
	raw := input.labels[name]
	is_string(raw)
	values := {value | some part in split(raw, ","); value := trim_space(part); value != ""}
}

# label[name]: the value of a single-valued label that has exactly one value.
label[name] := value if {
	some name, values in label_values
	name in single_valued_labels
	count(values) == 1
	some value in values
}

# The record's classification (its reference entry, with its level), when known.
classification := reference.classifications[label.classification]

# The record's retention, when labelled with a known one.
retention := label.retention if reference.retentions[label.retention]

# The labels in their canonical form, as the rules read them: a single-valued label its one
# value, a multiple one its values sorted and joined with ","; "" for a label without values.
# Defined when no single-valued label has several values; the Envoy adapter writes them back
# on an allowed hop (and removes the header of a label that is ""), so that later enforcement
# points see them exactly so.
canonical_labels := {name: canonical_value(spec, object.get(label_values, name, set())) |
	some name, spec in label_schema
} if {
	every name in single_valued_labels {
		count(object.get(label_values, name, set())) <= 1
	}
}

canonical_value(spec, values) := concat(",", sort(values)) if {
	spec.multiple
} else := concat("", values)

required_labels contains name if {
	some name, spec in label_schema
	spec.required
}

# The reference entries each label's values must be keys of.
known_values[name] := reference[spec.values] if some name, spec in label_schema

# Note: `not f(input.x)` is undefined (not true) when input.x is absent, as OPA
# evaluates the argument outside the negation; hence this helper rule.
sender_known if sender_entry

# The record's subject is a minor: the body's subject_age is a number under adult_age. The
# one read of the body beyond its type: it makes every decision OPA's, with the body (no
# precomputed table can enumerate it), as intended.
adult_age := 18

subject_is_minor if {
	age := input.record.subject_age
	is_number(age)
	age < adult_age
}

# --- record-level violations (status 400) ------------------------------------

# METADATA
# title: Label missing
# description: every label the schema declares required (here classification) must be present and non-empty.
# custom:
#   code: LABEL_MISSING
#   message: a required label is missing or empty
record_violations contains violation(rego.metadata.rule(), detail) if {
	some name in required_labels
	count(object.get(label_values, name, set())) == 0
	detail := sprintf("label %q (header %s) is required", [name, label_schema[name].header])
}

# METADATA
# title: Label unknown
# description: |
#   every label value must be a key of the reference document the schema names for its
#   label (case-sensitive). One reason per label, naming all its unknown values.
# custom:
#   code: LABEL_UNKNOWN
#   message: a label value is not in the reference data
record_violations contains violation(rego.metadata.rule(), detail) if {
	some name, values in label_values
	unknown := [json.marshal(value) | some value in values; not known_values[name][value]]
	count(unknown) > 0
	verb := {true: "is", false: "are"}[count(unknown) == 1]
	known := concat(", ", sort(object.keys(known_values[name])))
	detail := sprintf("%s %s %s unknown (known: %s)", [name, concat(", ", sort(unknown)), verb, known])
}

# METADATA
# title: Labels contradictory
# description: |
#   a single-valued label (classification, retention) carries one value. Envoy joins
#   repeated headers with commas, so "internal,secret" means the record was labelled
#   twice, differently.
# custom:
#   code: LABELS_CONTRADICTORY
#   message: a single-valued label has several values
record_violations contains violation(rego.metadata.rule(), detail) if {
	some name, values in label_values
	name in single_valued_labels
	count(values) > 1
	detail := sprintf("%s has the values %s; send exactly one", [name, concat(", ", sort(values))])
}

# METADATA
# title: Record malformed
# description: the record (the request body) must be a JSON object.
# custom:
#   code: RECORD_MALFORMED
#   message: the record must be a JSON object
record_violations contains violation(rego.metadata.rule(), detail) if {
	not record.is_json_object
	detail := sprintf("got %s", [record.kind])
}

# METADATA
# title: Sender unknown
# description: the sender must be an instance or a gateway of the catalog.
# custom:
#   code: SENDER_UNKNOWN
#   message: the sender is not in this enforcement point's catalog
record_violations contains violation(rego.metadata.rule(), detail) if {
	not sender_known
	detail := sprintf("sender %s is neither an instance nor a gateway", [shown_sender])
}

# METADATA
# title: Step unknown
# description: the catalog must hold at least one instance of the requested step.
# custom:
#   code: STEP_UNKNOWN
#   message: no instance of the requested step is in this enforcement point's catalog
record_violations contains violation(rego.metadata.rule(), detail) if {
	count(candidates) == 0
	known := concat(", ", sort(object.keys(object.get(index, "steps", {}))))
	detail := sprintf("step %s (steps here: %s)", [shown_step, known])
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

# --- destinations -------------------------------------------------------------

excluded_ids contains reason.instance if some reason in exclusions

allowed_ids := object.keys(candidates) - excluded_ids

preferred_ids contains id if {
	some id in allowed_ids
	candidates[id].region == sender_region
}

# The allowed instances in preference tiers, each sorted: the sender's region first.
destinations := [tier |
	some ids in [preferred_ids, allowed_ids - preferred_ids]
	count(ids) > 0
	tier := sort(ids)
]

no_instance_summary := sprintf("no instance of step %s may receive this record", [shown_step])

# --- helpers ------------------------------------------------------------------

violation(metadata, detail) := {
	"code": metadata.custom.code,
	"message": sprintf("%s: %s", [metadata.custom.message, detail]),
}

exclusion(metadata, id, detail) := object.union(violation(metadata, detail), {"instance": id})

denial(status, fallback_code, summary, reasons) := {
	"allowed": false,
	"status": status,
	"code": shared_code(reasons, fallback_code),
	"message": sprintf("%s: %s", [summary, concat("; ", [reason.message | some reason in ordered])]),
	"reasons": ordered,
} if {
	ordered := sort(reasons)
}

shared_code(reasons, fallback_code) := code if {
	codes := {reason.code | some reason in reasons}
	count(codes) == 1
	some code in codes
} else := fallback_code

listed(values) := "none" if {
	count(values) == 0
} else := concat(",", sort(values))

# shown_sender, shown_step: an input field as JSON, for messages ("nothing" when absent).
# Rules rather than one function of the key: each names the input field it reads, so that
# the control plane's check of what the decision reads (complyroute/engines/precompute.py)
# sees a plain reference.
default shown_sender := "nothing"

shown_sender := json.marshal(input.sender) if input.sender

default shown_step := "nothing"

shown_step := json.marshal(input.step) if input.step
