# complyroute platform, package complyroute.compliance (the rule set's own rules are in compliance.rego beside it).
# What every rule set decides with, written once: the entrypoint and how a
# decision and its tiers are assembled, the schema-driven label checks, the
# generic record checks and the helpers. A rule set's own compliance.rego, in
# this same package, supplies its exclusions (at least one rule: the decision
# reads them) and any record checks, required labels or names of its own; the
# control plane adds this file to a rule-set folder that lacks it
# (complyroute/policy/policyfiles.py, PLATFORM; `complyroute new-rule-set`
# writes a rule set that lacks it).
# Contract: docs/architecture.md (section "Policy").
#
# Two kinds of rules feed the decision:
# - record_violations: the input itself is unusable (labels missing, unknown
#   or contradictory, record malformed, sender or step unknown). Any of them
#   denies the hop with status 400, whatever else holds.
# - exclusions: one candidate instance of the step may not receive this
#   record. The hop is denied with status 451 only when every candidate is
#   excluded.
#
# Every rule of either kind reads its code and message from its own METADATA
# (custom.code, custom.message) through rego.metadata.rule().
package complyroute.compliance

import data.complyroute.record

# METADATA
# title: Routing decision
# description: |
#   The one entrypoint, data.complyroute.compliance.decision.
#
#   Input (direct form):
#     labels      object of raw header values by label name, as the label
#                 schema (reference data `labels`) declares them (a multiple
#                 label comma-separated; a missing key or an empty string is a
#                 missing label)
#     record      the parsed body, must be a JSON object (absent when the
#                 body was not JSON)
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
decision := judged(record_violations)

# The decision from the record's violations: a denial when there is any, else the tiers
# (routed). Each document the decision needs is read once, here or in routed: OPA's partial
# evaluation, which decides what may be precomputed (complyroute/engines/independence.py),
# walks every rule a read reaches, again at each read; intermediate rules read several times
# made a decision's partial evaluation 2.3 times as costly.
judged(violations) := denial(400, "INPUT_INVALID", "input rejected", violations) if {
	count(violations) > 0
} else := routed(exclusions)

# The candidates nobody excluded, in preference tiers (the sender's region first), each
# sorted; the denial when every candidate is excluded.
routed(excluded) := {"allowed": true, "status": 200, "destinations": tiers, "reasons": []} if {
	excluded_ids := {reason.instance | some reason in excluded}
	allowed_ids := object.keys(candidates) - excluded_ids
	count(allowed_ids) > 0
	preferred_ids := {id | some id in allowed_ids; candidates[id].region == sender_region}
	tiers := [tier | some ids in [preferred_ids, allowed_ids - preferred_ids]; count(ids) > 0; tier := sort(ids)]
} else := denial(451, "NO_COMPLIANT_INSTANCE", no_instance_summary, excluded)

no_instance_summary := sprintf("no instance of step %s may receive this record", [shown_step])

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
#   "required":   true when every record must carry it (default false; a rule set may require
#                 it in some cases: required_labels)
#   "subsets_of": for a multiple label, the catalog attribute of instances whose values bound
#                 the sets precomputed ahead of time (complyroute/engines/precompute.py); any
#                 other set is decided in full, at run time
# }. The services, both engines, the label token, the audit and trace follow it: adding a
# label takes the schema, the rules that read it and their tests.
label_schema := reference.labels

# Complete rules rather than partial ones, here and for known_values: a decision reads them
# some forty times, and OPA evaluates a complete rule once per query (a partial one again at
# every read of the whole object: the decision space took 2.3 times as long).
# regal ignore:prefer-set-or-object-rule
single_valued_labels := {name | some name, spec in label_schema; not spec.multiple}

# label_values[name]: the set of non-empty, trimmed comma-separated values.
# regal ignore:prefer-set-or-object-rule
label_values := {name: values |
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

# The labels a record must carry: those the schema requires (a rule set adds its own cases).
required_labels contains name if {
	some name, spec in label_schema
	spec.required
}

# Why a label is required, appended to its LABEL_MISSING message (a rule set explains its own cases).
required_because[name] := "" if {
	some name, spec in label_schema
	spec.required
}

# The reference entries each label's values must be keys of.
# regal ignore:prefer-set-or-object-rule
known_values := {name: reference[spec.values] | some name, spec in label_schema}

# Note: `not f(input.x)` is undefined (not true) when input.x is absent, as OPA
# evaluates the argument outside the negation; hence this helper rule.
sender_known if sender_entry

# --- record-level violations (status 400) ------------------------------------

# METADATA
# title: Label missing
# description: every label the schema requires, and those the rule set requires in some cases (required_labels).
# custom:
#   code: LABEL_MISSING
#   message: a required label is missing or empty
record_violations contains violation(rego.metadata.rule(), detail) if {
	some name in required_labels
	count(object.get(label_values, name, set())) == 0
	because := object.get(required_because, name, "")
	detail := sprintf("label %q (header %s) is required%s", [name, label_schema[name].header, because])
}

# METADATA
# title: Label unknown
# description: |
#   every label value must be a key of the reference document the schema names
#   for its label (case-sensitive). One reason per label, naming all its unknown
#   values: an answer stays a small multiple of the labels sent, however many
#   unknown values they hold.
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
#   a single-valued label carries one value. Envoy joins repeated headers with
#   commas, so "EU,US" means the record was labelled twice, differently.
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
default shown_sender := "nothing"

shown_sender := json.marshal(input.sender) if input.sender

default shown_step := "nothing"

shown_step := json.marshal(input.step) if input.step
