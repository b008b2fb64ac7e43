// POST /process at the last and at a middle step, GET /health and GET /stats, through
// app.inject (src/routes.js). Each allowed case has its refused twin next to it.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { doWork } from '../src/routes.js'
import { DECIDED, DOWNSTREAM_PATH, LABELS, LAST, MIDDLE, RECORD, fakeClock, ok, post, setup, stats, without } from '../test-support/app.js'
import { LABELS_ENV } from '../test-support/labels.js'

// ---------------------------------------------------------------- last step

test('last step: answers 200 with its own path entry (t_in <= t_out)', async (t) => {
  const { app, lines } = setup(t, LAST)
  const before = performance.timeOrigin + performance.now()
  const res = await post(app, { headers: { ...LABELS, 'x-request-id': 'r-1' } })
  const after = performance.timeOrigin + performance.now()
  assert.equal(res.statusCode, 200)
  assert.match(res.headers['content-type'], /^application\/json/)
  assert.equal(res.headers['x-request-id'], 'r-1')
  const body = res.json()
  assert.equal(body.request_id, 'r-1')
  assert.equal(body.path.length, 1)
  const [entry] = body.path
  assert.deepEqual(Object.keys(entry).sort(), ['instance', 'node', 'region', 'revision', 'step', 't_in', 't_out'])
  assert.equal(entry.revision, null) // no enforcement point decided this hop (no x-complyroute-revision)
  assert.equal(entry.instance, 'store-eu')
  assert.equal(entry.step, 'store')
  assert.equal(entry.region, 'EU')
  assert.equal(entry.node, 'node-3')
  assert.ok(before <= entry.t_in && entry.t_in <= entry.t_out && entry.t_out <= after, JSON.stringify(entry))
  assert.equal(lines.length, 1)
})

test('last step refused twin: a missing label answers 400 LABEL_MISSING, nothing audited', async (t) => {
  const { app, lines } = setup(t, LAST)
  const res = await post(app, { headers: without(LABELS, 'x-data-category') })
  assert.equal(res.statusCode, 400)
  const body = res.json()
  assert.equal(body.code, 'LABEL_MISSING')
  assert.match(body.message, /x-data-category/)
  assert.equal(body.request_id, 'generated-1')
  assert.deepEqual(body.reasons, [{ code: 'LABEL_MISSING', message: 'header x-data-category is missing or empty' }])
  assert.equal(lines.length, 0)
})

// ---------------------------------------------------------------- middle step

test('middle step: forwards exactly the specified headers and body, prepends its entry', async (t) => {
  const { app, calls } = setup(t, MIDDLE, { now: fakeClock() })
  const res = await post(app, {
    headers: {
      ...LABELS,
      'x-request-id': 'r-2',
      'x-complyroute-destination': 'store-us', // a client's choice is never forwarded
      'x-complyroute-step': 'elsewhere',
      ...DECIDED, // set for this hop by the point that decided it, never passed on
      cookie: 'a=b'
    }
  })
  assert.equal(res.statusCode, 200)
  assert.equal(calls.length, 1)
  assert.deepEqual(calls[0].headers, {
    'content-type': 'application/json',
    'x-data-region': 'EU',
    'x-data-category': 'personal',
    'x-data-consent': 'billing,care',
    'x-request-id': 'r-2',
    'x-complyroute-step': 'store'
  })
  assert.deepEqual(JSON.parse(calls[0].body), RECORD)

  const body = res.json()
  assert.equal(body.request_id, 'r-2')
  assert.equal(body.path.length, 2)
  const [own, next] = body.path
  assert.equal(own.instance, 'analyse-eu')
  assert.equal(own.step, 'analyse')
  assert.equal(own.region, 'EU')
  assert.equal(own.node, 'node-2')
  assert.ok(own.t_in < own.t_out && own.t_out < own.t_back, JSON.stringify(own))
  assert.equal(own.revision, '0123abc') // the revision of the rule set that decided the hop into it
  assert.deepEqual(next, DOWNSTREAM_PATH[0])
})

test('middle step: no x-data-consent in, none out; unknown path-entry fields are dropped', async (t) => {
  const extra = [{ ...DOWNSTREAM_PATH[0], secret: 'x' }]
  const { app, calls } = setup(t, MIDDLE, { answer: ok(extra) })
  const res = await post(app, { headers: without(LABELS, 'x-data-consent') })
  assert.equal(res.statusCode, 200)
  assert.equal('x-data-consent' in calls[0].headers, false)
  assert.deepEqual(res.json().path[1], DOWNSTREAM_PATH[0])
})

test('middle step refused twin: a missing label is answered here, nothing forwarded', async (t) => {
  const { app, calls, lines } = setup(t, MIDDLE)
  const res = await post(app, { headers: without(LABELS, 'x-data-region', 'x-data-category') })
  assert.equal(res.statusCode, 400)
  assert.equal(res.json().code, 'LABEL_MISSING')
  // In the schema's order (COMPLYROUTE_LABELS): category before region.
  assert.equal(res.json().message, 'missing label headers: x-data-category, x-data-region')
  assert.deepEqual(res.json().reasons.map((reason) => reason.message), ['header x-data-category is missing or empty', 'header x-data-region is missing or empty'])
  assert.equal(calls.length, 0)
  assert.equal(lines.length, 0)
})

test('middle step: the record is sent on as it came, byte for byte', async (t) => {
  const { app, calls } = setup(t, MIDDLE)
  const payload = '{ "subject" : "alice",\n  "amount": 12.50 }'
  const res = await post(app, { payload })
  assert.equal(res.statusCode, 200)
  assert.equal(calls[0].body, payload)
})

test('sent-on refused twin: a body with a constructor.prototype key is refused, nothing sent on', async (t) => {
  const { app, calls, lines } = setup(t, MIDDLE)
  const res = await post(app, { payload: '{"constructor": {"prototype": {"polluted": true}}}' })
  assert.equal(res.statusCode, 400)
  assert.equal(res.json().code, 'BODY_INVALID')
  assert.equal(calls.length, 0)
  assert.equal(lines.length, 0)
})

// ---------------------------------------------------------------- health

test('GET /health answers 200 {status, instance, step, labels}: labels, the digest of the label setting in effect', async (t) => {
  const { app } = setup(t, MIDDLE)
  const res = await app.inject({ method: 'GET', url: '/health' })
  assert.equal(res.statusCode, 200)
  const digest = `sha256:${createHash('sha256').update(LABELS_ENV.COMPLYROUTE_LABELS).digest('hex')}`
  assert.deepEqual(res.json(), { status: 'ok', instance: 'analyse-eu', step: 'analyse', labels: digest })
})

// ---------------------------------------------------------------- stats

test('stats: every /process request is counted once by its outcome', async (t) => {
  let next = 'ok'
  const answer = () => {
    if (next === 'ok') return ok()
    if (next === 'deny') return { status: 451, body: '{"code":"DENIED","message":"no"}' }
    throw new Error('unreachable')
  }
  const { app } = setup(t, MIDDLE, { answer })
  assert.deepEqual(await stats(app), { received: 0, answered: 0, forwarded: 0, downstream_denied: 0, downstream_failed: 0, rejected: 0, internal_errors: 0 })

  await post(app) // answered
  await post(app) // answered
  next = 'deny'
  await post(app) // downstream_denied
  next = 'fail'
  await post(app) // downstream_failed
  await post(app, { headers: without(LABELS, 'x-data-region') }) // rejected
  await post(app, { payload: 'nope' }) // rejected
  await post(app, { headers: { ...LABELS, 'content-type': 'text/plain' } }) // rejected
  await app.inject({ method: 'GET', url: '/nope' }) // not a record: not counted

  const counters = await stats(app)
  assert.deepEqual(counters, { received: 7, answered: 2, forwarded: 4, downstream_denied: 1, downstream_failed: 1, rejected: 3, internal_errors: 0 })
  assert.equal(counters.received, counters.answered + counters.downstream_denied + counters.downstream_failed + counters.rejected + counters.internal_errors)
})

test('stats at the last step: nothing forwarded', async (t) => {
  const { app } = setup(t, LAST)
  await post(app)
  await post(app, { payload: '[]' })
  const counters = await stats(app)
  assert.equal(counters.received, 2)
  assert.equal(counters.answered, 1)
  assert.equal(counters.rejected, 1)
  assert.equal(counters.forwarded, 0)
})

// ---------------------------------------------------------------- the work

test('doWork: the digest depends on the body and the number of rounds', () => {
  assert.equal(doWork('{}', 0), '')
  assert.equal(doWork('{}', 2), doWork('{}', 2))
  assert.notEqual(doWork('{}', 2), doWork('{}', 3))
  assert.notEqual(doWork('{"a":1}', 2), doWork('{}', 2))
  assert.match(doWork('{}', 1), /^[0-9a-f]{64}$/)
})
