# METADATA
# title: complyroute catalog index
# description: |
#   Derives, from an enforcement point's catalog and the reference data, the
#   document its OPA loads as data.complyroute.index: the catalog indexed the
#   way a decision reads it, so that no decision recomputes it. The control
#   plane evaluates `documents` ahead of time, once for all enforcement points
#   of a deployment (complyroute/policydata.py). Contract: docs/architecture.md
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
#              needs           category -> the consent a record of that
#                              category needs to go there: its purposes for a
#                              personal category, else {}
# and, for the Envoy adapter's quick path (data.complyroute.envoy.response):
#   preferred  sender -> step -> id: the candidate the destination rule tries
#              first, the smallest id in the sender's region, else the
#              smallest id
#   asks       region -> category -> what a record so labelled asks of an
#              instance, as a part of its candidate entry: protected: true for
#              personal data of a GDPR subject, and the certifications the
#              category requires
#   consents   canonical consent label -> {purpose: true}: every non-empty set
#              of known purposes, sorted, each once, joined with "," (2^n - 1
#              labels for n purposes: 63 for the reference data's 6)
# `needs` and `asks` restate the exclusion rules of data.complyroute.compliance
# (residency, certification, purpose limitation) as data: an instance may
# receive a record if its candidate entry holds what the labels ask and the
# consent covers what it needs.
index(catalog) := {
	"senders": senders,
	"steps": steps,
	"preferred": {id: {step: preferred(candidates, sender) | some step, candidates in steps} | some id, sender in senders},
	"asks": {region: {category: asks(region_info, category_info) |
		some category, category_info in reference.categories
	} |
		some region, region_info in reference.regions
	},
	"consents": consents,
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
	"purposes": purposes,
	"needs": {category: needs(info, purposes) | some category, info in reference.categories},
}) if {
	purposes := {item: true | some item in as_set(object.get(instance, "purposes", []))}
}

needs(category_info, purposes) := purposes if {
	category_info.personal == true
} else := {}

asks(region_info, category_info) := object.union(
	{"certifications": {required: true | required := category_info.requires_certification}},
	{"protected": true | category_info.personal == true; region_info.gdpr == true},
)

preferred(candidates, sender) := min(in_region) if {
	in_region := {id | some id, candidate in candidates; candidate.region == sender.region}
	count(in_region) > 0
} else := min(object.keys(candidates))

consents[concat(",", chosen)] := {purpose: true | some purpose in chosen} if {
	known := sort(object.keys(reference.purposes))
	some set_bits in numbers.range(1, bits.lsh(1, count(known)) - 1)
	chosen := [purpose | some i, purpose in known; bits.and(set_bits, bits.lsh(1, i)) != 0]
}

# Regions an instance may be in to receive personal data of GDPR subjects.
protected_regions := {code | some code, info in reference.regions; info.gdpr == true} | {code |
	some code in reference.adequacy
}

# as_set accepts a list or a comma-separated string (catalog values).
as_set(value) := {item | some part in split(value, ","); item := trim_space(part); item != ""} if {
	is_string(value)
} else := {item | some item in value}
