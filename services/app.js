// The service instance: one step of a complyroute chain.
//
// `app` is the Fastify plugin: the error contract (src/errors.js), the labels in effect
// (src/labels.js, replaced by setLabels) and the routes (src/routes.js); `buildApp` creates a
// Fastify instance with it, creating the forwarder and the audit log from the configuration
// unless they are injected (tests inject them). server.js runs it as a process.

import { randomUUID } from 'node:crypto'
import { performance } from 'node:perf_hooks'
import Fastify, { LogController } from 'fastify'
import { createAuditLog } from './src/audit.js'
import { answerError, clientErrorHandler } from './src/errors.js'
import { createForwarder } from './src/forwarder.js'
import { labelsInEffect } from './src/labels.js'
import { createMetrics } from './src/metrics.js'
import { routes } from './src/routes.js'
import { BODY_LIMIT, errorSchema, isValidRequestId } from './src/schemas.js'

export function defaultClock () {
  return performance.timeOrigin + performance.now()
}

/**
 * @param {import('fastify').FastifyInstance} fastify
 * @param {object} opts
 * @param {object} opts.config the result of parseConfig
 * @param {{write(entry: object): Promise<void>}} opts.audit
 * @param {(request: {body: string, headers: Record<string, string>}) => Promise<{status: number, body: string}>} [opts.forward] required when config.nextStep is set
 * @param {() => number} [opts.now] clock, ms since the epoch (fractional)
 * @param {object} [opts.metrics] what GET /metrics tells (src/metrics.js createMetrics; one of the instance's own by default)
 */
export async function app (fastify, opts) {
  const { config, audit } = opts
  const forward = opts.forward
  const now = opts.now ?? defaultClock
  const metrics = opts.metrics ?? createMetrics(config)
  if (!config) throw new Error('app: opts.config is required')
  if (!audit || typeof audit.write !== 'function') throw new Error('app: opts.audit with write(entry) is required')
  if (config.nextStep && typeof forward !== 'function') throw new Error('app: opts.forward is required when NEXT_STEP is set')

  // The labels in effect, in the schema's order (the audit line's labels and the LABEL_MISSING
  // reasons keep it), and the digest of their setting (GET /health reports it). Replaced whole
  // by setLabels; a record takes the labels in effect when it arrives and keeps them to its
  // answer, so it is checked, logged and sent on by one setting.
  let inEffect = labelsInEffect(config.labels, config.labelDigest)
  fastify.decorate('setLabels', function setLabels ({ labels, digest }) {
    inEffect = labelsInEffect(labels, digest)
  })

  fastify.addSchema(errorSchema)
  fastify.setErrorHandler(answerError)
  // The hooks take a callback: an async hook costs a promise per request.
  fastify.addHook('onSend', function (request, reply, payload, done) {
    reply.header('x-request-id', request.id)
    done(null, payload)
  })

  routes(fastify, { config, audit, forward, now, metrics, labels: () => inEffect })
}

// Apply to the instance it is registered on (no encapsulation), as
// fastify-plugin would: the error and not-found handlers then cover every route.
app[Symbol.for('skip-override')] = true
app[Symbol.for('fastify.display-name')] = 'complyroute-service'

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
 * @param {boolean} [deps.validateSchemas] check the routes' schemas against JSON Schema's meta-schema (the tests)
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
    // The routes' schemas are checked against JSON Schema's meta-schema by the tests
    // (test/app.test.js: validateSchemas), not at every start: compiling the meta-schema took
    // a tenth of an instance's start (about 20 of 195 ms of CPU here), and a deployment starts
    // an instance per service. The schemas are this module's, the same in every instance.
    ajv: { customOptions: { validateSchema: deps.validateSchemas ?? false } },
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
