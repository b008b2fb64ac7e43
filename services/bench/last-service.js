// What the bench's floor app answers in place of the rest of a chain: the path entries a chain's
// last services would have written, in the very form they write them (src/answers.js: each
// entry names the revision that decided the hop into its instance), so that a service measured
// in front of it handles the answer as it handles one in a deployment.

import { pathEntryJson, pathEntryPrefix } from '../src/answers.js'

export const BENCH_REVISION = '0123456789abcdef0123456789abcdef01234567' // a commit, as a deployment names its rule set

/** `length` path entries as JSON text (comma-separated), times from `t` (ms). */
export function lastServicesEntries (length, t) {
  return Array.from({ length }, (_, i) => {
    const n = String(i + 2).padStart(2, '0')
    const prefix = pathEntryPrefix({ instance: `svc-${n}`, step: `step-${n}`, region: 'EU', node: `node-${(i % 3) + 1}` })
    return pathEntryJson(prefix, t + i, t + i + 0.5, undefined, BENCH_REVISION)
  }).join(',')
}
