// The forwarder (src/forwarder.js), on undici's MockAgent: no socket is opened.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { MockAgent } from 'undici'
import { ForwardError, createForwarder } from '../src/forwarder.js'

const ORIGIN = 'http://enforcement.test:12002'

// The forwarder dispatches through the agent (which hands undici's handler interface to
// its mock pool); the answers are set on the pool.
function mock (t) {
  const agent = new MockAgent()
  agent.disableNetConnect()
  t.after(() => agent.close())
  return { agent, pool: agent.get(ORIGIN) }
}

test('forwarder: POSTs the body and headers to /process and returns status and body', async (t) => {
  const { agent, pool } = mock(t)
  let seen
  pool.intercept({ path: '/process', method: 'POST' }).reply((opts) => {
    seen = opts
    return { statusCode: 451, data: '{"code":"DENIED"}' }
  })
  const forwarder = createForwarder({ egressUrl: ORIGIN, timeoutMs: 1000, dispatcher: agent })
  const answer = await forwarder.forward({ body: '{"a":1}', headers: { 'content-type': 'application/json', 'x-complyroute-step': 'store' } })
  assert.deepEqual(answer, { status: 451, body: '{"code":"DENIED"}' })
  assert.equal(seen.body, '{"a":1}')
  assert.equal(seen.headers['x-complyroute-step'], 'store')
  await forwarder.close()
})

test('forwarder: connection errors, time-outs and oversized answers are ForwardErrors', async (t) => {
  const { agent, pool } = mock(t)
  const forwarder = createForwarder({ egressUrl: ORIGIN, timeoutMs: 50, maxAnswerBytes: 10, dispatcher: agent })
  const request = { body: '{}', headers: { 'content-type': 'application/json' } }

  pool.intercept({ path: '/process', method: 'POST' }).replyWithError(Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:12002'), { code: 'ECONNREFUSED' }))
  await assert.rejects(forwarder.forward(request), (err) => err instanceof ForwardError && /ECONNREFUSED/.test(err.message))

  pool.intercept({ path: '/process', method: 'POST' }).reply(200, '{}').delay(500)
  await assert.rejects(forwarder.forward(request), (err) => err instanceof ForwardError && err.message === 'no answer within 50 ms')

  pool.intercept({ path: '/process', method: 'POST' }).reply(200, 'x'.repeat(11))
  await assert.rejects(forwarder.forward(request), (err) => err instanceof ForwardError && /larger than 10 bytes/.test(err.message))
})

test('forwarder: every exchange has its own deadline, from when it started; one past it fails, one within is answered', async (t) => {
  const { agent, pool } = mock(t)
  const forwarder = createForwarder({ egressUrl: ORIGIN, timeoutMs: 150, dispatcher: agent })
  const request = { body: '{}', headers: { 'content-type': 'application/json' } }
  const settled = (promise, started) => promise.then(
    (answer) => ({ answer, after: performance.now() - started }),
    (err) => ({ err, after: performance.now() - started })
  )
  pool.intercept({ path: '/process', method: 'POST' }).reply(200, 'late').delay(1000)
  pool.intercept({ path: '/process', method: 'POST' }).reply(200, 'in time').delay(120)
  pool.intercept({ path: '/process', method: 'POST' }).reply(200, 'late too').delay(1000)

  const first = settled(forwarder.forward(request), performance.now())
  await new Promise((resolve) => setTimeout(resolve, 100))
  // Started 100 ms later: the first one's deadline passes while they are in flight.
  const secondStart = performance.now()
  const second = settled(forwarder.forward(request), secondStart)
  const third = settled(forwarder.forward(request), secondStart)

  const [a, b, c] = await Promise.all([first, second, third])
  assert.equal(a.err?.message, 'no answer within 150 ms')
  assert.deepEqual(b.answer, { status: 200, body: 'in time' })
  assert.equal(c.err?.message, 'no answer within 150 ms')
  assert.ok(c.after >= 140, `the third expired ${c.after} ms after it started`)
})

const POINT = 'spiffe://complyroute/point/central-entity'

test('forwarder: mutual TLS needs an https egress URL and the identity to expect', () => {
  const tls = { cert: 'cert', key: 'key', ca: 'ca' }
  assert.throws(() => createForwarder({ egressUrl: 'http://127.0.0.1:1', timeoutMs: 1000, tls, egressIdentity: POINT }), /needs an https egress URL/)
  assert.throws(() => createForwarder({ egressUrl: 'https://127.0.0.1:1', timeoutMs: 1000, tls }), /needs the identity/)
})
