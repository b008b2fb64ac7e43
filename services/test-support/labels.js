// Test fixture (no tests here): the label schema as the control plane hands it to a service
// instance (COMPLYROUTE_LABELS, complyroute/policy/labels.py service_setting): the three labels the
// shipped rule set declares, in the schema's order (by name).
export const SHIPPED_LABELS = Object.freeze([
  Object.freeze({ name: 'category', header: 'x-data-category', required: true }),
  Object.freeze({ name: 'consent', header: 'x-data-consent', required: false }),
  Object.freeze({ name: 'region', header: 'x-data-region', required: true })
])

/** The environment variable of a schema (default: the shipped one), to spread into an env. */
export function labelsEnv (labels = SHIPPED_LABELS) {
  return Object.freeze({ COMPLYROUTE_LABELS: JSON.stringify(labels) })
}

export const LABELS_ENV = labelsEnv()
