# METADATA
# title: complyroute catalog index
# description: |
#   Derives, from an enforcement point's catalog and the reference data, the
#   document its OPA loads as data.complyroute.index: the catalog indexed the
#   way a decision reads it, so that no decision recomputes it. The control
#   plane evaluates `documents` ahead of time, once for all enforcement points
#   of a deployment (complyroute/policy/policydata.py). Contract: docs/architecture.md
#   (section "Policy").
package complyroute.indexing

reference := data.complyroute.reference

# METADATA
# title: OPA data of every enforcement point
# description: |
#   Input: {"catalogs": {point name: catalog}}, each catalog as
#   docs/architecture.md describes it ({"instances", "gateways"}).
#   Output: point name -> the data document that point's OPA loads at the
#   root, {"complyroute": {"index": index(catalog)}}.
# entrypoint: true
documents[point] := {"complyroute": {"index": index(catalog)}} if some point, catalog in input.catalogs

# index(catalog), in JSON types only (a point loads it from a file, and the
# tests hand it to the policy as it is):
#   senders  id -> {"region"?}: every instance and gateway (an instance wins a
#            clash)
#   steps    step -> id -> candidate: the instances of each step, with
#              region?         as in the catalog
#              protected       whether the region may receive personal data of
#                              GDPR subjects (gdpr: true, or adequate)
#              certifications  {certification: true}
#              purposes        {purpose: true}
index(catalog) := {
	"senders": senders,
	"steps": steps,
} if {
	instances := object.get(catalog, "instances", {})
	senders := object.union(
		{id: located(gateway) | some id, gateway in object.get(catalog, "gateways", {})},
		{id: located(instance) | some id, instance in instances},
	)
	steps := {step: {id: candidate(instance) | some id, instance in instances; instance.step == step} |
		some step in {instance.step | some instance in instances}
	}
}

located(entry) := {"region": region} if {
	region := entry.region
} else := {}

candidate(instance) := object.union(located(instance), {
	"protected": object.get(instance, "region", null) in protected_regions,
	"certifications": {item: true | some item in as_set(object.get(instance, "certifications", []))},
	"purposes": {item: true | some item in as_set(object.get(instance, "purposes", []))},
})

# Regions an instance may be in to receive personal data of GDPR subjects.
protected_regions := {code | some code, info in reference.regions; info.gdpr == true} | {code |
	some code in reference.adequacy
}

# as_set accepts a list or a comma-separated string (catalog values).
as_set(value) := {item | some part in split(value, ","); item := trim_space(part); item != ""} if {
	is_string(value)
} else := {item | some item in value}
