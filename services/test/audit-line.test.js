// The audit line of an accepted record (src/routes.js auditEntry), none for a refused one.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { GENESIS, createAuditLog } from '../src/audit.js'
import { DECIDED, LABELS, LAST, MIDDLE, fakeClock, post, setup, stats, without } from '../test-support/app.js'

test('an accepted record writes one audit line: labels, digest of the bytes received, id, who decided, when and with which rules', async (t) => {
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
    decided_at: 1795326065162,
    revision: '0123abc'
  }])
})

test('audit line twin: a record no enforcement point decided says so (null), one without consent has consent null', async (t) => {
  const { app, lines } = setup(t, MIDDLE)
  await post(app, { headers: without(LABELS, 'x-data-consent'), payload: '{"subject":"bob"}' })
  assert.deepEqual(lines[0].labels, { region: 'EU', category: 'personal', consent: null })
  assert.equal(lines[0].digest, `sha256:${createHash('sha256').update('{"subject":"bob"}').digest('hex')}`)
  assert.deepEqual([lines[0].sender, lines[0].decided_by, lines[0].decided_at, lines[0].revision], [null, null, null, null])
})

test('audit line twin: a decision time that is no number of milliseconds is written as none (null)', async (t) => {
  const { app, lines } = setup(t, MIDDLE)
  for (const value of ['-', '1.5e12', '', '12345678901234567'])
    await post(app, { headers: { ...LABELS, ...DECIDED, 'x-complyroute-decided-at': value } })
  assert.deepEqual(lines.map((line) => line.decided_at), [null, null, null, null])
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
