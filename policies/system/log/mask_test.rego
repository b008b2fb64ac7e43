# METADATA
# title: Decision log mask tests
# description: |
#   Table-driven: each row names a field of a decision log entry and whether OPA erases
#   it. The record (raw, parsed) and the label token go; the labels, the record's id,
#   the sender and step and the decision stay (what `complyroute trace` prints). That OPA
#   really writes no record body is checked on real decisions (tests/e2e/test_trace_e2e.py).
package system.log_test

import data.system.log

# The fields of one decision log entry: JSON pointer -> erased?
fields := {
	# the record as Envoy sends it: the body, raw or parsed
	"/input/attributes/request/http/body": true,
	"/input/attributes/request/http/raw_body": true,
	"/input/parsed_body": true,
	# the label token, a credential for one record: on its way in and in the entry's answer
	"/input/attributes/request/http/headers/x-complyroute-labels": true,
	"/result/headers/x-complyroute-labels": true,
	# what a trace shows
	"/input/attributes/request/http/headers/x-data-region": false,
	"/input/attributes/request/http/headers/x-data-category": false,
	"/input/attributes/request/http/headers/x-data-consent": false,
	"/input/attributes/request/http/headers/x-request-id": false,
	"/input/attributes/request/http/headers/x-complyroute-digest": false,
	"/input/attributes/contextExtensions": false,
	"/result": false,
	"/result/body": false,
	"/result/headers/x-complyroute-destination": false,
	"/result/headers/x-complyroute-revision": false,
}

rows_erased(erased) := {pointer | some pointer; fields[pointer] == erased}

test_mask_erases_the_record_and_the_token_allowed if {
	rows_erased(true) - log.mask == set()
}

test_mask_keeps_what_a_trace_shows_denied if {
	rows_erased(false) & log.mask == set()
}

test_mask_erases_nothing_the_table_does_not_name_denied if {
	log.mask - rows_erased(true) == set()
}
