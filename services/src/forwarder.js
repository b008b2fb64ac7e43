// The outgoing side: POST a record to `${EGRESS_URL}/process` (the enforcement point)
// over a keep-alive undici Pool, with one deadline for the whole exchange (waiting for a
// connection, sending, the answer's headers and body).
//
// Per exchange this costs one handler object: the answer is collected from undici's
// dispatch callbacks (no response stream), and the deadlines share one timer (no
// AbortSignal and timer per request).
//
// Under mutual TLS (options.tls) the pool's connections present this part's certificate,
// trust only the deployment's CA, and accept a next hop only when its certificate names
// options.egressIdentity: checked once per connection, nothing per exchange.

import { performance } from 'node:perf_hooks'
// The Pool alone, not undici's index, which loads every dispatcher, fetch, WebSocket and the
// cache too: 0.09 of the 0.44 CPU-s an instance takes to start here (fifty-service deployments
// start fifty). undici, pinned in package.json, has no exports map that would close this path.
import Pool from 'undici/lib/dispatcher/pool.js'
import { checkServerIdentityFor } from './identity.js'

export const DEFAULT_CONNECTIONS = 64
export const DEFAULT_MAX_ANSWER_BYTES = 1024 * 1024

export class ForwardError extends Error {
  constructor (message, options) {
    super(message, options)
    this.name = 'ForwardError'
  }
}

function describe (err) {
  const code = err && err.code
  const message = (err && err.message) || String(err)
  return code && !message.includes(code) ? `${code}: ${message}` : message
}

/**
 * The exchanges in flight, oldest first. Every exchange has the same time-out, so they
 * expire in the order they started: one timer, armed for the oldest, is enough. It is
 * not re-armed when an exchange ends; when it fires it expires what is due and is armed
 * again for the oldest remaining exchange, so under steady load it fires about once
 * per time-out.
 */
class Deadlines {
  #timeoutMs
  #inFlight = new Set()
  #timer = null

  constructor (timeoutMs) {
    this.#timeoutMs = timeoutMs
  }

  add (exchange) {
    exchange.deadline = performance.now() + this.#timeoutMs
    this.#inFlight.add(exchange)
    if (this.#timer === null) this.#arm(this.#timeoutMs)
  }

  delete (exchange) {
    this.#inFlight.delete(exchange)
  }

  #arm (ms) {
    this.#timer = setTimeout(() => this.#expire(), Math.max(1, Math.ceil(ms)))
    this.#timer.unref()
  }

  #expire () {
    this.#timer = null
    const now = performance.now()
    for (const exchange of this.#inFlight) {
      if (exchange.deadline > now) {
        this.#arm(exchange.deadline - now)
        return
      }
      this.#inFlight.delete(exchange)
      exchange.expire()
    }
  }
}

/**
 * One exchange: an undici dispatch handler that settles its promise exactly once, with
 * {status, body} or a ForwardError.
 */
class Exchange {
  constructor (limits, resolve, reject) {
    this.limits = limits // {timeoutMs, maxAnswerBytes, deadlines}: the forwarder's
    this.resolve = resolve
    this.reject = reject
    this.controller = null
    this.settled = false
    this.status = 0
    this.chunks = []
    this.size = 0
    this.deadline = 0
  }

  fail (error, controller = this.controller) {
    if (this.settled) return
    this.settled = true
    this.limits.deadlines.delete(this)
    controller?.abort(error)
    this.reject(error)
  }

  expire () {
    this.fail(new ForwardError(`no answer within ${this.limits.timeoutMs} ms`))
  }

  onRequestStart (controller) {
    this.controller = controller
    // Expired while waiting for a connection: do not send it.
    if (this.settled) controller.abort(new ForwardError('expired before it was sent'))
  }

  onResponseStart (controller, statusCode) {
    if (statusCode >= 200) this.status = statusCode
  }

  onResponseData (controller, chunk) {
    if (this.settled) return
    this.size += chunk.length
    if (this.size > this.limits.maxAnswerBytes) {
      this.fail(new ForwardError(`answer larger than ${this.limits.maxAnswerBytes} bytes`), controller)
      return
    }
    this.chunks.push(chunk)
  }

  onResponseEnd () {
    if (this.settled) return
    this.settled = true
    this.limits.deadlines.delete(this)
    const body = this.chunks.length === 1 ? this.chunks[0].toString('utf8') : Buffer.concat(this.chunks).toString('utf8')
    this.resolve({ status: this.status, body })
  }

  onResponseError (controller, err) {
    if (this.settled) return
    this.settled = true
    this.limits.deadlines.delete(this)
    this.reject(err instanceof ForwardError ? err : new ForwardError(describe(err), { cause: err }))
  }
}

// undici's connect options (handed to tls.connect): the CA replaces the system's trust
// store, and the identity check replaces the host name check (certificates name no host).
function mutualTls (origin, tls, egressIdentity) {
  if (!origin.startsWith('https:')) throw new Error(`forwarder: mutual TLS needs an https egress URL, not ${origin}`)
  if (!egressIdentity) throw new Error('forwarder: mutual TLS needs the identity the next hop must present')
  return {
    ca: tls.ca,
    cert: tls.cert,
    key: tls.key,
    minVersion: 'TLSv1.3',
    checkServerIdentity: checkServerIdentityFor(egressIdentity)
  }
}

/**
 * @param {object} options
 * @param {string} options.egressUrl origin of the enforcement point (http://host:port)
 * @param {number} options.timeoutMs deadline for one exchange
 * @param {number} [options.connections] size of the keep-alive pool
 * @param {number} [options.maxAnswerBytes] larger answers fail
 * @param {{cert: string, key: string, ca: string} | null} [options.tls] this part's credentials (config.tls): mutual TLS to an https egressUrl
 * @param {string} [options.egressIdentity] the SPIFFE id the next hop must present; required with tls
 * @param {import('undici').Dispatcher} [options.dispatcher] for tests (an undici MockAgent); not closed by close()
 * @returns {{forward(request: {body: string, headers: Record<string, string>}): Promise<{status: number, body: string}>, close(): Promise<void>}}
 */
export function createForwarder ({ egressUrl, timeoutMs, connections = DEFAULT_CONNECTIONS, maxAnswerBytes = DEFAULT_MAX_ANSWER_BYTES, tls = null, egressIdentity, dispatcher }) {
  const origin = new URL(egressUrl).origin
  const owned = dispatcher === undefined
  const pool = dispatcher ?? new Pool(origin, { connections, pipelining: 1, connect: tls ? mutualTls(origin, tls, egressIdentity) : undefined })
  const limits = { timeoutMs, maxAnswerBytes, deadlines: new Deadlines(timeoutMs) }

  function forward ({ body, headers }) {
    return new Promise((resolve, reject) => {
      const exchange = new Exchange(limits, resolve, reject)
      limits.deadlines.add(exchange)
      try {
        pool.dispatch({ origin, path: '/process', method: 'POST', headers, body }, exchange)
      } catch (err) {
        exchange.onResponseError(null, err)
      }
    })
  }

  async function close () {
    if (owned) await pool.close()
  }

  return { forward, close }
}
