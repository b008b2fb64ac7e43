// The audit log (on a temporary file) and the forwarder (on undici's
// MockAgent: no socket is opened).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { MockAgent } from 'undici'
import { createAuditLog } from '../lib/audit.js'
import { ForwardError, createForwarder } from '../lib/forwarder.js'

function tempDir (t) {
  const dir = mkdtempSync(join(tmpdir(), 'complyroute-test-'))
  t.after(() => rmSync(dir, { recursive: true, force: true }))
  return dir
}

test('audit log: lines are appended as JSON and flushed by close()', async (t) => {
  const file = join(tempDir(t), 'nested', 'dir', 'a.jsonl')
  const first = createAuditLog(file)
  await Promise.all([first.write({ n: 1 }), first.write({ n: 2 })])
  await first.close()
  await first.close() // idempotent
  const second = createAuditLog(file) // appends, never truncates
  second.write({ n: 3 }) // not awaited: close() still flushes it
  await second.close()
  const lines = readFileSync(file, 'utf8').split('\n')
  assert.equal(lines.pop(), '')
  assert.deepEqual(lines.map((line) => JSON.parse(line)), [{ n: 1 }, { n: 2 }, { n: 3 }])
})

test('audit log: an unwritable path fails at creation, a write after close is refused', async (t) => {
  const dir = tempDir(t)
  assert.throws(() => createAuditLog(dir), /EISDIR/)
  const audit = createAuditLog(join(dir, 'b.jsonl'))
  await audit.close()
  await assert.rejects(audit.write({ n: 1 }), /closed/)
})

const ORIGIN = 'http://enforcement.test:12002'

function mock (t) {
  const agent = new MockAgent()
  agent.disableNetConnect()
  t.after(() => agent.close())
  return agent.get(ORIGIN)
}

test('forwarder: POSTs the body and headers to /process and returns status and body', async (t) => {
  const pool = mock(t)
  let seen
  pool.intercept({ path: '/process', method: 'POST' }).reply((opts) => {
    seen = opts
    return { statusCode: 451, data: '{"code":"DENIED"}' }
  })
  const forwarder = createForwarder({ egressUrl: ORIGIN, timeoutMs: 1000, dispatcher: pool })
  const answer = await forwarder.forward({ body: '{"a":1}', headers: { 'content-type': 'application/json', 'x-complyroute-step': 'store' } })
  assert.deepEqual(answer, { status: 451, body: '{"code":"DENIED"}' })
  assert.equal(seen.body, '{"a":1}')
  assert.equal(seen.headers['x-complyroute-step'], 'store')
  await forwarder.close()
})

test('forwarder: connection errors, time-outs and oversized answers are ForwardErrors', async (t) => {
  const pool = mock(t)
  const forwarder = createForwarder({ egressUrl: ORIGIN, timeoutMs: 50, maxAnswerBytes: 10, dispatcher: pool })
  const request = { body: '{}', headers: { 'content-type': 'application/json' } }

  pool.intercept({ path: '/process', method: 'POST' }).replyWithError(Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:12002'), { code: 'ECONNREFUSED' }))
  await assert.rejects(forwarder.forward(request), (err) => err instanceof ForwardError && /ECONNREFUSED/.test(err.message))

  pool.intercept({ path: '/process', method: 'POST' }).reply(200, '{}').delay(500)
  await assert.rejects(forwarder.forward(request), (err) => err instanceof ForwardError && err.message === 'no answer within 50 ms')

  pool.intercept({ path: '/process', method: 'POST' }).reply(200, 'x'.repeat(11))
  await assert.rejects(forwarder.forward(request), (err) => err instanceof ForwardError && /larger than 10 bytes/.test(err.message))
})
