// The answers of POST /process that carry the next hop's: the delivered path, written as text
// (this hop's entry, then the next hop's entries, copied or rewritten), and the next hop's
// error answer, relayed.

function isPlainObject (value) {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}

function isPathEntry (entry) {
  return isPlainObject(entry) &&
    typeof entry.instance === 'string' && typeof entry.step === 'string' &&
    typeof entry.region === 'string' && typeof entry.node === 'string' &&
    Number.isFinite(entry.t_in) && Number.isFinite(entry.t_out) &&
    (entry.t_back === undefined || Number.isFinite(entry.t_back)) &&
    (entry.revision === undefined || entry.revision === null || typeof entry.revision === 'string')
}

function parseJson (text) {
  try {
    return JSON.parse(text)
  } catch {
    return undefined
  }
}

/** A next hop's error answer (its text) as we relay it, or null when it is not JSON {code: string, ...}. */
export function relayableError (text, status, requestId) {
  const parsed = parseJson(text)
  if (!isPlainObject(parsed) || typeof parsed.code !== 'string' || parsed.code === '') return null
  if (parsed.message !== undefined && typeof parsed.message !== 'string') return null
  if (parsed.reasons !== undefined && !(Array.isArray(parsed.reasons) && parsed.reasons.every(isPlainObject))) return null
  const body = { ...parsed }
  if (body.message === undefined) body.message = `next hop answered ${status}`
  if (typeof body.request_id !== 'string' || body.request_id === '') body.request_id = requestId
  return body
}

// A 200 answer is written as text, not by a serializer: this hop's entry from a prefix
// built once, then the downstream entries. Those are copied as they came when the next
// hop's answer is in exactly the form written here, which one regular expression checks
// (a linear scan in native code: no parse, no per-entry validation, no re-serialization),
// so a hop's cost barely grows with the path behind it. The expression only matches
// valid JSON with the contract's shape, so a hostile answer cannot make this hop's
// answer invalid: any other answer is parsed, validated and rewritten entry by entry
// (unknown fields dropped), or refused.

const PLAIN_STRING = /"[^"\\\u0000-\u001f]*"/.source // a JSON string without escapes
const FINITE_NUMBER = /-?(?:0|[1-9][0-9]{0,299})(?:\.[0-9]+)?/.source // no exponent: below 1e300
const WRITTEN_PATH_ENTRY = `\\{"instance":${PLAIN_STRING},"step":${PLAIN_STRING},"region":${PLAIN_STRING},"node":${PLAIN_STRING},"t_in":${FINITE_NUMBER},"t_out":${FINITE_NUMBER}(?:,"t_back":${FINITE_NUMBER})?,"revision":(?:${PLAIN_STRING}|null)\\}`
// A delivered answer as deliveredAnswer writes it; group 1: the path's entries.
const WRITTEN_DELIVERED_ANSWER = new RegExp(`^\\{"request_id":${PLAIN_STRING},"path":\\[(${WRITTEN_PATH_ENTRY}(?:,${WRITTEN_PATH_ENTRY})*)\\]\\}$`)

// The start of a path entry, up to its t_in value: built once per instance.
export function pathEntryPrefix ({ instance, step, region, node }) {
  return `{"instance":${JSON.stringify(instance)},"step":${JSON.stringify(step)},"region":${JSON.stringify(region)},"node":${JSON.stringify(node)},"t_in":`
}

// Finite numbers only (the callers check): their JSON is their string. `revision`: the rule
// set's revision that decided the hop into the instance (x-complyroute-revision), null when
// no point decided it (the baseline).
export function pathEntryJson (prefix, tIn, tOut, tBack, revision) {
  const decidedBy = `"revision":${typeof revision === 'string' ? JSON.stringify(revision) : 'null'}`
  return tBack === undefined ? `${prefix}${tIn},"t_out":${tOut},${decidedBy}}` : `${prefix}${tIn},"t_out":${tOut},"t_back":${tBack},${decidedBy}}`
}

// 200 {request_id, path: [own, ...downstream]}; `downstream` is JSON text of entries.
export function deliveredAnswer (requestId, own, downstream) {
  return `{"request_id":${JSON.stringify(requestId)},"path":[${own}${downstream === undefined ? '' : `,${downstream}`}]}`
}

/**
 * The entries of a next hop's 200 answer as JSON text (comma-separated), or null when
 * the answer has no valid path.
 */
export function downstreamPathEntries (body) {
  const written = WRITTEN_DELIVERED_ANSWER.exec(body)
  if (written !== null) return written[1]
  const parsed = parseJson(body)
  if (!isPlainObject(parsed) || !Array.isArray(parsed.path) || parsed.path.length === 0 || !parsed.path.every(isPathEntry)) return null
  return parsed.path.map((entry) => pathEntryJson(pathEntryPrefix(entry), entry.t_in, entry.t_out, entry.t_back, entry.revision)).join(',')
}
