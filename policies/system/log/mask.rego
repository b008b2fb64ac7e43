# METADATA
# title: What OPA's decision logs leave out
# description: >-
#   With engine.decision_logs "file", each enforcement point's OPA logs every decision
#   (complyroute/proxy/opa.py opa_config), after asking this policy, OPA's default
#   mask_decision, which fields of the decision to erase. A decision log names the point,
#   the labels, the request id, the decision and its reasons, the revision: never the
#   record itself (its body, raw or parsed), nor the label token (a credential the entry
#   issues for one record) in the request or in the answer.
package system.log

# METADATA
# description: The JSON pointers OPA erases from a decision log entry before writing it.
# scope: document
# entrypoint: true
mask contains "/input/attributes/request/http/body"

mask contains "/input/attributes/request/http/raw_body"

mask contains "/input/parsed_body"

mask contains "/input/attributes/request/http/headers/x-complyroute-labels"

mask contains "/result/headers/x-complyroute-labels"
