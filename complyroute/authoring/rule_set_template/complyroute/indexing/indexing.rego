# METADATA
# title: NAME catalog index
# description: |
#   Derives, from an enforcement point's catalog, the document its OPA loads
#   as data.complyroute.index: the catalog indexed the way a decision reads it.
#   The control plane evaluates `documents` ahead of time, once for all
#   enforcement points of a deployment. Its fields are the rule set's: add
#   what its rules read of a candidate.
package complyroute.indexing

# METADATA
# title: OPA data of every enforcement point
# description: |
#   Input: {"catalogs": {point name: catalog}}, each catalog as
#   docs/architecture.md describes it ({"instances", "gateways"}).
#   Output: point name -> {"complyroute": {"index": index(catalog)}}.
# entrypoint: true
documents[point] := {"complyroute": {"index": index(catalog)}} if some point, catalog in input.catalogs

# index(catalog):
#   senders  id -> {"region"?}: every instance and gateway (an instance wins a clash)
#   steps    step -> id -> candidate {"region"?}: the instances of each step
index(catalog) := {"senders": senders, "steps": steps} if {
	instances := object.get(catalog, "instances", {})
	senders := object.union(
		{id: located(gateway) | some id, gateway in object.get(catalog, "gateways", {})},
		{id: located(instance) | some id, instance in instances},
	)
	steps := {step: {id: located(instance) | some id, instance in instances; instance.step == step} |
		some step in {instance.step | some instance in instances}
	}
}

located(entry) := {"region": entry.region} if is_string(entry.region)

else := {}
