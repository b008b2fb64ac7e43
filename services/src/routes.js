// The routes of a service instance: POST /process (a record: its checks, its work, its audit
// line, and sending it on or answering it), GET /health, GET /stats, GET /metrics (Prometheus's
// text, src/metrics.js), and the answer to a request no route takes. Under mutual TLS each route
// admits only the peers that need it.

import { createHash } from 'node:crypto'
import { performance } from 'node:perf_hooks'
import { deliveredAnswer, downstreamPathEntries, pathEntryJson, pathEntryPrefix, relayableError } from './answers.js'
import { sha256Hex } from './audit.js'
import { AppError, answerError } from './errors.js'
import { peerAllowed, peerIdentity } from './identity.js'
import { LABEL_TOKEN_HEADERS, labelTokenCheck } from './label-tokens.js'
import { loggedLabels, missingLabelError } from './labels.js'
import { STAT_NAMES, healthSchema, metricsSchema, processSchema, statsSchema } from './schemas.js'

// Set by the enforcement point that decided the hop into this instance, overwriting any
// value a sender chose (complyroute/proxy/envoy.py _deciding_listener); absent when no
// point decided it (the baseline, or a record that bypassed the enforcement points).
const DECISION_HEADERS = Object.freeze({
  sender: 'x-complyroute-sender',
  decided_by: 'x-complyroute-decided-by',
  decided_at: 'x-complyroute-decided-at',
  revision: 'x-complyroute-revision'
})

/** When the deciding point took the hop (ms since the epoch, its clock), null without a number. */
function decidedAt (headers) {
  const value = headers[DECISION_HEADERS.decided_at]
  return typeof value === 'string' && /^[0-9]{1,16}$/.test(value) ? Number(value) : null
}

const kTIn = Symbol('complyroute.t_in')
const kOutcome = Symbol('complyroute.outcome')
const kBodyText = Symbol('complyroute.body_text')
const kLabels = Symbol('complyroute.labels')

const JSON_CONTENT_TYPE = 'application/json; charset=utf-8'

/** The code of a refusal's answer ({code, message, ...} as text, src/errors.js), read only for refusals. */
function refusalCode (payload) {
  try {
    const code = JSON.parse(payload).code
    return typeof code === 'string' ? code : 'UNKNOWN'
  } catch {
    return 'UNKNOWN'
  }
}

/** The fixed work per record: `iterations` chained SHA-256 rounds over the body. */
export function doWork (body, iterations) {
  let digest = Buffer.alloc(0)
  for (let i = 0; i < iterations; i++) {
    digest = createHash('sha256').update(digest).update(body).digest()
  }
  return digest.toString('hex')
}

/**
 * Add the routes to `fastify` (the app plugin's instance: its error contract covers them).
 * @param {import('fastify').FastifyInstance} fastify
 * @param {object} opts the app plugin's (config, audit, forward, now)
 * @param {() => {labels: object[], digest: string, requiredHeaders: string[]}} labels the labels in effect (src/labels.js)
 * @param {ReturnType<import('./metrics.js').createMetrics>} metrics what GET /metrics tells (src/metrics.js)
 */
export function routes (fastify, { config, audit, forward, now, labels, metrics }) {
  const stats = Object.fromEntries(STAT_NAMES.map((name) => [name, 0]))

  // The audit line of an accepted record (src/audit.js adds the chain link): the labels as
  // they arrived, which are canonical when an enforcement point allowed the hop (it rewrites
  // them); the digest of the exact text sent on; who decided the hop, when, with which rule set.
  function auditEntry (tIn, requestId, recordLabels, headers, digest) {
    return {
      ts: tIn,
      instance: config.instanceId,
      step: config.step,
      request_id: requestId,
      labels: loggedLabels(recordLabels, headers),
      digest,
      sender: headers[DECISION_HEADERS.sender] ?? null,
      decided_by: headers[DECISION_HEADERS.decided_by] ?? null,
      decided_at: decidedAt(headers),
      revision: headers[DECISION_HEADERS.revision] ?? null
    }
  }
  const checkLabelToken = config.labelTokens ? labelTokenCheck() : null

  const ownEntryPrefix = pathEntryPrefix({ instance: config.instanceId, step: config.step, region: config.region, node: config.node })

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

  const mtls = config.tls != null
  // Mutual TLS: each route admits only the peers that need it (src/identity.js
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

  fastify.get('/health', { schema: healthSchema, onRequest: mtls ? peerCheck('GET', '/health') : undefined }, async function () {
    return { status: 'ok', instance: config.instanceId, step: config.step, labels: labels().digest }
  })

  fastify.get('/stats', { schema: statsSchema, onRequest: mtls ? peerCheck('GET', '/stats') : undefined }, async function () {
    return { ...stats }
  })

  fastify.get('/metrics', { schema: metricsSchema, onRequest: mtls ? peerCheck('GET', '/metrics') : undefined }, async function (request, reply) {
    reply.header('content-type', metrics.contentType)
    return metrics.text()
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
      request[kLabels] = labels()
      stats.received++
      metrics.received()
      done()
    }, ...(mtls ? [peerCheck('POST', '/process')] : [])],
    // Before the schema's checks: a missing label is answered before an invalid request id, as
    // when the labels were part of the schema (and before a body that is no object).
    preValidation: function checkLabels (request, reply, done) {
      done(missingLabelError(request.headers, request[kLabels].requiredHeaders))
    },
    // The error contract's answer, the handler's outcome cleared: the error is what is counted.
    errorHandler: function (err, request, reply) {
      request[kOutcome] = null
      answerError(err, request, reply)
    },
    onSend: function (request, reply, payload, done) {
      // Exactly one counter per answered record: the handler's outcome, or
      // (the error handler cleared it) a refusal or an internal error.
      const outcome = request[kOutcome] ?? (reply.statusCode >= 500 ? 'internal_errors' : 'rejected')
      stats[outcome]++
      if (request[kOutcome] === null) metrics.refused(refusalCode(payload))
      done(null, payload)
    }
  }, async function processRecord (request, reply) {
    const tIn = request[kTIn]
    const requestId = request.id
    const headers = request.headers
    const body = request[kBodyText]
    const recordLabels = request[kLabels].labels
    // Once per record: the label-token check and the audit line both need it.
    const digest = `sha256:${sha256Hex(body)}`
    if (checkLabelToken !== null) checkLabelToken(requestId, headers, digest)

    doWork(body, config.workIterations)

    try {
      const writing = performance.now()
      await audit.write(auditEntry(tIn, requestId, recordLabels, headers, digest))
      metrics.auditWritten((performance.now() - writing) / 1000)
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
    for (const label of recordLabels) {
      const value = headers[label.header]
      if (value !== undefined) outgoing[label.header] = value
    }
    if (checkLabelToken !== null) outgoing[LABEL_TOKEN_HEADERS.token] = headers[LABEL_TOKEN_HEADERS.token]

    stats.forwarded++
    metrics.forwarded()
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
      const relayed = relayableError(answer.body, answer.status, requestId)
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
