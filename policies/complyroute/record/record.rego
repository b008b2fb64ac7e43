# METADATA
# title: The record's shape, as the platform reads it
# description: |
#   Whether the record (the request body, input.record) is a JSON object, and
#   its type for messages. A part of the platform, not of a rule set: every
#   rule set gets this package from policies/ (complyroute/policy/policyfiles.py
#   PLATFORM), and its RECORD_MALFORMED rule reads it.
#
#   The control plane relies on it when it asks which answers may be
#   precomputed (complyroute/engines/independence.py): the quick path takes a
#   record only when its body is a JSON object, so OPA's partial evaluation
#   asks the decision with this package answering "an object", and the record
#   itself unknown. A rule that reads the record in any other way is then seen
#   by OPA to depend on it.
package complyroute.record

# Note: `not f(input.x)` is undefined (not true) when input.x is absent, as OPA
# evaluates the argument outside the negation; hence a rule to negate.
is_json_object if is_object(input.record)

default kind := "nothing (body absent or not valid JSON)"

kind := type_name(input.record)
