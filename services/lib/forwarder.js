// The outgoing side: POST a record to `${EGRESS_URL}/process` (the enforcement
// point) over a keep-alive undici Pool, with one deadline for the whole
// exchange (connect, headers and body).

import { Pool } from 'undici'

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
 * @param {object} options
 * @param {string} options.egressUrl origin of the enforcement point (http://host:port)
 * @param {number} options.timeoutMs deadline for one exchange
 * @param {number} [options.connections] size of the keep-alive pool
 * @param {number} [options.maxAnswerBytes] larger answers fail
 * @param {import('undici').Dispatcher} [options.dispatcher] for tests (an undici MockPool); not closed by close()
 * @returns {{forward(request: {body: string, headers: Record<string, string>}): Promise<{status: number, body: string}>, close(): Promise<void>}}
 */
export function createForwarder ({ egressUrl, timeoutMs, connections = DEFAULT_CONNECTIONS, maxAnswerBytes = DEFAULT_MAX_ANSWER_BYTES, dispatcher }) {
  const origin = new URL(egressUrl).origin
  const owned = dispatcher === undefined
  const pool = dispatcher ?? new Pool(origin, { connections, pipelining: 1 })

  async function forward ({ body, headers }) {
    const signal = AbortSignal.timeout(timeoutMs)
    try {
      const answer = await pool.request({ origin, path: '/process', method: 'POST', headers, body, signal })
      const chunks = []
      let size = 0
      for await (const chunk of answer.body) {
        size += chunk.length
        if (size > maxAnswerBytes) {
          answer.body.destroy()
          throw new ForwardError(`answer larger than ${maxAnswerBytes} bytes`)
        }
        chunks.push(chunk)
      }
      return { status: answer.statusCode, body: Buffer.concat(chunks).toString('utf8') }
    } catch (err) {
      if (err instanceof ForwardError) throw err
      if (signal.aborted) throw new ForwardError(`no answer within ${timeoutMs} ms`, { cause: err })
      throw new ForwardError(describe(err), { cause: err })
    }
  }

  async function close () {
    if (owned) await pool.close()
  }

  return { forward, close }
}
