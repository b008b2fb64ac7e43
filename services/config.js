// Configuration of one service instance, read from the environment.
//
// parseConfig(env) is the only place that reads the variables: server.js
// re-exports it and uses it, the tests call it directly. An invalid or missing
// variable throws a ConfigError whose message names the variable.

import { join } from 'node:path'

export const LOG_LEVELS = Object.freeze(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'])

export const DEFAULTS = Object.freeze({
  HOST: '127.0.0.1',
  PORT: 3000,
  WORK_ITERATIONS: 200,
  EGRESS_TIMEOUT_MS: 30000,
  LOG_LEVEL: 'warn',
  AUDIT_DIR: join('run', 'audit')
})

// Identifiers (instance ids, step names, regions, nodes, certifications,
// purposes): what the policy catalog and the headers can carry safely.
const TOKEN = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/

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

function list (env, name) {
  const value = read(env, name)
  if (value === '') return Object.freeze([])
  const items = value.split(',').map((item) => item.trim())
  for (const item of items) {
    if (!TOKEN.test(item)) {
      throw new ConfigError(name, `invalid item ${JSON.stringify(item)} in ${JSON.stringify(value)}: expected a comma-separated list of identifiers`)
    }
  }
  return Object.freeze([...new Set(items)])
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
    nextStep,
    egressUrl: egress ?? null,
    host,
    port,
    auditLog,
    workIterations,
    egressTimeoutMs,
    logLevel
  })
}
