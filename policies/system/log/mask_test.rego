# METADATA
# title: Decision log mask tests
# description: |
#   The record and the label token are erased wherever a decision holds them; the
#   labels, the request id and the decision stay (what `complyroute trace` prints).
package system.log_test

import data.system.log

test_mask_erases_the_record_and_the_token_allowed if {
	erased := {
		"/input/attributes/request/http/body",
		"/input/attributes/request/http/raw_body",
		"/input/parsed_body",
		"/input/attributes/request/http/headers/x-complyroute-labels",
		"/result/headers/x-complyroute-labels",
	}
	every pointer in erased {
		pointer in log.mask
	}
}

test_mask_keeps_what_a_trace_shows_denied if {
	kept := {
		"/input/attributes/request/http/headers/x-data-region",
		"/input/attributes/request/http/headers/x-request-id",
		"/input/attributes/contextExtensions",
		"/result",
		"/result/headers/x-complyroute-destination",
	}
	every pointer in kept {
		not pointer in log.mask
	}
}
