// Test fixture (no tests here): the configurations, headers and record the app's tests send,
// and setup(), a built app with a fake audit log and a fake next hop, driven by app.inject.
import { buildApp } from '../app.js'
import { parseConfig } from '../config.js'
import { LABELS_ENV } from './labels.js'

export const LAST_ENV = { INSTANCE_ID: 'store-eu', STEP: 'store', REGION: 'EU', NODE: 'node-3', WORK_ITERATIONS: '3', LOG_LEVEL: 'silent', ...LABELS_ENV }
export const MIDDLE_ENV = {
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
export const LAST = parseConfig(LAST_ENV)
export const MIDDLE = parseConfig(MIDDLE_ENV)

export const LABELS = Object.freeze({ 'x-data-region': 'EU', 'x-data-category': 'personal', 'x-data-consent': 'billing,care' })
export const RECORD = Object.freeze({ subject: 'alice', amount: 12 })
// What the enforcement point that decided a hop adds to it (complyroute/proxy/envoy.py).
export const DECIDED = Object.freeze({
  'x-complyroute-sender': 'ingest-eu',
  'x-complyroute-decided-by': 'router-1',
  'x-complyroute-decided-at': '1795326065162',
  'x-complyroute-revision': '0123abc'
})

export const DOWNSTREAM_PATH = Object.freeze([
  { instance: 'store-eu', step: 'store', region: 'EU', node: 'node-3', t_in: 1000.5, t_out: 1001.25, revision: '0123abc' }
])

export function ok (path = DOWNSTREAM_PATH) {
  return { status: 200, body: JSON.stringify({ request_id: 'ignored', path }) }
}

/** A counting fake clock: every reading is one millisecond later. */
export function fakeClock (start = 1_700_000_000_000) {
  let t = start
  return () => ++t
}

export function setup (t, config, { answer = ok(), now, genId, audit } = {}) {
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

export function post (app, { headers = LABELS, body = RECORD, payload, url = '/process' } = {}) {
  return app.inject({
    method: 'POST',
    url,
    headers: { 'content-type': 'application/json', ...headers },
    payload: payload ?? JSON.stringify(body)
  })
}

export function without (object, ...keys) {
  const copy = { ...object }
  for (const key of keys) delete copy[key]
  return copy
}

export async function stats (app) {
  return (await app.inject({ method: 'GET', url: '/stats' })).json()
}
