// The labels are configuration (src/labels.js): COMPLYROUTE_LABELS says which headers are
// required, logged and sent on, and setLabels replaces them while running.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { buildApp } from '../app.js'
import { parseConfig } from '../config.js'
import { LABELS, LAST, LAST_ENV, MIDDLE, MIDDLE_ENV, post, setup, stats, without } from '../test-support/app.js'
import { SHIPPED_LABELS, labelsEnv } from '../test-support/labels.js'

test('empty label values count as missing; an empty consent is carried', async (t) => {
  const { app, calls } = setup(t, MIDDLE)
  const refused = await post(app, { headers: { ...LABELS, 'x-data-region': '' } })
  assert.equal(refused.statusCode, 400)
  assert.equal(refused.json().code, 'LABEL_MISSING')
  const allowed = await post(app, { headers: { ...LABELS, 'x-data-consent': '' } })
  assert.equal(allowed.statusCode, 200)
  assert.equal(calls[0].headers['x-data-consent'], '')
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
