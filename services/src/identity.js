// Identities under mutual TLS: every part of a deployment holds a certificate of the
// deployment's CA whose one URI SAN is its SPIFFE-style identity
// (spiffe://complyroute/<kind>/<name>, complyroute/trust/pki.py). A service admits a peer by that
// identity (peerIdentity, peerAllowed) and checks that its next hop presents the identity
// the control plane expects there (checkServerIdentityFor).

const SPIFFE_ID = /^spiffe:\/\/[a-z0-9.-]+(\/[A-Za-z0-9._:-]+)+$/
export const MAX_SPIFFE_ID_LENGTH = 255

export function isSpiffeId (value) {
  return typeof value === 'string' && value.length <= MAX_SPIFFE_ID_LENGTH && SPIFFE_ID.test(value)
}

/**
 * The URI entries of a certificate's subject alternative names, as Node prints them
 * (`subjectaltname` of getPeerCertificate(), `subjectAltName` of X509Certificate):
 * "DNS:a, URI:spiffe://x, IP Address:1.2.3.4". Node prints a value holding a comma, a
 * quote or a control character as a JSON string ("URI:\"a, URI:b\""), so the entries are
 * read one by one rather than split on ", ": a crafted value cannot pass for two entries.
 * @param {string | undefined} altNames
 * @returns {string[] | null} the URIs, or null when the text is not in that form
 */
export function uriSans (altNames) {
  const uris = []
  if (typeof altNames !== 'string' || altNames === '') return uris
  let i = 0
  while (i < altNames.length) {
    const colon = altNames.indexOf(':', i)
    if (colon === -1) return null
    const type = altNames.slice(i, colon)
    let value
    let end
    if (altNames[colon + 1] === '"') {
      end = colon + 2
      while (end < altNames.length && altNames[end] !== '"') end += altNames[end] === '\\' ? 2 : 1
      if (end >= altNames.length) return null
      end++
      try {
        value = JSON.parse(altNames.slice(colon + 1, end))
      } catch {
        return null
      }
    } else {
      end = altNames.indexOf(', ', colon + 1)
      if (end === -1) end = altNames.length
      value = altNames.slice(colon + 1, end)
    }
    if (type === 'URI') uris.push(value)
    if (end === altNames.length) break
    if (altNames.startsWith(', ', end)) i = end + 2
    else return null
  }
  return uris
}

/** A certificate's identity: its one URI SAN when that is a SPIFFE id, else null. */
export function certificateIdentity (altNames) {
  const uris = uriSans(altNames)
  return uris !== null && uris.length === 1 && isSpiffeId(uris[0]) ? uris[0] : null
}

const kPeerIdentity = Symbol('complyroute.peer_identity')

/**
 * The identity of the peer on a TLS connection, from the certificate it presented (the
 * server verified it against the CA during the handshake: rejectUnauthorized). Read once
 * per connection and kept on the socket, so the requests of a kept-alive connection cost
 * a property read. null when there is none (no certificate, not TLS, app.inject's socket).
 */
export function peerIdentity (socket) {
  let identity = socket[kPeerIdentity]
  if (identity === undefined) {
    identity = null
    if (typeof socket.getPeerCertificate === 'function' && socket.authorized === true) {
      identity = certificateIdentity(socket.getPeerCertificate().subjectaltname)
    }
    socket[kPeerIdentity] = identity
  }
  return identity
}

/**
 * Whether a peer may make a request, under mutual TLS: POST /process from the parts that
 * send records here (RECORD_PEERS: the enforcement point(s) deciding hops into this
 * service), GET /health and GET /stats from the control plane (CONTROL_PEERS), anything
 * else (which is answered 404) from either; a peer in neither list, or without an
 * identity, from nowhere. `url` is the route's path, not the request's raw URL.
 * @param {{recordPeers: readonly string[], controlPeers: readonly string[]}} config
 * @param {string} method
 * @param {string} url
 * @param {string | null} peerId
 */
export function peerAllowed (config, method, url, peerId) {
  if (peerId === null) return false
  if (method === 'POST' && url === '/process') return config.recordPeers.includes(peerId)
  if ((method === 'GET' || method === 'HEAD') && (url === '/health' || url === '/stats')) return config.controlPeers.includes(peerId)
  if ((method === 'GET' || method === 'HEAD') && url === '/metrics') return config.monitoringPeers.includes(peerId)
  return config.recordPeers.includes(peerId) || config.controlPeers.includes(peerId)
}

/**
 * tls.connect's checkServerIdentity for a next hop that must present `expected`: it
 * replaces the host name check (the parts' certificates name no host, only an identity).
 * Called once per connection, after the chain was verified against the CA.
 */
export function checkServerIdentityFor (expected) {
  const wanted = `URI:${expected}`
  return function checkServerIdentity (host, cert) {
    const uris = uriSans(cert?.subjectaltname)
    if (uris !== null && uris.includes(expected)) return undefined
    const presented = uris === null ? JSON.stringify(cert?.subjectaltname) : uris.length > 0 ? uris.map((uri) => `URI:${uri}`).join(', ') : 'no URI SAN'
    return new Error(`next hop presented ${presented}, expected ${wanted}`)
  }
}
