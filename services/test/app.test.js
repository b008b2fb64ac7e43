// The app through app.inject only: no port is opened, the forwarder and the
// audit log are fakes. Each allowed case has its refused twin next to it.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { buildApp, clientErrorHandler, doWork, downstreamPathEntries } from '../app.js'
import { parseConfig } from '../config.js'
import { GENESIS, createAuditLog } from '../lib/audit.js'
import { LABELS_ENV, SHIPPED_LABELS, labelsEnv } from '../test-support/labels.js'

const LAST_ENV = { INSTANCE_ID: 'store-eu', STEP: 'store', REGION: 'EU', NODE: 'node-3', WORK_ITERATIONS: '3', LOG_LEVEL: 'silent', ...LABELS_ENV }
const MIDDLE_ENV = {
  INSTANCE_ID: 'analyse-eu',
  STEP: 'analyse',
  REGION: 'EU',
  NODE: 'node-2',
  NEXT_STEP: 'store',
  EGRESS_URL: 'http://127.0.0.1:12002',
  WORK_ITERATIONS: '3',
  LOG_LEVEL: 'silent',
  ...LABELS_ENV
}
const LAST = parseConfig(LAST_ENV)
const MIDDLE = parseConfig(MIDDLE_ENV)

const LABELS = Object.freeze({ 'x-data-region': 'EU', 'x-data-category': 'personal', 'x-data-consent': 'billing,care' })
const RECORD = Object.freeze({ subject: 'alice', amount: 12 })
// What the enforcement point that decided a hop adds to it (complyroute/proxy/envoy.py).
const DECIDED = Object.freeze({
  'x-complyroute-sender': 'ingest-eu',
  'x-complyroute-decided-by': 'router-1',
  'x-complyroute-revision': '0123abc'
})

const DOWNSTREAM_PATH = Object.freeze([
  { instance: 'store-eu', step: 'store', region: 'EU', node: 'node-3', t_in: 1000.5, t_out: 1001.25, revision: '0123abc' }
])

function ok (path = DOWNSTREAM_PATH) {
  return { status: 200, body: JSON.stringify({ request_id: 'ignored', path }) }
}

/** A counting fake clock: every reading is one millisecond later. */
function fakeClock (start = 1_700_000_000_000) {
  let t = start
  return () => ++t
}

function setup (t, config, { answer = ok(), now, genId, audit } = {}) {
  const lines = []
  const calls = []
  const fakeAudit = audit ?? { async write (entry) { lines.push(entry) } }
  const forward = async (request) => {
    calls.push(request)
    return typeof answer === 'function' ? answer(request) : answer
  }
  let ids = 0
  const app = buildApp(config, {
    audit: fakeAudit,
    forward: config.nextStep ? forward : undefined,
    now,
    genId: genId ?? (() => `generated-${++ids}`),
    logger: false
  })
  t.after(() => app.close())
  return { app, lines, calls }
}

function post (app, { headers = LABELS, body = RECORD, payload, url = '/process' } = {}) {
  return app.inject({
    method: 'POST',
    url,
    headers: { 'content-type': 'application/json', ...headers },
    payload: payload ?? JSON.stringify(body)
  })
}

function without (object, ...keys) {
  const copy = { ...object }
  for (const key of keys) delete copy[key]
  return copy
}

async function stats (app) {
  return (await app.inject({ method: 'GET', url: '/stats' })).json()
}

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

// ---------------------------------------------------------------- delivered paths

// The downstream path of a chain of three more hops, as a service writes it.
const WRITTEN_PATH = Object.freeze([
  { instance: 'analyse-eu', step: 'analyse', region: 'EU', node: 'node-2', t_in: 1000.5, t_out: 1000.75, t_back: 1003.5, revision: 'r-1' },
  { instance: 'enrich-eu', step: 'enrich', region: 'EU', node: 'node-1', t_in: 1001, t_out: 1001.25, t_back: 1003, revision: 'r-1' },
  { instance: 'store-eu', step: 'store', region: 'EU', node: 'node-3', t_in: 1002, t_out: 1002.5, revision: null }
])
const WRITTEN_ANSWER = JSON.stringify({ request_id: 'r-11', path: WRITTEN_PATH })

test('middle step: a downstream answer as a service writes it is copied into the answer as it came', async (t) => {
  // 1003.50 is how no serializer writes 1003.5: seeing it in the answer shows the copy.
  const body = WRITTEN_ANSWER.replace('"t_back":1003.5', '"t_back":1003.50')
  const { app } = setup(t, MIDDLE, { answer: { status: 200, body }, now: fakeClock() })
  const res = await post(app, { headers: { ...LABELS, 'x-request-id': 'r-11' } })
  assert.equal(res.statusCode, 200)
  assert.ok(res.payload.endsWith(`,${body.slice(body.indexOf('[') + 1)}`), res.payload)
  const { request_id: requestId, path } = res.json()
  assert.equal(requestId, 'r-11')
  assert.deepEqual(path.slice(1), WRITTEN_PATH)
  assert.equal(path[0].instance, 'analyse-eu')
  assert.ok(path[0].t_in < path[0].t_out && path[0].t_out < path[0].t_back, JSON.stringify(path[0]))
})

test('middle step: a valid downstream answer in another form is rewritten entry by entry', async (t) => {
  const reordered = WRITTEN_PATH.map(({ t_in: tIn, ...rest }) => ({ t_in: tIn, ...rest }))
  const forms = [
    JSON.stringify({ path: WRITTEN_PATH, request_id: 'r-12' }, null, 2), // spaces, keys in another order
    JSON.stringify({ request_id: 'r-12', path: reordered }), // entry keys in another order
    JSON.stringify({ request_id: 'r-12', path: WRITTEN_PATH }).replace('"store-eu"', '"store\u002deu"'), // escapes
    JSON.stringify({ request_id: 'r-12', path: WRITTEN_PATH }).replace('1002.5', '10025e-1') // an exponent
  ]
  for (const body of forms) {
    const { app } = setup(t, MIDDLE, { answer: { status: 200, body } })
    const res = await post(app)
    assert.equal(res.statusCode, 200, body)
    assert.deepEqual(res.json().path.slice(1), WRITTEN_PATH, body)
    assert.equal(res.payload.includes(' '), false)
  }
})

test('delivered refused twin: a 200 answer with a path entry out of the contract is refused with 502', async (t) => {
  const entry = WRITTEN_PATH[2]
  const bad = [
    { ...entry, t_in: '1002' },
    { ...entry, t_out: null },
    { ...entry, t_back: 'late' },
    { ...entry, instance: 7 },
    { ...entry, revision: 7 },
    { ...entry, revision: ['r-1'] },
    without(entry, 'node')
  ].map((e) => JSON.stringify({ request_id: 'r-13', path: [WRITTEN_PATH[0], e] }))
  bad.push(WRITTEN_ANSWER.replace('1002.5', '1e999')) // parses to Infinity
  bad.push(WRITTEN_ANSWER.replace('"t_out":1002.5', '"t_out":NaN'))
  for (const body of bad) {
    const { app } = setup(t, MIDDLE, { answer: { status: 200, body } })
    const res = await post(app, { headers: { ...LABELS, 'x-request-id': 'r-13' } })
    assert.equal(res.statusCode, 502, body)
    assert.deepEqual(res.json(), { code: 'NEXT_HOP_FAILED', message: 'next hop answered 200 without a valid path', request_id: 'r-13' })
  }
})

/** A deterministic pseudo-random generator (mulberry32). */
function random (seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0
    let x = Math.imul(seed ^ (seed >>> 15), 1 | seed)
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296
  }
}

test('hostile next hop: no mangled answer makes this hop write invalid JSON or an entry out of the contract', () => {
  const next = random(8)
  const pick = (text) => text[Math.floor(next() * text.length)]
  const noise = '"\\{}[],:0123456789.eE+-ntuflasr \n\u0000\u2028é'
  let kept = 0
  for (let i = 0; i < 5000; i++) {
    let body = WRITTEN_ANSWER
    for (let edits = 1 + Math.floor(next() * 3); edits > 0; edits--) {
      const at = Math.floor(next() * body.length)
      const kind = next()
      if (kind < 0.3) body = body.slice(0, at) + body.slice(at + 1) // drop a character
      else if (kind < 0.6) body = body.slice(0, at) + pick(noise) + body.slice(at) // insert one
      else if (kind < 0.9) body = body.slice(0, at) + pick(noise) + body.slice(at + 1) // replace one
      else body = body.slice(0, at) + body.slice(at, at + 40) + body.slice(at) // repeat a stretch
    }
    const entries = downstreamPathEntries(body)
    if (entries === null) continue
    kept++
    const path = JSON.parse(`[${entries}]`) // throws if this hop would write invalid JSON
    for (const entry of path) {
      assert.deepEqual(Object.keys(entry).filter((key) => !['instance', 'step', 'region', 'node', 't_in', 't_out', 't_back', 'revision'].includes(key)), [], body)
      assert.ok(entry.revision === null || typeof entry.revision === 'string', body)
      for (const key of ['instance', 'step', 'region', 'node']) assert.equal(typeof entry[key], 'string', body)
      for (const key of ['t_in', 't_out']) assert.ok(Number.isFinite(entry[key]), body)
      assert.ok(entry.t_back === undefined || Number.isFinite(entry.t_back), body)
    }
  }
  // Some mangled answers are still valid (a digit changed, a space added): they are kept.
  assert.ok(kept > 0 && kept < 5000, `${kept} kept`)
})

test('hostile next hop: a 1 MiB answer that fails at its end is refused in linear time', () => {
  const entry = JSON.stringify(WRITTEN_PATH[0])
  const entries = Array(Math.floor(1024 * 1024 / (entry.length + 1))).fill(entry).join(',')
  const started = performance.now()
  assert.equal(downstreamPathEntries(`{"request_id":"r","path":[${entries}]}`).length, entries.length)
  assert.equal(downstreamPathEntries(`{"request_id":"r","path":[${entries},{"instance":"x"]}`), null)
  assert.equal(downstreamPathEntries(`{"request_id":"r","path":[${entries}`), null)
  assert.ok(performance.now() - started < 2000, `${performance.now() - started} ms`)
})

// ---------------------------------------------------------------- relayed answers

test('a 451 denial is relayed: same status, same body, request_id kept', async (t) => {
  const denial = {
    code: 'CERTIFICATION_MISSING',
    message: 'no instance of store holds health-data',
    request_id: 'r-3',
    reasons: [{ code: 'CERTIFICATION_MISSING', message: 'store-eu lacks health-data', instance: 'store-eu' }],
    extra: { kept: true }
  }
  const { app } = setup(t, MIDDLE, { answer: { status: 451, body: JSON.stringify(denial) } })
  const res = await post(app, { headers: { ...LABELS, 'x-request-id': 'r-3' } })
  assert.equal(res.statusCode, 451)
  assert.deepEqual(res.json(), denial)
})

test('a relayed denial without request_id or message gets them', async (t) => {
  const { app } = setup(t, MIDDLE, { answer: { status: 451, body: '{"code":"CONSENT_MISSING"}' } })
  const res = await post(app, { headers: { ...LABELS, 'x-request-id': 'r-4' } })
  assert.equal(res.statusCode, 451)
  assert.deepEqual(res.json(), { code: 'CONSENT_MISSING', message: 'next hop answered 451', request_id: 'r-4' })
})

test('a 503 or 400 JSON error from the enforcement point is relayed as is', async (t) => {
  for (const [status, code] of [[503, 'DECISION_UNAVAILABLE'], [400, 'LABEL_UNKNOWN'], [502, 'NEXT_HOP_FAILED']]) {
    const { app } = setup(t, MIDDLE, { answer: { status, body: JSON.stringify({ code, message: 'm', request_id: 'r-5' }) } })
    const res = await post(app, { headers: { ...LABELS, 'x-request-id': 'r-5' } })
    assert.equal(res.statusCode, status)
    assert.deepEqual(res.json(), { code, message: 'm', request_id: 'r-5' })
  }
})

test('relay refused twin: error answers that are not {code: string} JSON become 502 NEXT_HOP_FAILED', async (t) => {
  const cases = [
    [{ status: 451, body: 'denied' }, /451 without a JSON error body/],
    [{ status: 503, body: 'upstream connect error or disconnect/reset before headers' }, /503 without a JSON error body/],
    [{ status: 451, body: '{"message":"no code"}' }, /451 without a JSON error body/],
    [{ status: 451, body: '{"code":7}' }, /451 without a JSON error body/],
    [{ status: 451, body: '{"code":"X","reasons":"not a list"}' }, /451 without a JSON error body/],
    [{ status: 404, body: '' }, /404 without a JSON error body/],
    [{ status: 302, body: '{"code":"MOVED"}' }, /unexpected status 302/]
  ]
  for (const [answer, message] of cases) {
    const { app } = setup(t, MIDDLE, { answer })
    const res = await post(app, { headers: { ...LABELS, 'x-request-id': 'r-6' } })
    assert.equal(res.statusCode, 502, answer.body)
    const body = res.json()
    assert.equal(body.code, 'NEXT_HOP_FAILED')
    assert.match(body.message, message)
    assert.equal(body.request_id, 'r-6')
  }
})

test('200 answers without a valid path become 502 NEXT_HOP_FAILED', async (t) => {
  for (const body of ['not json', '{}', '{"path":[]}', '{"path":[{"instance":"x"}]}', '[1]']) {
    const { app } = setup(t, MIDDLE, { answer: { status: 200, body } })
    const res = await post(app)
    assert.equal(res.statusCode, 502, body)
    assert.deepEqual(without(res.json(), 'request_id'), { code: 'NEXT_HOP_FAILED', message: 'next hop answered 200 without a valid path' })
  }
})

test('a forwarder error (unreachable, time-out) answers 502 NEXT_HOP_FAILED naming it', async (t) => {
  const { app } = setup(t, MIDDLE, { answer: () => { throw new Error('connect ECONNREFUSED 127.0.0.1:12002') } })
  const res = await post(app, { headers: { ...LABELS, 'x-request-id': 'r-7' } })
  assert.equal(res.statusCode, 502)
  assert.deepEqual(res.json(), {
    code: 'NEXT_HOP_FAILED',
    message: 'next hop failed: connect ECONNREFUSED 127.0.0.1:12002',
    request_id: 'r-7'
  })
})

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

test('empty label values count as missing; an empty consent is carried', async (t) => {
  const { app, calls } = setup(t, MIDDLE)
  const refused = await post(app, { headers: { ...LABELS, 'x-data-region': '' } })
  assert.equal(refused.statusCode, 400)
  assert.equal(refused.json().code, 'LABEL_MISSING')
  const allowed = await post(app, { headers: { ...LABELS, 'x-data-consent': '' } })
  assert.equal(allowed.statusCode, 200)
  assert.equal(calls[0].headers['x-data-consent'], '')
})

// ---------------------------------------------------------------- routes

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

test('GET /health answers 200 {status, instance, step, labels}: labels, the digest of the label setting in effect', async (t) => {
  const { app } = setup(t, MIDDLE)
  const res = await app.inject({ method: 'GET', url: '/health' })
  assert.equal(res.statusCode, 200)
  const digest = `sha256:${createHash('sha256').update(LABELS_ENV.COMPLYROUTE_LABELS).digest('hex')}`
  assert.deepEqual(res.json(), { status: 'ok', instance: 'analyse-eu', step: 'analyse', labels: digest })
})

// ---------------------------------------------------------------- audit

test('an accepted record writes one audit line: labels, digest of the bytes received, id, who decided and with which rules', async (t) => {
  const { app, lines } = setup(t, MIDDLE, { now: fakeClock(5000) })
  const payload = '{ "subject": "alice",  "amount": 12 }' // as sent, spaces and all
  const res = await post(app, { headers: { ...LABELS, ...DECIDED, 'x-request-id': 'r-8' }, payload })
  assert.equal(res.statusCode, 200)
  assert.deepEqual(lines, [{
    ts: res.json().path[0].t_in,
    instance: 'analyse-eu',
    step: 'analyse',
    request_id: 'r-8',
    labels: { region: 'EU', category: 'personal', consent: 'billing,care' },
    digest: `sha256:${createHash('sha256').update(payload).digest('hex')}`,
    sender: 'ingest-eu',
    decided_by: 'router-1',
    revision: '0123abc'
  }])
})

test('audit line twin: a record no enforcement point decided says so (null), one without consent has consent null', async (t) => {
  const { app, lines } = setup(t, MIDDLE)
  await post(app, { headers: without(LABELS, 'x-data-consent'), payload: '{"subject":"bob"}' })
  assert.deepEqual(lines[0].labels, { region: 'EU', category: 'personal', consent: null })
  assert.equal(lines[0].digest, `sha256:${createHash('sha256').update('{"subject":"bob"}').digest('hex')}`)
  assert.deepEqual([lines[0].sender, lines[0].decided_by, lines[0].revision], [null, null, null])
})

test('audit lines through the real log: one chained line per accepted record, none for a refused one', async (t) => {
  const file = join(mkdtempSync(join(tmpdir(), 'complyroute-app-')), 'analyse-eu.jsonl')
  t.after(() => rmSync(dirname(file), { recursive: true, force: true }))
  const audit = createAuditLog(file)
  const { app } = setup(t, MIDDLE, { audit })
  const sent = await Promise.all(['a', 'b', 'c'].map((id) => post(app, { headers: { ...LABELS, ...DECIDED, 'x-request-id': id } })))
  assert.deepEqual(sent.map((res) => res.statusCode), [200, 200, 200])
  assert.equal((await post(app, { headers: { ...LABELS, 'x-request-id': 'd,d' } })).statusCode, 400)
  await audit.close()
  const lines = readFileSync(file, 'utf8').trim().split('\n')
  assert.deepEqual(lines.map((line) => JSON.parse(line).request_id).sort(), ['a', 'b', 'c'])
  // The labels as written: by name, in the order COMPLYROUTE_LABELS gives (the schema's).
  for (const line of lines) assert.ok(line.includes(',"labels":{"category":"personal","consent":"billing,care","region":"EU"},'), line)
  let expected = GENESIS
  for (const line of lines) {
    assert.equal(JSON.parse(line).prev, expected)
    expected = createHash('sha256').update(line).digest('hex')
  }
})

test('an accepted record is audited even when the next hop then denies it', async (t) => {
  const { app, lines } = setup(t, MIDDLE, { answer: { status: 451, body: '{"code":"DENIED","message":"no"}' } })
  assert.equal((await post(app)).statusCode, 451)
  assert.equal(lines.length, 1)
})

test('a rejected record writes no audit line', async (t) => {
  const { app, lines } = setup(t, LAST)
  await post(app, { headers: without(LABELS, 'x-data-region') })
  await post(app, { payload: '[]' })
  await post(app, { payload: '{' })
  await post(app, { headers: { ...LABELS, 'content-type': 'text/plain' } })
  await post(app, { headers: { ...LABELS, 'x-request-id': 'has space' } })
  assert.equal(lines.length, 0)
})

test('an audit write failure answers 500 AUDIT_FAILED and forwards nothing', async (t) => {
  const audit = { async write () { throw new Error('ENOSPC') } }
  const { app, calls } = setup(t, MIDDLE, { audit })
  const res = await post(app, { headers: { ...LABELS, 'x-request-id': 'r-9' } })
  assert.equal(res.statusCode, 500)
  assert.deepEqual(res.json(), { code: 'AUDIT_FAILED', message: 'the audit log could not be written', request_id: 'r-9' })
  assert.equal(calls.length, 0)
  const counters = await stats(app)
  assert.equal(counters.internal_errors, 1)
  assert.equal(counters.forwarded, 0)
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

// ---------------------------------------------------------------- wiring

test('buildApp creates the forwarder it is not given; the bare plugin refuses a middle step without one, and no audit log', async (t) => {
  const noForward = buildApp(MIDDLE, { audit: { async write () {} }, forward: undefined, logger: false })
  // buildApp creates the real forwarder when none is injected: that is accepted
  await noForward.ready()
  await noForward.close()

  const Fastify = (await import('fastify')).default
  const { app } = await import('../app.js')
  const bare = Fastify({ logger: false })
  bare.register(app, { config: MIDDLE, audit: { async write () {} } })
  await assert.rejects(bare.ready(), /opts.forward is required/)
  const noAudit = Fastify({ logger: false })
  noAudit.register(app, { config: LAST })
  await assert.rejects(noAudit.ready(), /opts.audit/)
})

test('doWork: the digest depends on the body and the number of rounds', () => {
  assert.equal(doWork('{}', 0), '')
  assert.equal(doWork('{}', 2), doWork('{}', 2))
  assert.notEqual(doWork('{}', 2), doWork('{}', 3))
  assert.notEqual(doWork('{"a":1}', 2), doWork('{}', 2))
  assert.match(doWork('{}', 1), /^[0-9a-f]{64}$/)
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

// ---------------------------------------------------------------- label tokens

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
  assert.deepEqual(Object.keys(lines[0]), ['ts', 'instance', 'step', 'request_id', 'labels', 'digest', 'sender', 'decided_by', 'revision'])
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

test('buildApp opens the configured audit log itself and flushes it on close', async (t) => {
  const { mkdtempSync, readFileSync, rmSync } = await import('node:fs')
  const { tmpdir } = await import('node:os')
  const { join } = await import('node:path')
  const dir = mkdtempSync(join(tmpdir(), 'complyroute-app-'))
  t.after(() => rmSync(dir, { recursive: true, force: true }))
  const file = join(dir, 'audit', 'store-eu.jsonl')
  const config = parseConfig({ INSTANCE_ID: 'store-eu', STEP: 'store', REGION: 'EU', NODE: 'node-3', AUDIT_LOG: file, LOG_LEVEL: 'silent', ...LABELS_ENV })
  const app = buildApp(config, { logger: false })
  const accepted = await post(app, { headers: { ...LABELS, 'x-request-id': 'r-10' } })
  const refused = await post(app, { headers: without(LABELS, 'x-data-region'), body: RECORD })
  assert.equal(accepted.statusCode, 200)
  assert.equal(refused.statusCode, 400)
  await app.close()
  const lines = readFileSync(file, 'utf8').trim().split('\n').map((line) => JSON.parse(line))
  assert.equal(lines.length, 1)
  assert.equal(lines[0].request_id, 'r-10')
  assert.equal(lines[0].instance, 'store-eu')
})

// ---------------------------------------------------------------- the label schema is configuration

// A fourth label, required, in the schema's order (by name): between category and consent.
const CLASSIFICATION = Object.freeze({ name: 'classification', header: 'x-data-classification', required: true })
const FOUR_LABELS = Object.freeze([SHIPPED_LABELS[0], CLASSIFICATION, ...SHIPPED_LABELS.slice(1)])
const FOUR_MIDDLE = parseConfig({ ...MIDDLE_ENV, ...labelsEnv(FOUR_LABELS) })
const FOUR_LAST = parseConfig({ ...LAST_ENV, ...labelsEnv(FOUR_LABELS) })
const FOUR = Object.freeze({ ...LABELS, 'x-data-classification': 'secret' })

test('a fourth label in COMPLYROUTE_LABELS is required, logged in its place in the schema\'s order, and sent on', async (t) => {
  const { app, calls, lines } = setup(t, FOUR_MIDDLE)
  const res = await post(app, { headers: { ...FOUR, 'x-request-id': 'r-f1', 'x-data-unknown': 'x' } })
  assert.equal(res.statusCode, 200)
  assert.deepEqual(calls[0].headers, {
    'content-type': 'application/json',
    'x-data-category': 'personal',
    'x-data-classification': 'secret',
    'x-data-consent': 'billing,care',
    'x-data-region': 'EU',
    'x-request-id': 'r-f1',
    'x-complyroute-step': 'store'
  })
  assert.equal(JSON.stringify(lines[0].labels), '{"category":"personal","classification":"secret","consent":"billing,care","region":"EU"}')

  // Refused twin: without it (or empty), the existing LABEL_MISSING answer; nothing logged or sent on.
  for (const headers of [without(FOUR, 'x-data-classification'), { ...FOUR, 'x-data-classification': '' }]) {
    const refused = await post(app, { headers: { ...headers, 'x-request-id': 'r-f2' } })
    assert.equal(refused.statusCode, 400)
    assert.deepEqual(refused.json(), {
      code: 'LABEL_MISSING',
      message: 'missing label header: x-data-classification',
      request_id: 'r-f2',
      reasons: [{ code: 'LABEL_MISSING', message: 'header x-data-classification is missing or empty' }]
    })
  }
  const both = await post(app, { headers: without(FOUR, 'x-data-classification', 'x-data-region') })
  assert.equal(both.json().message, 'missing label headers: x-data-classification, x-data-region')
  assert.equal(calls.length, 1)
  assert.equal(lines.length, 1)
  assert.deepEqual(await stats(app), { received: 4, answered: 1, forwarded: 1, downstream_denied: 0, downstream_failed: 0, rejected: 3, internal_errors: 0 })
})

test('the fourth label at the last step: required there too, and logged', async (t) => {
  const { app, lines } = setup(t, FOUR_LAST)
  assert.equal((await post(app, { headers: FOUR })).statusCode, 200)
  assert.equal((await post(app)).statusCode, 400)
  assert.deepEqual(lines.map((line) => line.labels), [{ category: 'personal', classification: 'secret', consent: 'billing,care', region: 'EU' }])
})

test('denied twin: a header outside COMPLYROUTE_LABELS is neither required, logged nor sent on', async (t) => {
  // The shipped schema does not name x-data-classification: the same record's header is dropped.
  const { app, calls, lines } = setup(t, MIDDLE)
  const res = await post(app, { headers: { ...FOUR, 'x-request-id': 'r-f3' } })
  assert.equal(res.statusCode, 200)
  assert.equal('x-data-classification' in calls[0].headers, false)
  assert.deepEqual(Object.keys(calls[0].headers).filter((name) => name.startsWith('x-data-')).sort(), ['x-data-category', 'x-data-consent', 'x-data-region'])
  assert.deepEqual(lines[0].labels, { category: 'personal', consent: 'billing,care', region: 'EU' })
  assert.ok(!JSON.stringify(lines[0]).includes('secret'), JSON.stringify(lines[0]))
})

test('no label is built in: a schema of one optional label requires none of the shipped headers, logs and sends on only its own', async (t) => {
  const config = parseConfig({ ...MIDDLE_ENV, ...labelsEnv([{ name: 'tier', header: 'x-tier', required: false }]) })
  const { app, calls, lines } = setup(t, config)
  const bare = await post(app, { headers: { 'x-request-id': 'r-f4' } })
  assert.equal(bare.statusCode, 200)
  assert.deepEqual(lines[0].labels, { tier: null })
  assert.deepEqual(calls[0].headers, { 'content-type': 'application/json', 'x-request-id': 'r-f4', 'x-complyroute-step': 'store' })
  const tiered = await post(app, { headers: { ...LABELS, 'x-tier': 'gold', 'x-request-id': 'r-f5' } })
  assert.equal(tiered.statusCode, 200)
  assert.deepEqual(lines[1].labels, { tier: 'gold' })
  assert.deepEqual(calls[1].headers, { 'content-type': 'application/json', 'x-tier': 'gold', 'x-request-id': 'r-f5', 'x-complyroute-step': 'store' })
})

// ---------------------------------------------------------------- labels given while running

const FOUR_SETTING = Object.freeze({ labels: FOUR_LABELS, digest: 'sha256:four' })

test('setLabels: a label added while running is required, logged and sent on from the next record; /health reports its setting', async (t) => {
  const { app, calls, lines } = setup(t, MIDDLE)
  assert.equal((await post(app, { headers: { ...FOUR, 'x-request-id': 'r-s1' } })).statusCode, 200)
  app.setLabels(FOUR_SETTING)
  assert.equal((await app.inject({ method: 'GET', url: '/health' })).json().labels, 'sha256:four')
  assert.equal((await post(app, { headers: { ...FOUR, 'x-request-id': 'r-s2' } })).statusCode, 200)
  // Refused twin: the same record without the new label, now required.
  const refused = await post(app, { headers: { ...LABELS, 'x-request-id': 'r-s3' } })
  assert.equal(refused.statusCode, 400)
  assert.equal(refused.json().message, 'missing label header: x-data-classification')
  assert.deepEqual(calls.map((call) => call.headers['x-data-classification']), [undefined, 'secret'])
  assert.deepEqual(lines.map((line) => line.labels.classification), [undefined, 'secret'])
})

test('setLabels: a record that arrived before keeps the labels it arrived under, to its answer', async (t) => {
  let release
  const held = new Promise((resolve) => { release = resolve })
  const lines = []
  const { app, calls } = setup(t, MIDDLE, { audit: { async write (entry) { lines.push(entry); if (entry.request_id === 'r-h1') await held } } })
  const first = post(app, { headers: { ...FOUR, 'x-request-id': 'r-h1' } })
  while (lines.length === 0) await new Promise((resolve) => setImmediate(resolve))
  app.setLabels(FOUR_SETTING)
  const second = await post(app, { headers: { ...FOUR, 'x-request-id': 'r-h2' } })
  release()
  assert.equal((await first).statusCode, 200)
  assert.equal(second.statusCode, 200)
  // The held record: logged and sent on under the labels it arrived under; the next one under the new.
  const byId = Object.fromEntries(calls.map((call) => [call.headers['x-request-id'], call.headers]))
  assert.equal('x-data-classification' in byId['r-h1'], false)
  assert.equal(byId['r-h2']['x-data-classification'], 'secret')
  assert.deepEqual(lines.map((line) => [line.request_id, 'classification' in line.labels]), [['r-h1', false], ['r-h2', true]])
})

test('setLabels refused twin: no labels is refused and the labels in effect stay', async (t) => {
  const { app } = setup(t, MIDDLE)
  await app.ready()
  for (const labels of [undefined, []]) assert.throws(() => app.setLabels({ labels, digest: 'sha256:none' }), /the labels .* are required/)
  assert.equal((await post(app)).statusCode, 200)
  assert.equal((await post(app, { headers: without(LABELS, 'x-data-region') })).statusCode, 400)
})

test('the app refuses a configuration without labels', async () => {
  for (const labels of [undefined, []]) {
    const app = buildApp({ ...LAST, labels }, { audit: { async write () {} }, logger: false })
    await assert.rejects(app.ready(), /the labels \(COMPLYROUTE_LABELS, config\.labels\) are required/)
    await app.close().catch(() => {})
  }
})
