// The process of one service instance: configuration from the environment,
// listen, and a graceful shutdown on SIGTERM/SIGINT (stop accepting, answer
// the requests in flight, close the keep-alive pool, flush the audit log,
// exit 0). On SIGHUP it reads its labels again (COMPLYROUTE_LABELS_FILE).
//
// Importing this module starts nothing; running it (`node server.js`) does.

import { pathToFileURL } from 'node:url'
import { buildApp } from './app.js'
import { ConfigError, parseConfig, readLabelSetting } from './config.js'

// The one configuration parser, re-exported (the tests check it is the same).
export { parseConfig }

export const SHUTDOWN_GRACE_MS = 10_000

/**
 * Parse the configuration, build the app and listen.
 * @param {Record<string, string | undefined>} [env]
 * @param {object} [deps] passed to buildApp
 * @returns {Promise<import('fastify').FastifyInstance>}
 * @throws {ConfigError} before anything is opened, when the configuration is invalid
 */
export async function start (env = process.env, deps = {}) {
  const config = parseConfig(env)
  const fastify = buildApp(config, deps)
  try {
    await fastify.listen({ host: config.host, port: config.port })
  } catch (err) {
    await fastify.close().catch(() => {})
    throw err
  }
  return fastify
}

/**
 * Close on the first SIGTERM/SIGINT; a second signal, or a close that takes
 * longer than graceMs, exits with status 1.
 */
export function handleSignals (fastify, { graceMs = SHUTDOWN_GRACE_MS, exit = process.exit } = {}) {
  let closing = false
  const onSignal = (signal) => {
    if (closing) {
      fastify.log.error({ signal }, 'second signal while closing: exiting now')
      exit(1)
      return
    }
    closing = true
    fastify.log.info({ signal }, 'closing')
    const timer = setTimeout(() => {
      fastify.log.error({ grace_ms: graceMs }, 'close took too long: exiting')
      exit(1)
    }, graceMs)
    timer.unref()
    fastify.close().then(
      () => { clearTimeout(timer); exit(0) },
      (err) => { clearTimeout(timer); fastify.log.error({ err }, 'close failed'); exit(1) }
    )
  }
  process.on('SIGTERM', onSignal)
  process.on('SIGINT', onSignal)
  return onSignal
}

/**
 * On SIGHUP, read the label setting again (config.js readLabelSetting: the file
 * COMPLYROUTE_LABELS_FILE names, as the control plane rewrote it) and apply it to the records
 * that arrive from then on; GET /health reports its digest. A setting that does not parse is
 * logged and the labels in effect stay. A signal rather than a watch on the file: the control
 * plane says when the file is whole, and a watch would cost each instance an inotify instance
 * of the user's (128 by default), which the Envoys' watched folders use too.
 */
export function handleLabelReload (fastify, env = process.env) {
  const onSignal = () => {
    let setting
    try {
      setting = readLabelSetting(env)
    } catch (err) {
      fastify.log.error({ err: err.message }, 'labels not read again: the labels in effect stay')
      return
    }
    fastify.setLabels(setting)
    fastify.log.info({ labels: setting.labels.map((label) => label.name), digest: setting.digest }, 'labels read again')
  }
  process.on('SIGHUP', onSignal)
  return onSignal
}

async function main () {
  let fastify
  try {
    fastify = await start()
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`complyroute service: invalid configuration: ${err.message}\n`)
    } else {
      process.stderr.write(`complyroute service: cannot start: ${err.stack || err}\n`)
    }
    process.exit(1)
  }
  handleSignals(fastify)
  handleLabelReload(fastify)
  const fatal = (err) => {
    fastify.log.fatal({ err }, 'uncaught error: exiting')
    process.exit(1)
  }
  process.on('uncaughtException', fatal)
  process.on('unhandledRejection', fatal)
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main()
}
