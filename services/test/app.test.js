// The composition (app.js): buildApp creates what it is not given, the bare plugin refuses
// what it lacks.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import Fastify from 'fastify'
import { app, buildApp } from '../app.js'
import { parseConfig } from '../config.js'
import { LABELS, LAST, MIDDLE, RECORD, post, without } from '../test-support/app.js'
import { LABELS_ENV } from '../test-support/labels.js'

test('buildApp creates the forwarder it is not given; the bare plugin refuses a middle step without one, and no audit log', async (t) => {
  const noForward = buildApp(MIDDLE, { audit: { async write () {} }, forward: undefined, logger: false })
  // buildApp creates the real forwarder when none is injected: that is accepted
  await noForward.ready()
  await noForward.close()

  const bare = Fastify({ logger: false })
  bare.register(app, { config: MIDDLE, audit: { async write () {} } })
  await assert.rejects(bare.ready(), /opts.forward is required/)
  const noAudit = Fastify({ logger: false })
  noAudit.register(app, { config: LAST })
  await assert.rejects(noAudit.ready(), /opts.audit/)
})

test('every route schema is a valid JSON Schema (Ajv checks it against the meta-schema, which instances skip at start)', async () => {
  const checked = buildApp(LAST, { audit: { async write () {} }, logger: false, validateSchemas: true })
  await checked.ready()
  await checked.close()
})

test('schema check refused twin: a route schema the meta-schema refuses fails the checked build', async () => {
  const broken = { body: { type: 'object', properties: { id: { type: 'string', minLength: -1 } } } }
  for (const validateSchemas of [true, false]) {
    const app = buildApp(LAST, { audit: { async write () {} }, logger: false, validateSchemas })
    app.post('/broken', { schema: broken }, async () => ({}))
    if (validateSchemas) {
      await assert.rejects(app.ready(), /must be >= 0/)
    } else {
      await app.ready() // what an instance does: the check is the test's
    }
    await app.close()
  }
})

test('buildApp opens the configured audit log itself and flushes it on close', async (t) => {
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
