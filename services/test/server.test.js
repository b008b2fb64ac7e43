// server.js is imported, never run: nothing listens here.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import * as config from '../config.js'
import * as server from '../server.js'

test('server.js reuses config.js\'s parser (one parser, no duplicate)', () => {
  assert.equal(server.parseConfig, config.parseConfig)
})

test('start() refuses an invalid environment before opening anything', async () => {
  await assert.rejects(
    server.start({ INSTANCE_ID: 'a', STEP: 'a', REGION: 'EU', NODE: 'n', NEXT_STEP: 'b' }),
    (err) => err instanceof config.ConfigError && err.variable === 'EGRESS_URL'
  )
  await assert.rejects(server.start({}), (err) => err instanceof config.ConfigError && err.variable === 'INSTANCE_ID')
})

function fakeFastify (closeResult) {
  const calls = { close: 0, logs: [] }
  const log = (level) => (obj, msg) => calls.logs.push([level, msg])
  return {
    calls,
    log: { info: log('info'), error: log('error') },
    close () {
      calls.close++
      return closeResult
    }
  }
}

test('the first signal closes gracefully and exits 0', async () => {
  const fastify = fakeFastify(Promise.resolve())
  const exits = []
  const onSignal = server.handleSignals(fastify, { exit: (code) => exits.push(code) })
  try {
    onSignal('SIGTERM')
    await new Promise((resolve) => setImmediate(resolve))
    assert.equal(fastify.calls.close, 1)
    assert.deepEqual(exits, [0])
  } finally {
    process.removeListener('SIGTERM', onSignal)
    process.removeListener('SIGINT', onSignal)
  }
})

test('a second signal while closing, or a failed close, exits 1', async () => {
  const fastify = fakeFastify(new Promise(() => {}))
  const exits = []
  const onSignal = server.handleSignals(fastify, { exit: (code) => exits.push(code) })
  try {
    onSignal('SIGTERM')
    onSignal('SIGINT')
    assert.equal(fastify.calls.close, 1)
    assert.deepEqual(exits, [1])
  } finally {
    process.removeListener('SIGTERM', onSignal)
    process.removeListener('SIGINT', onSignal)
  }

  const failing = fakeFastify(Promise.reject(new Error('boom')))
  const exits2 = []
  const onSignal2 = server.handleSignals(failing, { exit: (code) => exits2.push(code) })
  try {
    onSignal2('SIGTERM')
    await new Promise((resolve) => setImmediate(resolve))
    assert.deepEqual(exits2, [1])
  } finally {
    process.removeListener('SIGTERM', onSignal2)
    process.removeListener('SIGINT', onSignal2)
  }
})
