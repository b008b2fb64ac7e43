package system.authz_test

import data.system.authz

test_reading_and_queries_allowed if {
	authz.allow with input as {"method": "GET", "path": ["v1", "data", "complyroute", "index"]}
	authz.allow with input as {"method": "POST", "path": ["v1", "data", "complyroute", "compliance", "decision"]}
}

test_writing_policies_or_data_denied if {
	not authz.allow with input as {"method": "PUT", "path": ["v1", "policies", "complyroute"]}
	not authz.allow with input as {"method": "DELETE", "path": ["v1", "policies", "complyroute"]}
	not authz.allow with input as {"method": "PUT", "path": ["v1", "data", "complyroute", "index"]}
	not authz.allow with input as {"method": "PATCH", "path": ["v1", "data"]}
	not authz.allow with input as {"method": "DELETE", "path": ["v1", "data", "complyroute"]}
}
