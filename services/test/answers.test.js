// The answers built from the next hop's (src/answers.js): a delivered path copied or rewritten,
// an error relayed, anything else refused with 502.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { downstreamPathEntries } from '../src/answers.js'
import { BENCH_REVISION, lastServicesEntries } from '../bench/last-service.js'
import { LABELS, MIDDLE, fakeClock, post, setup, without } from '../test-support/app.js'

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

test('the bench floor answers as services write: a service copies its 49 entries as they came', () => {
  // The bench measures a hop in front of the floor's answer (make bench, "next hop answers 49
  // path entries"): it must take the path a deployment's answers take. A number written as no
  // serializer writes it (.50) survives a copy, not a parse and rewrite.
  const entries = lastServicesEntries(49, 1700000000000).replace('"t_out":1700000000000.5,', '"t_out":1700000000000.50,')
  assert.equal(downstreamPathEntries(`{"request_id":"bench","path":[${entries}]}`), entries)
  assert.equal(JSON.parse(`[${entries}]`).filter((entry) => entry.revision === BENCH_REVISION).length, 49)
})

test('an answer whose entries name no revision (the floor before it wrote them as services do) is parsed and rewritten', () => {
  const entries = lastServicesEntries(49, 1700000000000).replaceAll(`,"revision":"${BENCH_REVISION}"`, '')
    .replace('"t_out":1700000000000.5', '"t_out":1700000000000.50')
  const rewritten = downstreamPathEntries(`{"request_id":"bench","path":[${entries}]}`)
  assert.ok(!rewritten.includes('1700000000000.50') && rewritten.includes('"revision":null'), rewritten.slice(0, 200))
})

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
