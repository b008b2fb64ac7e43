# METADATA
# title: The record's shape, as the quick path takes a record
# description: |
#   Replaces the platform's package of the record's shape
#   (policies/complyroute/record) in the copy of a rule set whose answers OPA's
#   partial evaluation checks (complyroute/engines/independence.py): the quick
#   path takes only a body that is a JSON object, so the decision is asked of
#   an object whose content is unknown.
package complyroute.record # regal ignore:directory-package-mismatch

is_json_object := true

kind := "object"
