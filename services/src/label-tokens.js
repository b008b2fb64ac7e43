// Label-token mode (LABEL_TOKENS=1): the point that decided the hop into this instance
// verified the signed label token and set the record's digest from its claims
// (complyroute/proxy/contract.py LABEL_TOKEN_HEADER, DIGEST_HEADER). The token is passed on to
// the next point, which verifies it again; the digest is not (the next point derives it).

import { AppError } from './errors.js'
import { RecentIds } from './recent-ids.js'

export const LABEL_TOKEN_HEADERS = Object.freeze({
  token: 'x-complyroute-labels',
  digest: 'x-complyroute-digest'
})
// How many accepted record ids an instance remembers to refuse a replayed record. A replay
// needs a token still valid (complyroute/trust/identity.py: 120 s), so this covers up to 1,250
// records/s per instance; an id forgotten earlier than that could be replayed once.
const REPLAY_WINDOW = 150_000

/**
 * The check of label-token mode, throwing the AppError of a refused record: the record must be
 * the one its token was issued for (the digest the deciding point took from the token is the
 * digest of the bytes received), and a record is taken once (its id, which the token carries
 * too, not accepted before). An id is remembered once its record passed these checks, before
 * its audit line: two copies in flight at once cannot both pass.
 * @returns {(requestId: string, headers: Record<string, string>, digest: string) => void}
 */
export function labelTokenCheck () {
  const acceptedIds = new RecentIds(REPLAY_WINDOW)
  return function checkLabelToken (requestId, headers, digest) {
    const token = headers[LABEL_TOKEN_HEADERS.token]
    if (typeof token !== 'string' || token === '') {
      throw new AppError(400, 'LABEL_TOKEN_MISSING', `header ${LABEL_TOKEN_HEADERS.token} is missing: this instance takes only records whose labels an enforcement point verified`)
    }
    const claimed = headers[LABEL_TOKEN_HEADERS.digest]
    if (typeof claimed !== 'string' || claimed === '') {
      throw new AppError(400, 'DIGEST_MISSING', `header ${LABEL_TOKEN_HEADERS.digest} is missing: the enforcement point sets it from the label token`)
    }
    if (claimed !== digest) {
      throw new AppError(400, 'RECORD_DIGEST_MISMATCH', 'the record is not the one its label token was issued for')
    }
    if (acceptedIds.has(requestId)) {
      throw new AppError(409, 'RECORD_REPLAYED', `record ${requestId} was accepted here already: a label token carries one record, once`)
    }
    acceptedIds.add(requestId)
  }
}
