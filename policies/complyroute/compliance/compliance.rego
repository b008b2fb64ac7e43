# METADATA
# title: complyroute compliance
# description: |
#   The shipped rule set: personal data of GDPR-protected subjects stays in
#   GDPR or adequate regions, health data goes only to certified instances,
#   and nothing goes beyond the subject's consent. Its exclusions and the
#   cases where it requires consent; the entrypoint (decision), the label and
#   record checks and the helpers are the platform's, in platform.rego beside
#   this file. Contract: docs/architecture.md (section "Policy").
package complyroute.compliance

# The record's category and subject region (their reference entries), when labelled with known ones.
category := reference.categories[label.category]

region := reference.regions[label.region]

personal if category.personal == true

consent := object.get(label_values, "consent", set())

required_labels contains "consent" if personal

required_because["consent"] := sprintf(" for category %q", [label.category]) if not label_schema.consent.required

# --- exclusions (status 451 when every candidate is excluded) -----------------

# METADATA
# title: Residency
# description: |
#   Personal data of subjects protected by GDPR (regions with gdpr: true) may
#   go only to instances in a GDPR region or in a region on the adequacy list.
# custom:
#   code: RESIDENCY_VIOLATION
#   message: personal data of GDPR-protected subjects may go only to GDPR or adequate regions
exclusions contains exclusion(rego.metadata.rule(), id, detail) if {
	personal
	region.gdpr == true
	some id, candidate in candidates
	not candidate.protected
	where := object.get(candidate, "region", "no region")
	detail := sprintf("%s is in %v; subject region %s, category %s", [id, where, label.region, label.category])
}

# METADATA
# title: Certification
# description: a category with requires_certification goes only to instances holding that certification.
# custom:
#   code: CERTIFICATION_MISSING
#   message: the instance lacks the certification the category requires
exclusions contains exclusion(rego.metadata.rule(), id, detail) if {
	required := category.requires_certification
	some id, candidate in candidates
	not candidate.certifications[required]
	held := listed(object.keys(candidate.certifications))
	detail := sprintf("%s holds %s; category %s requires %q", [id, held, label.category, required])
}

# METADATA
# title: Purpose limitation
# description: |
#   For personal categories, an instance may receive the record only if the
#   subject consented to every purpose the instance processes for.
# custom:
#   code: PURPOSE_NOT_CONSENTED
#   message: the instance processes for purposes the subject did not consent to
exclusions contains exclusion(rego.metadata.rule(), id, detail) if {
	personal
	some id, candidate in candidates
	not_consented := object.keys(candidate.purposes) - consent
	count(not_consented) > 0
	detail := sprintf("%s processes for %s; consent is %s", [id, listed(not_consented), listed(consent)])
}
