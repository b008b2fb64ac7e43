// The error contract (src/errors.js): bad bodies, unknown routes, request ids and malformed
// HTTP are answered as JSON {code, message}.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { buildApp } from '../app.js'
import { clientErrorHandler } from '../src/errors.js'
import { LABELS, LAST, MIDDLE, post, setup, without } from '../test-support/app.js'

// ---------------------------------------------------------------- bad input

test('bad bodies answer 400 BODY_INVALID; the valid body twin passes', async (t) => {
  const { app, lines } = setup(t, LAST)
  const cases = [
    ['[1,2]', 'body must be a JSON object'],
    ['"text"', 'body must be a JSON object'],
    ['null', 'body must be a JSON object'],
    ['42', 'body must be a JSON object'],
    ['{"subject": ', 'body is not valid JSON'],
    ['{"__proto__": {"polluted": true}}', 'body is not valid JSON'],
    ['', 'body is empty: expected a JSON object']
  ]
  for (const [payload, message] of cases) {
    const res = await post(app, { payload })
    assert.equal(res.statusCode, 400, payload)
    const body = res.json()
    assert.equal(body.code, 'BODY_INVALID', payload)
    assert.equal(body.message, message, payload)
    assert.deepEqual(body.reasons, [{ code: 'BODY_INVALID', message }])
  }
  assert.equal(lines.length, 0)
  assert.equal((await post(app, { payload: '{}' })).statusCode, 200)
  assert.equal(lines.length, 1)
})

test('a missing body answers 400 BODY_INVALID', async (t) => {
  const { app } = setup(t, LAST)
  const res = await app.inject({ method: 'POST', url: '/process', headers: LABELS })
  assert.equal(res.statusCode, 400)
  assert.equal(res.json().code, 'BODY_INVALID')
})

test('wrong content types answer 415, too large bodies 413, both as JSON', async (t) => {
  const { app, lines } = setup(t, LAST)
  for (const type of ['text/plain', 'application/x-www-form-urlencoded', 'application/xml']) {
    const res = await post(app, { headers: { ...LABELS, 'content-type': type } })
    assert.equal(res.statusCode, 415, type)
    assert.deepEqual(without(res.json(), 'request_id'), { code: 'CONTENT_TYPE_UNSUPPORTED', message: 'content-type must be application/json' })
  }
  const big = await post(app, { body: { blob: 'x'.repeat(64 * 1024) } })
  assert.equal(big.statusCode, 413)
  assert.equal(big.json().code, 'BODY_TOO_LARGE')
  assert.equal(lines.length, 0)
  const charset = await post(app, { headers: { ...LABELS, 'content-type': 'application/json; charset=utf-8' } })
  assert.equal(charset.statusCode, 200)
  const largest = await post(app, { body: { blob: 'x'.repeat(64 * 1024 - '{"blob":""}'.length) } })
  assert.equal(largest.statusCode, 200, 'a record of exactly 64 KiB is taken')
})

// ---------------------------------------------------------------- unknown routes

test('unknown routes and methods answer 404 JSON NOT_FOUND', async (t) => {
  const { app } = setup(t, LAST)
  for (const [method, url] of [['GET', '/nope'], ['GET', '/process'], ['DELETE', '/health'], ['POST', '/process/x']]) {
    const res = await app.inject({ method, url })
    assert.equal(res.statusCode, 404, `${method} ${url}`)
    assert.match(res.headers['content-type'], /^application\/json/)
    assert.deepEqual(without(res.json(), 'request_id'), { code: 'NOT_FOUND', message: `no route ${method} ${url}` })
    assert.match(res.json().request_id, /^generated-\d+$/)
  }
})

// ---------------------------------------------------------------- request ids

test('a request id is generated when absent or empty and kept when present', async (t) => {
  const { app, calls, lines } = setup(t, MIDDLE, { genId: () => 'uuid-1' })
  const generated = await post(app)
  assert.equal(generated.json().request_id, 'uuid-1')
  assert.equal(generated.headers['x-request-id'], 'uuid-1')
  assert.equal(calls[0].headers['x-request-id'], 'uuid-1')
  assert.equal(lines[0].request_id, 'uuid-1')

  const empty = await post(app, { headers: { ...LABELS, 'x-request-id': '' } })
  assert.equal(empty.json().request_id, 'uuid-1')

  const kept = await post(app, { headers: { ...LABELS, 'x-request-id': '4f1c-abc' } })
  assert.equal(kept.json().request_id, '4f1c-abc')
  assert.equal(calls[2].headers['x-request-id'], '4f1c-abc')
})

test('the default request id is a UUID', async (t) => {
  const app = buildApp(LAST, { audit: { async write () {} }, logger: false })
  t.after(() => app.close())
  const res = await post(app)
  assert.match(res.json().request_id, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
})

test('request id refused twin: an invalid x-request-id answers 400 REQUEST_ID_INVALID with a generated id', async (t) => {
  const { app, calls } = setup(t, MIDDLE, { genId: () => 'uuid-2' })
  // An id sent twice arrives joined: 'r-1,r-1' through Envoy, 'r-1, r-1' from Node's parser.
  for (const id of ['has space', 'x'.repeat(201), 'é', 'r-1,r-1', 'r-1, r-1']) {
    const res = await post(app, { headers: { ...LABELS, 'x-request-id': id } })
    assert.equal(res.statusCode, 400)
    assert.equal(res.json().code, 'REQUEST_ID_INVALID')
    assert.equal(res.json().request_id, 'uuid-2')
  }
  assert.equal(calls.length, 0)
})

test('malformed HTTP is answered in the {code, message} shape', () => {
  const written = []
  const socket = { destroyed: false, writable: true, write: (s) => written.push(s), destroy: () => { socket.destroyed = true } }
  clientErrorHandler.call(undefined, Object.assign(new Error('Parse Error'), { code: 'HPE_INVALID_METHOD' }), socket)
  assert.equal(written.length, 1)
  assert.match(written[0], /^HTTP\/1\.1 400 Bad Request\r\n/)
  assert.deepEqual(JSON.parse(written[0].split('\r\n\r\n')[1]), { code: 'BAD_REQUEST', message: 'malformed HTTP request' })
  assert.equal(socket.destroyed, true)

  const reset = { destroyed: false, writable: true, write: () => assert.fail('nothing written on a reset'), destroy () {} }
  clientErrorHandler.call(undefined, Object.assign(new Error('reset'), { code: 'ECONNRESET' }), reset)
})
