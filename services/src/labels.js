// The labels in effect: the configuration's (config.labels, COMPLYROUTE_LABELS: the rule set's
// label schema), or the ones given since (setLabels: server.js reads the labels file again on
// SIGHUP). They say which headers a record must carry (missingLabelError), which are logged
// (loggedLabels) and which are sent on (src/routes.js). A record takes the labels in effect when
// it arrives and keeps them to its answer.

import { AppError } from './errors.js'

/** A label setting as the routes read it: the labels, in the schema's order, their digest, the required headers. */
export function labelsInEffect (labels, digest) {
  if (!Array.isArray(labels) || labels.length === 0) throw new Error('app: the labels (COMPLYROUTE_LABELS, config.labels) are required')
  return Object.freeze({ labels, digest, requiredHeaders: labels.filter((label) => label.required).map((label) => label.header) })
}

/** LABEL_MISSING for a record without a required label (`requiredHeaders`: in the schema's order), else null. */
export function missingLabelError (headers, requiredHeaders) {
  const missing = requiredHeaders.filter((name) => typeof headers[name] !== 'string' || headers[name] === '')
  if (missing.length === 0) return null
  return new AppError(400, 'LABEL_MISSING', `missing label header${missing.length > 1 ? 's' : ''}: ${missing.join(', ')}`,
    missing.map((name) => ({ code: 'LABEL_MISSING', message: `header ${name} is missing or empty` })))
}

/** Every label: its header's value as it arrived, null when it is absent. */
export function loggedLabels (labels, headers) {
  const logged = {}
  for (const label of labels) logged[label.name] = headers[label.header] ?? null
  return logged
}
