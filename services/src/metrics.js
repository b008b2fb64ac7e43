// What an instance tells Prometheus on GET /metrics (prom-client, its own registry): the records
// it received, the records it sent on, the records it refused by the code of its answer, and how
// long writing their audit lines took. Every series names the instance and its step.

import { Counter, Histogram, Registry } from 'prom-client'

// The audit line's write is an append to the page cache (src/audit.js): tens of microseconds,
// longer while a batch of lines waits for its one write.
const AUDIT_WRITE_BUCKETS = [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1]

/**
 * @param {{instanceId: string, step: string}} config
 * @returns {{received(): void, forwarded(): void, refused(code: string): void, auditWritten(seconds: number): void,
 *   contentType: string, text(): Promise<string>}}
 */
export function createMetrics (config) {
  const registry = new Registry()
  registry.setDefaultLabels({ instance: config.instanceId, step: config.step })
  const received = new Counter({ name: 'complyroute_records_received_total', help: 'Records this instance received (POST /process).', registers: [registry] })
  const forwarded = new Counter({ name: 'complyroute_records_forwarded_total', help: 'Records this instance sent on to its next step.', registers: [registry] })
  const refused = new Counter({
    name: 'complyroute_records_refused_total',
    help: 'Records this instance answered with an error of its own, by the code of its answer.',
    labelNames: ['code'],
    registers: [registry]
  })
  const auditWrite = new Histogram({
    name: 'complyroute_audit_write_seconds',
    help: 'Time from handing an audit line to the audit log until it was written.',
    buckets: AUDIT_WRITE_BUCKETS,
    registers: [registry]
  })
  return {
    received: () => received.inc(),
    forwarded: () => forwarded.inc(),
    refused: (code) => refused.inc({ code }),
    auditWritten: (seconds) => auditWrite.observe(seconds),
    contentType: registry.contentType,
    text: () => registry.metrics()
  }
}
