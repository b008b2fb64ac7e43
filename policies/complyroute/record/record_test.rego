package complyroute.record_test

import data.complyroute.record

test_is_json_object_allowed if {
	every body in [{}, {"a": 1}] {
		record.is_json_object with input as {"record": body}
	}
}

test_is_json_object_denied if {
	not record.is_json_object with input as {}
	every body in [[], "x", 1, null] {
		not record.is_json_object with input as {"record": body}
	}
}

test_kind_allowed if {
	record.kind == "array" with input as {"record": []}
	record.kind == "object" with input as {"record": {}}
}

test_kind_denied if {
	record.kind == "nothing (body absent or not valid JSON)" with input as {}
}
