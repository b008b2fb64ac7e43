# METADATA
# title: classification catalog index
# description: |
#   Derives, from an enforcement point's catalog and the reference data, the
#   document its OPA loads as data.complyroute.index: the catalog indexed the
#   way a decision of the classification rule set reads it. The control plane
#   evaluates `documents` ahead of time, once for all enforcement points of a
#   deployment (complyroute/policy/policydata.py).
package complyroute.indexing

reference := data.complyroute.reference

# METADATA
# title: OPA data of every enforcement point
# description: |
#   Input: {"catalogs": {point name: catalog}}, each catalog
#   {"instances": {id: {step, region, node, certifications, purposes,
#   clearance, retains, quarantined, ...}}, "gateways": {id: {region, node}}}.
#   Output: point name -> the data document that point's OPA loads at the
#   root, {"complyroute": {"index": index(catalog)}}.
# entrypoint: true
documents[point] := {"complyroute": {"index": index(catalog)}} if some point, catalog in input.catalogs

# index(catalog), in JSON types only (a point loads it from a file, and the
# tests hand it to the policy as it is):
#   senders  id -> {"region"?}: every instance and gateway (an instance wins a
#            clash)
#   steps    step -> id -> candidate: the instances of each step, with
#              region?      as in the catalog
#              clearance    {"name", "level"}: the lowest known classification
#                           the attribute `clearance` names; "public" (the
#                           lowest level) when it names none (absent, empty,
#                           only unknown names)
#              retains      {retention: true}, the attribute `retains`
#              purposes     {purpose: true}
#              quarantined  whether the attribute `quarantined` holds "yes"
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
	"clearance": clearance(attribute(instance, "clearance"), levels),
	"retains": {item: true | some item in attribute(instance, "retains")},
	"purposes": {item: true | some item in attribute(instance, "purposes")},
	"quarantined": "yes" in attribute(instance, "quarantined"),
})

# The classifications' levels, by name.
levels[name] := info.level if some name, info in reference.classifications

# The lowest classification, which an instance without a known clearance holds.
public_clearance := clearance_at(min({level | some level in levels}), levels)

# An instance's clearance: the lowest level among the known names it holds (a list
# meant to hold one name; several grant the least of them), else public_clearance.
clearance(names, by_name) := clearance_at(min(held), by_name) if {
	held := {level | some name in names; level := by_name[name]}
	count(held) > 0
} else := public_clearance

clearance_at(level, by_name) := {"name": name, "level": level} if {
	some name, named_level in by_name
	named_level == level
}

# A catalog attribute as a set of strings: a list, or a comma-separated string; empty when absent.
attribute(instance, name) := as_set(object.get(instance, name, []))

as_set(value) := {item | some part in split(value, ","); item := trim_space(part); item != ""} if {
	is_string(value)
} else := {item | some item in value}
