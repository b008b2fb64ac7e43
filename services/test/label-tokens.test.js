// Label-token mode (src/label-tokens.js): a record is taken when its digest is its token's,
// once; each refused twin is neither audited nor sent on.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { parseConfig } from '../config.js'
import { DECIDED, LABELS, LAST_ENV, MIDDLE, MIDDLE_ENV, post, setup, stats } from '../test-support/app.js'

const TOKEN_LAST = parseConfig({ ...LAST_ENV, LABEL_TOKENS: '1' })
const TOKEN_MIDDLE = parseConfig({ ...MIDDLE_ENV, LABEL_TOKENS: '1' })
// What the deciding point sets from a verified token: the token itself (opaque here) and the
// digest of the record's bytes it was issued for.
const TOKEN = 'eyJhbGciOiJFUzI1NiJ9.eyJyZWdpb24iOiJFVSJ9.c2ln'
const PAYLOAD = '{ "subject": "alice", "amount": 12 }'
const sha256 = (text) => `sha256:${createHash('sha256').update(text).digest('hex')}`

// null: the header is absent.
function vouched (requestId, { payload = PAYLOAD, digest = sha256(payload), token = TOKEN } = {}) {
  const headers = { ...LABELS, ...DECIDED, 'x-request-id': requestId }
  if (digest !== null) headers['x-complyroute-digest'] = digest
  if (token !== null) headers['x-complyroute-labels'] = token
  return { headers, payload }
}

test('label tokens: a record matching its token\'s digest is accepted, audited with that digest, and sent on with the token (not the digest)', async (t) => {
  const { app, calls, lines } = setup(t, TOKEN_MIDDLE)
  const res = await post(app, vouched('r-t1'))
  assert.equal(res.statusCode, 200)
  assert.deepEqual(calls[0].headers, {
    'content-type': 'application/json',
    'x-data-region': 'EU',
    'x-data-category': 'personal',
    'x-data-consent': 'billing,care',
    'x-request-id': 'r-t1',
    'x-complyroute-step': 'store',
    'x-complyroute-labels': TOKEN
  })
  assert.equal(calls[0].body, PAYLOAD)
  assert.equal(lines.length, 1)
  assert.equal(lines[0].digest, sha256(PAYLOAD))
  assert.deepEqual(Object.keys(lines[0]), ['ts', 'instance', 'step', 'request_id', 'labels', 'digest', 'sender', 'decided_by', 'decided_at', 'revision'])
  // The last step answers it too.
  const last = setup(t, TOKEN_LAST)
  assert.equal((await post(last.app, vouched('r-t1'))).statusCode, 200)
})

test('label tokens refused twins: no token, no digest, another record\'s digest, a replayed id; none audited, none sent on', async (t) => {
  const { app, calls, lines } = setup(t, TOKEN_MIDDLE)
  const refusals = [
    [vouched('r-t2', { token: null }), 400, 'LABEL_TOKEN_MISSING'],
    [vouched('r-t2', { token: '' }), 400, 'LABEL_TOKEN_MISSING'],
    [vouched('r-t2', { digest: null }), 400, 'DIGEST_MISSING'],
    [vouched('r-t2', { digest: '' }), 400, 'DIGEST_MISSING'],
    [vouched('r-t2', { token: null, digest: null }), 400, 'LABEL_TOKEN_MISSING'],
    [vouched('r-t2', { digest: sha256('{"subject":"mallory"}') }), 400, 'RECORD_DIGEST_MISMATCH'],
    [vouched('r-t2', { digest: sha256(PAYLOAD).toUpperCase() }), 400, 'RECORD_DIGEST_MISMATCH'],
    [vouched('r-t2', { digest: sha256(PAYLOAD).slice('sha256:'.length) }), 400, 'RECORD_DIGEST_MISMATCH'],
    // The same token and digest, the record changed on the way.
    [{ ...vouched('r-t2'), payload: PAYLOAD.replace('12', '13') }, 400, 'RECORD_DIGEST_MISMATCH']
  ]
  for (const [request, status, code] of refusals) {
    const res = await post(app, request)
    assert.equal(res.statusCode, status, code)
    const body = res.json()
    assert.equal(body.code, code)
    assert.equal(body.request_id, 'r-t2')
    assert.deepEqual(body.reasons, [{ code, message: body.message }])
  }
  const mismatch = await post(app, vouched('r-t2', { digest: sha256('{}') }))
  assert.equal(mismatch.json().message, 'the record is not the one its label token was issued for')
  assert.equal(lines.length, 0)
  assert.equal(calls.length, 0)

  // None of those refusals used up the id: the record itself is accepted once, then refused.
  assert.equal((await post(app, vouched('r-t2'))).statusCode, 200)
  const replayed = await post(app, vouched('r-t2'))
  assert.equal(replayed.statusCode, 409)
  assert.deepEqual(replayed.json(), {
    code: 'RECORD_REPLAYED',
    message: 'record r-t2 was accepted here already: a label token carries one record, once',
    request_id: 'r-t2'
  })
  assert.equal(lines.length, 1)
  assert.equal(calls.length, 1)

  const counters = await stats(app)
  assert.equal(counters.received, refusals.length + 3)
  assert.equal(counters.rejected, refusals.length + 2)
  assert.equal(counters.answered, 1)
  assert.equal(counters.forwarded, 1)
})

test('label tokens: two copies of a record in flight at once, one is accepted', async (t) => {
  const { app, lines } = setup(t, TOKEN_LAST)
  const answers = await Promise.all([post(app, vouched('r-t3')), post(app, vouched('r-t3'))])
  assert.deepEqual(answers.map((res) => res.statusCode).sort(), [200, 409])
  assert.equal(lines.length, 1)
})

test('label tokens: a record accepted before its audit write failed stays taken', async (t) => {
  const audit = { async write () { throw new Error('ENOSPC') } }
  const { app } = setup(t, TOKEN_LAST, { audit })
  assert.equal((await post(app, vouched('r-t4'))).statusCode, 500)
  assert.equal((await post(app, vouched('r-t4'))).statusCode, 409)
})

test('label tokens off: no token or digest is required, and a sender\'s token is not sent on', async (t) => {
  const { app, calls, lines } = setup(t, MIDDLE)
  assert.equal((await post(app)).statusCode, 200)
  const res = await post(app, vouched('r-t5', { digest: sha256('{}') }))
  assert.equal(res.statusCode, 200)
  assert.equal('x-complyroute-labels' in calls[1].headers, false)
  assert.equal('x-complyroute-digest' in calls[1].headers, false)
  assert.equal(lines[1].digest, sha256(PAYLOAD))
})
