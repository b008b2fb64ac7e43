// Configuration of one service instance, read from the environment.
//
// parseConfig(env) is the only place that reads the variables: server.js
// re-exports it and uses it, the tests call it directly. An invalid or missing
// variable throws a ConfigError whose message names the variable.

import { X509Certificate, createHash, createPrivateKey } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { MAX_SPIFFE_ID_LENGTH, certificateIdentity, isSpiffeId } from './src/identity.js'

export const LOG_LEVELS = Object.freeze(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'])

export const DEFAULTS = Object.freeze({
  HOST: '127.0.0.1',
  PORT: 3000,
  WORK_ITERATIONS: 100, // the one default: the control plane sets it only where a manifest does
  EGRESS_TIMEOUT_MS: 30000,
  LOG_LEVEL: 'warn',
  AUDIT_DIR: join('run', 'audit')
})

// Identifiers (instance ids, step names, regions, nodes, certifications,
// purposes): what the policy catalog and the headers can carry safely.
const TOKEN = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/

// The label schema (COMPLYROUTE_LABELS or COMPLYROUTE_LABELS_FILE): what a label's name and its header may be, as the rule
// set's schema allows them (complyroute/policy/labels.py NAME, HEADER, OWN_HEADERS). A label header is
// lowercase (Node hands headers over lowercased), not one of complyroute's own headers, and
// not x-request-id, which the instance reads and sends on itself.
const LABEL_NAME = /^[a-z][a-z0-9_]{0,31}$/
const LABEL_HEADER = /^x-[a-z0-9][a-z0-9-]{0,62}$/
const OWN_HEADERS = 'x-complyroute-'
const INSTANCE_HEADERS = Object.freeze(['x-request-id'])
const LABEL_FIELDS = Object.freeze(['header', 'name', 'required'])
const LABELS_EXPECTED = 'expected a JSON array of at least one label, {"name", "header", "required"} each, in the schema\'s order'

const MAX_WORK_ITERATIONS = 1_000_000
const MAX_TIMEOUT_MS = 600_000

export class ConfigError extends Error {
  constructor (variable, message) {
    super(`${variable}: ${message}`)
    this.name = 'ConfigError'
    this.variable = variable
  }
}

// An unset variable and an empty (or blank) one mean the same: not set.
function read (env, name) {
  const value = env[name]
  if (value === undefined || value === null) return ''
  return String(value).trim()
}

function token (env, name, { required = false, fallback } = {}) {
  const value = read(env, name)
  if (value === '') {
    if (required) throw new ConfigError(name, 'is required')
    return fallback
  }
  if (!TOKEN.test(value)) {
    throw new ConfigError(name, `invalid value ${JSON.stringify(value)}: expected letters, digits, '.', '_', ':' or '-' (at most 128 characters)`)
  }
  return value
}

// A comma-separated list, each item trimmed and valid (`valid`), each once; `expected` says
// what an item must be.
function validList (env, name, valid, expected) {
  const value = read(env, name)
  if (value === '') return Object.freeze([])
  const items = value.split(',').map((item) => item.trim())
  for (const item of items) {
    if (!valid(item)) throw new ConfigError(name, `invalid item ${JSON.stringify(item)} in ${JSON.stringify(value)}: ${expected}`)
  }
  return Object.freeze([...new Set(items)])
}

function list (env, name) {
  return validList(env, name, (item) => TOKEN.test(item), 'expected a comma-separated list of identifiers')
}

// SPIFFE-style identities (spiffe://complyroute/point/central-entity): who a part is under
// mutual TLS, the one URI SAN of its certificate (src/identity.js).
const SPIFFE_EXPECTED = `expected a SPIFFE id, spiffe://<trust domain>/<path> (at most ${MAX_SPIFFE_ID_LENGTH} characters)`

function spiffeId (env, name) {
  const value = read(env, name)
  if (value === '') return null
  if (!isSpiffeId(value)) throw new ConfigError(name, `invalid value ${JSON.stringify(value)}: ${SPIFFE_EXPECTED}`)
  return value
}

function spiffeList (env, name) {
  return validList(env, name, isSpiffeId, `${SPIFFE_EXPECTED}, comma-separated`)
}

function flag (env, name) {
  const value = read(env, name)
  if (value === '' || value === '0') return false
  if (value === '1') return true
  throw new ConfigError(name, `invalid value ${JSON.stringify(value)}: expected 1 (on) or 0 (off)`)
}

function integer (env, name, { fallback, min, max }) {
  const value = read(env, name)
  if (value === '') return fallback
  if (!/^\d+$/.test(value)) throw new ConfigError(name, `invalid value ${JSON.stringify(value)}: expected an integer from ${min} to ${max}`)
  const n = Number(value)
  if (!Number.isSafeInteger(n) || n < min || n > max) {
    throw new ConfigError(name, `invalid value ${JSON.stringify(value)}: expected an integer from ${min} to ${max}`)
  }
  return n
}

function egressUrl (env) {
  const value = read(env, 'EGRESS_URL')
  if (value === '') return undefined
  let url
  try {
    url = new URL(value)
  } catch {
    throw new ConfigError('EGRESS_URL', `invalid URL ${JSON.stringify(value)}`)
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new ConfigError('EGRESS_URL', `invalid URL ${JSON.stringify(value)}: the scheme must be http or https`)
  }
  if ((url.pathname !== '/' && url.pathname !== '') || url.search !== '' || url.hash !== '' || url.username !== '' || url.password !== '') {
    throw new ConfigError('EGRESS_URL', `invalid URL ${JSON.stringify(value)}: expected an origin only (scheme, host, port), the path /process is added`)
  }
  return url.origin
}

/**
 * The labels this instance requires, logs and sends on, set by the control plane from the rule
 * set's label schema (complyroute/policy/labels.py service_setting): a JSON array of {"name",
 * "header", "required"} in the schema's order, at least one, names and headers each used once,
 * given either in COMPLYROUTE_LABELS itself or in the file COMPLYROUTE_LABELS_FILE names (a
 * local deployment's: the instance reads it again on SIGHUP, server.js, so a reload can add a
 * label without a restart). Returns {labels, digest}: the labels frozen, in the order given (the
 * audit line's labels keep it), and "sha256:<hex>" of the setting's text as read, which the
 * instance reports (GET /health) so the control plane knows which setting it applies.
 */
export function readLabelSetting (env = process.env) {
  const file = read(env, 'COMPLYROUTE_LABELS_FILE')
  if (file !== '' && read(env, 'COMPLYROUTE_LABELS') !== '') {
    throw new ConfigError('COMPLYROUTE_LABELS_FILE', 'is set and so is COMPLYROUTE_LABELS: set one of them')
  }
  if (file === '') {
    const value = read(env, 'COMPLYROUTE_LABELS')
    return labelSetting('COMPLYROUTE_LABELS', value, `${LABELS_EXPECTED} (or COMPLYROUTE_LABELS_FILE, a file holding it)`)
  }
  let text
  try {
    text = readFileSync(file, 'utf8')
  } catch (err) {
    throw new ConfigError('COMPLYROUTE_LABELS_FILE', `cannot read ${JSON.stringify(file)}: ${err.code ?? err.message}`)
  }
  return labelSetting('COMPLYROUTE_LABELS_FILE', text, `${JSON.stringify(file)}: ${LABELS_EXPECTED}`, `${JSON.stringify(file)}: `)
}

/** The labels alone (readLabelSetting), for bench/floor.js, which forwards the same headers. */
export function parseLabels (env = process.env) {
  return readLabelSetting(env).labels
}

function labelSetting (name, text, expected, where = '') {
  if (text.trim() === '') throw new ConfigError(name, `${where}is required: ${expected}`)
  let declared
  try {
    declared = JSON.parse(text)
  } catch (err) {
    throw new ConfigError(name, `${where}is not JSON (${err.message}): ${expected}`)
  }
  if (!Array.isArray(declared) || declared.length === 0) {
    throw new ConfigError(name, `${where}invalid value ${JSON.stringify(text.trim())}: ${expected}`)
  }
  const names = new Map()
  const headers = new Map()
  const labels = Object.freeze(declared.map((label, index) => {
    const at = `${where}label ${index}`
    if (typeof label !== 'object' || label === null || Array.isArray(label) ||
        Object.keys(label).sort().join(',') !== LABEL_FIELDS.join(',')) {
      throw new ConfigError(name, `${at} is ${JSON.stringify(label)}: expected an object with exactly the fields "name", "header" and "required"`)
    }
    if (typeof label.name !== 'string' || !LABEL_NAME.test(label.name)) {
      throw new ConfigError(name, `${at}: invalid name ${JSON.stringify(label.name)}: expected a lowercase letter, then lowercase letters, digits or '_' (at most 32 characters)`)
    }
    const named = `${where}label ${label.name}`
    if (typeof label.header !== 'string' || !LABEL_HEADER.test(label.header) || label.header.startsWith(OWN_HEADERS) || INSTANCE_HEADERS.includes(label.header)) {
      throw new ConfigError(name, `${named}: invalid header ${JSON.stringify(label.header)}: expected x- then a lowercase letter or digit and at most 62 more lowercase letters, digits or '-', not ${OWN_HEADERS}* nor ${INSTANCE_HEADERS.join(', ')}`)
    }
    if (typeof label.required !== 'boolean') {
      throw new ConfigError(name, `${named}: invalid required ${JSON.stringify(label.required)}: expected true or false`)
    }
    if (names.has(label.name)) throw new ConfigError(name, `${named} is declared twice (labels ${names.get(label.name)} and ${index})`)
    if (headers.has(label.header)) throw new ConfigError(name, `${named}: header ${label.header} is label ${headers.get(label.header)}'s header too`)
    names.set(label.name, index)
    headers.set(label.header, label.name)
    return Object.freeze({ name: label.name, header: label.header, required: label.required })
  }))
  return Object.freeze({ labels, digest: `sha256:${createHash('sha256').update(text).digest('hex')}` })
}

const TLS_VARIABLES = Object.freeze(['TLS_CERT', 'TLS_KEY', 'TLS_CA'])
const PEM_CERTIFICATE = /-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/g

function readPem (name, path) {
  try {
    return readFileSync(path, 'utf8')
  } catch (err) {
    throw new ConfigError(name, `cannot read ${JSON.stringify(path)}: ${err.code ?? err.message}`)
  }
}

function certificate (name, path, pem) {
  try {
    return new X509Certificate(pem)
  } catch (err) {
    throw new ConfigError(name, `${JSON.stringify(path)} is not a PEM certificate: ${err.message}`)
  }
}

/**
 * The mutual TLS credentials, read and checked at start so that a wrong file stops the
 * instance with a message naming its variable instead of failing every handshake later:
 * the certificate names this part by one SPIFFE id, the key is its EC P-256 key, the CA
 * file holds CA certificates and one of them issued the certificate. null when none of
 * the three variables is set (plain HTTP); some but not all set is an error.
 */
function tlsCredentials (env) {
  const paths = Object.fromEntries(TLS_VARIABLES.map((name) => [name, read(env, name)]))
  const set = TLS_VARIABLES.filter((name) => paths[name] !== '')
  if (set.length === 0) return null
  if (set.length < TLS_VARIABLES.length) {
    const missing = TLS_VARIABLES.find((name) => paths[name] === '')
    throw new ConfigError(missing, `is required when ${set.join(' and ')} ${set.length > 1 ? 'are' : 'is'} set: mutual TLS needs TLS_CERT, TLS_KEY and TLS_CA`)
  }

  const cert = readPem('TLS_CERT', paths.TLS_CERT)
  const x509 = certificate('TLS_CERT', paths.TLS_CERT, cert)
  const identity = certificateIdentity(x509.subjectAltName)
  if (identity === null) {
    throw new ConfigError('TLS_CERT', `${JSON.stringify(paths.TLS_CERT)} must name this part by exactly one URI SAN, a SPIFFE id (it has ${JSON.stringify(x509.subjectAltName ?? 'none')})`)
  }

  const key = readPem('TLS_KEY', paths.TLS_KEY)
  let keyObject
  try {
    keyObject = createPrivateKey(key)
  } catch (err) {
    throw new ConfigError('TLS_KEY', `${JSON.stringify(paths.TLS_KEY)} is not a PEM private key: ${err.message}`)
  }
  if (keyObject.asymmetricKeyType !== 'ec' || keyObject.asymmetricKeyDetails?.namedCurve !== 'prime256v1') {
    throw new ConfigError('TLS_KEY', `${JSON.stringify(paths.TLS_KEY)} must be an EC P-256 key`)
  }
  if (!x509.checkPrivateKey(keyObject)) {
    throw new ConfigError('TLS_KEY', `${JSON.stringify(paths.TLS_KEY)} is not the key of the certificate in TLS_CERT`)
  }

  const ca = readPem('TLS_CA', paths.TLS_CA)
  const authorities = (ca.match(PEM_CERTIFICATE) ?? []).map((pem) => certificate('TLS_CA', paths.TLS_CA, pem))
  if (authorities.length === 0) throw new ConfigError('TLS_CA', `${JSON.stringify(paths.TLS_CA)} holds no PEM certificate`)
  if (!authorities.every((authority) => authority.ca)) {
    throw new ConfigError('TLS_CA', `${JSON.stringify(paths.TLS_CA)} holds a certificate that is not a CA's`)
  }
  if (!authorities.some((authority) => x509.checkIssued(authority) && x509.verify(authority.publicKey))) {
    throw new ConfigError('TLS_CERT', `${JSON.stringify(paths.TLS_CERT)} was not issued by the CA in TLS_CA`)
  }

  const tls = { identity, cert, ca, certFile: paths.TLS_CERT, keyFile: paths.TLS_KEY, caFile: paths.TLS_CA }
  // Not enumerable: a configuration that gets logged or printed does not show the key.
  Object.defineProperty(tls, 'key', { value: key, enumerable: false })
  return Object.freeze(tls)
}

/**
 * Parse and validate the configuration from an environment object.
 * @param {Record<string, string | undefined>} env usually process.env
 * @returns {Readonly<object>} the configuration (camelCase keys)
 * @throws {ConfigError} naming the first invalid or missing variable
 */
export function parseConfig (env = process.env) {
  const instanceId = token(env, 'INSTANCE_ID', { required: true })
  const step = token(env, 'STEP', { required: true })
  const region = token(env, 'REGION', { required: true })
  const node = token(env, 'NODE', { required: true })
  const certifications = list(env, 'CERTIFICATIONS')
  const purposes = list(env, 'PURPOSES')
  const { labels, digest: labelDigest } = readLabelSetting(env)

  const nextStep = token(env, 'NEXT_STEP', { fallback: null })
  const egress = egressUrl(env)
  if (nextStep !== null && egress === undefined) {
    throw new ConfigError('EGRESS_URL', `is required when NEXT_STEP is set (NEXT_STEP=${nextStep})`)
  }
  if (nextStep === null && egress !== undefined) {
    throw new ConfigError('NEXT_STEP', `is empty but EGRESS_URL is set (${egress}): set NEXT_STEP, or unset EGRESS_URL for the last step`)
  }

  const host = read(env, 'HOST') || DEFAULTS.HOST
  if (/\s|\//.test(host)) throw new ConfigError('HOST', `invalid value ${JSON.stringify(host)}: expected a host name or an IP address`)
  const port = integer(env, 'PORT', { fallback: DEFAULTS.PORT, min: 0, max: 65535 })

  const auditLog = read(env, 'AUDIT_LOG') || join(DEFAULTS.AUDIT_DIR, `${instanceId}.jsonl`)
  if (auditLog.endsWith('/')) throw new ConfigError('AUDIT_LOG', `invalid value ${JSON.stringify(auditLog)}: expected a file path, not a directory`)

  const workIterations = integer(env, 'WORK_ITERATIONS', { fallback: DEFAULTS.WORK_ITERATIONS, min: 0, max: MAX_WORK_ITERATIONS })
  const egressTimeoutMs = integer(env, 'EGRESS_TIMEOUT_MS', { fallback: DEFAULTS.EGRESS_TIMEOUT_MS, min: 1, max: MAX_TIMEOUT_MS })

  // Mutual TLS: with TLS_CERT, TLS_KEY and TLS_CA the instance listens on HTTPS, admits
  // only the listed peers, and sends on only to a next hop presenting EGRESS_IDENTITY.
  const tls = tlsCredentials(env)
  const recordPeers = spiffeList(env, 'RECORD_PEERS')
  const controlPeers = spiffeList(env, 'CONTROL_PEERS')
  const monitoringPeers = spiffeList(env, 'MONITORING_PEERS')
  const egressIdentity = spiffeId(env, 'EGRESS_IDENTITY')
  if (tls === null) {
    // Without TLS there is no peer identity to check: a list given anyway would be ignored
    // silently, so it is refused.
    for (const [name, given] of [['RECORD_PEERS', recordPeers.length > 0], ['CONTROL_PEERS', controlPeers.length > 0],
      ['MONITORING_PEERS', monitoringPeers.length > 0], ['EGRESS_IDENTITY', egressIdentity !== null]]) {
      if (given) throw new ConfigError(name, 'is set but mutual TLS is off: set TLS_CERT, TLS_KEY and TLS_CA, or unset it')
    }
  } else {
    // Set, but possibly empty: an instance no part of the plan sends to (the baseline's
    // second replica of a step) admits no record at all.
    if (env.RECORD_PEERS === undefined || env.RECORD_PEERS === null) {
      throw new ConfigError('RECORD_PEERS', 'is required with mutual TLS (TLS_CERT, TLS_KEY, TLS_CA): the identities that may send records (empty: none)')
    }
    if (nextStep !== null) {
      if (egressIdentity === null) throw new ConfigError('EGRESS_IDENTITY', `is required with mutual TLS when NEXT_STEP is set (NEXT_STEP=${nextStep})`)
      if (!egress.startsWith('https:')) throw new ConfigError('EGRESS_URL', `invalid URL ${JSON.stringify(egress)}: must be https with mutual TLS`)
    }
  }
  if (nextStep === null && egressIdentity !== null) {
    throw new ConfigError('EGRESS_IDENTITY', `is set (${egressIdentity}) but NEXT_STEP is empty: this is the last step, it sends nothing on`)
  }
  // Label tokens: the enforcement point deciding the hop into this instance verified the
  // record's signed labels; the instance checks the record is the one they were issued for.
  const labelTokens = flag(env, 'LABEL_TOKENS')

  const logLevel = (read(env, 'LOG_LEVEL') || DEFAULTS.LOG_LEVEL).toLowerCase()
  if (!LOG_LEVELS.includes(logLevel)) {
    throw new ConfigError('LOG_LEVEL', `invalid value ${JSON.stringify(logLevel)}: expected one of ${LOG_LEVELS.join(', ')}`)
  }

  return Object.freeze({
    instanceId,
    step,
    region,
    node,
    certifications,
    purposes,
    labels,
    labelDigest,
    nextStep,
    egressUrl: egress ?? null,
    host,
    port,
    auditLog,
    workIterations,
    egressTimeoutMs,
    logLevel,
    tls,
    recordPeers,
    controlPeers,
    monitoringPeers,
    egressIdentity,
    labelTokens
  })
}
