// The service instance: one step of a complyroute chain.
//
// `app` is the Fastify plugin with the routes (POST /process, GET /health,
// GET /stats) and the JSON error answers; `buildApp` creates a Fastify
// instance with it, creating the forwarder and the audit log from the
// configuration unless they are injected (tests inject them).

import { createHash, randomUUID } from 'node:crypto'
import { STATUS_CODES } from 'node:http'
import { performance } from 'node:perf_hooks'
import Fastify, { LogController } from 'fastify'
import { createAuditLog, sha256Hex } from './lib/audit.js'
import { createForwarder } from './lib/forwarder.js'
import { peerAllowed, peerIdentity } from './lib/identity.js'
import { RecentIds } from './lib/recent-ids.js'

// The labels are the configuration's (config.labels, COMPLYROUTE_LABELS: the rule set's label
// schema), or the ones given since (setLabels: server.js reads the labels file again on SIGHUP):
// which headers a record must carry, which are logged and which are sent on.
// Set by the enforcement point that decided the hop into this instance, overwriting any
// value a sender chose (complyroute/proxy/envoy.py _deciding_listener); absent when no
// point decided it (the baseline, or a record that bypassed the enforcement points).
export const DECISION_HEADERS = Object.freeze({
  sender: 'x-complyroute-sender',
  decided_by: 'x-complyroute-decided-by',
  revision: 'x-complyroute-revision'
})
// Label-token mode (LABEL_TOKENS=1): the point that decided the hop into this instance
// verified the signed label token and set the record's digest from its claims
// (complyroute/proxy/contract.py LABEL_TOKEN_HEADER, DIGEST_HEADER). The token is passed on to
// the next point, which verifies it again; the digest is not (the next point derives it).
export const LABEL_TOKEN_HEADERS = Object.freeze({
  token: 'x-complyroute-labels',
  digest: 'x-complyroute-digest'
})
// How many accepted record ids an instance remembers to refuse a replayed record. A replay
// needs a token still valid (complyroute/trust/identity.py: 120 s), so this covers up to 1,250
// records/s per instance; an id forgotten earlier than that could be replayed once.
export const REPLAY_WINDOW = 150_000
// The largest record: the enforcement points' limit too (complyroute/proxy/contract.py
// MAX_RECORD_BYTES), so a record one part takes, every part takes.
export const BODY_LIMIT = 64 * 1024

// A client's x-request-id is kept when it is 1 to 200 visible ASCII characters other than
// ','; an absent or empty one is replaced by a UUID; anything else is refused (400). The
// comma is refused because it is what a repeated header is joined with (Envoy joins with
// ',', Node with ', '): an id sent twice must be refused, not taken as an id nobody sent.
const REQUEST_ID_PATTERN = '^([\\x21-\\x2b\\x2d-\\x7e]{1,200})?$'
const REQUEST_ID = /^[\x21-\x2b\x2d-\x7e]{1,200}$/

const kTIn = Symbol('complyroute.t_in')
const kOutcome = Symbol('complyroute.outcome')
const kBodyText = Symbol('complyroute.body_text')
const kLabels = Symbol('complyroute.labels')

const JSON_CONTENT_TYPE = 'application/json; charset=utf-8'

export function defaultClock () {
  return performance.timeOrigin + performance.now()
}

export function isValidRequestId (value) {
  return typeof value === 'string' && REQUEST_ID.test(value)
}

/** The fixed work per record: `iterations` chained SHA-256 rounds over the body. */
export function doWork (body, iterations) {
  let digest = Buffer.alloc(0)
  for (let i = 0; i < iterations; i++) {
    digest = createHash('sha256').update(digest).update(body).digest()
  }
  return digest.toString('hex')
}

// ---------------------------------------------------------------- schemas

const reasonSchema = {
  type: 'object',
  additionalProperties: true,
  properties: {
    code: { type: 'string' },
    message: { type: 'string' },
    instance: { type: 'string' }
  }
}

// Every error answer, our own and the ones relayed from downstream (which may
// carry more properties: they are kept).
export const errorSchema = {
  $id: 'complyroute-error',
  type: 'object',
  required: ['code', 'message'],
  additionalProperties: true,
  properties: {
    code: { type: 'string' },
    message: { type: 'string' },
    request_id: { type: 'string' },
    reasons: { type: 'array', items: reasonSchema }
  }
}

const errorRef = { $ref: 'complyroute-error#' }
const errorResponses = { '4xx': errorRef, '5xx': errorRef }

const pathEntrySchema = {
  type: 'object',
  required: ['instance', 'step', 'region', 'node', 't_in', 't_out'],
  additionalProperties: false,
  properties: {
    instance: { type: 'string' },
    step: { type: 'string' },
    region: { type: 'string' },
    node: { type: 'string' },
    t_in: { type: 'number' },
    t_out: { type: 'number' },
    t_back: { type: 'number' }
  }
}

const processResponseSchema = {
  200: {
    type: 'object',
    required: ['request_id', 'path'],
    additionalProperties: false,
    properties: {
      request_id: { type: 'string' },
      path: { type: 'array', minItems: 1, items: pathEntrySchema }
    }
  },
  ...errorResponses
}

// A record's labels are checked against the labels in effect when it arrived (checkLabels in
// the plugin), not by this schema: a route's schema is compiled once, and the labels can change.
function processSchema () {
  return {
    headers: { type: 'object', properties: { 'x-request-id': { type: 'string', pattern: REQUEST_ID_PATTERN } } },
    body: { type: 'object' },
    response: processResponseSchema
  }
}

const noQuery = { type: 'object', additionalProperties: false, properties: {} }

const healthSchema = {
  querystring: noQuery,
  response: {
    200: {
      type: 'object',
      required: ['status', 'instance', 'step', 'labels'],
      additionalProperties: false,
      properties: {
        status: { type: 'string', enum: ['ok'] },
        instance: { type: 'string' },
        step: { type: 'string' },
        // The digest of the label setting in effect (config.js readLabelSetting): the control
        // plane waits for the one it wrote before it applies rules reading a new label.
        labels: { type: 'string' }
      }
    },
    ...errorResponses
  }
}

export const STAT_NAMES = Object.freeze([
  'received', 'answered', 'forwarded', 'downstream_denied', 'downstream_failed', 'rejected', 'internal_errors'
])

const statsSchema = {
  querystring: noQuery,
  response: {
    200: {
      type: 'object',
      required: [...STAT_NAMES],
      additionalProperties: false,
      properties: Object.fromEntries(STAT_NAMES.map((name) => [name, { type: 'integer', minimum: 0 }]))
    },
    ...errorResponses
  }
}

// ---------------------------------------------------------------- errors

class AppError extends Error {
  constructor (statusCode, code, message, reasons) {
    super(message)
    this.statusCode = statusCode
    this.code = code
    this.reasons = reasons
  }
}

const CODE_BY_STATUS = {
  400: 'BAD_REQUEST',
  404: 'NOT_FOUND',
  405: 'METHOD_NOT_ALLOWED',
  408: 'REQUEST_TIMEOUT',
  413: 'BODY_TOO_LARGE',
  414: 'URI_TOO_LONG',
  415: 'CONTENT_TYPE_UNSUPPORTED',
  431: 'HEADERS_TOO_LARGE'
}

/** LABEL_MISSING for a record without a required label (`requiredHeaders`: in the schema's order), else null. */
export function missingLabelError (headers, requiredHeaders) {
  const missing = requiredHeaders.filter((name) => typeof headers[name] !== 'string' || headers[name] === '')
  if (missing.length === 0) return null
  return new AppError(400, 'LABEL_MISSING', `missing label header${missing.length > 1 ? 's' : ''}: ${missing.join(', ')}`,
    missing.map((name) => ({ code: 'LABEL_MISSING', message: `header ${name} is missing or empty` })))
}

/** Map any error Fastify or a handler raises to {status, code, message, reasons?}. */
export function classifyError (err) {
  if (err instanceof AppError) return { status: err.statusCode, code: err.code, message: err.message, reasons: err.reasons }
  if (err.validation) {
    // The only header the route's schema checks (the labels are checked apart, missingLabelError).
    if (err.validationContext === 'headers') {
      return { status: 400, code: 'REQUEST_ID_INVALID', message: 'x-request-id must be sent once, as 1 to 200 visible ASCII characters other than \',\'' }
    }
    if (err.validationContext === 'body') {
      return { status: 400, code: 'BODY_INVALID', message: 'body must be a JSON object' }
    }
    return { status: 400, code: 'BAD_REQUEST', message: `invalid ${err.validationContext}: ${err.message}` }
  }
  switch (err.code) {
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return { status: 400, code: 'BODY_INVALID', message: 'body is empty: expected a JSON object' }
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
      return { status: 400, code: 'BODY_INVALID', message: 'body is not valid JSON' }
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return { status: 413, code: 'BODY_TOO_LARGE', message: `body is larger than ${BODY_LIMIT} bytes` }
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return { status: 415, code: 'CONTENT_TYPE_UNSUPPORTED', message: 'content-type must be application/json' }
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return { status: 400, code: 'BAD_REQUEST', message: 'content-length does not match the body' }
  }
  const status = err.statusCode
  if (Number.isInteger(status) && status >= 400 && status < 500) {
    return { status, code: CODE_BY_STATUS[status] ?? 'BAD_REQUEST', message: err.message || STATUS_CODES[status] }
  }
  return { status: 500, code: 'INTERNAL_ERROR', message: 'internal error' }
}

function errorBody (classified, requestId) {
  const body = { code: classified.code, message: classified.message }
  if (requestId) body.request_id = requestId
  if (classified.status === 400) {
    body.reasons = classified.reasons ?? [{ code: classified.code, message: classified.message }]
  }
  return body
}

/**
 * Fastify's clientErrorHandler (malformed HTTP, before any route): answers in
 * the same {code, message} shape. `this` is the Fastify instance.
 */
export function clientErrorHandler (err, socket) {
  if (err.code === 'ECONNRESET' || socket.destroyed) return
  let status = 400
  if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT') status = 408
  else if (err.code === 'HPE_HEADER_OVERFLOW') status = 431
  const body = JSON.stringify({ code: CODE_BY_STATUS[status], message: status === 400 ? 'malformed HTTP request' : STATUS_CODES[status] })
  this?.log?.trace({ err }, 'client error')
  if (socket.writable) {
    socket.write(`HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`)
  }
  socket.destroy(err)
}

// ---------------------------------------------------------------- downstream answers

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

/** A downstream error answer we relay, or null when it is not {code: string, ...}. */
export function relayableError (parsed, status, requestId) {
  if (!isPlainObject(parsed) || typeof parsed.code !== 'string' || parsed.code === '') return null
  if (parsed.message !== undefined && typeof parsed.message !== 'string') return null
  if (parsed.reasons !== undefined && !(Array.isArray(parsed.reasons) && parsed.reasons.every(isPlainObject))) return null
  const body = { ...parsed }
  if (body.message === undefined) body.message = `next hop answered ${status}`
  if (typeof body.request_id !== 'string' || body.request_id === '') body.request_id = requestId
  return body
}

// ---------------------------------------------------------------- delivered answers
//
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
function pathEntryPrefix ({ instance, step, region, node }) {
  return `{"instance":${JSON.stringify(instance)},"step":${JSON.stringify(step)},"region":${JSON.stringify(region)},"node":${JSON.stringify(node)},"t_in":`
}

// Finite numbers only (the callers check): their JSON is their string. `revision`: the rule
// set's revision that decided the hop into the instance (x-complyroute-revision), null when
// no point decided it (the baseline).
function pathEntryJson (prefix, tIn, tOut, tBack, revision) {
  const decidedBy = `"revision":${typeof revision === 'string' ? JSON.stringify(revision) : 'null'}`
  return tBack === undefined ? `${prefix}${tIn},"t_out":${tOut},${decidedBy}}` : `${prefix}${tIn},"t_out":${tOut},"t_back":${tBack},${decidedBy}}`
}

// 200 {request_id, path: [own, ...downstream]}; `downstream` is JSON text of entries.
function deliveredAnswer (requestId, own, downstream) {
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

// ---------------------------------------------------------------- the plugin

function labelsInEffect (labels, digest) {
  if (!Array.isArray(labels) || labels.length === 0) throw new Error('app: the labels (COMPLYROUTE_LABELS, config.labels) are required')
  return Object.freeze({ labels, digest, requiredHeaders: labels.filter((label) => label.required).map((label) => label.header) })
}

/**
 * @param {import('fastify').FastifyInstance} fastify
 * @param {object} opts
 * @param {object} opts.config the result of parseConfig
 * @param {{write(entry: object): Promise<void>}} opts.audit
 * @param {(request: {body: string, headers: Record<string, string>}) => Promise<{status: number, body: string}>} [opts.forward] required when config.nextStep is set
 * @param {() => number} [opts.now] clock, ms since the epoch (fractional)
 */
export async function app (fastify, opts) {
  const { config, audit } = opts
  const forward = opts.forward
  const now = opts.now ?? defaultClock
  if (!config) throw new Error('app: opts.config is required')
  if (!audit || typeof audit.write !== 'function') throw new Error('app: opts.audit with write(entry) is required')
  if (config.nextStep && typeof forward !== 'function') throw new Error('app: opts.forward is required when NEXT_STEP is set')

  const stats = Object.fromEntries(STAT_NAMES.map((name) => [name, 0]))
  // The labels in effect, in the schema's order (the audit line's labels and the LABEL_MISSING
  // reasons keep it), and the digest of their setting (GET /health reports it). Replaced whole
  // by setLabels; a record takes the labels in effect when it arrives and keeps them to its
  // answer, so it is checked, logged and sent on by one setting.
  let inEffect = labelsInEffect(config.labels, config.labelDigest)
  fastify.decorate('setLabels', function setLabels ({ labels, digest }) {
    inEffect = labelsInEffect(labels, digest)
  })

  // Every label: its header's value as it arrived, null when it is absent.
  function auditLabels (labels, headers) {
    const logged = {}
    for (const label of labels) logged[label.name] = headers[label.header] ?? null
    return logged
  }
  // The audit line of an accepted record (lib/audit.js adds the chain link): the labels as
  // they arrived, which are canonical when an enforcement point allowed the hop (it rewrites
  // them); the digest of the exact text sent on; who decided the hop, with which rule set.
  function auditEntry (tIn, requestId, labels, headers, digest) {
    return {
      ts: tIn,
      instance: config.instanceId,
      step: config.step,
      request_id: requestId,
      labels: auditLabels(labels, headers),
      digest,
      sender: headers[DECISION_HEADERS.sender] ?? null,
      decided_by: headers[DECISION_HEADERS.decided_by] ?? null,
      revision: headers[DECISION_HEADERS.revision] ?? null
    }
  }
  // Label-token mode: the record must be the one its token was issued for (the digest the
  // deciding point took from the token is the digest of the bytes received), and a record
  // is taken once (its id, which the token carries too, not accepted before). An id is
  // remembered once its record passed these checks, before its audit line: two copies in
  // flight at once cannot both pass.
  const acceptedIds = config.labelTokens ? new RecentIds(REPLAY_WINDOW) : null
  function checkLabelToken (requestId, headers, digest) {
    const token = headers[LABEL_TOKEN_HEADERS.token]
    if (typeof token !== 'string' || token === '') {
      throw new AppError(400, 'LABEL_TOKEN_MISSING', `header ${LABEL_TOKEN_HEADERS.token} is missing: this instance takes only records whose labels an enforcement point verified`)
    }
    const claimed = headers[LABEL_TOKEN_HEADERS.digest]
    if (typeof claimed !== 'string' || claimed === '') {
      throw new AppError(400, 'DIGEST_MISSING', `header ${LABEL_TOKEN_HEADERS.digest} is missing: the enforcement point sets it from the label token`)
    }
    if (claimed !== digest) {
      throw new AppError(400, 'RECORD_DIGEST_MISMATCH', 'the record is not the one its label token was issued for')
    }
    if (acceptedIds.has(requestId)) {
      throw new AppError(409, 'RECORD_REPLAYED', `record ${requestId} was accepted here already: a label token carries one record, once`)
    }
    acceptedIds.add(requestId)
  }

  const ownEntryPrefix = pathEntryPrefix({ instance: config.instanceId, step: config.step, region: config.region, node: config.node })

  fastify.addSchema(errorSchema)
  // Records are JSON; text/plain (parsed by default) must answer 415 too.
  fastify.removeContentTypeParser('text/plain')
  // Fastify's own JSON parser (it refuses __proto__ and constructor.prototype keys),
  // keeping the text: the record is sent on as it came, not serialized again.
  const parseJsonBody = fastify.getDefaultJsonParser('error', 'error')
  fastify.removeContentTypeParser('application/json')
  fastify.addContentTypeParser('application/json', { parseAs: 'string' }, function (request, text, done) {
    request[kBodyText] = text
    parseJsonBody(request, text, done)
  })
  // Present on every request from the start: one object shape for all of them.
  fastify.decorateRequest(kTIn, 0)
  fastify.decorateRequest(kOutcome, null)
  fastify.decorateRequest(kBodyText, '')
  fastify.decorateRequest(kLabels, null)

  fastify.setErrorHandler(function (err, request, reply) {
    request[kOutcome] = null
    const classified = classifyError(err)
    // An AppError was logged where it was raised, with its cause.
    if (classified.status >= 500 && !(err instanceof AppError)) request.log.error({ err }, 'request failed')
    else request.log.debug({ err, code: classified.code }, 'request refused')
    reply.code(classified.status).send(errorBody(classified, request.id))
  })

  const mtls = config.tls != null
  // Mutual TLS: each route admits only the peers that need it (lib/identity.js
  // peerAllowed); the refusal is an answer, not a dropped connection, so a misrouted part
  // learns why. A route's hook knows the route it guards: the check never depends on how
  // the request spelled its URL.
  function refusePeer (request, reply, peer) {
    request.log.warn({ peer }, 'peer not allowed')
    reply.code(403).send({
      code: 'PEER_NOT_ALLOWED',
      message: `this service takes records only from the enforcement point that decides hops into it (peer ${peer ?? 'unknown'})`,
      request_id: request.id
    })
  }

  function peerCheck (method, url) {
    return function checkPeer (request, reply, done) {
      const peer = peerIdentity(request.raw.socket)
      if (peerAllowed(config, method, url, peer)) done()
      else refusePeer(request, reply, peer)
    }
  }

  fastify.setNotFoundHandler(function (request, reply) {
    // No route: any peer of this service learns it is a 404, a stranger only its 403.
    if (mtls) {
      const peer = peerIdentity(request.raw.socket)
      if (!peerAllowed(config, request.method, request.url, peer)) {
        refusePeer(request, reply, peer)
        return
      }
    }
    const url = request.url.length > 200 ? `${request.url.slice(0, 200)}...` : request.url
    reply.code(404).send({ code: 'NOT_FOUND', message: `no route ${request.method} ${url}`, request_id: request.id })
  })

  // The hooks take a callback: an async hook costs a promise per request.
  fastify.addHook('onSend', function (request, reply, payload, done) {
    reply.header('x-request-id', request.id)
    done(null, payload)
  })

  fastify.get('/health', { schema: healthSchema, onRequest: mtls ? peerCheck('GET', '/health') : undefined }, async function () {
    return { status: 'ok', instance: config.instanceId, step: config.step, labels: inEffect.digest }
  })

  fastify.get('/stats', { schema: statsSchema, onRequest: mtls ? peerCheck('GET', '/stats') : undefined }, async function () {
    return { ...stats }
  })

  function nextHopFailed (request, reply, message) {
    request[kOutcome] = 'downstream_failed'
    request.log.warn({ next_step: config.nextStep }, message)
    reply.code(502)
    return { code: 'NEXT_HOP_FAILED', message, request_id: request.id }
  }

  fastify.post('/process', {
    schema: processSchema(),
    // Counted first: a record refused for its peer is received and rejected like any other.
    onRequest: [function (request, reply, done) {
      request[kTIn] = now()
      request[kLabels] = inEffect
      stats.received++
      done()
    }, ...(mtls ? [peerCheck('POST', '/process')] : [])],
    // Before the schema's checks: a missing label is answered before an invalid request id, as
    // when the labels were part of the schema (and before a body that is no object).
    preValidation: function checkLabels (request, reply, done) {
      done(missingLabelError(request.headers, request[kLabels].requiredHeaders))
    },
    onSend: function (request, reply, payload, done) {
      // Exactly one counter per answered record: the handler's outcome, or
      // (the error handler cleared it) a refusal or an internal error.
      const outcome = request[kOutcome] ?? (reply.statusCode >= 500 ? 'internal_errors' : 'rejected')
      stats[outcome]++
      done(null, payload)
    }
  }, async function processRecord (request, reply) {
    const tIn = request[kTIn]
    const requestId = request.id
    const headers = request.headers
    const body = request[kBodyText]
    const labels = request[kLabels].labels
    // Once per record: the label-token check and the audit line both need it.
    const digest = `sha256:${sha256Hex(body)}`
    if (acceptedIds !== null) checkLabelToken(requestId, headers, digest)

    doWork(body, config.workIterations)

    try {
      await audit.write(auditEntry(tIn, requestId, labels, headers, digest))
    } catch (err) {
      request.log.error({ err }, 'audit log write failed')
      throw new AppError(500, 'AUDIT_FAILED', 'the audit log could not be written')
    }

    // Every answer from here is JSON; a delivered one is written as text.
    reply.header('content-type', JSON_CONTENT_TYPE)

    if (!config.nextStep) {
      request[kOutcome] = 'answered'
      return deliveredAnswer(requestId, pathEntryJson(ownEntryPrefix, tIn, now(), undefined, headers[DECISION_HEADERS.revision]))
    }

    // Built from scratch: only the labels of the schema (each one the record carries), the
    // request id, the next step and (label-token mode) the token go on (so neither a client's
    // x-complyroute-destination nor a header outside the schema ever does).
    const outgoing = {
      'content-type': 'application/json',
      'x-request-id': requestId,
      'x-complyroute-step': config.nextStep
    }
    for (const label of labels) {
      const value = headers[label.header]
      if (value !== undefined) outgoing[label.header] = value
    }
    if (acceptedIds !== null) outgoing[LABEL_TOKEN_HEADERS.token] = headers[LABEL_TOKEN_HEADERS.token]

    stats.forwarded++
    const tOut = now()
    let answer
    try {
      answer = await forward({ body, headers: outgoing })
    } catch (err) {
      return nextHopFailed(request, reply, `next hop failed: ${err.message}`)
    }
    const tBack = now()

    if (answer.status === 200) {
      const downstream = downstreamPathEntries(answer.body)
      if (downstream !== null) {
        request[kOutcome] = 'answered'
        return deliveredAnswer(requestId, pathEntryJson(ownEntryPrefix, tIn, tOut, tBack, headers[DECISION_HEADERS.revision]), downstream)
      }
      return nextHopFailed(request, reply, 'next hop answered 200 without a valid path')
    }
    if (answer.status >= 400 && answer.status <= 599) {
      const relayed = relayableError(parseJson(answer.body), answer.status, requestId)
      if (relayed) {
        request[kOutcome] = 'downstream_denied'
        request.log.info({ status: answer.status, code: relayed.code }, 'relaying the next hop\'s answer')
        reply.code(answer.status)
        return relayed
      }
      return nextHopFailed(request, reply, `next hop answered ${answer.status} without a JSON error body`)
    }
    return nextHopFailed(request, reply, `next hop answered unexpected status ${answer.status}`)
  })
}

// Apply to the instance it is registered on (no encapsulation), as
// fastify-plugin would: the error and not-found handlers then cover every route.
app[Symbol.for('skip-override')] = true
app[Symbol.for('fastify.display-name')] = 'complyroute-service'

// ---------------------------------------------------------------- buildApp

// Mutual TLS on the listening side: TLS 1.3 only, and a client without a certificate of
// the deployment's CA fails the handshake (it gets no HTTP answer). Which verified peer
// may use which route is the routes' check (peerAllowed).
function httpsOptions (tls) {
  return { key: tls.key, cert: tls.cert, ca: tls.ca, requestCert: true, rejectUnauthorized: true, minVersion: 'TLSv1.3' }
}

/**
 * Create the Fastify instance of one service instance.
 * @param {object} config the result of parseConfig
 * @param {object} [deps] injected dependencies; the missing ones are created
 *   from the configuration and closed when the instance closes
 * @param {Function} [deps.forward] ({body, headers}) => Promise<{status, body}>
 * @param {{write: Function, close?: Function}} [deps.audit]
 * @param {() => number} [deps.now] clock (ms since the epoch)
 * @param {() => string} [deps.genId] request id generator (default randomUUID)
 * @param {boolean|object} [deps.logger] Fastify's logger option (default {level: config.logLevel})
 * @returns {import('fastify').FastifyInstance}
 */
export function buildApp (config, deps = {}) {
  const genId = deps.genId ?? randomUUID
  const fastify = Fastify({
    https: config.tls ? httpsOptions(config.tls) : null,
    logger: deps.logger ?? { level: config.logLevel },
    bodyLimit: BODY_LIMIT,
    requestIdHeader: false,
    logController: new LogController({ requestIdLogLabel: 'request_id' }),
    genReqId (req) {
      const id = req.headers['x-request-id']
      return isValidRequestId(id) ? id : genId()
    },
    // Requests on a connection that is still open while closing are served
    // (the connection is closed after the answer), not refused with a 503.
    return503OnClosing: false,
    clientErrorHandler,
    frameworkErrors (err, request, reply) {
      reply.code(400).send({ code: 'BAD_REQUEST', message: err.message, request_id: request.id })
    }
  })

  const owned = []
  let audit = deps.audit
  if (!audit) {
    audit = createAuditLog(config.auditLog)
    owned.push(audit)
  }
  let forward = deps.forward
  if (!forward && config.nextStep) {
    const forwarder = createForwarder({
      egressUrl: config.egressUrl,
      timeoutMs: config.egressTimeoutMs,
      tls: config.tls,
      egressIdentity: config.egressIdentity
    })
    forward = forwarder.forward
    owned.push(forwarder)
  }

  fastify.register(app, { config, audit, forward, now: deps.now })
  // Runs after the server has stopped and every in-flight request has been answered.
  fastify.addHook('onClose', async () => {
    await Promise.all(owned.map((resource) => resource.close()))
  })
  return fastify
}
